"""Tests for run.py: launching seeds x envs x sweeps (locally and on Ray), failures, Ctrl-C, resuming a launch,
curves and tables."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

import run
from launcher import sweeps
from launcher.jobs import Job, files_in, last_global_step, progress_of, written_dirs
from launcher.results import curves_figure, mean_eval_return, results_table, summary_in
from launcher.resume import resumed_jobs
from launcher.sweeps import jobs_for, packs

ROOT = Path(run.__file__).resolve().parent
# Every cost-setting argument pinned: dqn.py's defaults are tuned for learning and change.
TINY = {"algo": "dqn", "env": "CartPole-v1", "total_timesteps": 600, "learning_starts": 200, "buffer_size": 1000,
        "batch_size": 32, "train_frequency": 4, "gradient_steps": 1, "target_network_frequency": 100, "num_envs": 1,
        "eval_frequency": 0, "eval_episodes": 2, "threads": 1, "compile": False, "cuda": False}
ENV = {**os.environ, "WANDB_MODE": "offline"}
# A stand-in algorithm script for launching and resuming: the real scripts' flags, run directory and
# --resume (continue from checkpoint.pt with the run's saved arguments), no learning. Each call appends
# its arguments to argv.jsonl in its run directory.
STUB = """
import argparse, json, sys
from pathlib import Path
import yaml

p = argparse.ArgumentParser()
for flag in ("--config", "--env", "--run-name", "--resume", "--wandb-group"):
    p.add_argument(flag)
p.add_argument("--seed", type=int)
p.add_argument("--total-timesteps", type=int)
p.add_argument("--alpha", type=float)
p.add_argument("--track", action="store_true")
args = p.parse_args()
if args.resume:
    run_dir = Path(args.resume)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    step = json.loads((run_dir / "checkpoint.pt").read_text())["global_step"]
else:
    config = yaml.safe_load(Path(args.config).read_text()) | {k: v for k, v in vars(args).items() if v is not None}
    config["exp_name"] = "stub"
    run_dir = Path("runs") / args.run_name
    run_dir.mkdir(parents=True)  # as the real scripts: an existing run directory is refused
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    step = 0
total = args.total_timesteps or config["total_timesteps"]
with open(run_dir / "argv.jsonl", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
with open(run_dir / "metrics.jsonl", "a") as f:
    for step in range(step + 100, total + 1, 100):
        f.write(json.dumps({"global_step": step, "eval/episodic_return": float(step)}) + "\\n")
(run_dir / "checkpoint.pt").write_text(json.dumps({"global_step": step}))
summary = {"algo": "stub", "env": config["env"], "seed": config["seed"], "eval_return_mean": float(step),
           "eval_return_std": 0.0, "global_step": step, "interrupted": False}
(run_dir / "summary.json").write_text(json.dumps(summary))
"""


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")


@pytest.fixture
def stub(tmp_path, monkeypatch) -> Path:
    """A config of the stub algorithm, whose script run.py finds in tmp_path/algos."""
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "stub.py").write_text(STUB)
    monkeypatch.setattr(sweeps, "ALGOS", tmp_path / "algos")
    return write_config(tmp_path / "configs" / "tiny.yaml", {"algo": "stub", "env": "Stub-v0", "total_timesteps": 600})


def write_config(path: Path, values: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values))
    return path


def launcher(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def table_rows(output: str) -> dict[str, list[str]]:
    """{job: its cells} from the launch's final markdown table."""
    rows = [line.strip("|").split("|") for line in output.splitlines() if line.startswith("| ") and "__" in line]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def write_run(root: Path, algo: str, env: str, seed: int, points: list[tuple[int, float]],
              eval_return: float | None = None, steps: int = 1000, config: dict | None = None,
              training: list[tuple[int, float]] = (), wall_time: float = 60.0) -> Path:
    """A fake run directory in the scripts' layout: evaluation `points`, training returns `training`."""
    run_dir = root / "__".join([env, algo, *(f"{k}={v}" for k, v in (config or {}).items()), str(seed), "0"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"exp_name": algo, "env": env, "seed": seed, **(config or {})}))
    lines = [json.dumps({"global_step": step, "eval/episodic_return": value}) for step, value in points]
    lines += [json.dumps({"global_step": step, "charts/episodic_return": value}) for step, value in training]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if eval_return is not None:
        summary = {"run_name": run_dir.name, "env": env, "algo": algo, "seed": seed, "eval_return_mean": eval_return,
                   "eval_return_std": 0.0, "global_step": steps, "wall_time_s": wall_time}
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


# ---------------------------------------------------------------- command line and bad input

def test_no_arguments_lists_what_it_does_and_the_configs():
    result = launcher()
    assert result.returncode == 0, result.stderr
    assert "python run.py plot" in result.stdout and "python run.py table" in result.stdout
    assert "configs/dqn/cartpole.yaml" in result.stdout


