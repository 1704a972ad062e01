"""A tune in packs against the same runs as one process each: wall time, and the same result per run.

    python benchmarks/tune_speed.py                          # 32 trials x seeds 1 2 3, DQN CartPole at 50k steps
    python benchmarks/tune_speed.py --trials 4 --steps 5000  # a quick look

Three ways to train the same trials (Optuna's random sampler, seed 0: one round, so the same settings every time),
one after the other on this machine, two processes at a time in each:

1. packs: `run.py tune configs/dqn/cartpole.yaml --set total_timesteps=<steps> --trials T --seeds ... --num-seeds N
   --jobs 2`, N = T x seeds / 2: the trials x seeds as two packs;
2. halving: the same with `--rungs R --eta 2`: the best half of the trials going on at each rung;
3. alone: each (trial, seed) as its own `python algos/dqn.py --config configs/dqn/cartpole.yaml ...` with the
   trial's settings, two at a time: the way to tune without packs (one process per run, one run per core).

It checks that every run of the packs ended with the same final evaluation as the same run alone, bit for bit, and
so every run of the trials halving trained to the end, and writes benchmarks/results/tune_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "dqn" / "cartpole.yaml"


def timed(command: list[str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "WANDB_MODE": "disabled"})
    return time.perf_counter() - start


def study(tune_dir: Path) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=tune_dir.name, storage=f"sqlite:///{tune_dir / 'study.db'}").get_trials()


def returns_of(runs: Path, pattern: str) -> list[float] | None:
    found = list(runs.glob(pattern))
    if len(found) != 1 or not (found[0] / "summary.json").is_file():
        return None
    summary = json.loads((found[0] / "summary.json").read_text())
    return None if summary["interrupted"] else summary["eval_returns"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--rungs", type=int, default=4)
    p.add_argument("--work", type=Path, help="where the runs go (default: a temporary directory)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tune_speed.json")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tune-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = len(args.seeds) * args.trials
    tune = [sys.executable, str(ROOT / "run.py"), "tune", str(CONFIG), "--set", f"total_timesteps={args.steps}",
            "--trials", str(args.trials), "--seeds", *map(str, args.seeds), "--num-seeds", str(-(-runs // 2)),
            "--jobs", "2", "--sampler", "random"]
    wall = {}
    print(f"{args.trials} trials x seeds {args.seeds}, DQN CartPole-v1, {args.steps} steps each; runs in {work}",
          flush=True)
    wall["packs"] = timed([*tune, "--runs-dir", str(work / "packs")], work / "packs.log")
    print(f"packs:   {wall['packs']:.0f} s", flush=True)
    wall["halving"] = timed([*tune, "--rungs", str(args.rungs), "--eta", "2", "--runs-dir", str(work / "halving")],
                            work / "halving.log")
    print(f"halving: {wall['halving']:.0f} s", flush=True)
    [packs_dir] = (work / "packs").glob("cartpole__tune__*")
    [halving_dir] = (work / "halving").glob("cartpole__tune__*")
    trials = study(packs_dir)
    assert [t.params for t in trials] == [t.params for t in study(halving_dir)], "the two tunes asked other trials"

    def alone(trial, seed: int) -> None:
        flags = [part for key, value in trial.params.items()
                 for part in (f"--{key.replace('_', '-')}", repr(value) if isinstance(value, float) else str(value))]
        name = f"trial={trial.number}__{seed}"
        with open(work / "alone" / f"{name}.log", "w") as out:
            subprocess.run([sys.executable, str(ROOT / "algos" / "dqn.py"), "--config", str(CONFIG),
                            "--total-timesteps", str(args.steps), "--seed", str(seed), *flags, "--run-name", name],
                           cwd=work / "alone", stdout=out, stderr=subprocess.STDOUT, check=True,
                           env={**os.environ, "WANDB_MODE": "disabled"})

    (work / "alone").mkdir(exist_ok=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda ts: alone(*ts), [(t, s) for t in trials for s in args.seeds]))
    wall["alone"] = time.perf_counter() - start
    print(f"alone:   {wall['alone']:.0f} s", flush=True)

    same = {"packs": 0, "halving": 0}
    finished = {"packs": 0, "halving": 0}
    for t in trials:
        for seed in args.seeds:
            mine = returns_of(work / "alone" / "runs", f"trial={t.number}__{seed}")
            for way, where in (("packs", work / "packs"), ("halving", work / "halving")):
                theirs = returns_of(where, f"CartPole-v1__dqn__trial={t.number}__{seed}__*")
                if theirs is not None:
                    finished[way] += 1
                    same[way] += theirs == mine
    halving_trials = study(halving_dir)
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "trials": args.trials, "seeds": args.seeds, "steps": args.steps, "rungs": args.rungs, "eta": 2,
        "wall_s": wall, "ratio_to_alone": {way: wall[way] / wall["alone"] for way in ("packs", "halving")},
        "runs_finished": finished, "runs_equal_to_alone": same, "runs": runs,
        "best": {"packs": max(t.value for t in trials if t.value is not None),
                 "halving": max(t.value for t in halving_trials if t.value is not None)},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| way | wall time | / alone | runs trained to the end | equal to the run alone |\n|---|---|---|---|---|")
    for way in ("alone", "packs", "halving"):
        ratio = wall[way] / wall["alone"]
        done = runs if way == "alone" else finished[way]
        equal = "-" if way == "alone" else f"{same[way]} / {finished[way]}"
        print(f"| {way} | {wall[way]:.0f} s | {ratio:.2f} | {done} | {equal} |")
    print(f"best trial's value: packs {result['best']['packs']:.1f}, halving {result['best']['halving']:.1f}; "
          f"{args.out}")


if __name__ == "__main__":
    main()
