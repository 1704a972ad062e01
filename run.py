"""Launch a config over seeds x envs x swept values, resume a launch, plot learning curves, tabulate results.

    python run.py CONFIG.yaml [--seeds 1 2 3] [--env ID ...] [--set key=value ...] [--sweep key=v1,v2 ...]
                              [--num-seeds N] [--jobs N] [--track] [--ray ADDRESS] [--runs-dir runs]
    python run.py resume runs/LAUNCH_ID [--total-timesteps N] [--jobs N] [--ray ADDRESS]
    python run.py evaluate RUNS... [--eval-episodes N] [--seed S] [--capture-video] [--jobs N]
    python run.py plot RUN_DIR... [--metric TAG] [--smooth N] [--by KEY] [--out curves.png]
    python run.py table RUN_DIR... [--by KEY] [--metric final|final-episodes|last-episodes|best-eval] [--episodes N]
    python run.py tune CONFIG.yaml --trials N [--space SPACE.yaml] [--seeds 1 2 3] [--num-seeds N] [--sampler NAME]
                       [--objective mean-std|min|mean] [--jobs N] [--ray ADDRESS]     (--resume runs/TUNE_ID continues)
    python run.py CONFIG.yaml --help        # every launch option (and resume/plot/table --help)

A launch runs algos/<algo>.py (the config's `algo:` key, else its folder name) once per env x swept
values x seed, as separate processes, N at a time, or as Ray tasks with --ray (auto: the cluster this
machine is in; local: a new local one); with --num-seeds N, a process trains up to N consecutive seeds
(the scripts' --num-seeds), and a sweep of settings the script marks Packable inside packs of up to N runs
(the scripts' --pack), split by the other swept settings.
Runs go to runs/<env>__<algo>[__key=value...]__<seed>__<launch id>/,
logs and launch.json (what was launched) to runs/<launch id>/; the launch id is <config stem>__<unix time>
(also the W&B group). `resume` continues the unfinished jobs of a launch, locally or on Ray: those with a
checkpoint.pt with --resume, the others from scratch; finished ones are skipped. `tune` asks Optuna for trials
of the settings in a search space, trains each on every seed (trials x seeds packed as --num-seeds allows), scores
each trial by its seeds' final evaluations and writes the trials' table and figure and the best settings as a config.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from launcher import tune

ROOT = Path(__file__).resolve().parent
ALGOS = ROOT / "algos"  # where a config's algo names its script (tests point it at a stub)
STATUS_EVERY_S = 30.0  # CI logs want a heartbeat, not a redrawn progress bar
GRACE_S = 10.0  # time a stopped job gets to write its summary.json before it is killed
LAUNCHER_KEYS = {"config": "CONFIG", "seed": "--seeds", "num_seeds": "--num-seeds", "env": "--env",
                 "run_name": "(set by run.py)", "pack": "--sweep with --num-seeds",
                 "track": "--track", "wandb_group": "(set by run.py)", "resume": "run.py resume"}
TRAINING_RETURN = "charts/episodic_return"  # what plot falls back to when evaluations are too few
TRAINING_SMOOTH = 20  # its default rolling window, in episodes


def fail(message: str) -> NoReturn:
    raise SystemExit(f"error: {message}")


def say(text: str) -> None:
    print(text, flush=True)  # flushed so CI logs show progress as it happens


@dataclass
class Job:
    run_name: str  # the first seed's run directory, which holds a pack's checkpoint
    env: str
    seed: int  # the first seed
    argv: list[str]  # the script's arguments after --config CONFIG, or in its place --resume runs/<run_name> ...
    log: Path
    values: dict[str, str] = field(default_factory=dict)  # swept key: its raw value in this job (all its runs)
    pack: list[str] = field(default_factory=list)  # every run's directory (seeds seed, seed+1, ..., or `members`)
    members: list[dict[str, Any]] = field(default_factory=list)  # a packed sweep: each run's seed and swept values
    status: str = "pending"  # pending, running, ok, failed, stopped, not started
    handle: Any = None  # a Popen, or a Ray ObjectRef
    start: float = 0.0
    end: float = 0.0
    total_steps: int | None = None

    @property
    def names(self) -> list[str]:
        return self.pack or [self.run_name]

    @property
    def label(self) -> str:
        seeds = f"seed {self.seed}" if len(self.names) == 1 else f"seeds {self.seed}-{self.seed + len(self.names) - 1}"
        if self.members:  # a packed sweep: its runs' values
            seeds = f"{len(self.members)} runs: " + " ".join(sorted({", ".join(f"{k}={v}" for k, v in m.items()
                                                                             if k != "seed") for m in self.members}))
        return " ".join([self.env, *(f"{k}={v}" for k, v in self.values.items()), seeds])

    def run_values(self, i: int) -> tuple[int, dict[str, Any]]:
        """The seed and swept values of the job's i-th run."""
        if self.members:
            member = self.members[i]
            return int(member["seed"]), self.values | {k: v for k, v in member.items() if k != "seed"}
        return self.seed + i, self.values

    @property
    def resumes(self) -> bool:
        return self.argv[:1] == ["--resume"]

    def script_args(self, config: str) -> list[str]:
        return self.argv if self.resumes else ["--config", config, *self.argv]


# ---------------------------------------------------------------- launch: configs and jobs

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


def yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


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
    """Script flags for the overrides: tyro spells booleans --name / --no-name."""
    flags = []
    for key, raw in overrides.items():
        name, value = key.replace("_", "-"), yaml_value(raw)
        flags += [f"--{name}" if value else f"--no-{name}"] if isinstance(value, bool) else [f"--{name}", raw]
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


