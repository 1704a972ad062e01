"""End-to-end wall time of our training runs against Stable-Baselines3's, at the same hyper-parameters.

    python benchmarks/sps.py                          # DQN, configs/dqn/cartpole.yaml, 100k steps, seeds 1 2 3
    python benchmarks/sps.py --algo ddpg              # DDPG, configs/ddpg/pendulum.yaml, 20k steps
    python benchmarks/sps.py --steps 30000 --seeds 1  # shorter

Each run is a fresh process started from the shell and timed from start to exit: imports, start-up,
any compilation, training and the final 10-episode evaluation all count. Ours is the script a user
types (`python algos/dqn.py --config ...`), on one torch thread; SB3's is benchmarks/sb3_run.py with
the same config values (SB3's DQN always uses the Huber loss, so ours runs with --loss huber here;
SB3's run evaluates only at the end, so ours runs with --eval-frequency 0).
The two libraries alternate, seed by seed, so machine load hits both alike. Requires the `bench`
extra (stable-baselines3). Writes benchmarks/results/sps_<algo>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {"dqn": ("configs/dqn/cartpole.yaml", 100_000), "ddpg": ("configs/ddpg/pendulum.yaml", 20_000)}


def timed(command: list[str], cwd: str) -> tuple[float, str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    out = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return wall, out.stdout


def ours(algo: str, config: Path, steps: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        flags = ["--loss", "huber"] if algo == "dqn" else []
        wall, _ = timed([sys.executable, str(ROOT / "algos" / f"{algo}.py"), "--config", str(config), "--seed",
                         str(seed), "--total-timesteps", str(steps), "--threads", "1", "--no-cuda", "--eval-episodes",
                         "10", "--eval-frequency", "0", "--run-name", "sps", *flags], tmp)
        summary = json.loads((Path(tmp) / "runs" / "sps" / "summary.json").read_text())
    return {"lib": "ours", "seed": seed, "steps": summary["global_step"], "wall_s": wall,
            "train_s": summary["global_step"] / summary["train_sps"], "eval_return": summary["eval_return_mean"]}


def sb3(algo: str, config: Path, steps: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wall, stdout = timed([sys.executable, str(ROOT / "benchmarks" / "sb3_run.py"), algo, str(config), "--steps",
                              str(steps), "--seed", str(seed)], tmp)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"lib": "sb3", "seed": seed, "steps": steps, "wall_s": wall, "train_s": result["learn_s"],
            "eval_return": result["eval_return"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=list(DEFAULTS), default="dqn")
    parser.add_argument("--config", type=Path)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    config = options.config or ROOT / DEFAULTS[options.algo][0]
    steps = options.steps or DEFAULTS[options.algo][1]
    rows = []
    for seed in options.seeds:
        for run in (ours, sb3) if seed % 2 else (sb3, ours):  # alternate who goes first
            rows.append(run(options.algo, config, steps, seed))
            print(json.dumps(rows[-1]), flush=True)
    median = {lib: {key: statistics.median(r[key] for r in rows if r["lib"] == lib)
                    for key in ("wall_s", "train_s", "eval_return")} for lib in ("ours", "sb3")}
    ratio = median["sb3"]["wall_s"] / median["ours"]["wall_s"]
    print(f"\n{options.algo} on {config.name}, {steps} steps, seeds {options.seeds}, one torch thread; medians:")
    print("| lib | wall time (s), start-up included | in-loop training (s) | steps/s end to end | final eval return |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for lib in ("ours", "sb3"):
        wall, train, score = (median[lib][key] for key in ("wall_s", "train_s", "eval_return"))
        print(f"| {lib} | {wall:.1f} | {train:.1f} | {steps / wall:.0f} | {score:.1f} |")
    print(f"\nwall-time ratio SB3 / ours: {ratio:.2f}x")
    out = options.out or ROOT / "benchmarks" / "results" / f"sps_{options.algo}.json"
    out.write_text(json.dumps({
        "benchmark": f"{options.algo} end-to-end wall time vs stable-baselines3", "config": str(config),
        "steps": steps, "seeds": options.seeds, "rows": rows, "medians": median, "wall_ratio_sb3_over_ours": ratio,
        "date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "torch_threads": 1,
    }, indent=2))


if __name__ == "__main__":
    main()
