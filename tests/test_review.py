"""Guards of the training loops, each through main(): bad runs are refused before anything is
written, short n-step runs do not crash, losses are logged at a steady rate, the Atari preset runs."""

from __future__ import annotations

import builtins
import json

import pytest

from tests.algo_utils import load_algo, parse, run_dir_of, tiny_args

ALGOS = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn", "ddpg")}


@pytest.mark.parametrize("name", list(ALGOS))
def test_capture_video_without_the_video_extra_is_refused_at_start_up(tmp_path, monkeypatch, name):
    """Not after the whole run, at the final evaluation: before the run directory exists, naming the extra."""
    monkeypatch.chdir(tmp_path)
    real_import = builtins.__import__

    def no_imageio(module, *args, **kwargs):
        if module.startswith("imageio"):
            raise ImportError(f"No module named {module!r}")
        return real_import(module, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_imageio)
    algo = ALGOS[name]
    env = "Pendulum-v1" if name == "ddpg" else "CartPole-v1"
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[video\]"'):
        algo.main(tiny_args(algo, env=env, capture_video=True))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["per_dqn", "nstep_dqn"])
def test_n_step_runs_that_learn_before_a_window_closes_wait_for_a_batch(tmp_path, monkeypatch, name):
    """--n-step 5 with learning_starts 0: the first windows close only at step 5, so updates must wait until
    the buffer holds a batch instead of sampling an empty one."""
    monkeypatch.chdir(tmp_path)
    algo = ALGOS[name]
    summary = algo.main(tiny_args(algo, n_step=5, learning_starts=0, batch_size=16, train_frequency=1,
                                  total_timesteps=200))
    # The first update comes once 16 transitions are stored: after step 16 + (5 - 1).
    assert summary["updates"] == 200 - (16 + 4) + 1


@pytest.mark.parametrize("change, message", [
    ({"alpha": -0.1}, "alpha >= 0"), ({"prio_eps": 0.0}, "prio_eps > 0"), ({"beta_start": 1.5}, "beta_start <= 1"),
    ({"gamma": 1.2}, r"gamma in \[0, 1\]"),
])
def test_per_dqn_refuses_bad_prioritization_settings_before_the_run_directory(tmp_path, monkeypatch, change, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=message):
        ALGOS["per_dqn"].main(tiny_args(ALGOS["per_dqn"], **change))
    assert not (tmp_path / "runs").exists()


def test_losses_are_logged_every_100_updates_whatever_the_training_rounds(tmp_path, monkeypatch):
    """Rounds of 128 gradient steps every 256 environment steps (the shape of the old CartPole config): one
    loss record per 100 updates, at the step whose round made the 100th, not one per 6,400 steps."""
    monkeypatch.chdir(tmp_path)
    algo = ALGOS["dqn"]
    args = tiny_args(algo, total_timesteps=2048, learning_starts=255, train_frequency=256, gradient_steps=128,
                     buffer_size=4096, batch_size=32)
    summary = algo.main(args)
    assert summary["updates"] == 8 * 128  # rounds at steps 256, 512, ..., 2048
    records = [json.loads(line) for line in (run_dir_of(tmp_path, args) / "metrics.jsonl").read_text().splitlines()]
    steps = [r["global_step"] for r in records if "losses/td_loss" in r]
    # Update u (1-based) happens in the round at step 256 * (1 + (u - 1) // 128).
    assert steps == [256 * (1 + (u - 1) // 128) for u in range(100, 8 * 128 + 1, 100)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_the_atari_preset_trains_a_few_hundred_steps_on_the_cpu(tmp_path, monkeypatch, capsys, name):
    """`python algos/<name>.py --env PongNoFrameskip-v4` with a small budget: the preset is announced, frames are
    stored once, the Nature CNN takes gradient steps. A smoke test: nothing here says Pong learns."""
    monkeypatch.chdir(tmp_path)
    algo = ALGOS[name]
    args = parse(algo, ["--env", "PongNoFrameskip-v4", "--total-timesteps", "300", "--learning-starts", "200",
                            "--buffer-size", "1000", "--eval-episodes", "1", "--eval-frequency", "0",
                            "--checkpoint-frequency", "0", "--threads", "1", "--no-cuda", "--run-name", "pong"])
    assert "Atari preset" in capsys.readouterr().out
    summary = algo.main(args)
    envs, train_frequency = algo.ATARI_PRESET["num_envs"], algo.ATARI_PRESET["train_frequency"]
    rounds = sum(s // train_frequency - (s - envs) // train_frequency  # each loop step: envs agent steps
                 for s in range(envs, summary["global_step"] + 1, envs) if s > 200)
    assert summary["updates"] == rounds * algo.ATARI_PRESET["gradient_steps"] > 0
    assert summary["eval_episodes"] == 1
