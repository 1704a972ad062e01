"""Tests for run.py: launching seeds x envs (locally and on Ray), failures, Ctrl-C, curves and tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import run

ROOT = Path(run.__file__).resolve().parent
# Every cost-setting argument pinned: dqn.py's defaults are tuned for learning and change.
TINY = {"algo": "dqn", "env": "CartPole-v1", "total_timesteps": 600, "learning_starts": 200, "buffer_size": 1000,
        "batch_size": 32, "train_frequency": 4, "gradient_steps": 1, "target_network_frequency": 100, "num_envs": 1,
        "eval_frequency": 0, "eval_episodes": 2, "threads": 1, "compile": False, "cuda": False}
ENV = {**os.environ, "WANDB_MODE": "offline"}


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")


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
              eval_return: float | None = None, steps: int = 1000) -> Path:
    """A fake run directory in tracking.Run's layout."""
    run_dir = root / f"{env}__{algo}__{seed}__0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"exp_name": algo, "env": env, "seed": seed}))
    lines = [json.dumps({"global_step": step, "eval/episodic_return": value}) for step, value in points]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if eval_return is not None:
        summary = {"run_name": run_dir.name, "env": env, "algo": algo, "seed": seed, "eval_return_mean": eval_return,
                   "eval_return_std": 0.0, "global_step": steps}
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
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            run.main([*argv, "--runs-dir", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    result = launcher(config, "--set", "oops")  # and from the shell: one line, no traceback
    assert result.returncode != 0 and result.stderr.strip() == "error: --set takes key=value, got 'oops'"


def test_jobs_pass_seeds_envs_overrides_and_tracking(tmp_path):
    args = run.launch_parser().parse_args(
        ["c.yaml", "--seeds", "1", "2", "--env", "CartPole-v1", "ALE/Pong-v5", "--set", "learning_rate=1e-3",
         "cuda=false", "--set", "compile=true", "--track"])
    jobs = run.jobs_for(args, TINY, "dqn", "c__123", tmp_path)
    assert [job.run_name for job in jobs] == ["CartPole-v1__dqn__1__c__123", "CartPole-v1__dqn__2__c__123",
                                              "ALE-Pong-v5__dqn__1__c__123", "ALE-Pong-v5__dqn__2__c__123"]
    assert jobs[2].argv == ["--seed", "1", "--env", "ALE/Pong-v5", "--learning-rate", "1e-3", "--no-cuda",
                            "--compile", "--run-name", "ALE-Pong-v5__dqn__1__c__123", "--track", "--wandb-group",
                            "c__123"]
    untracked = run.jobs_for(run.launch_parser().parse_args(["c.yaml"]), TINY, "dqn", "c__1", tmp_path)
    assert len(untracked) == 1 and "--track" not in untracked[0].argv and "CartPole-v1" in untracked[0].argv


def test_last_global_step_reads_a_file_still_being_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert run.last_global_step(metrics) is None
    metrics.write_text("".join(json.dumps({"global_step": s, "x": "y" * 300}) + "\n" for s in range(0, 5000, 100))
                       + '{"global_step": 99')
    assert run.last_global_step(metrics) == 4900
    run_dir = tmp_path / "runs" / "r"  # the periodic status line reads the same file
    run_dir.mkdir(parents=True)
    metrics.rename(run_dir / "metrics.jsonl")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"total_timesteps": 100_000}))
    job = run.Job("r", "CartPole-v1", 3, [], tmp_path / "r.log")
    assert run.progress_of(job, tmp_path / "runs") == "CartPole-v1 seed 3 4.9k/100k"


# ---------------------------------------------------------------- launching

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
        assert f"run {name}" in (tmp_path / "runs" / launch_id / "logs" / f"{name}.log").read_text()


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


def test_ctrl_c_stops_the_jobs_and_reports(tmp_path):
    config = write_config(tmp_path / "long.yaml", {**TINY, "total_timesteps": 10_000_000})
    runs_dir = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), str(config), "--seeds", "1", "2",
                             "--runs-dir", str(runs_dir)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not any(run.last_global_step(m) for m in runs_dir.glob("*/metrics.jsonl")):
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


def test_ray_runs_the_job_on_a_local_cluster_and_brings_the_run_back(tmp_path):
    ray = pytest.importorskip("ray")
    config = write_config(tmp_path / "tiny.yaml", TINY)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        code = run.main([str(config), "--seeds", "3", "--ray", "local", "--runs-dir", str(tmp_path / "runs")])
    finally:
        ray.shutdown()
    assert code == 0
    [run_dir] = (tmp_path / "runs").glob("CartPole-v1__dqn__3__tiny__*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["global_step"] == 600
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) > 1
    [log] = (tmp_path / "runs").glob("tiny__*/logs/*.log")
    assert f"run {run_dir.name}" in log.read_text()


# ---------------------------------------------------------------- curves and tables

def test_plot_draws_one_line_per_algo_and_env_with_the_seed_mean(tmp_path):
    write_run(tmp_path / "a", "dqn", "CartPole-v1", 1, [(0, 0.0), (100, 10.0), (200, 20.0)])
    write_run(tmp_path / "a", "dqn", "CartPole-v1", 2, [(0, 0.0), (50, 10.0), (200, 40.0)])
    write_run(tmp_path / "b", "per_dqn", "CartPole-v1", 1, [(0, 1.0), (200, 3.0)])
    write_run(tmp_path / "b", "dqn", "Acrobot-v1", 1, [(0, -500.0), (100, -100.0)])
    fig = run.curves_figure([tmp_path / "a", tmp_path / "b"], "eval/episodic_return")
    lines = {(ax.get_title(), line.get_label()): line for ax in fig.axes for line in ax.get_lines()}
    assert set(lines) == {("CartPole-v1", "dqn (2 seeds)"), ("CartPole-v1", "per_dqn (1 seeds)"),
                          ("Acrobot-v1", "dqn (1 seeds)")}
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
        run.curves_figure([tmp_path], "charts/SPS")
    with pytest.raises(SystemExit, match="no summary.json under"):
        run.results_table([tmp_path])


def test_table_gives_mean_and_std_over_seeds(tmp_path, capsys):
    for seed, value in enumerate([10.0, 20.0, 30.0]):
        write_run(tmp_path / "runs", "dqn", "CartPole-v1", seed, [(0, 0.0)], eval_return=value, steps=1000)
    write_run(tmp_path / "runs", "per_dqn", "CartPole-v1", 1, [(0, 0.0)], eval_return=-5.25, steps=800)
    write_run(tmp_path / "runs", "per_dqn", "CartPole-v1", 2, [(0, 0.0)], eval_return=-4.75, steps=900)
    write_run(tmp_path / "runs", "ddpg", "Hopper-v5", 1, [(0, 0.0)])  # no summary.json yet: not in the table
    assert run.main(["table", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[2:] == ["| dqn | CartPole-v1 | 3 | 20.0 ± 8.2 | 1000 |",
                         "| per_dqn | CartPole-v1 | 2 | -5.0 ± 0.2 | 800–900 |"]
