"""Exact resume: a run killed after a checkpoint, or stopped by SIGTERM mid-training, and resumed with
`--resume` ends exactly like the same run left alone (model.pt tensors, evaluation returns, metrics);
bad checkpoints are refused and change nothing. Every run here is a real `python algos/<algo>.py` process
on one CPU thread, as a user (or Slurm) would start and stop it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.algo_utils import ROOT

pytestmark = pytest.mark.slow

# Budgets that reach hundreds of gradient steps in a few seconds; checkpoints every 1000 steps.
CASES = {
    "dqn": ["--total-timesteps", "3000", "--learning-starts", "500", "--train-frequency", "4", "--gradient-steps",
            "1", "--num-envs", "2", "--eval-frequency", "1000"],
    "per_dqn": ["--total-timesteps", "3000", "--learning-starts", "500", "--train-frequency", "4",
                "--gradient-steps", "1", "--n-step", "3"],
    "nstep_dqn": ["--total-timesteps", "3000", "--learning-starts", "500", "--train-frequency", "4",
                  "--gradient-steps", "1", "--n-step", "3", "--tau", "0.1", "--target-network-frequency", "1"],
    "ddpg": ["--total-timesteps", "1500", "--learning-starts", "300", "--ou-theta", "0.15", "--normalize-obs",
             "--num-envs", "2"],
}
COMMON = ["--eval-episodes", "3", "--save-model", "--checkpoint-frequency", "1000", "--no-cuda", "--threads", "1"]


def start(cwd: Path, algo: str, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "algos" / f"{algo}.py"), *argv], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {proc.stdout.read()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)


def finished(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def outcome(run: Path) -> tuple[dict, list[float], list[str]]:
    """model.pt, the final evaluation returns, and metrics.jsonl without the wall-clock SPS records."""
    model = torch.load(run / "model.pt", weights_only=True)
    returns = json.loads((run / "summary.json").read_text())["eval_returns"]
    metrics = [line for line in (run / "metrics.jsonl").read_text().splitlines() if "charts/SPS" not in line]
    return model, returns, metrics


def assert_same(a: tuple, b: tuple, episodes: int = 3) -> None:
    flat = {k: v for k, v in a[0].items()} if isinstance(next(iter(a[0].values())), torch.Tensor) else \
        {f"{part}.{k}": v for part, state in a[0].items() for k, v in state.items()}
    other = {k: v for k, v in b[0].items()} if isinstance(next(iter(b[0].values())), torch.Tensor) else \
        {f"{part}.{k}": v for part, state in b[0].items() for k, v in state.items()}
    assert flat.keys() == other.keys()
    assert all(torch.equal(flat[k], other[k]) for k in flat), [k for k in flat if not torch.equal(flat[k], other[k])]
    assert a[1] == b[1] and len(a[1]) == episodes
    assert a[2] == b[2]


@pytest.mark.parametrize("algo", list(CASES))
def test_killed_or_stopped_runs_resume_bit_for_bit(tmp_path, algo):
    argv = [*CASES[algo], *COMMON]
    runs = tmp_path / "runs"
    alone = start(tmp_path, algo, *argv, "--run-name", "alone")
    killed = start(tmp_path, algo, *argv, "--run-name", "killed")
    stopped = start(tmp_path, algo, *argv, "--run-name", "stopped")

    # SIGKILL right after the first checkpoint: nothing but checkpoint.pt (and the metrics up to now) survives.
    wait_for(lambda: (runs / "killed" / "checkpoint.pt").exists(), killed, "a checkpoint")
    killed.kill()
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    # SIGTERM mid-training, between checkpoints: the run writes one at the current step and says how to resume.
    def past_the_first_checkpoint() -> bool:  # a gradient step after step 1000, so the stop falls between checkpoints
        metrics = runs / "stopped" / "metrics.jsonl"  # not there until the process has started its run
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return any("losses/" in line and json.loads(line)["global_step"] > 1000 for line in lines)

    wait_for(past_the_first_checkpoint, stopped, "a gradient step after the first checkpoint")
    stopped.send_signal(signal.SIGTERM)
    out = finished(stopped)
    assert "stopped by SIGTERM" in out and f"--resume {Path('runs') / 'stopped'}" in out, out
    summary = json.loads((runs / "stopped" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["eval_return_mean"] is None
    step = summary["global_step"]
    assert 0 < step < int(CASES[algo][1]) and step % 1000 != 0  # stopped between checkpoints

    resumed = [start(tmp_path, algo, "--resume", str(Path("runs") / name)) for name in ("killed", "stopped")]
    finished(alone)
    for proc in resumed:
        assert "resuming runs/" in finished(proc)
    assert_same(outcome(runs / "alone"), outcome(runs / "killed"))
    assert_same(outcome(runs / "alone"), outcome(runs / "stopped"))


def test_resume_refuses_bad_checkpoints_and_other_flags_and_changes_nothing(tmp_path):
    argv = [*CASES["dqn"], *COMMON, "--total-timesteps", "1200"]  # a short run, its last checkpoint at 1200
    finished(start(tmp_path, "dqn", *argv, "--run-name", "done"))
    run = tmp_path / "runs" / "done"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    def refused(algo: str, *args: str) -> str:
        out = subprocess.run([sys.executable, str(ROOT / "algos" / f"{algo}.py"), *args], cwd=tmp_path, text=True,
                             capture_output=True)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing overwritten
        return out.stderr

    assert "not of per_dqn.py" in refused("per_dqn", "--resume", "runs/done")
    assert ("it takes only --total-timesteps, --wandb-resume, --stop-step, --members, --precision, --threads, "
            "got --seed") in refused("dqn", "--resume", "runs/done", "--seed", "3")
    assert "cannot resume from" in refused("dqn", "--resume", "runs/nothing-here")

    # A mismatched environment: the checkpoint's env state is CartPole's, the env built is Acrobot's.
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["args"]["env"] = "Acrobot-v1"
    os.makedirs(tmp_path / "runs" / "other")
    torch.save(state, tmp_path / "runs" / "other" / "checkpoint.pt")
    assert "cannot resume from runs/other" in refused("dqn", "--resume", "runs/other")

    # A truncated file (a copy cut short, as a full disk would leave it).
    os.makedirs(tmp_path / "runs" / "cut")
    (tmp_path / "runs" / "cut" / "checkpoint.pt").write_bytes(before["checkpoint.pt"][:5000])
    assert "cannot resume from" in refused("dqn", "--resume", "runs/cut")


def test_resume_can_train_longer_and_appends_to_the_metrics(tmp_path):
    finished(start(tmp_path, "dqn", *CASES["dqn"], *COMMON, "--total-timesteps", "2000", "--run-name", "short",
                   "--no-anneal-lr"))  # an annealed learning rate ends at 0: such a run is not extended
    run = tmp_path / "runs" / "short"
    first = (run / "metrics.jsonl").read_text()
    out = finished(start(tmp_path, "dqn", "--resume", "runs/short", "--total-timesteps", "3000", "--threads", "2"))
    assert "3000 steps" in out
    assert yaml.safe_load((run / "config.yaml").read_text())["threads"] == 2  # the cores of the machine it goes on
    metrics = (run / "metrics.jsonl").read_text()
    assert metrics.startswith(first) and json.loads(metrics.splitlines()[-1])["global_step"] == 3000
    assert json.loads((run / "summary.json").read_text())["global_step"] == 3000


def test_a_signal_during_the_final_evaluation_still_writes_the_summary(tmp_path):
    """SIGTERM while the final evaluation runs: summary.json (interrupted, no returns) and a checkpoint from
    which --resume runs just the evaluation."""
    argv = ["--total-timesteps", "600", "--learning-starts", "100", "--eval-episodes", "5000", "--no-cuda",
            "--checkpoint-frequency", "600"]
    proc = start(tmp_path, "dqn", *argv, "--run-name", "evaluating")
    run = tmp_path / "runs" / "evaluating"
    wait_for(lambda: (run / "checkpoint.pt").exists(), proc, "the end of training")  # written just before it
    time.sleep(0.5)  # into the 5000 evaluation episodes (all seeds' evaluations run in one vector env: quick)
    proc.send_signal(signal.SIGTERM)
    out = finished(proc)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["eval_returns"] == [] and summary["global_step"] == 600, out
    out = finished(start(tmp_path, "dqn", "--resume", "runs/evaluating", "--total-timesteps", "600"))
    assert "over 5000 episodes | 600 steps" in out


def test_the_config_of_a_paused_and_resumed_run_trains_a_new_run_equal_to_it(tmp_path):
    """A run paused (--stop-step) and resumed to its end: `--config runs/s/config.yaml --run-name s2` trains a new run
    in runs/s2, equal to runs/s, and leaves runs/s as it was. Fails if config.yaml holds the one-off options of the
    process that wrote it (`resume`: the rerun resumed runs/s under its old name, rewriting its summary.json and
    metrics.jsonl; `stop_step`: it paused at the step)."""
    argv = [*CASES["dqn"], *COMMON, "--total-timesteps", "2000"]
    finished(start(tmp_path, "dqn", *argv, "--run-name", "s", "--stop-step", "1000"))
    finished(start(tmp_path, "dqn", "--resume", "runs/s"))
    runs = tmp_path / "runs"
    before = {p.name: p.read_bytes() for p in (runs / "s").iterdir() if p.is_file()}
    config = yaml.safe_load((runs / "s" / "config.yaml").read_text())
    assert not {"resume", "stop_step", "members", "evaluate"} & config.keys(), config
    out = finished(start(tmp_path, "dqn", "--config", "runs/s/config.yaml", "--run-name", "s2"))
    assert "run runs/s2 " in out and "2000 steps" in out, out
    assert {p.name: p.read_bytes() for p in (runs / "s").iterdir() if p.is_file()} == before
    assert_same(outcome(runs / "s"), outcome(runs / "s2"))
