"""Sweeps and packing: a launch (run.py CONFIG): the config and the script it names, --set and --sweep, and one job
per env x swept values x pack of seeds, a sweep of the settings a script marks Packable packed inside processes."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from launcher import ROOT, fail, say, seeds_checked, yaml_value
from launcher.jobs import Job, run_launch

ALGOS = ROOT / "algos"  # where a config's algo names its script (tests point it at a stub)
LAUNCHER_KEYS = {"config": "CONFIG", "seed": "--seeds", "num_seeds": "--num-seeds", "env": "--env",
                 "run_name": "(set by run.py)", "pack": "--sweep with --num-seeds",
                 "track": "--track", "wandb_group": "(set by run.py)", "resume": "run.py resume"}


def config_and_script(path: Path) -> tuple[dict[str, Any], Path]:
    """The config's values and the algorithm script it names."""
    if not path.is_file():
        fail(f"config {path} not found (python run.py lists the configs)")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        fail(f"config {path} is not valid YAML: {' '.join(str(e).split())}")
    if not isinstance(values, dict):
        fail(f"config {path} must be a mapping of argument names to values")
    algo = str(values.get("algo") or path.resolve().parent.name)
    script = ALGOS / f"{algo}.py"
    if not script.is_file():
        how = "its algo key" if values.get("algo") else "it has no algo key and its folder"
        fail(f"config {path}: {how} names {algo!r}, but there is no algos/{algo}.py")
    return values, script


def argument_name(key: str, option: str) -> str:
    """A script argument's name as the config spells it; refuses the ones run.py sets itself."""
    name = key.strip().replace("-", "_")
    if name in LAUNCHER_KEYS:
        fail(f"{option} {name}=...: run.py sets {name} itself; use {LAUNCHER_KEYS[name]}")
    return name


def overrides_from(pairs: list[str]) -> dict[str, str]:
    """{argument name: raw value} from --set key=value pairs."""
    overrides = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            fail(f"--set takes key=value, got {pair!r}")
        overrides[argument_name(key, "--set")] = value
    return overrides


def sweep_from(pairs: list[str], overrides: dict[str, str]) -> dict[str, list[str]]:
    """{argument name: its raw values, in order, without repeats} from --sweep key=v1,v2,... arguments."""
    sweep: dict[str, list[str]] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        values = [value.strip() for value in text.split(",")]
        if not eq or not key.strip():
            fail(f"--sweep takes key=v1,v2,..., got {pair!r}")
        name = argument_name(key, "--sweep")
        if not all(values):
            fail(f"--sweep {pair!r} has an empty value; give key=v1,v2,...")
        if name in overrides:
            fail(f"{name} is given both in --set and --sweep; keep one")
        if name in sweep:
            fail(f"--sweep {name} is given twice; list all its values in one --sweep")
        sweep[name] = list(dict.fromkeys(values))
    return sweep


def flags_from(overrides: dict[str, str]) -> list[str]:
    """Script flags for the overrides: tyro spells booleans --name / --no-name, and null None."""
    flags = []
    for key, raw in overrides.items():
        name, value = key.replace("_", "-"), yaml_value(raw)
        flags += [f"--{name}" if value else f"--no-{name}"] if isinstance(value, bool) else \
            [f"--{name}", "None" if value is None else raw]
    return flags


def name_safe(text: str) -> str:
    """Text fit for a directory name on any filesystem (and a W&B run name)."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "-", text)


def packable_keys(script: Path) -> set[str]:
    """The settings the script marks Packable[...] in its Args: its packs' members may differ in them."""
    return set(re.findall(r"^    (\w+): Packable\[", script.read_text(), flags=re.MULTILINE))


def packs(seeds: list[int], size: int) -> list[list[int]]:
    """The seeds in runs of consecutive ones, at most `size` long (a script trains seed .. seed+N-1)."""
    groups: list[list[int]] = []
    for seed in dict.fromkeys(seeds):
        if groups and len(groups[-1]) < size and seed == groups[-1][-1] + 1:
            groups[-1].append(seed)
        else:
            groups.append([seed])
    return groups


