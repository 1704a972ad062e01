"""Evaluating trained runs again (run.py evaluate): each run's algorithm file with --evaluate, then a table."""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
from pathlib import Path

import yaml

from launcher import ROOT, fail, say, seeds_checked
from launcher.results import format_return, latest_evaluation, markdown, run_dirs_under, summary_in


def evaluate_runs(args: argparse.Namespace) -> int:
    """`run.py evaluate`: each run's algorithm file with --evaluate (as processes, --jobs at a time), then a table
    of the training's final evaluation beside the new one. The exit code is 1 if any evaluation failed."""
    seeds_checked("--seed", [] if args.seed is None else [args.seed])
    commands = {}
    for run_dir in run_dirs_under(args.run_dirs, "config.yaml"):
        algo = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("algo")
        script = ROOT / "algos" / f"{algo}.py"
        if not script.is_file():
            fail(f"{run_dir}: its config.yaml names no algorithm of algos/ (algo: {algo})")
        more = [flag for name in ("eval_episodes", "eval_epsilon", "seed") if getattr(args, name) is not None
                for flag in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]
        commands[run_dir] = [sys.executable, str(script), "--evaluate", str(run_dir), *more,
                             *(["--capture-video"] if args.capture_video else []), *(["--track"] if args.track else [])]
    say(f"evaluating {len(commands)} run(s), {args.jobs} at a time")

    def evaluated(run_dir: Path) -> subprocess.CompletedProcess:
        done = subprocess.run(commands[run_dir], capture_output=True, text=True)
        say(f"{'done  ' if done.returncode == 0 else 'FAILED'} {run_dir}: {(done.stdout + done.stderr).strip()[-300:]}")
        return done

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(commands, pool.map(evaluated, commands), strict=True))
    rows = []
    for run_dir, done in results.items():
        record = latest_evaluation(run_dir) if done.returncode == 0 else None
        again = "failed"
        if record is not None:
            again = f"{record['mean']:.1f} ± {record['std']:.1f} ({len(record['returns'])} episodes)"
        rows.append([run_dir, format_return(summary_in(run_dir)), again, (record or {}).get("video") or "-"])
    say(markdown(["run", "final evaluation in training", "evaluation now", "video"], rows))
    return int(any(done.returncode for done in results.values()))