def summary_in(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def finished(run_dir: Path) -> bool:
    """A run is finished when its summary.json is readable and does not say it was interrupted (an unreadable one,
    cut short by a kill while it was written, counts as unfinished)."""
    summary = summary_in(run_dir)
    return bool(summary) and summary.get("interrupted") is False


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


# ---------------------------------------------------------------- launch: where jobs run

def signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has already exited
        os.killpg(proc.pid, sig)


def started_job(command: list[str], cwd: Path, log: Any) -> subprocess.Popen:
    """A job's process, in its own process group (a stop reaches its children too), with SIGINT deliverable.

    Ray's processes block SIGINT and a child inherits the mask: without unblocking it here, the job
    would never see the Ctrl-C that tells it to save what it has.
    """
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class LocalJobs:
    """Jobs as child processes of this one."""

    grace_s = GRACE_S

    def __init__(self, script: Path, config: Path, runs_dir: Path):
        self.command, self.config = [sys.executable, "-u", str(script)], str(config.resolve())
        # The scripts write ./runs/<run_name>: run the jobs where ./runs is runs_dir.
        self.tmp = None  # held so the directory lives as long as the jobs
        self.cwd = runs_dir.parent
        if runs_dir.name != "runs":
            self.tmp = tempfile.TemporaryDirectory(prefix="run-py-")
            self.cwd = Path(self.tmp.name)
            (self.cwd / "runs").symlink_to(runs_dir, target_is_directory=True)

    def start(self, job: Job) -> None:
        with open(job.log, "a") as log:  # a resumed job's log continues its first part
            job.handle = started_job([*self.command, *job.script_args(self.config)], self.cwd, log)

    def returncode(self, job: Job) -> int | None:
        return job.handle.poll()

    def interrupt(self, job: Job) -> None:
        signal_group(job.handle, signal.SIGINT)  # the scripts catch it and save what they have

    def kill(self, job: Job) -> None:
        signal_group(job.handle, signal.SIGKILL)
        job.handle.wait()

    def close(self) -> None:
        pass


class StopFlag:
    """A Ray actor: set by the driver on Ctrl-C, polled by every task, so each stops its job gently."""

    def __init__(self):
        self.stopped = False

    def set(self) -> None:
        self.stopped = True

    def is_set(self) -> bool:
        return self.stopped


def exit_code(proc: subprocess.Popen, stop_requested: Any, poll_s: float = 0.5) -> int:
    """The job's exit code; once a stop is requested: SIGINT, GRACE_S to save what it has, then SIGKILL."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=poll_s)
        if stop_requested():
            signal_group(proc, signal.SIGINT)
            try:
                return proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                signal_group(proc, signal.SIGKILL)
                return proc.wait()


def run_in_tempdir(script_name: str, script_text: str, config_name: str, config_text: str, argv: list[str],
                   run_names: list[str], run_archive: bytes, stop: Any) -> tuple[int, str, bytes]:
    """On a Ray worker: run one job in a fresh directory; its exit code, its log, its run directories as a tar.

    `run_archive` is the run directories of a job that resumes (else empty); `stop` is the launch's StopFlag.
    """
    import ray

    def stop_requested() -> bool:
        return ray.get(stop.is_set.remote())

    with tempfile.TemporaryDirectory(prefix="run-py-") as tmp:
        work = Path(tmp)
        (work / script_name).write_text(script_text)
        (work / config_name).write_text(config_text)
        if run_archive:
            with tarfile.open(fileobj=io.BytesIO(run_archive)) as tar:
                tar.extractall(work / "runs", filter="data")
        if stop_requested():  # queued until the launch was stopped: never start
            return 130, "not started: the launch was stopped first\n", b""
        with open(work / "job.log", "w") as log:
            proc = started_job([sys.executable, "-u", script_name, *argv], work, log)
            try:
                code = exit_code(proc, stop_requested)
            except BaseException:  # ray.cancel (the driver gave up waiting) raises KeyboardInterrupt here
                signal_group(proc, signal.SIGKILL)
                raise
        return code, (work / "job.log").read_text(errors="replace"), run_archive_of(work / "runs", run_names)


def run_archive_of(runs_dir: Path, names: list[str]) -> bytes:
    archive, dirs = io.BytesIO(), [runs_dir / name for name in names if (runs_dir / name).is_dir()]
    if dirs:
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for run_dir in dirs:
                tar.add(run_dir, arcname=run_dir.name)
    return archive.getvalue()


class RayJobs:
    """Jobs as Ray tasks; each ships the script and config (and a resumed job's run directory) and sends
    its run directory back."""

    grace_s = GRACE_S + 30  # the task's own grace, then packing and sending the run directory back

    def __init__(self, address: str, script: Path, config: Path, settings: dict[str, Any], runs_dir: Path):
        try:
            import ray
        except ImportError:
            fail('--ray needs Ray: pip install "ray[default]>=2.30" (or pip install -e ".[ray]")')
        self.ray, self.runs_dir, self.settings = ray, runs_dir, settings
        self.started_ray = not ray.is_initialized()
        try:
            if self.started_ray:
                ray.init(address=address)  # "auto", "local" (a new local instance) or a cluster address
        except (ConnectionError, RuntimeError, ValueError) as e:
            fail(f"cannot start or reach Ray at {address!r}: {' '.join(str(e).split())}")
        if __name__ != "__main__":  # imported (tests): workers cannot import this file, so ship the function
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        env_vars = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
        self.task, self.runtime_env = ray.remote(run_in_tempdir), {"env_vars": env_vars} if env_vars else None
        self.stop = ray.remote(num_cpus=0)(StopFlag).remote()
        self.files = (script.name, script.read_text(), config.name, config.read_text())

    def start(self, job: Job) -> None:
        settings = self.settings | {k: yaml_value(v) for k, v in job.values.items()}  # a sweep may set threads
        gpus = 1 if settings.get("cuda") is True and self.ray.cluster_resources().get("GPU", 0) >= 1 else 0
        archive = run_archive_of(self.runs_dir, job.names) if job.resumes else b""
        job.handle = self.task.options(num_cpus=int(settings.get("threads") or 1), num_gpus=gpus,
                                       runtime_env=self.runtime_env).remote(
            *self.files, job.script_args(self.files[2]), job.names, archive, self.stop)

    def returncode(self, job: Job) -> int | None:
        if not self.ray.wait([job.handle], timeout=0)[0]:
            return None
        try:
            code, log_text, archive = self.ray.get(job.handle)
        except self.ray.exceptions.RayError as e:
            code, log_text, archive = 1, f"the Ray task failed: {e}\n", b""
        with open(job.log, "a") as log:
            log.write(log_text)
        if archive:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(self.runs_dir, filter="data")
        return code

    def interrupt(self, job: Job) -> None:
        self.stop.set.remote()  # every task sees it at its next poll

    def kill(self, job: Job) -> None:
        self.ray.cancel(job.handle)  # raises KeyboardInterrupt in the task, which kills its job

    def close(self) -> None:
        if self.started_ray:
            self.ray.shutdown()


# ---------------------------------------------------------------- launch: the loop and the report

def last_global_step(metrics: Path) -> int | None:
    """The last global_step in a metrics.jsonl that may still be being written."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["global_step"])
        except (ValueError, KeyError, TypeError):
            continue  # a half-written line, or the cut first one
    return None


def progress_of(job: Job, runs_dir: Path) -> str:
    run_dir = runs_dir / job.run_name
    if job.total_steps is None:
        with contextlib.suppress(OSError, AttributeError, yaml.YAMLError):  # not written yet
            job.total_steps = yaml.safe_load((run_dir / "config.yaml").read_text()).get("total_timesteps")
    step = last_global_step(run_dir / "metrics.jsonl")
    return f"{job.label} {'-' if step is None else f'{step / 1000:.1f}k'}/{(job.total_steps or 0) / 1000:.0f}k"


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "    (no log)"


def finish(job: Job, code: int, runs_dir: Path, count: str) -> None:
    job.end, job.status = time.time(), "ok" if code == 0 else "failed"
    if code == 0:
        ret = ", ".join(str(summary_in(runs_dir / name).get("eval_return_mean")) for name in job.names)
        say(f"done   {count} {job.label}: eval return {ret}, {job.end - job.start:.0f}s")
    else:
        say(f"FAILED {count} {job.label} (exit {code}); last lines of {job.log}:\n{log_tail(job.log)}")


def status_after_stop(job: Job, runs_dir: Path) -> str:
    if all(finished(runs_dir / name) for name in job.names):
        return "ok"  # it finished while the others were being stopped
    return "stopped" if (runs_dir / job.run_name).is_dir() else "not started"


def stop(running: list[Job], backend: LocalJobs | RayJobs) -> None:
    say(f"interrupted: stopping {len(running)} running job(s)")
    for job in running:
        backend.interrupt(job)
    deadline = time.time() + backend.grace_s
    try:
        while running and time.time() < deadline:
            running = [job for job in running if backend.returncode(job) is None]
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: no more waiting
    for job in running:
        backend.kill(job)


def run_jobs(jobs: list[Job], backend: LocalJobs | RayJobs, max_parallel: int, runs_dir: Path) -> None:
    pending, running, done = list(jobs), [], 0
    start = last_status = time.time()
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                job = pending.pop(0)
                backend.start(job)
                job.status, job.start = "running", time.time()
                running.append(job)
                how = "resume" if job.resumes else "start "
                say(f"{how} [{len(jobs) - len(pending)}/{len(jobs)}] {job.label}: log {job.log}")
            for job in list(running):
                code = backend.returncode(job)
                if code is not None:
                    running.remove(job)
                    done += 1
                    finish(job, code, runs_dir, f"[{done}/{len(jobs)}]")
            if running and time.time() - last_status >= STATUS_EVERY_S:
                last_status = time.time()
                say(f"status {last_status - start:.0f}s: {done} done, {len(running)} running, {len(pending)} pending | "
                    + " | ".join(progress_of(job, runs_dir) for job in running))
            time.sleep(0.5)
    except KeyboardInterrupt:
        stop(running, backend)
        for job in running:
            job.status, job.end = status_after_stop(job, runs_dir), time.time()
        for job in pending:
            job.status = "not started"


def format_return(summary: dict[str, Any]) -> str:
    if summary.get("eval_return_mean") is None:
        return "-"
    return f"{summary['eval_return_mean']:.1f} ± {summary.get('eval_return_std') or 0.0:.1f}"


def markdown(header: list[str], rows: list[list[Any]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def run_launch(jobs: list[Job], script: Path, config: Path, settings: dict[str, Any], runs_dir: Path,
               args: argparse.Namespace, launch_id: str) -> int:
    """Runs the jobs, prints their table; the exit code: 130 if stopped, 1 if any failed, else 0."""
    backend = RayJobs(args.ray, script, config, settings, runs_dir) if args.ray else LocalJobs(script, config, runs_dir)
    max_parallel = args.jobs or (len(jobs) if args.ray else 1)
    say(f"{max_parallel} at a time" + (f" as Ray tasks on {args.ray}" if args.ray else " on this machine"))
    try:
        run_jobs(jobs, backend, max_parallel, runs_dir)
    finally:
        backend.close()
    swept = any(job.values or job.members for job in jobs)
    rows = [[name, job.env, job.run_values(i)[0], job.status, format_return(summary_in(runs_dir / name)),
             f"{job.end - job.start:.0f}s" if job.end else "-",
             *([" ".join(f"{k}={v}" for k, v in job.run_values(i)[1].items())] if swept else [])]
            for job in jobs for i, name in enumerate(job.names)]
    say("\n" + markdown(["job", "env", "seed", "status", "eval return", "wall time", *(["swept"] if swept else [])],
                        rows))
    by = f" --by {next(iter(jobs[0].run_values(0)[1]))}" if swept else ""
    say(f"\ncurves: python run.py plot {runs_dir}/*__{launch_id}{by} --out {runs_dir / launch_id}/curves.png"
        f"\ntable:  python run.py table {runs_dir}/*__{launch_id}{by}")
    if any(job.status in ("stopped", "not started") for job in jobs):
        say(f"resume: python run.py resume {runs_dir / launch_id}")
        return 130
    return 1 if any(job.status == "failed" for job in jobs) else 0


def launch(args: argparse.Namespace) -> int:
    config, script = config_and_script(args.config)
    overrides = overrides_from(args.set)  # bad --set or --sweep: stop before anything starts
    sweep = sweep_from(args.sweep, overrides)
    if args.jobs is not None and args.jobs < 1:
        fail(f"--jobs must be >= 1, got {args.jobs}")
    if args.num_seeds < 1:
        fail(f"--num-seeds must be >= 1, got {args.num_seeds}")
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


def resume(args: argparse.Namespace) -> int:
    launch_dir = args.launch_dir.resolve()
    if args.jobs is not None and args.jobs < 1:
        fail(f"--jobs must be >= 1, got {args.jobs}")
    try:
        record = json.loads((launch_dir / "launch.json").read_text())
    except (OSError, ValueError) as e:
        fail(f"{launch_dir} has no readable launch.json ({e}); give runs/<launch id> as a launch wrote it")
    script = ALGOS / f"{record['algo']}.py"
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


# ---------------------------------------------------------------- tune: Optuna's trials as pack members

def trial_jobs(packs: list[list[dict[str, Any]]], env: str, algo: str, tune_id: str, log_dir: Path,
               common: list[str]) -> list[Job]:
    """A job per pack of (trial, seed) runs (tune.trial_packs): the settings its members differ in through the
    script's --pack, those they share as flags; each run's directory <env>__<algo>__trial=<n>__<seed>__<tune id>."""
    jobs = []
    for members in packs:
        names = [trial_run_name(env, algo, member["trial"], member["seed"], tune_id) for member in members]
        shared, differ = tune.pack_settings(members)
        if len(members) == 1:
            argv = ["--seed", str(members[0]["seed"]), *common, *flags_from(shared), "--run-name", names[0]]
        else:
            pack = [f"seed={','.join(str(member['seed']) for member in members)}",
                    *(f"{key}={','.join(values)}" for key, values in differ.items())]
            argv = ["--pack", *pack, f"run_name={','.join(names)}", *common, *flags_from(shared)]
        jobs.append(Job(names[0], env, members[0]["seed"], argv, log_dir / f"{names[0]}.log",
                        pack=names if len(names) > 1 else [],
                        members=[{"seed": member["seed"], "trial": member["trial"]} for member in members]))
    return jobs


def trial_run_name(env: str, algo: str, trial: int, seed: int, tune_id: str) -> str:
    return f"{env.replace('/', '-')}__{algo}__trial={trial}__{seed}__{tune_id}"


def new_tune(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """A new tune's record (tune.json) and directory runs/<config stem>__tune__<unix time>, after every check."""
    if args.config is None:
        fail("run.py tune needs a config (or --resume runs/<tune id> to continue a tune)")
    config, script = config_and_script(args.config)
    overrides = overrides_from(args.set)
    space = args.space or ROOT / "configs" / script.stem / "spaces" / "default.yaml"
    tune.space_from(space, tune.args_class(script), LAUNCHER_KEYS)
    tune.sampler_named(args.sampler, 0)
    if args.trials is None or args.trials < 1:
        fail(f"--trials must be >= 1, got {args.trials}")
    for name in ("num_seeds", "jobs", "round"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if "num_seeds" in config:
        fail(f"config {args.config} sets num_seeds, which run.py sets itself; use --num-seeds")
    if {**config, **overrides}.get("stop_return") is not None:
        fail("stop_return stops a run early, so its final evaluation would not be the trial's: drop it")
    runs_dir = Path(args.runs_dir).resolve()
    stamp = int(time.time())
    while (runs_dir / f"{args.config.stem}__tune__{stamp}").exists():
        stamp += 1
    tune_id = f"{args.config.stem}__tune__{stamp}"
    (runs_dir / tune_id / "logs").mkdir(parents=True)
    seeds = list(dict.fromkeys(args.seeds))
    record = {"tune_id": tune_id, "algo": script.stem, "env": str(config.get("env") or "default"),
              "config": str(args.config.resolve()), "config_text": args.config.read_text(),
              "space": str(Path(space).resolve()), "space_text": Path(space).read_text(), "set": overrides,
              "seeds": seeds, "num_seeds": args.num_seeds, "objective": args.objective, "sampler": args.sampler,
              "sampler_seed": args.sampler_seed, "trials": args.trials,
              "round": args.round or (args.jobs or 1) * max(1, args.num_seeds // len(seeds))}
    (runs_dir / tune_id / "tune.json").write_text(json.dumps(record, indent=1))
    (runs_dir / tune_id / Path(record["config"]).name).write_text(record["config_text"])
    (runs_dir / tune_id / "space.yaml").write_text(record["space_text"])
    return record, runs_dir / tune_id


def run_tune(args: argparse.Namespace) -> int:
    """`run.py tune`: trials asked in rounds (Optuna's ask and tell, the study in <tune dir>/study.db), each round's
    trials x seeds trained as packs of jobs, each trial told its objective; then the table, the figure and the best
    settings as a config. The exit code: 130 if stopped (`--resume` continues), else 0."""
    optuna = tune.optuna_module()
    if args.resume is not None:
        if args.config is not None:
            fail("--resume continues a tune with its own config; give one or the other")
        tune_dir = args.resume.resolve()
        try:
            record = json.loads((tune_dir / "tune.json").read_text())
        except (OSError, ValueError) as e:
            fail(f"{tune_dir} has no readable tune.json ({e}); give runs/<tune id> as a tune wrote it")
        record["trials"] = args.trials or record["trials"]
        (tune_dir / "tune.json").write_text(json.dumps(record, indent=1))
    else:
        record, tune_dir = new_tune(args)
    script, runs_dir, tune_id = ALGOS / f"{record['algo']}.py", tune_dir.parent, record["tune_id"]
    space = tune.space_from(tune_dir / "space.yaml", tune.args_class(script), LAUNCHER_KEYS)
    config = tune_dir / Path(record["config"]).name
    settings = (yaml.safe_load(record["config_text"]) or {}) | {k: yaml_value(v) for k, v in record["set"].items()}
    backend = RayJobs(args.ray, script, config, settings, runs_dir) if args.ray else LocalJobs(script, config, runs_dir)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tune_dir / 'study.db'}")  # one object: one view of the trials
    how, seeds = record["objective"], record["seeds"]
    study = optuna.create_study(study_name=tune_id, storage=storage, direction="maximize", load_if_exists=True)
    common = [*(["--env", record["env"]] if record["env"] != "default" else []), *flags_from(record["set"])]
    say(f"tune {tune_id}: {record['trials']} trials of {script.name} x seeds {' '.join(map(str, seeds))}, "
        f"{record['round']} trials a round, objective: {tune.OBJECTIVES[how]}; record in {tune_dir / 'tune.json'}")

    def returns_of(trial) -> list[float] | None:
        names = [trial_run_name(record["env"], record["algo"], trial.number, seed, tune_id) for seed in seeds]
        if not all(finished(runs_dir / name) for name in names):
            return None
        return [summary_in(runs_dir / name)["eval_return_mean"] for name in names]

    try:
        while True:
            trials = study.get_trials(deepcopy=False)
            running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
            if running:  # a round that was stopped: its trials as they were asked, its runs where they stopped
                first = running[0].user_attrs["round"]
            elif len(trials) >= record["trials"]:
                break
            else:
                first = len(trials)
                sampler = tune.sampler_named(record["sampler"], tune.round_seed(record["sampler_seed"], first))
                asking = optuna.load_study(study_name=tune_id, storage=storage, sampler=sampler)
                with tune.signals_held():
                    for _ in range(min(record["round"], record["trials"] - first)):
                        asking.ask(tune.distributions(space)).set_user_attr("round", first)
            trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("round") == first]
            packs = tune.trial_packs([(t.number, t.params) for t in trials], seeds, record["num_seeds"],
                                     packable_keys(script))
            jobs = []
            for job in trial_jobs(packs, record["env"], record["algo"], tune_id, tune_dir / "logs", common):
                if all(finished(runs_dir / name) for name in job.names):
                    continue
                if (runs_dir / job.run_name / "checkpoint.pt").is_file():
                    job.argv = ["--resume", f"runs/{job.run_name}"]
                for name in job.names if not job.resumes else []:  # the scripts refuse an existing run directory
                    shutil.rmtree(runs_dir / name, ignore_errors=True)
                jobs.append(job)
            say(f"round of trials {trials[0].number}-{trials[-1].number}: {sum(len(j.names) for j in jobs)} run(s) "
                f"in {len(jobs)} process(es)")
            run_jobs(jobs, backend, args.jobs or (len(jobs) if args.ray else 1), runs_dir)
            stopped = any(job.status in ("stopped", "not started") for job in jobs)
            for trial in trials:
                returns = returns_of(trial)
                if trial.state != optuna.trial.TrialState.RUNNING or returns is None and stopped:
                    continue
                with tune.signals_held():
                    if returns is None:
                        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                    else:
                        study.tell(trial.number, tune.objective(returns, how))
                values = " ".join(f"{key}={tune.text(value)}" for key, value in trial.params.items())
                result = "failed" if returns is None else \
                    f"{tune.objective(returns, how):.1f} ({' '.join(f'{r:.1f}' for r in returns)})"
                say(f"trial {trial.number}: {result} | {values}")
            if stopped:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        say(f"stopped; continue: python run.py tune --resume {tune_dir}")
        return 130
    finally:
        backend.close()
    trials = study.get_trials(deepcopy=False)
    returns = {t.number: r for t in trials if (r := returns_of(t)) is not None}
    table = tune.trials_table(trials, returns, how)
    (tune_dir / "trials.md").write_text(table + "\n")
    tune.trials_figure(trials, returns, how, space).savefig(tune_dir / "trials.png", dpi=120)
    say("\n" + table)
    if not returns:
        say("no trial finished")
        return 1
    best = study.best_trial
    overrides = {k: yaml_value(v) for k, v in record["set"].items()}
    (tune_dir / "best.yaml").write_text(tune.best_config(record["config_text"], overrides, best, how, seeds, tune_id))
    say(f"\nbest: trial {best.number}, {best.value:.1f}; table {tune_dir / 'trials.md'}, figure "
        f"{tune_dir / 'trials.png'}\nits settings: python algos/{record['algo']}.py --config {tune_dir / 'best.yaml'}")
    return 0


# ---------------------------------------------------------------- results: curves and tables

def run_dirs_under(paths: list[Path], marker: str) -> list[Path]:
    """Run directories (those holding `marker`) given as themselves or anywhere under the paths."""
    found = set()
    for path in paths:
        if not path.is_dir():
            fail(f"{path} is not a directory")
        found |= {path} if (path / marker).is_file() else {m.parent for m in path.rglob(marker)}
    if not found:
        fail(f"no {marker} under {' '.join(map(str, paths))}")
    return sorted(found)


def run_key(run_dir: Path, by: str | None) -> tuple[str, str, Any]:
    """(algo, env, the value of config key `by` or None) of a run, from its summary.json or config.yaml."""
    config = {}
    with contextlib.suppress(OSError, yaml.YAMLError):
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    summary = summary_in(run_dir)
    algo, env = summary.get("algo", config.get("exp_name", "?")), summary.get("env", config.get("env", run_dir.name))
    return str(algo), str(env), (config.get(by, "-") if by else None)


def key_order(key: tuple[str, str, Any]) -> tuple:
    """Sorts numbers by value (0.2 before 1.0 before 10), other values by text."""
    value = key[2]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return key[0], key[1], (0, value, "") if number else (1, 0, str(value))


def metric_series(run_dir: Path, metric: str) -> tuple[Any, Any]:
    """(steps, values) of one metric in a run's metrics.jsonl, by step."""
    import numpy as np

    points = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a run still writing its last line
        if record.get(metric) is not None:
            points.append((record["global_step"], record[metric]))
    points.sort(key=lambda p: p[0])
    return np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float)


def rolling_mean(values: Any, window: int) -> Any:
    """Each point's mean with up to window - 1 points before it (shorter windows at the start)."""
    import numpy as np

    sums = np.concatenate([[0.0], np.cumsum(values)])
    end = np.arange(1, len(values) + 1)
    begin = np.maximum(0, end - window)
    return (sums[end] - sums[begin]) / (end - begin)


def seed_band(series: list[tuple[Any, Any]]) -> tuple[Any, Any, Any, Any]:
    """(grid, mean, min, max) over seeds, each seed interpolated onto the steps all of them cover."""
    import numpy as np

    lo, hi = max(s[0] for s, _ in series), min(s[-1] for s, _ in series)
    steps = np.unique(np.concatenate([s for s, _ in series]))
    grid = steps[(steps >= lo) & (steps <= hi)]
    if len(grid) == 0:
        grid = np.array([hi])  # the seeds' step ranges do not overlap
    elif len(grid) > 500:
        grid = np.linspace(lo, hi, 500)
    values = np.stack([np.interp(grid, s, v) for s, v in series])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def curve_metric(runs: list[Path], metric: str | None, smooth: int | None) -> tuple[str, int]:
    """The metric to plot and its rolling window: the one asked for; by default the evaluation return,
    or the training return smoothed when some run has fewer than 3 evaluations (a config that
    evaluates only at the end draws no curve)."""
    if metric is not None:
        return metric, smooth or 1
    if all(len(metric_series(run_dir, "eval/episodic_return")[0]) >= 3 for run_dir in runs) or not all(
            len(metric_series(run_dir, TRAINING_RETURN)[0]) >= 3 for run_dir in runs):
        return "eval/episodic_return", smooth or 1
    window = smooth or TRAINING_SMOOTH
    say(f"fewer than 3 evaluations in some runs: plotting {TRAINING_RETURN} smoothed over {window} episodes "
        "(--metric eval/episodic_return plots the evaluations)")
    return TRAINING_RETURN, window


def curves_figure(paths: list[Path], metric: str | None = None, smooth: int | None = None,
                  by: str | None = None) -> Any:
    """One panel per env, one line per algorithm (and value of config key `by`): the mean over seeds
    of each seed's curve (smoothed, then interpolated onto common steps), shaded from min to max."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = run_dirs_under(paths, "metrics.jsonl")
    metric, window = curve_metric(runs, metric, smooth)
    groups: dict[tuple[str, str, Any], list] = {}
    for run_dir in runs:
        steps, values = metric_series(run_dir, metric)
        if len(steps):
            groups.setdefault(run_key(run_dir, by), []).append((steps, rolling_mean(values, window)))
        else:
            say(f"skipped {run_dir}: no {metric} in its metrics.jsonl")
    if not groups:
        fail(f"no run has {metric}; try --metric {TRAINING_RETURN}")
    envs = sorted({env for _, env, _ in groups})
    cols = min(3, len(envs))
    rows = -(-len(envs) // cols)
    fig = Figure(figsize=(5 * cols, 3.5 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, env in zip(axes, envs, strict=False):
        for key in sorted((k for k in groups if k[1] == env), key=key_order):
            series, (algo, _, value) = groups[key], key
            grid, mean, low, high = seed_band(series)
            label = f"{algo}{f' {by}={value}' if by else ''} ({len(series)} seed{'s' if len(series) > 1 else ''})"
            line, = ax.plot(grid, mean, marker="o" if len(grid) == 1 else None, label=label)
            if len(grid) > 1:
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            else:  # a single evaluation: a bar shows the spread where a band would be invisible
                ax.vlines(grid, low, high, color=line.get_color(), alpha=0.4, linewidth=6)
        ylabel = metric + (f" (rolling mean of {window})" if window > 1 else "")
        ax.set(title=env, xlabel="global_step", ylabel=ylabel)
        ax.legend()
    for ax in axes[len(envs):]:
        ax.set_visible(False)  # the grid's unused panels
    return fig


def mean_eval_return(run_dir: Path) -> float | None:
    """The area under the evaluation curve over its step span: the mean return over the run
    (trapezoids between evaluations); None with fewer than two evaluations."""
    if not (run_dir / "metrics.jsonl").is_file():
        return None
    steps, values = metric_series(run_dir, "eval/episodic_return")
    if len(steps) < 2 or steps[-1] == steps[0]:
        return None
    return float(((values[1:] + values[:-1]) / 2 * (steps[1:] - steps[:-1])).sum() / (steps[-1] - steps[0]))


def mean_and_std(values: list[float]) -> str:
    """mean ± sample standard deviation (n - 1 in the denominator; 0 for a single value)."""
    if not values:
        return "-"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1f}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}min" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def latest_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The newest record that `--evaluate` left in <run dir>/evaluations/ (named by its unix time), or None."""
    records = sorted((run_dir / "evaluations").glob("*.json"), key=lambda path: float(path.stem))
    return json.loads(records[-1].read_text()) if records else None


METRICS = {  # run.py table --metric: what each row's value is, per run (then mean ± sample std over the runs)
    "final": "final eval return (mean ± sample std over seeds)",
    "final-episodes": "final eval return (mean ± std over all seeds' episodes)",
    "last-episodes": "mean of the last {episodes} training episodes (mean ± sample std over seeds)",
    "best-eval": "best evaluation during training (mean ± sample std over seeds)",
}


def metric_values(run_dir: Path, summary: dict[str, Any], metric: str, episodes: int) -> list[float]:
    """A run's values of a table metric: its final evaluation's mean (final), every episode of it
    (final-episodes), the mean of its last `episodes` training episodes by step (last-episodes: CleanRL's
    benchmarks), or the largest of its evaluations' means (best-eval: the TD3 paper's max over training); none
    where the run has nothing to give."""
    if metric == "final":
        return [summary["eval_return_mean"]] if summary.get("eval_return_mean") is not None else []
    if metric == "final-episodes":
        return list(summary.get("eval_returns") or [])
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    _, values = metric_series(run_dir, TRAINING_RETURN if metric == "last-episodes" else "eval/episodic_return")
    if not len(values):
        return []
    return [float(values[-episodes:].mean() if metric == "last-episodes" else values.max())]


def results_table(paths: list[Path], by: str | None = None, metric: str = "final", episodes: int = 100) -> str:
    """Markdown, one row per (algo, env[, value of config key `by`]): the metric (see METRICS; the final
    evaluation return by default) and the mean evaluation return over the run (the area under its curve), each as
    mean ± std over seeds; and the latest re-evaluation (`--evaluate`) of each run, where some run has one."""
    groups: dict[tuple[str, str, Any], list[Path]] = {}
    for run_dir in run_dirs_under(paths, "summary.json"):
        groups.setdefault(run_key(run_dir, by), []).append(run_dir)
    rows = []
    for key in sorted(groups, key=key_order):
        summaries = [summary_in(run_dir) for run_dir in groups[key]]
        per_run = [metric_values(run_dir, summary, metric, episodes)
                   for run_dir, summary in zip(groups[key], summaries, strict=True)]
        returns = [value for values in per_run for value in values]
        areas = [a for a in map(mean_eval_return, groups[key]) if a is not None]
        steps = sorted({s.get("global_step", 0) for s in summaries})
        walls = [s["wall_time_s"] for s in summaries if s.get("wall_time_s") is not None]
        again = [record["mean"] for record in map(latest_evaluation, groups[key]) if record is not None]
        rows.append([key[0], key[1], *([key[2]] if by else []), sum(1 for values in per_run if values),
                     mean_and_std(returns),
                     mean_and_std(areas), steps[0] if len(steps) == 1 else f"{steps[0]}–{steps[-1]}",
                     duration(statistics.fmean(walls)) if walls else "-", f"{mean_and_std(again)} ({len(again)})"])
    header = ["algo", "env", *([by] if by else []), "seeds", METRICS[metric].format(episodes=episodes),
              "mean eval return over the run (area under curve)", "steps", "wall time (mean)",
              "latest re-evaluation (mean ± sample std over seeds, runs)"]
    if all(row[-1] == "- (0)" for row in rows):  # nothing re-evaluated: no column
        header, rows = header[:-1], [row[:-1] for row in rows]
    return markdown(header, rows)


def evaluate_runs(args: argparse.Namespace) -> int:
    """`run.py evaluate`: each run's algorithm file with --evaluate (as processes, --jobs at a time), then a table
    of the training's final evaluation beside the new one. The exit code is 1 if any evaluation failed."""
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


# ---------------------------------------------------------------- command line

def launch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py", description="Run a config once per env x swept values x seed.")
    p.add_argument("config", type=Path, help="configs/<algo>/<env>.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="seeds to run (default: 1)")
    p.add_argument("--num-seeds", type=int, default=1, metavar="N",
                   help="train up to N consecutive seeds in one process, or N runs of a sweep of packable settings "
                        "(docs/packs.md; default: 1)")
    p.add_argument("--env", nargs="+", help="environment ids (default: the config's env)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override a script argument in every job, e.g. --set learning_rate=1e-3 cuda=true")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="run every value (YAML, as --set); several --sweep run their cartesian product")
    add_where_options(p)
    p.add_argument("--track", action="store_true", help="log to W&B, grouped by launch")
    p.add_argument("--runs-dir", default="runs", help="where run directories and logs go (default: runs)")
    return p


def add_where_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, help="jobs running at once (default: 1; with --ray all, queued by resources)")
    p.add_argument("--ray", metavar="ADDRESS", help="run as Ray tasks: auto, local, or a cluster address")


def resume_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py resume", description="Continue the unfinished jobs of a launch: "
                                "from their checkpoint.pt with --resume, else from scratch.")
    p.add_argument("launch_dir", type=Path, help="runs/<launch id>, the folder holding the launch's launch.json")
    p.add_argument("--total-timesteps", type=int, help="train every unfinished run this long instead")
    add_where_options(p)
    return p


def tune_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py tune", description="Tune a config's settings with Optuna: every trial "
                                "on each seed, the trials x seeds trained as packs (docs/launcher.md, Tuning).")
    p.add_argument("config", type=Path, nargs="?", help="configs/<algo>/<env>.yaml")
    p.add_argument("--space", type=Path, help="the search space (default: configs/<algo>/spaces/default.yaml)")
    p.add_argument("--trials", type=int, help="trials in the study in all (--resume: more extends it)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="each trial's seeds (default: 1 2 3)")
    p.add_argument("--num-seeds", type=int, default=1, metavar="N",
                   help="runs (trial x seed) per process: trials that share their unpackable settings are packed")
    p.add_argument("--objective", choices=list(tune.OBJECTIVES), default="mean-std",
                   help="a trial's value from its seeds' final evaluation returns: "
                        + "; ".join(f"{name}: the {what}" for name, what in tune.OBJECTIVES.items())
                        + " (default: mean-std)")
    p.add_argument("--sampler", default="tpe", help="an Optuna sampler: tpe (default), random, cmaes, gp, qmc, "
                   "nsgaii or any class name of optuna.samplers")
    p.add_argument("--sampler-seed", type=int, default=0, help="the sampler's seed (default: 0)")
    p.add_argument("--round", type=int, metavar="N", help="trials asked and trained together (default: --jobs x the "
                   "trials a pack holds)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override a script argument in every run, e.g. --set total_timesteps=50000")
    p.add_argument("--resume", type=Path, metavar="TUNE_DIR", help="continue the tune in runs/<tune id> (its "
                   "stopped round first; --trials, --jobs and --ray may change)")
    add_where_options(p)
    p.add_argument("--runs-dir", default="runs", help="where run directories and the tune's go (default: runs)")
    return p


def results_parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"run.py {command}")
    p.add_argument("run_dirs", type=Path, nargs="+", help="run directories, or directories holding them")
    p.add_argument("--by", metavar="KEY", help="split by this key of each run's config.yaml, e.g. --by alpha")
    if command == "table":
        p.add_argument("--metric", choices=list(METRICS), default="final",
                       help="final: each seed's final evaluation mean (default); final-episodes: every final "
                       "evaluation episode pooled (as a single agent's episodes are reported); last-episodes: the mean "
                       "of each seed's last --episodes training episodes (CleanRL's benchmarks); best-eval: each "
                       "seed's best evaluation during training (the TD3 paper's max)")
        p.add_argument("--episodes", type=int, default=100, help="training episodes for --metric last-episodes")
    if command == "plot":
        p.add_argument("--metric", help="a tag in metrics.jsonl (default: eval/episodic_return, or "
                       f"{TRAINING_RETURN} smoothed when some run has fewer than 3 evaluations)")
        p.add_argument("--smooth", type=int, metavar="N", help="rolling mean over N points of each run's curve")
        p.add_argument("--out", type=Path, default=Path("curves.png"), help="the image to write")
    return p


def evaluate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py evaluate", description="Evaluate trained runs again with their "
                                "algorithm file's --evaluate (model.pt, else checkpoint.pt) and tabulate.")
    p.add_argument("run_dirs", type=Path, nargs="+", help="run directories, or directories holding them")
    p.add_argument("--eval-episodes", type=int, help="episodes per run (default: each run's own setting)")
    p.add_argument("--eval-epsilon", type=float, help="exploration epsilon (DQN files; default: the run's)")
    p.add_argument("--seed", type=int, help="seed of the evaluation (default: each run's own)")
    p.add_argument("--capture-video", action="store_true", help="record each run's first evaluation episode")
    p.add_argument("--track", action="store_true", help="log each result (and video) to the run's W&B run")
    p.add_argument("--jobs", type=int, default=2, help="evaluations at a time")
    return p


def overview() -> str:
    configs = []
    for path in sorted((ROOT / "configs").glob("*/*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        configs.append(f"  {path.relative_to(ROOT)}  ({values.get('algo', path.parent.name)} on {values.get('env')})")
    return __doc__ + "\nconfigs:\n" + ("\n".join(configs) or "  (none)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        say(overview())
        return 0
    if argv[0] == "plot":
        args = results_parser("plot").parse_args(argv[1:])
        if args.smooth is not None and args.smooth < 1:
            fail(f"--smooth must be >= 1, got {args.smooth}")
        curves_figure(args.run_dirs, args.metric, args.smooth, args.by).savefig(args.out, dpi=120)
        say(f"wrote {args.out}")
        return 0
    if argv[0] == "table":
        args = results_parser("table").parse_args(argv[1:])
        if args.episodes < 1:
            fail(f"--episodes must be >= 1, got {args.episodes}")
        say(results_table(args.run_dirs, args.by, args.metric, args.episodes))
        return 0
    if argv[0] == "resume":
        return resume(resume_parser().parse_args(argv[1:]))
    if argv[0] == "evaluate":
        return evaluate_runs(evaluate_parser().parse_args(argv[1:]))
    if argv[0] == "tune":
        return run_tune(tune_parser().parse_args(argv[1:]))
    return launch(launch_parser().parse_args(argv))


def interrupt_on_sigterm(*_: Any) -> None:
    raise KeyboardInterrupt  # a cancelled CI job stops its jobs the way Ctrl-C does


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    sys.exit(main())
