#!/usr/bin/env bash
# The GPU measurements, in parts. On a machine with a CUDA GPU, from the repository root:
#   pip install -e ".[dev,atari]" && OUT=gpu-results bash benchmarks/gpu.sh [PART ...] [-- PER_DQN_FLAGS]
# Parts (default: tests tree prefetch pong-sps, at most 8 minutes; each part under its own timeout):
#   tests     the CUDA tests: buffers, frames, prefetch, the graphed learner, the algorithms' CUDA runs (2 min)
#   tree      PER sample + update at 2^20 items: eager, compiled, graph-replayed (benchmarks/gpu_tree.py, 1 min)
#   prefetch  a host buffer feeding the GPU: plain copies against buffers.Prefetcher (benchmarks/prefetch.py)
#   pong-sps  per_dqn on Pong: training steps/s, eager against --compile and --compile --cudagraphs (3 min)
#   seeds     many seeds in one process: seed-steps/s of dqn.py on CartPole and per_dqn.py on Pong (a 20k buffer per
#             seed) at --num-seeds 1, 8, 32, 128, compiled and graphed; then PER's alpha sweep on CartPole (6 alphas
#             x seeds 1-5, 10k steps each) as one packed process of 30 runs against six packs of 5 (12 min)
#   pong      per_dqn on Pong with the preset's 8 envs at the book's replay ratio (--train-frequency 1: on a GPU the
#             update is not the step's cost), the whole learner step compiled and replayed as CUDA graphs, evaluated
#             (10 episodes) every 25k agent steps. Writes as it goes, so a cut run still reports: $OUT/pong_curve.json
#             (each evaluation with agent steps and seconds since the part started), $OUT/pong_progress.json.
#             PONG_SECONDS (default 480) then SIGTERM: the run writes its checkpoint and summary.json like a
#             preempted job; PONG_FLAGS (default "--cuda --compile --cudagraphs --train-frequency 1 --threads 8");
#             flags after -- go to per_dqn.py. A dry run on a CPU (two evaluations, 400 updates):
#               PONG_SECONDS=300 PONG_FLAGS="--no-cuda --train-frequency 1" OUT=/tmp/pong-dry bash benchmarks/gpu.sh \
#                 pong -- --total-timesteps 1600 --learning-starts 1200 --eval-frequency 800 --eval-episodes 1
#   wheels    on a machine with internet: the wheels a bare GPU machine lacks (Python 3.12 with torch, numpy, pyyaml,
#             tqdm, pytest; no gymnasium, ale-py, tensordict or tyro) into .whl/, which every other part installs from
# Results land in $OUT (default /tmp/gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=(tests tree prefetch pong-sps seeds pong wheels)
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
chosen=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  [[ " ${PARTS[*]} " == *" $1 "* ]] || { echo "error: no part $1 (parts: ${PARTS[*]}; see --help)" >&2; exit 2; }
  chosen+=("$1"); shift
