#!/usr/bin/env bash
# Pong on one GPU in at most 9 minutes: algos/per_dqn.py with its Atari preset (PongNoFrameskip-v4, no --config),
# the update compiled and replayed as a CUDA graph. Writes the evaluation return against agent steps and wall time.
# On a machine with a CUDA GPU, from the repository root (offline: see gpu.sh on gpu_wheels.sh):
#   pip install -e ".[dev,atari]" && OUT=pong-gpu bash benchmarks/pong_gpu.sh
# The run gets SIGTERM at PONG_SECONDS (default 520): it writes its checkpoint and summary.json (interrupted) like a
# preempted job. PONG_FLAGS (default "--compile --cudagraphs") picks the update's mode.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pong-gpu}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
PONG_SECONDS=${PONG_SECONDS:-520} PONG_FLAGS=${PONG_FLAGS---compile --cudagraphs} python3 - "$OUT" "$@" <<'PY'
import json, os, subprocess, sys, time
from pathlib import Path
out, extra = Path(sys.argv[1]), sys.argv[2:]
limit = float(os.environ["PONG_SECONDS"])
cmd = [sys.executable, "algos/per_dqn.py", "--env", "PongNoFrameskip-v4", "--cuda", *os.environ["PONG_FLAGS"].split(),
       "--threads", "8", "--eval-frequency", "25000", "--eval-episodes", "3", "--run-name", "pong-gpu", *extra]
print(" ".join(cmd), flush=True)
start, curve, seen = time.time(), [], 0
log = open(out / "pong_gpu.log", "w")
proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
metrics = Path("runs/pong-gpu/metrics.jsonl")
while proc.poll() is None or metrics.exists() and metrics.stat().st_size > seen:
    if time.time() - start > limit and proc.poll() is None:
        proc.terminate()  # SIGTERM: checkpoint, summary.json, exit
    if metrics.exists():
        with open(metrics) as f:
            f.seek(seen)
            for line in f.readlines():
                if line.endswith("\n"):
                    seen += len(line.encode())
                    record = json.loads(line)
                    if "eval/episodic_return" in record:  # stamped with the wall time at which it was read
                        curve.append({"wall_s": round(time.time() - start, 1), **record})
                        print(curve[-1], flush=True)
    time.sleep(2)
(out / "pong_curve.json").write_text(json.dumps(curve, indent=1))
for name in ("summary.json", "config.yaml", "metrics.jsonl"):
    if (path := Path("runs/pong-gpu") / name).exists():
        (out / name).write_bytes(path.read_bytes())
solved = [c for c in curve if c["eval/episodic_return"] >= 18]
print("solved (evaluation >= 18):", f"{solved[0]['wall_s']} s, {solved[0]['global_step']} steps" if solved else "no")
PY
tail -3 "$OUT/pong_gpu.log"
