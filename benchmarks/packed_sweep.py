"""PER's alpha sweep as packed processes: 6 values of alpha x seeds 1-5 (30 runs of per_dqn on CartPole-v1 at
configs/per_dqn/cartpole.yaml's budget), launched with run.py as packs of 5 (six processes: one alpha each) and as
packs of 15 (two processes, three alphas each), two processes at a time either way; then each run of one launch
is compared with the same run of the other (model.pt, the final evaluation's returns, metrics.jsonl without SPS).

    python benchmarks/packed_sweep.py                       # the config's budget (100k steps per run)
    python benchmarks/packed_sweep.py --steps 3000          # a quick try (written all the same, with its budget)

Timed: each launch from start to exit (run.py, its processes' start-up, training, evaluations). Writes
benchmarks/results/packed_sweep.json and, with --figure, the packed launch's curves by alpha (run.py plot).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ALPHAS = "0,0.2,0.4,0.6,0.8,1.0"
SEEDS = ["1", "2", "3", "4", "5"]


def launch(runs_dir: Path, num_seeds: int, steps: int | None) -> tuple[float, Path]:
    """run.py's alpha sweep in packs of `num_seeds`, two processes at a time: (wall seconds, its launch dir)."""
    budget = ["--set", f"total_timesteps={steps}"] if steps else []
    command = [sys.executable, "run.py", "configs/per_dqn/cartpole.yaml", "--sweep", f"alpha={ALPHAS}", "--seeds",
               *SEEDS, "--num-seeds", str(num_seeds), "--jobs", "2", "--runs-dir", str(runs_dir), *budget]
    start = time.time()
    subprocess.run(command, cwd=ROOT, check=True, env=os.environ | {"WANDB_MODE": "disabled"})
    wall = time.time() - start
    return wall, next(p for p in runs_dir.iterdir() if (p / "launch.json").is_file())


def outcome(run_dir: Path) -> tuple[dict, list[float], list[str], float]:
    model = torch.load(run_dir / "model.pt", weights_only=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "charts/SPS" not in line]
    return model, summary["eval_returns"], metrics, summary["eval_return_mean"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="total_timesteps per run (default: the config's)")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "packed_sweep")
    parser.add_argument("--figure", type=Path, default=None, help="write the packed launch's curves by alpha here")
    args = parser.parse_args()
    results = {}
    for label, size in (("6 processes of 5 (one alpha each)", 5), ("2 packed processes of 15", 15)):
        wall, launch_dir = launch(args.runs_dir / f"packs_of_{size}", size, args.steps)
        results[label] = {"num_seeds": size, "wall_s": round(wall, 1), "launch": launch_dir.name}
        print(f"{label}: {wall:.1f} s", flush=True)
    (five, _), (fifteen, _) = ((args.runs_dir / f"packs_of_{n}", n) for n in (5, 15))
    same, returns = [], {}
    for run_dir in sorted(p for p in five.iterdir() if (p / "summary.json").is_file()):
        tag = run_dir.name.rsplit("__", 2)[0]  # <env>__per_dqn__alpha=<a>__<seed>
        other = next(p for p in fifteen.iterdir() if p.name.startswith(tag + "__"))
        a, b = outcome(run_dir), outcome(other)
        same.append(a[1] == b[1] and a[2] == b[2] and all(torch.equal(a[0][k], b[0][k]) for k in a[0]))
        returns[tag.split("__", 2)[2]] = a[3]
    ratio = results["6 processes of 5 (one alpha each)"]["wall_s"] / results["2 packed processes of 15"]["wall_s"]
    record = {"steps_per_run": args.steps or "config (100000)", "runs": len(same), "identical_runs": sum(same),
              "launches": results, "speedup_packed": round(ratio, 2), "final_return_mean": returns,
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                          "torch": torch.__version__, "threads_per_process": 1}}
    out = ROOT / "benchmarks" / "results" / "packed_sweep.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"6 processes of 5 / 2 packed processes of 15: {ratio:.2f}x; {sum(same)} of {len(same)} runs identical; "
          f"{out}")
    if args.figure:
        subprocess.run([sys.executable, "run.py", "plot", str(fifteen), "--by", "alpha", "--out", str(args.figure)],
                       cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
