"""Jobs: a job (one process: a run, or a pack of runs), where jobs run (child processes of this one, or Ray
tasks), the loop that runs them N at a time with a heartbeat of their progress, stops them gently on Ctrl-C, and
prints their table."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launcher import fail, say, yaml_value
from launcher.results import finished, format_return, markdown, summary_in

STATUS_EVERY_S = 30.0  # CI logs want a heartbeat, not a redrawn progress bar
GRACE_S = 10.0  # time a stopped job gets to write its summary.json before it is killed


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
    reads: list[str] = field(default_factory=list)  # run directories it reads beyond its own (a pack it is cut from)
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

    @property
    def shipped(self) -> list[str]:
        """The run directories its process needs beside it: its own, and when it resumes, the one it resumes from
        and `reads` (a smaller pack cut from a checkpoint reads the directories of the whole pack)."""
        if not self.resumes:
            return []
        return list(dict.fromkeys([*self.names, Path(self.argv[1]).name, *self.reads]))


# ---------------------------------------------------------------- where jobs run

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


def files_in(runs_dir: Path) -> dict[Path, tuple[int, int, int]]:
    """Every file under runs_dir, with what tells it apart from the same file rewritten: (inode, size, mtime in ns).
    Files are rewritten whole by a rename (a new inode) or appended to (a new size and mtime)."""
    files = {}
    for path in runs_dir.rglob("*"):
        if path.is_file():
            state = path.stat()
            files[path] = (state.st_ino, state.st_size, state.st_mtime_ns)
    return files


def written_dirs(runs_dir: Path, before: dict[Path, tuple[int, int, int]]) -> list[str]:
    """The run directories under runs_dir in which a file was written since files_in gave `before`."""
    return sorted({path.relative_to(runs_dir).parts[0] for path, state in files_in(runs_dir).items()
                   if before.get(path) != state})


def run_in_tempdir(script_name: str, script_text: str, config_name: str, config_text: str, argv: list[str],
                   run_names: list[str], run_archive: bytes, stop: Any) -> tuple[int, str, bytes]:
    """On a Ray worker: run one job in a fresh directory; its exit code, its log, and as a tar its run directories
    and every other directory it wrote under runs/ (a pack cut with --members writes the model.pt of each member it
    leaves out into that member's directory, shipped here beside the pack's: the head must get it back).

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
        shipped = files_in(work / "runs")
        if stop_requested():  # queued until the launch was stopped: never start
            return 130, "not started: the launch was stopped first\n", b""
        with open(work / "job.log", "w") as log:
            proc = started_job([sys.executable, "-u", script_name, *argv], work, log)
            try:
                code = exit_code(proc, stop_requested)
            except BaseException:  # ray.cancel (the driver gave up waiting) raises KeyboardInterrupt here
                signal_group(proc, signal.SIGKILL)
                raise
        written = list(dict.fromkeys([*run_names, *written_dirs(work / "runs", shipped)]))
        return code, (work / "job.log").read_text(errors="replace"), run_archive_of(work / "runs", written)


def run_archive_of(runs_dir: Path, names: list[str]) -> bytes:
    archive, dirs = io.BytesIO(), [runs_dir / name for name in names if (runs_dir / name).is_dir()]
    if dirs:
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for run_dir in dirs:
                tar.add(run_dir, arcname=run_dir.name)
    return archive.getvalue()


class RayJobs:
    """Jobs as Ray tasks; each ships the script and config (and a resumed job's run directories: its own, the one it
    resumes from, those that one's pack holds) and sends back every run directory it wrote."""

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
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import the launcher
        env_vars = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
        self.task, self.runtime_env = ray.remote(run_in_tempdir), {"env_vars": env_vars} if env_vars else None
        self.stop = ray.remote(num_cpus=0)(StopFlag).remote()
        self.files = (script.name, script.read_text(), config.name, config.read_text())

    def start(self, job: Job) -> None:
        settings = self.settings | {k: yaml_value(v) for k, v in job.values.items()}  # a sweep may set threads
        gpus = 1 if settings.get("cuda") is True and self.ray.cluster_resources().get("GPU", 0) >= 1 else 0
        archive = run_archive_of(self.runs_dir, job.shipped)
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


# ---------------------------------------------------------------- the loop and the report

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
