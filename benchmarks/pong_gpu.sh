#!/usr/bin/env bash
# Pong on one GPU in one command of at most 9 minutes: first the buffers' CUDA tests (under a minute), then
# algos/per_dqn.py with its Atari preset's algorithm (PER, n = 3, the target every 1000 agent steps) at the book's
# replay ratio (one update per agent step) on PongNoFrameskip-v4 with 8 envs, the whole learner step compiled and
# replayed as CUDA graphs. Writes, as it goes (so a cut run still reports), $OUT/pong_curve.json (every evaluation:
# 10 episodes, wall time since the script started, agent steps) and $OUT/pong_progress.json (agent steps against
# wall time, every few seconds).
#
# Settings that differ from the preset, and why: --train-frequency 1 (the preset's 2 halves the book's replay ratio
# because on a CPU the update is the step's cost; a graphed update on a GPU is not, so this keeps the book's ratio),
# --eval-frequency 25000 (a curve), --compile --cudagraphs --threads 8. Everything else is the preset's (8 envs:
# the learner's eight updates of a loop iteration in one graph replay; fp32, as --precision auto takes on a GPU).
#
# On a machine with a CUDA GPU, from the repository root (offline: bash benchmarks/gpu_wheels.sh on a machine with
# internet first, then copy the repository with .whl/ over; this script installs them):
#   pip install -e ".[dev,atari]" && OUT=pong-gpu bash benchmarks/pong_gpu.sh
# Knobs: PONG_SECONDS (default 480: the training's share; SIGTERM then, and the run writes its checkpoint and
# summary.json like a preempted job), PONG_FLAGS (default "--cuda --compile --cudagraphs --train-frequency 1 --threads 8"),
# PONG_TESTS=0 skips the CUDA tests; further arguments go to per_dqn.py. A dry run on a CPU (two evaluations, 400 updates):
#   PONG_TESTS=0 PONG_SECONDS=300 PONG_FLAGS="--no-cuda --train-frequency 1" OUT=/tmp/pong-dry bash benchmarks/pong_gpu.sh \
#     --total-timesteps 1600 --learning-starts 1200 --eval-frequency 800 --eval-episodes 1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pong-gpu}; mkdir -p "$OUT"
START=$(date +%s.%N)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
if [ "${PONG_TESTS:-1}" != 0 ]; then
  echo "== the buffers' and the graphed learner's CUDA tests"
  timeout 75 python3 -m pytest -q -ra -n 4 -m cuda -p no:cacheprovider tests/test_prioritized.py tests/test_replay.py \
    tests/test_frames.py tests/test_learner.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -12
fi
echo "== per_dqn on Pong"
PONG_SECONDS=${PONG_SECONDS:-480} PONG_FLAGS=${PONG_FLAGS---cuda --compile --cudagraphs --train-frequency 1 --threads 8} \
  python3 - "$OUT" "$START" "$@" <<'PY'
import json, os, shutil, subprocess, sys, time
from pathlib import Path
out, started, extra = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
limit = float(os.environ["PONG_SECONDS"])
run = Path("runs/pong-gpu")
if run.exists():
    shutil.rmtree(run)  # a run of an earlier call of this script
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
        now = round(time.time() - started, 1)  # seconds since the script started (the CUDA tests included)
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
