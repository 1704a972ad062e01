#!/usr/bin/env bash
# Many seeds in one process on one GPU, at most 12 minutes: seed-steps per second of dqn.py on CartPole (its
# envs one numpy array) and per_dqn.py on Pong (its Atari preset, a 20k buffer per seed, all seeds' games in one
# ale-py vector env) at --num-seeds 1, 8, 32 and 128, the update compiled and replayed as a CUDA graph.
# Seed-steps/s = each seed's training steps/s (summary.json's train_sps) x seeds.
# On a machine with a CUDA GPU, from the repository root (offline: see gpu.sh on gpu_wheels.sh):
#   pip install -e ".[dev,atari]" && OUT=gpu-seeds bash benchmarks/gpu_seeds.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-seeds}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

common=(--cuda --compile --cudagraphs --threads 8 --eval-episodes 1 --eval-frequency 0)
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

# A packed sweep: PER's alpha sweep on CartPole (per_dqn.py, 6 alphas x seeds 1-5 = 30 runs) in one process, each
# run its own alpha and seed (--pack), against the same 30 runs as six packs of 5 (one alpha each) one after
# another: wall seconds of each, whole processes. Every run is 10k steps.
alphas=(0 0.2 0.4 0.6 0.8 1.0)
pack_alpha=$(printf '%s,' $(for a in "${alphas[@]}"; do printf '%s ' "$a" "$a" "$a" "$a" "$a"; done)); pack_alpha=${pack_alpha%,}
pack_seed=$(printf '1,2,3,4,5,%.0s' "${alphas[@]}"); pack_seed=${pack_seed%,}
sweep_common=(--config configs/per_dqn/cartpole.yaml --total-timesteps 10000 "${common[@]}")
{
  start=$(date +%s.%N)
  timeout 120 python3 algos/per_dqn.py "${sweep_common[@]}" --pack "alpha=$pack_alpha" "seed=$pack_seed" \
    --run-name "sweep30-{alpha}-{seed}" > "$OUT/sweep30.log" 2>&1 || tail -3 "$OUT/sweep30.log"
  echo "alpha sweep, 1 packed process of 30: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  start=$(date +%s.%N)
  for a in "${alphas[@]}"; do
    timeout 60 python3 algos/per_dqn.py "${sweep_common[@]}" --alpha "$a" --num-seeds 5 \
      --run-name "sweep5-$a-{seed}" > "$OUT/sweep5-$a.log" 2>&1 || tail -3 "$OUT/sweep5-$a.log"
  done
  echo "alpha sweep, 6 processes of 5, one after another: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
} | tee "$OUT/sweep_wall.txt"
