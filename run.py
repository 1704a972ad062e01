"""Launch a config over seeds x envs, plot learning curves, tabulate final evaluation returns.

    python run.py CONFIG.yaml [--seeds 1 2 3] [--env ID ...] [--set key=value ...] [--jobs N] [--track]
                              [--ray ADDRESS] [--runs-dir runs]
    python run.py plot RUN_DIR... [--metric eval/episodic_return] [--out curves.png]
    python run.py table RUN_DIR...
    python run.py CONFIG.yaml --help        # every launch option

A launch runs algos/<algo>.py (the config's `algo:` key, else its folder name) once per seed x env,
as separate processes, N at a time, or as Ray tasks with --ray (auto: the cluster this machine
is in; local: a new local one). Runs go to runs/<env>__<algo>__<seed>__<launch id>/, logs to
runs/<launch id>/logs/; the launch id is <config stem>__<unix time> (also the W&B group).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

ROOT = Path(__file__).resolve().parent
STATUS_EVERY_S = 30.0  # CI logs want a heartbeat, not a redrawn progress bar
GRACE_S = 10.0  # time a stopped job gets to write its summary.json before it is killed
LAUNCHER_KEYS = {"config": "CONFIG", "seed": "--seeds", "env": "--env", "run_name": "(set by run.py)",
                 "track": "--track", "wandb_group": "(set by run.py)"}


def fail(message: str) -> NoReturn:
    raise SystemExit(f"error: {message}")


def say(text: str) -> None:
    print(text, flush=True)  # flushed so CI logs show progress as it happens


@dataclass
class Job:
    run_name: str
    env: str
    seed: int
    argv: list[str]  # the script's arguments after --config
    log: Path
    status: str = "pending"  # pending, running, ok, failed, stopped, not started
    handle: Any = None  # a Popen, or a Ray ObjectRef
    start: float = 0.0
    end: float = 0.0
    total_steps: int | None = None

    @property
    def label(self) -> str:
        return f"{self.env} seed {self.seed}"


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
    script = ROOT / "algos" / f"{algo}.py"
    if not script.is_file():
        how = "its algo key" if values.get("algo") else "it has no algo key and its folder"
        fail(f"config {path}: {how} names {algo!r}, but there is no algos/{algo}.py")
    return values, script


def yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def overrides_from(pairs: list[str]) -> dict[str, str]:
    """{argument name: raw value} from --set key=value pairs."""
    overrides = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            fail(f"--set takes key=value, got {pair!r}")
        if key in LAUNCHER_KEYS:
            fail(f"--set {key}=...: run.py sets {key} itself; use {LAUNCHER_KEYS[key]}")
        overrides[key] = value
    return overrides


def flags_from(overrides: dict[str, str]) -> list[str]:
    """Script flags for the overrides: tyro spells booleans --name / --no-name."""
    flags = []
    for key, raw in overrides.items():
        name, value = key.replace("_", "-"), yaml_value(raw)
        flags += [f"--{name}" if value else f"--no-{name}"] if isinstance(value, bool) else [f"--{name}", raw]
    return flags


def jobs_for(args: argparse.Namespace, config: dict[str, Any], algo: str, launch_id: str, log_dir: Path) -> list[Job]:
    jobs, overrides = [], flags_from(overrides_from(args.set))
    tracking = ["--track", "--wandb-group", launch_id] if args.track else []
    for env in dict.fromkeys(args.env or [config.get("env")]):  # None: the script's default env
        for seed in dict.fromkeys(args.seeds):
            env_name = str(env or "default").replace("/", "-")  # ALE/Pong-v5 is one directory name
            run_name = f"{env_name}__{algo}__{seed}__{launch_id}"
            argv = ["--seed", str(seed), *(["--env", env] if env else []), *overrides, "--run-name", run_name]
            jobs.append(Job(run_name, str(env or "default"), seed, argv + tracking, log_dir / f"{run_name}.log"))
    return jobs


# ---------------------------------------------------------------- launch: where jobs run

def signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has already exited
        os.killpg(proc.pid, sig)


class LocalJobs:
    """Jobs as child processes, each in its own process group so a stop reaches its children too."""

    def __init__(self, script: Path, config: Path, runs_dir: Path):
        self.command = [sys.executable, "-u", str(script), "--config", str(config.resolve())]
        # tracking.Run writes ./runs/<run_name>: run the jobs where ./runs is runs_dir.
        self.tmp = None  # held so the directory lives as long as the jobs
        self.cwd = runs_dir.parent
        if runs_dir.name != "runs":
            self.tmp = tempfile.TemporaryDirectory(prefix="run-py-")
            self.cwd = Path(self.tmp.name)
            (self.cwd / "runs").symlink_to(runs_dir, target_is_directory=True)

    def start(self, job: Job) -> None:
        with open(job.log, "w") as log:
            job.handle = subprocess.Popen([*self.command, *job.argv], cwd=self.cwd, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)

    def returncode(self, job: Job) -> int | None:
        return job.handle.poll()

    def interrupt(self, job: Job) -> None:
        signal_group(job.handle, signal.SIGINT)  # the scripts catch it and save what they have

    def kill(self, job: Job) -> None:
        signal_group(job.handle, signal.SIGKILL)
        job.handle.wait()


def run_in_tempdir(script_name: str, script_text: str, config_name: str, config_text: str, argv: list[str],
                   run_name: str) -> tuple[int, str, bytes]:
    """On a Ray worker: run one job in a fresh directory; its exit code, its log, its run directory as a tar."""
    with tempfile.TemporaryDirectory(prefix="run-py-") as tmp:
        work = Path(tmp)
        (work / script_name).write_text(script_text)
        (work / config_name).write_text(config_text)
        with open(work / "job.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-u", script_name, "--config", config_name, *argv], cwd=work,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait()
            except BaseException:  # ray.cancel raises KeyboardInterrupt here
                signal_group(proc, signal.SIGKILL)
                raise
        archive = io.BytesIO()
        if (work / "runs" / run_name).is_dir():
            with tarfile.open(fileobj=archive, mode="w:gz") as tar:
                tar.add(work / "runs" / run_name, arcname=run_name)
        return code, (work / "job.log").read_text(errors="replace"), archive.getvalue()


class RayJobs:
    """Jobs as Ray tasks; each ships the script and config, and sends its run directory back."""

    def __init__(self, address: str, script: Path, config: Path, settings: dict[str, Any], runs_dir: Path):
        try:
            import ray
        except ImportError:
            fail('--ray needs Ray: pip install "ray[default]>=2.30" (or pip install -e ".[ray]")')
        self.ray, self.runs_dir = ray, runs_dir
        try:
            if not ray.is_initialized():
                ray.init() if address == "local" else ray.init(address=address)
        except (ConnectionError, RuntimeError, ValueError) as e:
            fail(f"cannot start or reach Ray at {address!r}: {' '.join(str(e).split())}")
        if __name__ != "__main__":  # imported (tests): workers cannot import this file, so ship the function
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        gpus = 1 if settings.get("cuda") is True and ray.cluster_resources().get("GPU", 0) >= 1 else 0
        env_vars = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
        self.task = ray.remote(run_in_tempdir).options(
            num_cpus=int(settings.get("threads") or 1), num_gpus=gpus,
            runtime_env={"env_vars": env_vars} if env_vars else None)
        self.files = (script.name, script.read_text(), config.name, config.read_text())

    def start(self, job: Job) -> None:
        job.handle = self.task.remote(*self.files, job.argv, job.run_name)

    def returncode(self, job: Job) -> int | None:
        if not self.ray.wait([job.handle], timeout=0)[0]:
            return None
        try:
            code, log_text, archive = self.ray.get(job.handle)
        except self.ray.exceptions.RayError as e:
            code, log_text, archive = 1, f"the Ray task failed: {e}\n", b""
        job.log.write_text(log_text)
        if archive:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(self.runs_dir, filter="data")
        return code

    def interrupt(self, job: Job) -> None:
        self.ray.cancel(job.handle)

    def kill(self, job: Job) -> None:
        self.ray.cancel(job.handle, force=True)


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


def summary_of(job: Job, runs_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((runs_dir / job.run_name / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "    (no log)"


def finish(job: Job, code: int, runs_dir: Path, count: str) -> None:
    job.end, job.status = time.time(), "ok" if code == 0 else "failed"
    if code == 0:
        ret = summary_of(job, runs_dir).get("eval_return_mean")
        say(f"done   {count} {job.label}: eval return {ret}, {job.end - job.start:.0f}s")
    else:
        say(f"FAILED {count} {job.label} (exit {code}); last lines of {job.log}:\n{log_tail(job.log)}")


def stop(running: list[Job], backend: LocalJobs | RayJobs) -> None:
    say(f"interrupted: stopping {len(running)} running job(s)")
    for job in running:
        backend.interrupt(job)
    deadline = time.time() + GRACE_S
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
                say(f"start  [{len(jobs) - len(pending)}/{len(jobs)}] {job.label}: log {job.log}")
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
            job.status, job.end = "stopped", time.time()
        for job in pending:
            job.status = "not started"


def format_return(summary: dict[str, Any]) -> str:
    if summary.get("eval_return_mean") is None:
        return "-"
    return f"{summary['eval_return_mean']:.1f} ± {summary.get('eval_return_std') or 0.0:.1f}"


def markdown(header: list[str], rows: list[list[Any]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def launch(args: argparse.Namespace) -> int:
    config, script = config_and_script(args.config)
    overrides_from(args.set)  # bad --set: stop before anything starts
    if args.jobs is not None and args.jobs < 1:
        fail(f"--jobs must be >= 1, got {args.jobs}")
    runs_dir = Path(args.runs_dir).resolve()
    stamp = int(time.time())
    while (runs_dir / f"{args.config.stem}__{stamp}").exists():
        stamp += 1  # two launches of one config in the same second
    launch_id = f"{args.config.stem}__{stamp}"
    log_dir = runs_dir / launch_id / "logs"
    log_dir.mkdir(parents=True)
    jobs = jobs_for(args, config, script.stem, launch_id, log_dir)
    settings = config | {k: yaml_value(v) for k, v in overrides_from(args.set).items()}
    backend = (RayJobs(args.ray, script, args.config, settings, runs_dir) if args.ray
               else LocalJobs(script, args.config, runs_dir))
    max_parallel = args.jobs or (len(jobs) if args.ray else 1)
    say(f"launch {launch_id}: {len(jobs)} job(s) of {script.relative_to(ROOT)}, {max_parallel} at a time"
        + (f" as Ray tasks on {args.ray}" if args.ray else ""))
    run_jobs(jobs, backend, max_parallel, runs_dir)
    rows = [[job.run_name, job.env, job.seed, job.status, format_return(summary_of(job, runs_dir)),
             f"{job.end - job.start:.0f}s" if job.end else "-"] for job in jobs]
    say("\n" + markdown(["job", "env", "seed", "status", "eval return", "wall time"], rows))
    say(f"\ncurves: python run.py plot {runs_dir}/*__{launch_id} --out {runs_dir / launch_id}/curves.png")
    if any(job.status in ("stopped", "not started") for job in jobs):
        return 130
    return 1 if any(job.status == "failed" for job in jobs) else 0


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


def algo_and_env(run_dir: Path) -> tuple[str, str]:
    for name, algo_key in (("summary.json", "algo"), ("config.yaml", "exp_name")):  # config.yaml: runs in progress
        try:
            values = yaml.safe_load((run_dir / name).read_text())  # JSON is YAML
            return str(values[algo_key]), str(values["env"])
        except (OSError, KeyError, TypeError, yaml.YAMLError):
            continue
    return "?", run_dir.name


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


def curves_figure(paths: list[Path], metric: str) -> Any:
    """One panel per env, one line per algorithm: the mean over seeds, shaded from min to max."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups: dict[tuple[str, str], list] = {}
    for run_dir in run_dirs_under(paths, "metrics.jsonl"):
        steps, values = metric_series(run_dir, metric)
        if len(steps):
            groups.setdefault(algo_and_env(run_dir), []).append((steps, values))
        else:
            say(f"skipped {run_dir}: no {metric} in its metrics.jsonl")
    if not groups:
        fail(f"no run has {metric}; try --metric charts/episodic_return")
    envs = sorted({env for _, env in groups})
    cols = min(3, len(envs))
    rows = -(-len(envs) // cols)
    fig = Figure(figsize=(5 * cols, 3.5 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, env in zip(axes, envs, strict=False):
        for (algo, _), series in sorted((k, v) for k, v in groups.items() if k[1] == env):
            grid, mean, low, high = seed_band(series)
            line, = ax.plot(grid, mean, marker="o" if len(grid) == 1 else None, label=f"{algo} ({len(series)} seeds)")
            if len(grid) > 1:
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            else:  # a single evaluation: a bar shows the spread where a band would be invisible
                ax.vlines(grid, low, high, color=line.get_color(), alpha=0.4, linewidth=6)
        ax.set(title=env, xlabel="global_step", ylabel=metric)
        ax.legend()
    for ax in axes[len(envs):]:
        ax.set_visible(False)  # the grid's unused panels
    return fig


def results_table(paths: list[Path]) -> str:
    """Markdown: the final evaluation return per (algo, env), mean ± std over seeds."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run_dir in run_dirs_under(paths, "summary.json"):
        summary = json.loads((run_dir / "summary.json").read_text())
        groups.setdefault((summary.get("algo", "?"), summary.get("env", "?")), []).append(summary)
    rows = []
    for (algo, env), summaries in sorted(groups.items()):
        returns = [s["eval_return_mean"] for s in summaries if s.get("eval_return_mean") is not None]
        steps = sorted({s.get("global_step", 0) for s in summaries})
        shown = f"{statistics.fmean(returns):.1f} ± {statistics.pstdev(returns):.1f}" if returns else "-"
        rows.append([algo, env, len(returns), shown, steps[0] if len(steps) == 1 else f"{steps[0]}–{steps[-1]}"])
    return markdown(["algo", "env", "seeds", "eval return (mean ± std over seeds)", "steps"], rows)


# ---------------------------------------------------------------- command line

def launch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py", description="Run a config once per seed x env.")
    p.add_argument("config", type=Path, help="configs/<algo>/<env>.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="seeds to run (default: 1)")
    p.add_argument("--env", nargs="+", help="environment ids (default: the config's env)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override a script argument in every job, e.g. --set learning_rate=1e-3 cuda=true")
    p.add_argument("--jobs", type=int, help="jobs running at once (default: 1; with --ray all, queued by resources)")
    p.add_argument("--track", action="store_true", help="log to W&B, grouped by launch")
    p.add_argument("--ray", metavar="ADDRESS", help="run as Ray tasks: auto, local, or a cluster address")
    p.add_argument("--runs-dir", default="runs", help="where run directories and logs go (default: runs)")
    return p


def results_parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"run.py {command}")
    p.add_argument("run_dirs", type=Path, nargs="+", help="run directories, or directories holding them")
    if command == "plot":
        p.add_argument("--metric", default="eval/episodic_return", help="a tag in metrics.jsonl")
        p.add_argument("--out", type=Path, default=Path("curves.png"), help="the image to write")
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
        curves_figure(args.run_dirs, args.metric).savefig(args.out, dpi=120)
        say(f"wrote {args.out}")
        return 0
    if argv[0] == "table":
        say(results_table(results_parser("table").parse_args(argv[1:]).run_dirs))
        return 0
    return launch(launch_parser().parse_args(argv))


def interrupt_on_sigterm(*_: Any) -> None:
    raise KeyboardInterrupt  # a cancelled CI job stops its jobs the way Ctrl-C does


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    sys.exit(main())
