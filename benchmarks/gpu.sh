#!/usr/bin/env bash
# Every GPU check in one call, at most 8 minutes (each part under its own timeout): the CUDA tests, the updates eager vs --compile vs --cudagraphs,
# the PER tree at 2^20, and per_dqn's training steps/s on Pong. Results land in $OUT (default /tmp/gpu-out).
# On a machine with a CUDA GPU, from the repository root:
#   pip install -e ".[dev,atari]" && OUT=gpu-results bash benchmarks/gpu.sh
# A GPU machine without internet: bash benchmarks/gpu_wheels.sh on one with it first (wheels into .whl/, which this
# script installs from), copy the repository with .whl/ to the GPU machine and run the script there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"

echo "== 1. CUDA tests (buffers, frames, prefetch, the algorithms' CUDA runs)"
timeout 120 python3 -m pytest -q -x -m cuda -p no:cacheprovider tests/test_replay.py tests/test_prioritized.py \
  tests/test_frames.py tests/test_prefetch.py tests/test_learner.py tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -15

echo "== 2. one update: eager, torch.compile, compile + CUDA graph"
timeout 120 python3 benchmarks/gpu_updates.py --out "$OUT/gpu_updates.json" 2>&1 | grep -v Warning | tail -8

echo "== 3. PER sample + update at 2^20: eager, compiled, graph-replayed"
timeout 60 python3 benchmarks/gpu_tree.py --out "$OUT/gpu_tree.json" 2>&1 | tail -8

echo "== 3b. a host buffer feeding the GPU: plain copies vs buffers.Prefetcher"
timeout 30 python3 benchmarks/prefetch.py 2>&1 | tail -6 | tee "$OUT/prefetch.txt"

echo "== 4. per_dqn on Pong: training steps/s, eager vs --compile vs --compile --cudagraphs"
for mode in "eager:" "compile:--compile" "cudagraphs:--compile --cudagraphs"; do
  name=pong-${mode%%:*}
  timeout 60 python3 algos/per_dqn.py --env PongNoFrameskip-v4 --cuda --threads 8 --total-timesteps 20000 \
    --learning-starts 2000 --eval-episodes 1 --eval-frequency 0 --run-name "$name" ${mode#*:} > "$OUT/$name.log" 2>&1
  python3 -c "import json; s = json.load(open('runs/$name/summary.json')); print('$name', round(s['train_sps']), 'steps/s')" \
    || tail -3 "$OUT/$name.log"
done | tee "$OUT/pong_sps.txt"
