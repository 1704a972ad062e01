"""The launcher's parts (run.py is its command line), one module each:

    jobs      a job, where jobs run (local processes, Ray tasks), the loop over them, its progress and its report
    sweeps    a launch: a config's script, --set and --sweep, seeds x envs x swept values as jobs, packing
    resume    continuing a launch's unfinished jobs
    evaluate  evaluating trained runs again (the scripts' --evaluate), as a table
    results   a run's summary and metrics, learning curves, the results table and its metrics (the peers')
    tune      tuning with Optuna over packs of trials: rounds of trials as jobs (run.py tune)
    space     a tune's search space file
    trials    a trial's value over its seeds, the tune's table, figure and best config
    halving   successive halving's rungs inside packs

and here, what they all use: the repository's root, the one-line error, the flushed line, the seeds a script takes, a
YAML value, a file written whole or not at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import yaml

ROOT = Path(__file__).resolve().parent.parent  # the repository: algos/, configs/

def fail(message: str) -> NoReturn:
    raise SystemExit(f"error: {message}")


def say(text: str) -> None:
    print(text, flush=True)  # flushed so CI logs show progress as it happens


def seeds_checked(option: str, seeds: list[int]) -> None:
    """Each seed one a script can take (NumPy's global seed, which a run sets, is 0 to 2**32 - 1); another is refused
    in one line before anything is written, instead of failing every run that has it."""
    for seed in seeds:
        if not 0 <= seed < 2**32:
            fail(f"{option} {seed}: a seed must be from 0 to 2**32 - 1")


def yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def write_whole(path: Path, text: str) -> None:
    """Write a file so that a kill at any moment leaves the old text or the new one, never a part (fsync, rename)."""
    part = path.with_name(path.name + ".part")
    with open(part, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)