def jobs_for(args: argparse.Namespace, config: dict[str, Any], algo: str, launch_id: str, log_dir: Path,
             packable: set[str] = frozenset()) -> list[Job]:
    """One job per env x combination of swept values x pack of seeds (one seed without --num-seeds). A key in
    `packable` (the script's Packable settings) is swept inside packs: the runs that share the env and every other
    swept value are packed, up to --num-seeds per process, each with its own seed and values (the script's
    --pack)."""
    overrides = overrides_from(args.set)
    sweep = sweep_from(args.sweep, overrides)
    tracking = ["--track", "--wandb-group", launch_id] if args.track else []
    inside = [key for key in sweep if key in packable] if args.num_seeds > 1 else []
    jobs = []
    for env in dict.fromkeys(args.env or [config.get("env")]):  # None: the script's default env
        env_name = str(env or "default").replace("/", "-")  # ALE/Pong-v5 is one directory name
        common = [*(["--env", env] if env else []), *flags_from(overrides)]
        for combination in itertools.product(*[values for key, values in sweep.items() if key not in inside]):
            values = dict(zip([key for key in sweep if key not in inside], combination, strict=True))
            if inside:  # a packed sweep: every (packed values, seed) run, in packs of at most num_seeds
                runs = [dict(zip(inside, packed, strict=True)) | {"seed": seed}
                        for packed in itertools.product(*[sweep[key] for key in inside])
                        for seed in dict.fromkeys(args.seeds)]
                for members in packed_runs(runs, inside, args.num_seeds):
                    names = [f"{env_name}__{algo}{swept_tag(sweep, values | m)}__{m['seed']}__{launch_id}"
                             for m in members]
                    pack = [f"{key}={','.join(str(m[key]) for m in members)}" for key in ("seed", *inside)]
                    argv = ["--pack", *pack, f"run_name={','.join(names)}", *common, *flags_from(values), *tracking]
                    jobs.append(Job(names[0], str(env or "default"), members[0]["seed"], argv,
                                    log_dir / f"{names[0]}.log", values, pack=names if len(names) > 1 else [],
                                    members=members))
                continue
            swept = swept_tag(sweep, values)
            for seeds in packs(args.seeds, args.num_seeds):
                names = [f"{env_name}__{algo}{swept}__{seed}__{launch_id}" for seed in seeds]
                pack = ["--num-seeds", str(len(seeds))] if len(seeds) > 1 else []  # the script names each seed's run
                name = f"{env_name}__{algo}{swept}__{{seed}}__{launch_id}" if pack else names[0]
                argv = ["--seed", str(seeds[0]), *pack, *common, *flags_from(values), "--run-name", name, *tracking]
                jobs.append(Job(names[0], str(env or "default"), seeds[0], argv, log_dir / f"{names[0]}.log", values,
                                pack=names if len(seeds) > 1 else []))
    return jobs


def packed_runs(runs: list[dict[str, str]], keys: list[str], size: int) -> list[list[dict[str, str]]]:
    """The runs of a packed sweep in packs of at most `size`, in order: runs whose swept values are null
    (td_lambda: null) apart from those with a value, since a script refuses a pack whose members have a setting some
    with a value and some without (harness/members.py, carried)."""
    kinds: dict[tuple[bool, ...], list[dict[str, str]]] = {}
    for run in runs:
        kinds.setdefault(tuple(yaml_value(run[key]) is None for key in keys), []).append(run)
    return [kind[start:start + size] for kind in kinds.values() for start in range(0, len(kind), size)]


def swept_tag(sweep: dict[str, list[str]], values: dict[str, str]) -> str:
    """The swept values' part of a run directory's name, in the sweep's order: __key=value..."""
    return "".join(f"__{name_safe(f'{key}={values[key]}')}" for key in sweep if key in values)


def launch(args: argparse.Namespace) -> int:
    config, script = config_and_script(args.config)
    overrides = overrides_from(args.set)  # bad --set or --sweep: stop before anything starts
    sweep = sweep_from(args.sweep, overrides)
    if args.jobs is not None and args.jobs < 1:
        fail(f"--jobs must be >= 1, got {args.jobs}")
    if args.num_seeds < 1:
        fail(f"--num-seeds must be >= 1, got {args.num_seeds}")
    seeds_checked("--seeds", args.seeds)
    if "num_seeds" in config:
        fail(f"config {args.config} sets num_seeds, which run.py sets itself; use --num-seeds")
    stop = {**config, **{k: yaml_value(v) for k, v in overrides.items()}}.get("stop_return")
    if args.num_seeds > 1 and (stop is not None or "stop_return" in sweep):
        fail("--num-seeds packs seeds that stop together, and stop_return stops a run at its own evaluation: "
             "launch with --num-seeds 1 to use stop_return")
    runs_dir = Path(args.runs_dir).resolve()
    stamp = int(time.time())
    while (runs_dir / f"{args.config.stem}__{stamp}").exists():
        stamp += 1  # two launches of one config in the same second
    launch_id = f"{args.config.stem}__{stamp}"
    (runs_dir / launch_id / "logs").mkdir(parents=True)
    jobs = jobs_for(args, config, script.stem, launch_id, runs_dir / launch_id / "logs", packable_keys(script))
    record = {"launch_id": launch_id, "config": str(args.config.resolve()), "config_text": args.config.read_text(),
              "algo": script.stem, "seeds": args.seeds, "envs": args.env, "sweep": sweep, "set": overrides,
              "track": args.track, "jobs": [{"run_name": job.run_name, "env": job.env, "seed": job.seed,
                                             "values": job.values, "argv": job.argv, "pack": job.pack,
                                             "members": job.members}
                                            for job in jobs]}
    (runs_dir / launch_id / "launch.json").write_text(json.dumps(record, indent=1))
    counts = [f"{len(values)} {key}" for key, values in sweep.items()]
    counts += [f"{len(set(args.seeds))} seed(s)", f"{len({job.env for job in jobs})} env(s)"]
    runs = sum(len(job.names) for job in jobs)
    processes = f" in {len(jobs)} process(es)" if runs > len(jobs) else ""
    say(f"launch {launch_id}: {runs} run(s) of {script.name}{processes} ({' x '.join(counts)}), record in "
        f"{runs_dir / launch_id / 'launch.json'}")
    settings = config | {k: yaml_value(v) for k, v in overrides.items()}
    return run_launch(jobs, script, args.config, settings, runs_dir, args, launch_id)
