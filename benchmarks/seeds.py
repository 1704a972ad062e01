"""Many seeds at once: our packed runs (`--num-seeds N`: N seeds in one process) against SB3 and our single runs.

    python benchmarks/seeds.py                                       # every case but baseline, seeds 1..10
    python benchmarks/seeds.py --cases dqn per_dqn                   # some of: dqn ddpg per_dqn scaling baseline
    python benchmarks/seeds.py --cases dqn --steps 3000 --seeds 1 2  # a quick try (writes the JSON all the same)
    python benchmarks/seeds.py --cases baseline --baseline-ref REF --repeats 2   # REF: an earlier commit or tag

What is timed is a batch of work: whole processes, each from start to exit (imports, start-up, training and
the final 10-episode evaluation), on one torch thread, at most two running at a time (the next starts when one
exits); a batch's wall time runs from its first start to its last exit. Cases:

  dqn       DQN, configs/dqn/cartpole.yaml: packed (the seeds split over 2 processes) vs SB3 and vs ours single
            (one process per seed). Goals: SB3 / packed >= 3, single / packed >= 3
  ddpg      DDPG, configs/ddpg/pendulum.yaml: packed vs SB3. Goal >= 3
  per_dqn   PER-DQN, configs/per_dqn/cartpole.yaml: packed vs ours single. Goal >= 3
  scaling   DQN CartPole, one process alone at --num-seeds 1, 5, 10, 20: seed-steps per second (goal: rising
            from 10 to 20)
  baseline  one DQN CartPole seed from this tree and from --baseline-ref (a temporary git worktree), alternating,
            one at a time: medians; goal: this tree no slower (at most 10% slower, the noise of one run)

Ours is `python algos/<algo>.py --config ... --threads 1 --no-cuda --eval-frequency 0` (DQN with --loss huber,
as in sps.py; --num-seeds only when N > 1), run with PYTHONPATH set to the tree it comes from; SB3's is
benchmarks/sb3_run.py. Needs stable-baselines3 for dqn and ddpg. Writes benchmarks/results/seeds.json: the
cases run replace their entries there, the others stay.
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
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"dqn": "configs/dqn/cartpole.yaml", "ddpg": "configs/ddpg/pendulum.yaml",
           "per_dqn": "configs/per_dqn/cartpole.yaml"}
CASES = ["dqn", "ddpg", "per_dqn", "scaling", "baseline"]
SIZES = [1, 5, 10, 20]  # --num-seeds of the scaling case


@dataclass
class Job:
    command: list[str]
    tree: Path  # PYTHONPATH: the checkout whose buffers/ and envs/ it imports
    seeds: list[int]  # the seeds whose results it leaves
    sb3: bool = False


def ours(algo: str, seeds: list[int], steps: int | None, tree: Path = ROOT) -> Job:
    flags = ["--num-seeds", str(len(seeds))] if len(seeds) > 1 else []
    flags += ["--total-timesteps", str(steps)] if steps else []
    flags += ["--loss", "huber"] if algo == "dqn" else []
    return Job([sys.executable, str(tree / "algos" / f"{algo}.py"), "--config", str(tree / CONFIGS[algo]), "--seed",
                str(seeds[0]), *flags, "--threads", "1", "--no-cuda", "--eval-episodes", "10", "--eval-frequency",
                "0", "--run-name", "bench"], tree, seeds)


def sb3(algo: str, seed: int, steps: int | None) -> Job:
    steps = steps or yaml.safe_load((ROOT / CONFIGS[algo]).read_text())["total_timesteps"]
    return Job([sys.executable, str(ROOT / "benchmarks" / "sb3_run.py"), algo, str(ROOT / CONFIGS[algo]), "--steps",
                str(steps), "--seed", str(seed)], ROOT, [seed], sb3=True)


def packed(algo: str, seeds: list[int], steps: int | None, processes: int = 2) -> list[Job]:
    size = -(-len(seeds) // processes)
    return [ours(algo, seeds[i:i + size], steps) for i in range(0, len(seeds), size)]


def results(job: Job, cwd: Path, stdout: str) -> list[dict]:
    """Per seed: steps and final evaluation, from SB3's JSON line or from each run directory's summary.json."""
    if job.sb3:
        line = json.loads(stdout.strip().splitlines()[-1])
        return [{"seed": job.seeds[0], "steps": line["steps"], "eval_return": line["eval_return"]}]
    rows = []
    for seed in job.seeds:
        path = cwd / "runs" / ("bench" if len(job.seeds) == 1 else f"bench__{seed}") / "summary.json"
        if not path.exists():
            found = sorted(p.name for p in (cwd / "runs").glob("*")) if (cwd / "runs").exists() else []
            raise RuntimeError(f"no {path.relative_to(cwd)} (runs/ holds {found})")
        summary = json.loads(path.read_text())
        if summary["seed"] != seed:
            raise RuntimeError(f"{path.relative_to(cwd)} is seed {summary['seed']}, not {seed}")
        rows.append({"seed": seed, "steps": summary["global_step"], "eval_return": summary["eval_return_mean"],
                     "in_run_wall_s": summary["wall_time_s"], "train_sps": summary["train_sps"]})
    return rows


def failure(job: Job, code: int, stderr: str) -> str:
    if "--num-seeds" in stderr and "Unrecognized" in stderr:
        return (f"{Path(job.command[1]).relative_to(job.tree)} in {job.tree} has no --num-seeds flag yet: the packed "
                "runs need the batched algorithms")
    return f"exit status {code}: {' '.join(job.command)}\n{stderr[-1500:]}"


def run_batch(label: str, jobs: list[Job], parallel: int = 2) -> dict:
    """Runs the jobs, `parallel` at a time, each in its own empty directory; wall time from first start to last exit."""
    waiting, running, rows, error = list(jobs), [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        try:
            while (waiting or running) and error is None:
                while waiting and len(running) < parallel:
                    job, cwd = waiting.pop(0), Path(tempfile.mkdtemp(dir=tmp))
                    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
                           "PYTHONPATH": os.pathsep.join([str(job.tree), os.environ.get("PYTHONPATH", "")])}
                    with open(cwd / "stdout", "w") as out, open(cwd / "stderr", "w") as err:
                        process = subprocess.Popen(job.command, cwd=cwd, env=env, stdout=out, stderr=err)
                    running.append((len(jobs) - len(waiting) - 1, cwd, process, time.perf_counter()))
                time.sleep(0.05)
                for item in [item for item in running if item[2].poll() is not None]:
                    running.remove(item)
                    index, cwd, process, began = item
                    job = jobs[index]
                    wall = time.perf_counter() - began
                    if process.returncode != 0:
                        error = failure(job, process.returncode, (cwd / "stderr").read_text())
                        break
                    try:
                        for row in results(job, cwd, (cwd / "stdout").read_text()):
                            rows.append({**row, "process": index, "process_wall_s": wall})
                    except (RuntimeError, ValueError, KeyError, IndexError) as e:
                        error = f"{' '.join(job.command)}: {e}"
            wall = time.perf_counter() - start
        finally:
            for _, _, process, _ in running:  # on an error or Ctrl-C: stop the batch's other processes
                process.terminate()
                process.wait()
    batch = {"label": label, "processes": len(jobs), "seeds": sum(len(job.seeds) for job in jobs), "error": error,
             "wall_s": None, "seed_steps_per_s": None, "eval_return_mean": None, "rows": rows}
    if error is None:
        steps = sum(row["steps"] for row in rows)
        batch.update(wall_s=wall, seed_steps=steps, seed_steps_per_s=steps / wall,
                     eval_return_mean=statistics.mean(row["eval_return"] for row in rows))
    print(f"  {label}: " + (f"{wall:.1f} s" if error is None else f"FAILED: {error}"), flush=True)
    return batch


def judge(row: dict, ref: dict, name: str, goal: float | None, at_most: bool = False) -> None:
    """Sets row's ratio, its wall time over ref's, and whether it is >= goal (<= goal if at_most)."""
    ratio = None if row["wall_s"] is None or ref["wall_s"] is None else row["wall_s"] / ref["wall_s"]
    met = None if ratio is None or goal is None else (ratio <= goal if at_most else ratio >= goal)
    row.update(ratio_name=name, ratio=ratio, goal=None if goal is None else f"{'<=' if at_most else '>='} {goal}",
               met=met)


def case_versus(algo: str, seeds: list[int], steps: int | None, peers: dict[str, float]) -> list[dict]:
    """Packed against SB3 and/or our single runs; the peers' ratios are their wall time over packed's."""
    ref = run_batch(f"ours packed ({algo})", packed(algo, seeds, steps))
    batches = [ref]
    for peer, goal in peers.items():
        jobs = [sb3(algo, s, steps) if peer == "sb3" else ours(algo, [s], steps) for s in seeds]
        batches.append(run_batch(f"{peer} ({algo})", jobs))
        judge(batches[-1], ref, f"{peer} / packed", goal)
    return batches


def case_scaling(seeds: list[int], steps: int | None) -> list[dict]:
    batches = [run_batch(f"N={n}", [ours("dqn", list(range(seeds[0], seeds[0] + n)), steps)], parallel=1)
               for n in SIZES]
    for batch in batches:
        if batch["wall_s"] is not None and batches[0]["wall_s"] is not None:
            ratio = batch["seed_steps_per_s"] / batches[0]["seed_steps_per_s"]
            batch.update(ratio_name="seed-steps/s vs N=1", ratio=ratio, goal=None, met=None)
    return batches


def case_baseline(seed: int, steps: int | None, ref: str, repeats: int) -> list[dict]:
    tree = Path(tempfile.mkdtemp(prefix="seeds-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        runs: dict[str, list[dict]] = {"current": [], f"baseline {ref}": []}
        for r in range(repeats):
            order = [("current", ROOT), (f"baseline {ref}", tree)]
            for label, root in order if r % 2 == 0 else order[::-1]:
                runs[label].append(run_batch(f"{label}, repeat {r + 1}", [ours("dqn", [seed], steps, root)], 1))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    batches = []
    for label, done in runs.items():
        ok = [b for b in done if b["error"] is None]
        batches.append({"label": label, "processes": len(done), "seeds": 1, "repeats": done,
                        "error": next((b["error"] for b in done if b["error"]), None),
                        "wall_s": statistics.median(b["wall_s"] for b in ok) if ok else None,
                        "seed_steps_per_s": statistics.median(b["seed_steps_per_s"] for b in ok) if ok else None,
                        "eval_return_mean": statistics.mean(b["eval_return_mean"] for b in ok) if ok else None})
    judge(batches[0], batches[1], "current / baseline (median wall)", 1.10, at_most=True)
    return batches


def table(case: str, batches: list[dict]) -> None:
    cell = lambda x, f: "n/a" if x is None else format(x, f)
    print(f"\n{case}:\n| batch | processes | seeds | wall (s) | seed-steps/s | final eval return, mean | ratio "
          "| goal | met |\n| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for b in batches:
        ratio = "" if "ratio_name" not in b else f"{b['ratio_name']}: {cell(b['ratio'], '.2f')}"
        ratio += "x" if b.get("ratio") is not None else ""
        goal = b.get("goal") or ""
        met = {True: "yes", False: "no"}.get(b.get("met"), "" if b.get("goal") is None else "n/a")
        print(f"| {b['label']} | {b['processes']} | {b['seeds']} | {cell(b['wall_s'], '.1f')} "
              f"| {cell(b['seed_steps_per_s'], '.0f')} | {cell(b['eval_return_mean'], '.1f')} | {ratio} | {goal} "
              f"| {met} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES[:-1], help="default: all but baseline")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    parser.add_argument("--steps", type=int, help="override every config's total_timesteps (quick tries)")
    parser.add_argument("--baseline-ref", help="the git commit or tag the baseline case compares with")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree in the baseline case")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "seeds.json")
    options = parser.parse_args()
    if "baseline" in options.cases and not options.baseline_ref:
        parser.error("the baseline case needs --baseline-ref REF (an earlier commit or tag to compare with)")
    seeds = options.seeds
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        parser.error("--seeds must be consecutive: a packed process trains seed .. seed + N - 1")
    load = os.getloadavg()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    versions = {}
    for package in ("torch", "stable-baselines3", "gymnasium"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    cases = {}
    for case in options.cases:
        print(f"{case}:", flush=True)
        start = time.time()
        if case == "dqn":
            batches = case_versus("dqn", seeds, options.steps, {"sb3": 3.0, "ours single": 3.0})
        elif case in ("ddpg", "per_dqn"):
            batches = case_versus(case, seeds, options.steps, {"sb3": 3.0} if case == "ddpg" else {"ours single": 3.0})
        elif case == "scaling":
            batches = case_scaling(seeds, options.steps)
        else:
            batches = case_baseline(seeds[0], options.steps, options.baseline_ref, options.repeats)
        table(case, batches)
        cases[case] = {"steps": options.steps or "config", "seeds": seeds, "date": time.strftime("%Y-%m-%d %H:%M"),
                       "case_s": time.time() - start, "batches": batches}
    old = json.loads(options.out.read_text()) if options.out.exists() else {}
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({
        "benchmark": "packed seeds (--num-seeds) vs SB3 and single-seed runs, whole processes, 2 at a time",
        "cases": {**old.get("cases", {}), **cases}, "date": time.strftime("%Y-%m-%d"),
        "commit": head.stdout.strip() + (" + uncommitted changes" if dirty else ""),
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "processor": platform.processor(),
        "torch_threads": 1, "versions": versions, "load_average_start": load, "load_average_end": os.getloadavg(),
    }, indent=2))
    failed = [b["label"] for c in cases.values() for b in c["batches"] if b["error"]]
    if failed:
        raise SystemExit(f"\nfailed batches: {', '.join(failed)} (see above; the JSON records the errors)")


if __name__ == "__main__":
    main()