def test_bad_input_gives_one_line_errors(tmp_path):
    config = write_config(tmp_path / "dqn" / "tiny.yaml", TINY)
    no_algo = write_config(tmp_path / "mystery" / "tiny.yaml", {"env": "CartPole-v1"})
    cases = [
        ([str(tmp_path / "missing.yaml")], "not found"),
        ([str(no_algo)], "no algo key.*algos/mystery.py"),
        ([str(write_config(tmp_path / "x.yaml", {"algo": "nope"}))], "no algos/nope.py"),
        ([str(config), "--set", "learning_rate"], "--set takes key=value"),
        ([str(config), "--set", "seed=3"], "use --seeds"),
        ([str(config), "--jobs", "0"], "--jobs must be >= 1"),
        ([str(config), "--sweep", "alpha"], "--sweep takes key=v1,v2,..., got 'alpha'"),
        ([str(config), "--sweep", "alpha="], "'alpha=' has an empty value"),
        ([str(config), "--sweep", "alpha=0.2,,0.4"], "has an empty value"),
        ([str(config), "--sweep", "seed=1,2"], "--sweep seed=...: run.py sets seed itself; use --seeds"),
        ([str(config), "--sweep", "env=CartPole-v1"], "use --env"),
        ([str(config), "--set", "alpha=0.1", "--sweep", "alpha=0.2,0.4"], "alpha is given both in --set and --sweep"),
        ([str(config), "--sweep", "alpha=0.2", "--sweep", "alpha=0.4"], "--sweep alpha is given twice"),
        ([str(config), "--seeds", "1", "2", "--num-seeds", "2", "--set", "stop_return=100"], "--num-seeds 1 to use"),
        ([str(config), "--seeds", "1", "-1"], "^error: --seeds -1: a seed must be from 0 to 2\\*\\*32 - 1"),
        ([str(config), "--seeds", str(2**32)], f"^error: --seeds {2**32}: a seed must be"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            run.main([*argv, "--runs-dir", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    with pytest.raises(SystemExit, match="no readable launch.json"):
        run.main(["resume", str(tmp_path)])
    for value in ("0", "-5"):  # 0 trained every run its own budget
        with pytest.raises(SystemExit, match=f"^error: --total-timesteps must be >= 1, got {value}"):
            run.main(["resume", str(tmp_path), "--total-timesteps", value])
    with pytest.raises(SystemExit, match="^error: --seed -1: a seed must be from 0"):  # before any run is evaluated
        run.main(["evaluate", str(tmp_path / "runs"), "--seed", "-1"])
    result = launcher(config, "--set", "oops")  # and from the shell: one line, no traceback
    assert result.returncode != 0 and result.stderr.strip() == "error: --set takes key=value, got 'oops'"


def test_jobs_pass_seeds_envs_overrides_and_tracking(tmp_path):
    args = run.launch_parser().parse_args(
        ["c.yaml", "--seeds", "1", "2", "--env", "CartPole-v1", "ALE/Pong-v5", "--set", "learning_rate=1e-3",
         "cuda=false", "--set", "compile=true", "--track"])
    jobs = jobs_for(args, TINY, "dqn", "c__123", tmp_path)
    assert [job.run_name for job in jobs] == ["CartPole-v1__dqn__1__c__123", "CartPole-v1__dqn__2__c__123",
                                              "ALE-Pong-v5__dqn__1__c__123", "ALE-Pong-v5__dqn__2__c__123"]
    assert jobs[2].argv == ["--seed", "1", "--env", "ALE/Pong-v5", "--learning-rate", "1e-3", "--no-cuda",
                            "--compile", "--run-name", "ALE-Pong-v5__dqn__1__c__123", "--track", "--wandb-group",
                            "c__123"]
    untracked = jobs_for(run.launch_parser().parse_args(["c.yaml"]), TINY, "dqn", "c__1", tmp_path)
    assert len(untracked) == 1 and "--track" not in untracked[0].argv and "CartPole-v1" in untracked[0].argv


def test_a_sweep_runs_the_product_of_its_values_for_every_env_and_seed(tmp_path):
    args = run.launch_parser().parse_args(
        ["c.yaml", "--seeds", "1", "2", "--env", "CartPole-v1", "Acrobot-v1", "--sweep", "alpha=0.2,1e-3,0.2",
         "--sweep", "double-q=true,false", "--set", "gamma=0.9", "--sweep", "note=a b/c", "--track"])
    jobs = jobs_for(args, TINY, "per_dqn", "c__9", tmp_path)
    assert len(jobs) == 2 * 2 * 2 * 1 * 2  # envs x alpha (0.2 once) x double_q x note x seeds
    assert [job.run_name for job in jobs[:3]] == [
        "CartPole-v1__per_dqn__alpha=0.2__double_q=true__note=a-b-c__1__c__9",
        "CartPole-v1__per_dqn__alpha=0.2__double_q=true__note=a-b-c__2__c__9",
        "CartPole-v1__per_dqn__alpha=0.2__double_q=false__note=a-b-c__1__c__9"]
    assert len({job.run_name for job in jobs}) == len(jobs)
    job = jobs[7]  # CartPole-v1, alpha 1e-3, double_q false, seed 2
    assert job.values == {"alpha": "1e-3", "double_q": "false", "note": "a b/c"} and job.seed == 2
    assert job.argv == ["--seed", "2", "--env", "CartPole-v1", "--gamma", "0.9", "--alpha", "1e-3", "--no-double-q",
                        "--note", "a b/c", "--run-name", job.run_name, "--track", "--wandb-group", "c__9"]
    assert job.label == "CartPole-v1 alpha=1e-3 double_q=false note=a b/c seed 2"
    assert {job.env for job in jobs[8:]} == {"Acrobot-v1"}


def test_num_seeds_packs_consecutive_seeds_into_one_job(tmp_path):
    """--num-seeds 2 over seeds 1 2 3 4 5 7 8: jobs for 1-2, 3-4, 5 and 7-8 (a script trains consecutive seeds),
    each with every seed's run directory; a resumed launch keeps the packs. Fails if seeds are packed across a
    gap, packs are longer than asked, or the script is not told how many seeds to train and how to name them."""
    args = run.launch_parser().parse_args(["c.yaml", "--seeds", "1", "2", "3", "4", "5", "7", "8", "--num-seeds", "2"])
    jobs = jobs_for(args, TINY, "dqn", "c__5", tmp_path)
    assert [job.names for job in jobs] == [[f"CartPole-v1__dqn__{s}__c__5" for s in seeds]
                                           for seeds in ([1, 2], [3, 4], [5], [7, 8])]
    assert [job.label for job in jobs] == ["CartPole-v1 seeds 1-2", "CartPole-v1 seeds 3-4", "CartPole-v1 seed 5",
                                           "CartPole-v1 seeds 7-8"]
    assert jobs[1].argv == ["--seed", "3", "--num-seeds", "2", "--env", "CartPole-v1", "--run-name",
                            "CartPole-v1__dqn__{seed}__c__5"]
    assert jobs[2].argv == ["--seed", "5", "--env", "CartPole-v1", "--run-name", "CartPole-v1__dqn__5__c__5"]
    assert packs([3, 1, 2, 2, 4], 3) == [[3], [1, 2], [4]]

    runs = tmp_path / "runs"
    for name in jobs[0].names + jobs[1].names[:1]:  # seeds 1 and 2 finished; 3-4 stopped after a checkpoint
        (runs / name).mkdir(parents=True)
        (runs / name / "summary.json").write_text(json.dumps({"interrupted": name in jobs[1].names}))
    (runs / jobs[1].run_name / "checkpoint.pt").write_text("{}")
    record = {"launch_id": "c__5", "jobs": [{"run_name": job.run_name, "env": job.env, "seed": job.seed,
                                            "values": {}, "argv": job.argv, "pack": job.pack} for job in jobs]}
    resumed = resumed_jobs(record, runs)
    assert [job.names for job in resumed] == [job.names for job in jobs[1:]]
    assert resumed[0].argv == ["--resume", f"runs/{jobs[1].run_name}"] and not resumed[1].resumes


def test_last_global_step_reads_a_file_still_being_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert last_global_step(metrics) is None
    metrics.write_text("".join(json.dumps({"global_step": s, "x": "y" * 300}) + "\n" for s in range(0, 5000, 100))
                       + '{"global_step": 99')
    assert last_global_step(metrics) == 4900
    run_dir = tmp_path / "runs" / "r"  # the periodic status line reads the same file
    run_dir.mkdir(parents=True)
    metrics.rename(run_dir / "metrics.jsonl")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"total_timesteps": 100_000}))
    job = Job("r", "CartPole-v1", 3, [], tmp_path / "r.log")
    assert progress_of(job, tmp_path / "runs") == "CartPole-v1 seed 3 4.9k/100k"


# ---------------------------------------------------------------- launching

@pytest.mark.slow
def test_launch_runs_every_seed_and_prints_the_table(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", TINY)
    result = launcher(config, "--seeds", "1", "2", "--jobs", "2", "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert len(rows) == 2
    for seed in (1, 2):
        [name] = [name for name in rows if f"__dqn__{seed}__tiny__" in name]
        summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        assert summary["seed"] == seed and summary["global_step"] == 600 and summary["eval_episodes"] == 2
        assert rows[name][:3] == ["CartPole-v1", str(seed), "ok"]
        assert rows[name][3].startswith(f"{summary['eval_return_mean']:.1f} ± ")
        launch_id = name.split("__dqn__")[1].split("__", 1)[1]
        assert f"run runs/{name} on cpu" in (tmp_path / "runs" / launch_id / "logs" / f"{name}.log").read_text()


@pytest.mark.slow
def test_a_failed_job_is_reported_and_the_others_finish(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", TINY)
    runs_dir = tmp_path / "elsewhere"  # not named runs: the jobs must still write here
    result = launcher(config, "--env", "CartPole-v1", "NoSuchEnv-v0", "--jobs", "2", "--runs-dir", runs_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and "'NoSuchEnv-v0' is not registered" in result.stdout  # the log's tail
    rows = table_rows(result.stdout)
    statuses = {cells[0]: cells[2] for cells in rows.values()}
    assert statuses == {"CartPole-v1": "ok", "NoSuchEnv-v0": "failed"}
    [ok] = [name for name in rows if name.startswith("CartPole-v1")]
    assert (runs_dir / ok / "summary.json").is_file()


@pytest.mark.slow
def test_ctrl_c_stops_the_jobs_and_reports(tmp_path):
    config = write_config(tmp_path / "long.yaml", {**TINY, "total_timesteps": 10_000_000})
    runs_dir = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), str(config), "--seeds", "1", "2",
                             "--runs-dir", str(runs_dir)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not any(last_global_step(m) for m in runs_dir.glob("*/metrics.jsonl")):
            time.sleep(0.2)  # until the first job is training
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    statuses = {cells[1]: cells[2] for cells in table_rows(output).values()}
    assert statuses == {"1": "stopped", "2": "not started"}, output
    [first] = runs_dir.glob("CartPole-v1__dqn__1__*")
    assert json.loads((first / "summary.json").read_text())["interrupted"] is True  # it stopped cleanly
    assert not list(runs_dir.glob("CartPole-v1__dqn__2__*"))


def test_a_ray_task_sends_back_the_directories_it_wrote_and_not_those_it_only_read(tmp_path):
    """What a task finds written since it was shipped its run directories: a file rewritten by a rename (model.pt,
    a checkpoint), a file appended to (metrics.jsonl) and a new directory; a directory only read stays behind."""
    for name in ("rewritten", "appended", "read"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "file").write_text("as shipped")
    before = files_in(tmp_path)
    (tmp_path / "rewritten" / "file.part").write_text("as shipped")  # same size: only the rename tells it apart
    os.replace(tmp_path / "rewritten" / "file.part", tmp_path / "rewritten" / "file")
    with open(tmp_path / "appended" / "file", "a") as f:
        f.write(" and more")
    (tmp_path / "new" / "videos").mkdir(parents=True)
    (tmp_path / "new" / "videos" / "eval-episode-0.mp4").write_bytes(b"")
    assert written_dirs(tmp_path, before) == ["appended", "new", "rewritten"]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray for this module's in-process Ray tests (run.py uses a Ray that is already running)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_runs_the_job_on_a_local_cluster_and_brings_the_run_back(tmp_path, ray_cluster):
    config = write_config(tmp_path / "tiny.yaml", TINY)
    code = run.main([str(config), "--seeds", "3", "--ray", "local", "--runs-dir", str(tmp_path / "runs")])
    assert code == 0
    [run_dir] = (tmp_path / "runs").glob("CartPole-v1__dqn__3__tiny__*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["global_step"] == 600
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) > 1
    [log] = (tmp_path / "runs").glob("tiny__*/logs/*.log")
    assert f"run runs/{run_dir.name} on" in log.read_text()


@pytest.mark.slow
def test_ray_ctrl_c_brings_each_run_back_with_its_summary(tmp_path):
    """run.py starts its own local Ray; Ctrl-C stops the tasks' jobs gently and their runs come back."""
    pytest.importorskip("ray")
    stem = f"ctrlc{os.getpid()}"  # the jobs' run directories live in Ray's workers' temporary directories
    config = write_config(tmp_path / f"{stem}.yaml", {**TINY, "total_timesteps": 10_000_000})
    runs_dir = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), str(config), "--seeds", "1", "2", "--ray", "local",
                             "--runs-dir", str(runs_dir)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and sum(bool(last_global_step(m)) for m in Path(tempfile.gettempdir()).glob(
                f"run-py-*/runs/*__{stem}__*/metrics.jsonl")) < 2:
            time.sleep(0.5)  # until both jobs are training
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert {cells[1]: cells[2] for cells in table_rows(output).values()} == {"1": "stopped", "2": "stopped"}, output
    assert f"resume: python run.py resume {runs_dir}/{stem}__" in output
    for seed in (1, 2):
        [run_dir] = runs_dir.glob(f"CartPole-v1__dqn__{seed}__{stem}__*")
        assert json.loads((run_dir / "summary.json").read_text())["interrupted"] is True, output
        assert last_global_step(run_dir / "metrics.jsonl") > 0
        [log] = runs_dir.glob(f"{stem}__*/logs/{run_dir.name}.log")
        assert "stopped by SIGINT at step" in log.read_text()


# ---------------------------------------------------------------- resuming a launch

def test_resumed_jobs_continue_from_a_checkpoint_and_start_the_rest_again(tmp_path):
    runs = tmp_path / "runs"
    states = {"finished": ("summary", "checkpoint"), "preempted": ("checkpoint", "config"),
              "cut_short": ("truncated", "checkpoint"),  # killed while summary.json was written: not finished
              "stopped": ("interrupted", "checkpoint"), "stopped_early": ("interrupted", "config"),
              "crashed_early": ("config",), "never_started": ()}
    for name, files in states.items():
        if files:
            (runs / name).mkdir(parents=True)
        for file in files:
            text = json.dumps({"interrupted": file == "interrupted", "eval_return_mean": 1.0})
            text = text[:10] if file == "truncated" else text
            path = {"summary": "summary.json", "interrupted": "summary.json", "truncated": "summary.json",
                    "config": "config.yaml", "checkpoint": "checkpoint.pt"}[file]
            (runs / name / path).write_text(text)
    record = {"launch_id": "l__1", "jobs": [{"run_name": name, "env": "E", "seed": seed, "values": {"alpha": "0.2"},
                                             "argv": ["--seed", str(seed), "--run-name", name]}
                                            for seed, name in enumerate(states)]}
    jobs = resumed_jobs(record, runs)
    assert {job.run_name: job.argv for job in jobs} == {
        "preempted": ["--resume", "runs/preempted"], "cut_short": ["--resume", "runs/cut_short"],
        "stopped": ["--resume", "runs/stopped"], "stopped_early": ["--seed", "4", "--run-name", "stopped_early"],
        "crashed_early": ["--seed", "5", "--run-name", "crashed_early"],
        "never_started": ["--seed", "6", "--run-name", "never_started"]}
    assert [job.resumes for job in jobs] == [True, True, True, False, False, False]
    assert jobs[0].log == runs / "l__1" / "logs" / "preempted.log" and jobs[0].values == {"alpha": "0.2"}
    assert jobs[0].script_args("c.yaml") == ["--resume", "runs/preempted"]
    assert jobs[3].script_args("c.yaml") == ["--config", "c.yaml", "--seed", "4", "--run-name", "stopped_early"]
    longer = resumed_jobs(record, runs, total_timesteps=900)
    assert longer[0].argv == ["--resume", "runs/preempted", "--total-timesteps", "900"]
    assert longer[3].argv == ["--seed", "4", "--run-name", "stopped_early", "--total-timesteps", "900"]


@pytest.mark.parametrize("where", ["local", "ray"])
def test_a_launch_records_its_jobs_and_resumes_the_unfinished_ones(stub, tmp_path, capsys, request, where):
    runs = tmp_path / "runs"
    ray = ["--ray", "local"] if where == "ray" else ["--jobs", "4"]
    if where == "ray":
        request.getfixturevalue("ray_cluster")
    assert run.main([str(stub), "--seeds", "1", "2", "--sweep", "alpha=0.2,0.4", "--runs-dir", str(runs), *ray]) == 0
    assert "4 run(s) of stub.py (2 alpha x 2 seed(s) x 1 env(s))" in capsys.readouterr().out
    [launch_dir] = runs.glob("tiny__*")
    record = json.loads((launch_dir / "launch.json").read_text())
    names = [f"Stub-v0__stub__alpha={alpha}__{seed}__{launch_dir.name}" for alpha in ("0.2", "0.4") for seed in (1, 2)]
    assert [job["run_name"] for job in record["jobs"]] == names
    assert record["config_text"] == stub.read_text() and record["sweep"] == {"alpha": ["0.2", "0.4"]}
    run_dirs = [runs / name for name in names]
    assert [yaml.safe_load((d / "config.yaml").read_text())["alpha"] for d in run_dirs] == [0.2, 0.2, 0.4, 0.4]

    # 0 finished; 1 preempted after a checkpoint at step 300; 2 stopped before its first checkpoint; 3 lost
    (run_dirs[1] / "summary.json").unlink()
    (run_dirs[1] / "checkpoint.pt").write_text(json.dumps({"global_step": 300}))
    (run_dirs[2] / "checkpoint.pt").unlink()
    (run_dirs[2] / "summary.json").write_text(json.dumps({"interrupted": True}))
    shutil.rmtree(run_dirs[3])
    stub.write_text("total_timesteps: oops")  # changed since: the jobs started again use the config as launched
    assert run.main(["resume", str(launch_dir), "--total-timesteps", "900", *ray]) == 0
    out = capsys.readouterr().out
    assert f"resume {launch_dir.name}: 1 run(s) continue from their checkpoint, 2 start again, 1 finished" in out
    assert f"removed {run_dirs[2]}: it had no checkpoint.pt" in out
    calls = [[json.loads(line) for line in (d / "argv.jsonl").read_text().splitlines()] for d in run_dirs]
    config = str(launch_dir / "tiny.yaml") if where == "local" else "tiny.yaml"  # Ray ships it by name
    assert calls[0] == [["--config", str(stub.resolve()) if where == "local" else "tiny.yaml",
                         *record["jobs"][0]["argv"]]]
    assert calls[1][1] == ["--resume", f"runs/{names[1]}", "--total-timesteps", "900"]
    for i in (2, 3):
        assert calls[i] == [["--config", config, *record["jobs"][i]["argv"], "--total-timesteps", "900"]]
    steps = [json.loads(line)["global_step"] for line in (run_dirs[1] / "metrics.jsonl").read_text().splitlines()]
    assert steps == [*range(100, 700, 100), *range(400, 1000, 100)]  # continued from its checkpoint's step
    assert [summary_in(d)["global_step"] for d in run_dirs] == [600, 900, 900, 900]

    assert run.main(["resume", str(launch_dir), *ray]) == 0
    assert "nothing to resume: all 4 run(s)" in capsys.readouterr().out


# ---------------------------------------------------------------- curves and tables

def test_plot_draws_one_line_per_algo_and_env_with_the_seed_mean(tmp_path):
    write_run(tmp_path / "a", "dqn", "CartPole-v1", 1, [(0, 0.0), (100, 10.0), (200, 20.0)])
    write_run(tmp_path / "a", "dqn", "CartPole-v1", 2, [(0, 0.0), (50, 10.0), (200, 40.0)])
    write_run(tmp_path / "b", "per_dqn", "CartPole-v1", 1, [(0, 1.0), (200, 3.0)])
    write_run(tmp_path / "b", "dqn", "Acrobot-v1", 1, [(0, -500.0), (100, -100.0)])
    fig = curves_figure([tmp_path / "a", tmp_path / "b"], "eval/episodic_return")
    lines = {(ax.get_title(), line.get_label()): line for ax in fig.axes for line in ax.get_lines()}
    assert set(lines) == {("CartPole-v1", "dqn (2 seeds)"), ("CartPole-v1", "per_dqn (1 seed)"),
                          ("Acrobot-v1", "dqn (1 seed)")}
    mean = lines[("CartPole-v1", "dqn (2 seeds)")]
    # seed 1 at 50 is 5, seed 2 at 100 is 10 + 30 * 50/150 = 20: the means of the interpolated seeds
    assert list(mean.get_xdata()) == [0, 50, 100, 200]
    assert list(mean.get_ydata()) == pytest.approx([0.0, 7.5, 15.0, 30.0])

    out = tmp_path / "curves.png"
    assert run.main(["plot", str(tmp_path), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (420, 1200)  # two panels of 5 x 3.5 inches at 120 dpi


def test_plot_and_table_say_when_there_is_nothing(tmp_path):
    write_run(tmp_path, "dqn", "CartPole-v1", 1, [(0, 1.0)])
    with pytest.raises(SystemExit, match="no run has charts/SPS"):
        curves_figure([tmp_path], "charts/SPS")
    with pytest.raises(SystemExit, match="no summary.json under"):
        results_table([tmp_path])


def test_table_gives_mean_and_std_over_seeds(tmp_path, capsys):
    for seed, value in enumerate([10.0, 20.0, 30.0]):
        write_run(tmp_path / "runs", "dqn", "CartPole-v1", seed, [(0, 0.0)], eval_return=value, steps=1000)
    write_run(tmp_path / "runs", "per_dqn", "CartPole-v1", 1, [(0, 0.0)], eval_return=-5.25, steps=800)
    write_run(tmp_path / "runs", "per_dqn", "CartPole-v1", 2, [(0, 0.0)], eval_return=-4.75, steps=900)
    write_run(tmp_path / "runs", "ddpg", "Hopper-v5", 1, [(0, 0.0)])  # no summary.json yet: not in the table
    assert run.main(["table", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split(" | ")[3:] == ["final eval return (mean ± sample std over seeds)",
                                         "mean eval return over the run (area under curve)", "steps",
                                         "wall time (mean) |"]
    assert lines[2:] == ["| dqn | CartPole-v1 | 3 | 20.0 ± 10.0 | - | 1000 | 60s |",  # one evaluation: no area
                         "| per_dqn | CartPole-v1 | 2 | -5.0 ± 0.4 | - | 800–900 | 60s |"]


def test_table_splits_by_a_config_key_with_the_area_under_the_evaluation_curve(tmp_path, capsys):
    runs = tmp_path / "runs"
    # the areas: (0 + 10) / 2 * 100 + 10 * 200 = 2500 over 300 steps, and (20 + 40) / 2 = 30 over 100 steps
    write_run(runs, "per_dqn", "CartPole-v1", 1, [(300, 10.0), (0, 0.0), (100, 10.0)], eval_return=10.0,
              config={"alpha": 0.2}, wall_time=30.0)
    write_run(runs, "per_dqn", "CartPole-v1", 2, [(100, 20.0), (200, 40.0)], eval_return=40.0,
              config={"alpha": 0.2}, wall_time=250.0)
    write_run(runs, "per_dqn", "CartPole-v1", 1, [(100, 5.0)], eval_return=5.0, config={"alpha": 10}, wall_time=9000)
    write_run(runs, "per_dqn", "CartPole-v1", 1, [(100, 7.0)], eval_return=7.0, config={"alpha": 2})
    write_run(runs, "dqn", "CartPole-v1", 1, [(100, 7.0)], eval_return=7.0)  # no alpha in its config
    assert run.main(["table", str(runs), "--by", "alpha"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| algo | env | alpha | seeds |")
    assert lines[2:] == ["| dqn | CartPole-v1 | - | 1 | 7.0 ± 0.0 | - | 1000 | 60s |",
                         "| per_dqn | CartPole-v1 | 0.2 | 2 | 25.0 ± 21.2 | 19.2 ± 15.3 | 1000 | 2min |",
                         "| per_dqn | CartPole-v1 | 2 | 1 | 7.0 ± 0.0 | - | 1000 | 60s |",  # 2 before 10: numbers
                         "| per_dqn | CartPole-v1 | 10 | 1 | 5.0 ± 0.0 | - | 1000 | 2.5h |"]
    assert mean_eval_return(runs / "CartPole-v1__per_dqn__alpha=0.2__1__0") == pytest.approx(2500 / 300)


def test_table_computes_the_metric_each_source_reports(tmp_path, capsys):
    """--metric last-episodes: the mean of each seed's last N training episodes (by step), then mean ± std over
    seeds; best-eval: each seed's largest evaluation; final-episodes: every final evaluation episode pooled. The
    values by hand: seed 1's last 100 of episodes 1..150 average 100.5, seed 2's three 20; the best evaluations
    are 50 and 2; the pooled episodes 1, 2, 3 and 10."""
    runs = tmp_path / "runs"
    one = write_run(runs, "ddpg", "Hopper-v5", 1, [(0, 5.0), (100, 50.0), (200, 30.0)], eval_return=2.0,
                    training=[(10 * i, float(i)) for i in range(150, 0, -1)])  # written out of order
    two = write_run(runs, "ddpg", "Hopper-v5", 2, [(0, 1.0), (100, 2.0)], eval_return=10.0,
                    training=[(5, 10.0), (6, 20.0), (7, 30.0)])
    for run_dir, returns in ((one, [1.0, 2.0, 3.0]), (two, [10.0])):
        summary = json.loads((run_dir / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps(summary | {"eval_returns": returns}))
    expected = {"last-episodes": ("mean of the last 100 training episodes", "60.2 ± 56.9"),
                "best-eval": ("best evaluation during training", "26.0 ± 33.9"),
                "final-episodes": ("final eval return (mean ± std over all seeds' episodes)", "4.0 ± 4.1"),
                "final": ("final eval return (mean ± sample std over seeds)", "6.0 ± 5.7")}
    for metric, (title, value) in expected.items():
        assert run.main(["table", str(runs), "--metric", metric]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[0].split(" | ")[3].startswith(title) and lines[2].split(" | ")[2:4] == ["2", value]
    assert run.main(["table", str(runs), "--metric", "last-episodes", "--episodes", "2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[2].split(" | ")[3] == "87.2 ± 88.0"  # of 149.5 and 25
    with pytest.raises(SystemExit, match="--episodes must be >= 1"):
        run.main(["table", str(runs), "--metric", "last-episodes", "--episodes", "0"])


def test_table_reads_a_metric_at_a_step_as_dopamine_and_cleanrl_report_it(tmp_path, capsys):
    """--at STEP: eval-at, the evaluation at that step; iteration, the mean of the training episodes that ended in
    the 250k steps up to it (Dopamine's iteration); last-episodes and best-eval up to it. A run that has not reached
    the step gives none (seed 2, at 300k, has no 500k value). By hand: seed 1's episodes at 10k, 20k, ... 600k are
    worth their step in thousands, so those ended in (250k, 500k] average 380, in (0, 250k] 130, and its last 3 up to
    500k 490; its evaluations 1, 2, 3 at 250k, 500k, 750k; seed 2's evaluation at 250k is 5 and its episodes in
    (0, 250k] average 4."""
    runs = tmp_path / "runs"
    write_run(runs, "per_dqn", "Breakout", 1, [(250_000, 1.0), (500_000, 2.0), (750_000, 3.0)], eval_return=3.0,
              steps=750_000, training=[(10_000 * i, float(10 * i)) for i in range(1, 61)])
    write_run(runs, "per_dqn", "Breakout", 2, [(250_000, 5.0)], eval_return=5.0, steps=300_000,
              training=[(100_000, 3.0), (200_000, 5.0)])
    expected = [("eval-at", "250000", "2", "3.0 ± 2.8"), ("eval-at", "500000", "1", "2.0 ± 0.0"),
                ("iteration", "500000", "1", "380.0 ± 0.0"), ("iteration", "250000", "2", "67.0 ± 89.1"),
                ("last-episodes", "500000", "1", "490.0 ± 0.0"), ("best-eval", "500000", "1", "2.0 ± 0.0")]
    for metric, at, seeds, value in expected:
        argv = ["table", str(runs), "--metric", metric, "--at", at] + (["--episodes", "3"] if "last" in metric else [])
        assert run.main(argv) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[2].split(" | ")[2:4] == [seeds, value], (metric, at, lines)
        assert at in lines[0]
    with pytest.raises(SystemExit, match="--metric iteration needs --at STEP"):
        run.main(["table", str(runs), "--metric", "iteration"])
    with pytest.raises(SystemExit, match="--at must be >= 1 and goes with"):
        run.main(["table", str(runs), "--metric", "final", "--at", "5"])


def test_plot_splits_by_a_config_key_and_smooths_each_run_before_averaging(tmp_path):
    write_run(tmp_path, "per_dqn", "CartPole-v1", 1, [(0, 0.0), (100, 10.0), (200, 20.0), (300, 30.0)],
              config={"alpha": 2})
    write_run(tmp_path, "per_dqn", "CartPole-v1", 2, [(0, 10.0), (150, 10.0), (300, 40.0)], config={"alpha": 2})
    write_run(tmp_path, "per_dqn", "CartPole-v1", 1, [(0, 1.0), (300, 2.0)], config={"alpha": 10})
    write_run(tmp_path, "per_dqn", "CartPole-v1", 1, [(0, 1.0), (300, 2.0)], config={"alpha": 0.5})
    fig = curves_figure([tmp_path], "eval/episodic_return", smooth=2, by="alpha")
    [ax] = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["per_dqn alpha=0.5 (1 seed)", "per_dqn alpha=2 (2 seeds)",
                                                    "per_dqn alpha=10 (1 seed)"]
    assert ax.get_ylabel() == "eval/episodic_return (rolling mean of 2)"
    # smoothed first: seed 1 is 0, 5, 15, 25 at 0, 100, 200, 300 and seed 2 is 10, 10, 25 at 0, 150, 300;
    # then each is interpolated onto every step either has: 0, 100, 150, 200, 300
    assert list(lines[1].get_xdata()) == [0, 100, 150, 200, 300]
    assert list(lines[1].get_ydata()) == pytest.approx([5.0, 7.5, 10.0, 15.0, 25.0])
    assert list(lines[2].get_ydata()) == pytest.approx([1.0, 1.5])


def test_plot_falls_back_to_the_smoothed_training_return_when_evaluations_are_few(tmp_path, capsys):
    training = [(10 * (i + 1), float(i * i)) for i in range(10)]  # 0, 1, 4, 9, ... at steps 10..100
    write_run(tmp_path, "dqn", "CartPole-v1", 1, [(100, 500.0)], training=training)
    write_run(tmp_path, "dqn", "CartPole-v1", 2, [(0, 9.0), (50, 20.0), (100, 500.0)], training=training)
    fig = curves_figure([tmp_path], smooth=3)
    assert "fewer than 3 evaluations in some runs: plotting charts/episodic_return smoothed over 3 episodes" in (
        capsys.readouterr().out)
    [ax] = fig.axes
    [line] = ax.get_lines()
    assert ax.get_ylabel() == "charts/episodic_return (rolling mean of 3)"
    squares = [i * i for i in range(10)]
    assert list(line.get_ydata()) == pytest.approx(
        [sum(squares[max(0, i - 2):i + 1]) / len(squares[max(0, i - 2):i + 1]) for i in range(10)])
    assert curves_figure([tmp_path]).axes[0].get_ylabel() == "charts/episodic_return (rolling mean of 20)"
    asked = curves_figure([tmp_path], "eval/episodic_return").axes[0]  # asked for by name: no fallback
    assert asked.get_ylabel() == "eval/episodic_return" and list(asked.get_lines()[0].get_xdata()) == [100]
    (tmp_path / "CartPole-v1__dqn__1__0" / "metrics.jsonl").write_text(json.dumps({"global_step": 1,
                                                                                   "eval/episodic_return": 3}))
    assert curves_figure([tmp_path]).axes[0].get_ylabel() == "eval/episodic_return"  # no training return there
    write_run(tmp_path / "ok", "dqn", "CartPole-v1", 1, [(0, 1.0), (1, 2.0), (2, 3.0)], training=training)
    assert curves_figure([tmp_path / "ok"]).axes[0].get_ylabel() == "eval/episodic_return"  # 3 evaluations


@pytest.mark.slow
@pytest.mark.parametrize("num_seeds", [1, 2])
def test_a_stopped_launch_of_the_real_scripts_resumes(tmp_path, num_seeds):
    """Ctrl-C a launch mid-run, then `run.py resume`: the stopped job continues from the checkpoint its
    SIGINT wrote (dqn.py --resume), the job that never started starts, and both finish their steps. With
    --num-seeds 2 both seeds are one job: the pack stops and continues as one."""
    config = write_config(tmp_path / "two.yaml", {**TINY, "total_timesteps": 4000, "train_frequency": 1})
    runs_dir = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), str(config), "--seeds", "1", "2",
                             "--num-seeds", str(num_seeds), "--runs-dir", str(runs_dir)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not any((last_global_step(m) or 0) >= 1000
                                             for m in runs_dir.glob("*/metrics.jsonl")):
            time.sleep(0.2)  # until the first job is well into training
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    [launch] = [d for d in runs_dir.iterdir() if (d / "launch.json").exists()]
    [first] = runs_dir.glob("CartPole-v1__dqn__1__*")
    assert (first / "checkpoint.pt").exists() and json.loads((first / "summary.json").read_text())["interrupted"]
    if num_seeds == 2:  # the pack's second seed stopped with the first, in its own directory
        [second] = runs_dir.glob("CartPole-v1__dqn__2__*")
        assert json.loads((second / "summary.json").read_text())["interrupted"]
        assert yaml.safe_load((second / "config.yaml").read_text())["seed"] == 2
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), "resume", str(launch)], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    for seed in (1, 2):
        [run_dir] = runs_dir.glob(f"CartPole-v1__dqn__{seed}__*")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["global_step"] == 4000 and summary["interrupted"] is False and summary["eval_episodes"] == 2
    assert "resuming runs/" in (launch / "logs" / f"{first.name}.log").read_text()
