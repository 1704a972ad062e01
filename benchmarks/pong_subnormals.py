"""Agent steps/s of a Pong run continued from a late checkpoint, with subnormal floats kept and flushed to zero.

    python benchmarks/pong_subnormals.py --run runs/PongNoFrameskip-v4__per_dqn__cpu_bf16__2 --steps 2000 --rounds 2

Late in a run many of Adam's moments are subnormal floats (below 1.2e-38): a weight whose gradient is 0 (a unit the
ReLUs never open, a pixel that never changes) has moments that decay by beta1 and beta2 each step, through that range.
x86 cores compute with subnormals many times slower than with normal floats, so a fresh network's update
(cpu_learner.py, cpu_ops.py) does not show it. A run (harness.Run) now flushes them to zero (torch.set_flush_denormal);
this script measures what that changes on a real run: it copies the run's checkpoint twice per round and continues
each copy for `--steps` agent steps in this process (`--resume COPY --stop-step`, the pause's evaluation replaced by a
no-op), once with subnormals kept (the flag left off) and once flushed, in turn, so a slow spell of the machine falls on
both. It reports the run's own agent steps/s (metrics.jsonl's charts/SPS at the pause: steps since the resume over
the time since), how many of the moments are subnormal before and after, and how many weights of the two copies differ
at the pause (flush-to-zero changes a sum only where a subnormal was one of its terms). Writes
benchmarks/results/pong_subnormals.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import harness.run  # noqa: E402
from harness.precision import cpu_flags  # noqa: E402
from tests.algo_utils import load_algo, parse  # noqa: E402

FILES = ("checkpoint.pt", "config.yaml", "metrics.jsonl", "summary.json")
TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32


def subnormal(tensors) -> tuple[int, int]:
    """(subnormal, all) elements of the tensors."""
    tensors = list(tensors)
    return sum(int(((t != 0) & (t.abs() < TINY)).sum()) for t in tensors), sum(t.numel() for t in tensors)


def moments(checkpoint: dict) -> dict:
    """Subnormal counts of Adam's first and second moments in a checkpoint."""
    states = checkpoint["optimizer"]["state"].values()
    return {name: subnormal(state[name] for state in states) for name in ("exp_avg", "exp_avg_sq")}


def resumed(algo, run: Path, start: int, steps: int, flushed: bool) -> tuple[float, dict, dict]:
    """Continue a copy of `run` for `steps` agent steps -> (agent steps/s, its Q-network weights, moments' counts)."""
    set_flush = torch.set_flush_denormal
    set_flush(False)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run.name
        copy.mkdir()
        for name in FILES:
            shutil.copy2(run / name, copy / name)
        if not flushed:
            torch.set_flush_denormal = lambda on: False  # the run's call leaves subnormals as they are
        try:
            algo.main(parse(algo, ["--resume", str(copy), "--stop-step", str(start + steps)]))
        finally:
            torch.set_flush_denormal = set_flush
            set_flush(False)
        lines = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
        sps = next(line["charts/SPS"] for line in reversed(lines) if "charts/SPS" in line)
        checkpoint = torch.load(copy / "checkpoint.pt", map_location="cpu", weights_only=False)
    return sps, checkpoint["q_network"], moments(checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "PongNoFrameskip-v4__per_dqn__cpu_bf16__2")
    parser.add_argument("--steps", type=int, default=2000, help="agent steps each copy continues for")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "pong_subnormals.json")
    options = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    harness.run.evaluate = lambda *args, **kwargs: [[0.0]]  # the pause's games are not the training's speed
    algo = load_algo("per_dqn")
    with tempfile.TemporaryDirectory() as tmp:  # a snapshot: the run may be training and replace its checkpoint
        snapshot = Path(tmp) / options.run.name
        snapshot.mkdir()
        for name in FILES:
            shutil.copy2(options.run / name, snapshot / name)
        measure(options, algo, snapshot)


def measure(options: argparse.Namespace, algo, run: Path) -> None:
    checkpoint = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    start, before = checkpoint["counts"][0], moments(checkpoint)
    weights_before = subnormal(v for v in checkpoint["q_network"].values() if v.is_floating_point())
    del checkpoint
    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "avx512f"})
    print(f"{options.run} at step {start}: subnormal moments {before}, weights {weights_before}; "
          f"{os.cpu_count()} cores, flags {' '.join(flags)}, torch {torch.__version__}", flush=True)
    rows = {"kept": [], "flushed": []}
    ends = {}
    for _ in range(options.rounds):
        for name in rows:
            sps, weights, after = resumed(algo, run, start, options.steps, flushed=name == "flushed")
            rows[name].append({"agent_steps_per_s": sps, "subnormal_moments_after": after})
            ends.setdefault(name, weights)
            print(f"{name:8s} {sps:6.1f} agent steps/s, subnormal moments after: {after}", flush=True)
    differ = {key: int((ends["kept"][key] != ends["flushed"][key]).sum()) for key in ends["kept"]}
    medians = {name: statistics.median(r["agent_steps_per_s"] for r in runs) for name, runs in rows.items()}
    print(f"median agent steps/s: kept {medians['kept']:.1f}, flushed {medians['flushed']:.1f} "
          f"({medians['flushed'] / medians['kept']:.2f}x); weights that differ at the pause: "
          f"{sum(differ.values())} of {sum(v.numel() for v in ends['kept'].values())} {differ}")
    options.out.write_text(json.dumps({
        "run": options.run.name, "start_step": start, "steps": options.steps, "cores": os.cpu_count(),
        "flags": flags, "torch": torch.__version__, "subnormal_moments_before": before,
        "subnormal_weights_before": weights_before, "runs": rows, "median_agent_steps_per_s": medians,
        "weights_differing_at_pause": differ}, indent=2))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