done
[ "${1:-}" = -- ] && shift  # the rest: per_dqn.py's flags, for the pong part
[ ${#chosen[@]} -gt 0 ] || chosen=(tests tree prefetch pong-sps)
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"

wheels() {
  mkdir -p .whl
  for wheel in gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 tensordict==0.15.3 pyvers==0.2.3 \
               tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$wheel" || return 1
  done
  ls -la .whl
}

tests() {
  timeout 120 python3 -m pytest -q -x -m cuda -p no:cacheprovider tests/test_replay.py tests/test_prioritized.py \
    tests/test_frames.py tests/test_prefetch.py tests/test_learner.py tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log" \
    | tail -15
}

tree() {
  timeout 60 python3 benchmarks/gpu_tree.py --out "$OUT/gpu_tree.json" 2>&1 | tail -8
}

prefetch() {
  timeout 30 python3 benchmarks/prefetch.py 2>&1 | tail -6 | tee "$OUT/prefetch.txt"
}

pong-sps() {
  for mode in "eager:" "compile:--compile" "cudagraphs:--compile --cudagraphs"; do
    name=pong-${mode%%:*}
    # shellcheck disable=SC2086  # ${mode#*:} is a list of flags
    timeout 60 python3 algos/per_dqn.py --env PongNoFrameskip-v4 --cuda --threads 8 --total-timesteps 20000 \
      --learning-starts 2000 --eval-episodes 1 --eval-frequency 0 --run-name "$name" ${mode#*:} > "$OUT/$name.log" 2>&1
    python3 -c "import json; s = json.load(open('runs/$name/summary.json')); print('$name', round(s['train_sps']), 'steps/s')" \
      || tail -3 "$OUT/$name.log"
  done | tee "$OUT/pong_sps.txt"
}

seeds() {
  local common=(--cuda --compile --cudagraphs --threads 8 --eval-episodes 1 --eval-frequency 0)
  for case in "cartpole:dqn.py:--total-timesteps 10000" \
              "pong:per_dqn.py:--env PongNoFrameskip-v4 --buffer-size 20000 --total-timesteps 6000 --learning-starts 2000"; do
    IFS=: read -r name script flags <<< "$case"
    for n in 1 8 32 128; do
      run=$name-seeds$n
      # shellcheck disable=SC2086  # $flags is a list of flags
      timeout 40 python3 "algos/$script" ${flags} "${common[@]}" --num-seeds "$n" --run-name "$run-{seed}" \
        > "$OUT/$run.log" 2>&1
      python3 -c "import json; s = json.load(open('runs/$run-1/summary.json')); \
print('$run', round(s['train_sps']), 'steps/s per seed,', round(s['train_sps'] * $n), 'seed-steps/s')" \
        || tail -3 "$OUT/$run.log"
    done
  done | tee "$OUT/seeds_sps.txt"
  local alphas=(0 0.2 0.4 0.6 0.8 1.0) pack_alpha pack_seed start
  pack_alpha=$(printf '%s,' $(for a in "${alphas[@]}"; do printf '%s ' "$a" "$a" "$a" "$a" "$a"; done))
  pack_seed=$(printf '1,2,3,4,5,%.0s' "${alphas[@]}")
  local sweep=(--config configs/per_dqn/cartpole.yaml --total-timesteps 10000 "${common[@]}")
  {
    start=$(date +%s.%N)
    timeout 120 python3 algos/per_dqn.py "${sweep[@]}" --pack "alpha=${pack_alpha%,}" "seed=${pack_seed%,}" \
      --run-name "sweep30-{alpha}-{seed}" > "$OUT/sweep30.log" 2>&1 || tail -3 "$OUT/sweep30.log"
    echo "alpha sweep, 1 packed process of 30: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    start=$(date +%s.%N)
    for a in "${alphas[@]}"; do
      timeout 60 python3 algos/per_dqn.py "${sweep[@]}" --alpha "$a" --num-seeds 5 \
        --run-name "sweep5-$a-{seed}" > "$OUT/sweep5-$a.log" 2>&1 || tail -3 "$OUT/sweep5-$a.log"
    done
    echo "alpha sweep, 6 processes of 5, one after another: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  } | tee "$OUT/sweep_wall.txt"
}

pong() {
  PONG_SECONDS=${PONG_SECONDS:-480} PONG_FLAGS=${PONG_FLAGS---cuda --compile --cudagraphs --train-frequency 1 --threads 8} \
    python3 - "$OUT" "$@" <<'PY'
import json, os, shutil, subprocess, sys, time
from pathlib import Path
out, extra = Path(sys.argv[1]), sys.argv[2:]
limit = float(os.environ["PONG_SECONDS"])
run = Path("runs/pong-gpu")
if run.exists():
    shutil.rmtree(run)  # a run of an earlier call
cmd = [sys.executable, "algos/per_dqn.py", "--env", "PongNoFrameskip-v4", *os.environ["PONG_FLAGS"].split(),
       "--eval-frequency", "25000", "--eval-episodes", "10", "--run-name", "pong-gpu", *extra]
print(" ".join(cmd), flush=True)
start, curve, progress, seen = time.time(), [], [], 0
log = open(out / "pong_gpu.log", "w")
proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
metrics = run / "metrics.jsonl"


def write(name, value):  # whole files, replaced atomically, so a cut run leaves readable ones
    (out / f"{name}.tmp").write_text(json.dumps(value, indent=1))
    os.replace(out / f"{name}.tmp", out / name)


while proc.poll() is None or metrics.exists() and metrics.stat().st_size > seen:
    if time.time() - start > limit and proc.poll() is None:
        proc.terminate()  # SIGTERM: checkpoint, summary.json, exit
    if metrics.exists():
        with open(metrics) as f:
            f.seek(seen)
            lines = f.readlines()
        now = round(time.time() - start, 1)
        for line in lines:
            if not line.endswith("\n"):
                break
            seen += len(line.encode())
            record = json.loads(line)
            if "eval/episodic_return" in record:
                curve.append({"wall_s": now, **record})
                print(curve[-1], flush=True)
                write("pong_curve.json", curve)
        if lines and lines[-1].endswith("\n"):
            progress.append({"wall_s": now, "global_step": json.loads(lines[-1])["global_step"]})
            write("pong_progress.json", progress)
    time.sleep(2)
write("pong_curve.json", curve)
for name in ("summary.json", "config.yaml", "metrics.jsonl"):
    if (path := run / name).exists():
        (out / name).write_bytes(path.read_bytes())
solved = [c for c in curve if c["eval/episodic_return"] >= 18]
print("solved (evaluation >= 18):", f"{solved[0]['wall_s']} s, {solved[0]['global_step']} steps" if solved else "no")
PY
  tail -3 "$OUT/pong_gpu.log"
}

if [ "${chosen[*]}" != wheels ]; then
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || exit 1
    export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" 2>/dev/null \
    | tee -a "$OUT/gpu.txt"
fi
for part in "${chosen[@]}"; do
  echo "== $part"
  if [ "$part" = pong ]; then pong "$@"; else "$part"; fi
done
