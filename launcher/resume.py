"""Resuming a launch (run.py resume): its unfinished jobs, from their checkpoint.pt, else started again."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from launcher import fail, say, sweeps, yaml_value
from launcher.jobs import Job, run_launch
from launcher.results import finished


def resumed_jobs(record: dict[str, Any], runs_dir: Path, total_timesteps: int | None = None) -> list[Job]:
    """The launch's unfinished jobs: continued from their checkpoint.pt, else started again.

    A run is finished when its summary.json exists and does not say `interrupted: true`; a job (a pack: all of
    its runs) that is finished is left out.
    """
    more = ["--total-timesteps", str(total_timesteps)] if total_timesteps else []
    jobs = []
    for job in record["jobs"]:
        run_dir, names = runs_dir / job["run_name"], job.get("pack") or [job["run_name"]]
        if all(finished(runs_dir / name) for name in names):
            continue
        # relative: both backends run a job where ./runs is runs_dir
        argv = ["--resume", f"runs/{job['run_name']}"] if (run_dir / "checkpoint.pt").is_file() else job["argv"]
        jobs.append(Job(job["run_name"], job["env"], job["seed"], argv + more,
                        runs_dir / record["launch_id"] / "logs" / f"{job['run_name']}.log", job["values"],
                        pack=job.get("pack") or [], members=job.get("members") or []))
    return jobs


def resume(args: argparse.Namespace) -> int:
    launch_dir = args.launch_dir.resolve()
    for name in ("jobs", "total_timesteps"):  # 0 is not "not given"
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        record = json.loads((launch_dir / "launch.json").read_text())
    except (OSError, ValueError) as e:
        fail(f"{launch_dir} has no readable launch.json ({e}); give runs/<launch id> as a launch wrote it")
    script = sweeps.ALGOS / f"{record['algo']}.py"
    if not script.is_file():
        fail(f"the launch ran algos/{record['algo']}.py, which is no longer there")
    runs_dir = launch_dir.parent
    jobs = resumed_jobs(record, runs_dir, args.total_timesteps)
    done = sum(len(job.get("pack") or [0]) for job in record["jobs"]) - sum(len(job.names) for job in jobs)
    if not jobs:
        say(f"nothing to resume: all {done} run(s) of {record['launch_id']} finished")
        return 0
    for job in jobs:
        for name in job.names if not job.resumes else []:  # the scripts refuse an existing run directory
            if (runs_dir / name).exists():
                shutil.rmtree(runs_dir / name)
                say(f"removed {runs_dir / name}: it had no checkpoint.pt to continue from")
    config = launch_dir / Path(record["config"]).name  # the config as launched, for the jobs started again
    config.write_text(record["config_text"])
    settings = (yaml.safe_load(record["config_text"]) or {}) | {k: yaml_value(v) for k, v in record["set"].items()}
    again = sum(len(job.names) for job in jobs if not job.resumes)
    say(f"resume {record['launch_id']}: {sum(len(job.names) for job in jobs) - again} run(s) continue from their "
        f"checkpoint, {again} start again, {done} finished")
    return run_launch(jobs, script, config, settings, runs_dir, args, record["launch_id"])
