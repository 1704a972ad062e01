"""Learning tests: each algorithm's config, run to its end exactly as `run.py` launches it, must end with a
final evaluation (10 episodes after the last training step, no early stop) at or above its threshold:
DQN, PER-DQN and n-step DQN >= 475 on CartPole-v1 within 100k steps, DDPG >= -200 on Pendulum-v1 within
20k steps, DQN >= -100 on Acrobot-v1 within 100k steps (Gymnasium's bar for solving it; a random policy scores
-500, a broken loss stays there). Two seeds per config here, run side by side (CI has two cores);
benchmarks/results.md has the 10-seed tables from the same configs, with the commands that made them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ("1", "2")


@pytest.mark.learning
@pytest.mark.parametrize("config, threshold, budget", [
    ("configs/dqn/cartpole.yaml", 475, 100_000),
    ("configs/per_dqn/cartpole.yaml", 475, 100_000),
    ("configs/nstep_dqn/cartpole.yaml", 475, 100_000),
    ("configs/ddpg/pendulum.yaml", -200, 20_000),
    ("configs/dqn/acrobot.yaml", -100, 100_000),
], ids=["dqn", "per_dqn", "nstep_dqn", "ddpg", "dqn_acrobot"])
def test_the_config_ends_at_or_above_its_threshold(tmp_path, config, threshold, budget):
    values = yaml.safe_load((ROOT / config).read_text())
    assert values["total_timesteps"] <= budget and values.get("stop_return") is None
    runs = tmp_path / "runs"
    out = subprocess.run([sys.executable, "run.py", config, "--seeds", *SEEDS, "--jobs", "2", "--set", "cuda=false",
                          "--runs-dir", str(runs)], cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"},
                         capture_output=True, text=True, timeout=3000)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for seed in SEEDS:
        [summary_file] = runs.glob(f"*__{seed}__*/summary.json")
        summary = json.loads(summary_file.read_text())
        assert summary["global_step"] == values["total_timesteps"] and not summary["interrupted"], summary
        assert summary["eval_episodes"] == 10
        assert summary["eval_return_mean"] >= threshold, (seed, summary["eval_returns"])
