"""algos/dqn.py: CLI and config handling, clear errors, smoke runs, W&B offline, and learning on CartPole."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import partial

import gymnasium as gym
import pytest
import torch
import yaml

from harness import stacked
from tests.algo_utils import ROOT, load_algo, parse, run_dir_of, tiny_args

dqn = load_algo("dqn")


def test_help_lists_arguments_with_their_help():
    out = subprocess.run([sys.executable, str(ROOT / "algos/dqn.py"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for flag in ("--env", "--total-timesteps", "--buffer-size", "--config", "--track", "--save-model"):
        assert flag in out.stdout
    assert "replay capacity" in out.stdout


def test_yaml_gives_defaults_and_flags_override_it(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("algo: dqn\nlearning_rate: 1e-3\nseed: 5\nenv: Acrobot-v1\nloss: huber\n")
    args = parse(dqn, ["--config", str(config), "--seed", "7"])
    assert (args.learning_rate, args.seed, args.env, args.loss) == (1e-3, 7, "Acrobot-v1", "huber")
    args = parse(dqn, ["--env", "MountainCar-v0", f"--config={config}"])
    assert args.env == "MountainCar-v0" and args.seed == 5 and args.config == str(config)


@pytest.mark.parametrize(
    "text, message",
    [
        ("learning_rat: 0.1\n", r"bad\.yaml: unknown key 'learning_rat' \(closest: learning_rate"),
        ("batch_size: abc\n", r"bad\.yaml: batch_size must be an int, got 'abc'"),
        ("batch_size: 6.5\n", r"bad\.yaml: batch_size must be an int, got 6\.5"),
        ("loss: l1\n", r"bad\.yaml: loss must be one of 'mse', 'huber', got 'l1'"),
        ("anneal_lr: 1\n", r"anneal_lr must be a bool"),
        ("- 1\n- 2\n", r"must be a mapping"),
        ("algo: per_dqn\n", r"is for algos/per_dqn.py, not dqn.py"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, capsys, text, message):
    import re

    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as error:
        parse(dqn, ["--config", str(config)])
    assert re.search(message, f"{error.value} {capsys.readouterr().err}"), capsys.readouterr().err


def test_bad_config_from_the_command_line_exits_without_traceback(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("gama: 0.9\n")
    out = subprocess.run([sys.executable, str(ROOT / "algos/dqn.py"), "--config", str(config)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0
    assert f"error: config {config}: unknown key 'gama' (closest: gamma" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"env": "NoSuchEnv-v0"}, r"NoSuchEnv-v0.*not registered"),
        ({"env": "Pendulum-v1"}, r"discrete action space.*Pendulum-v1.*ddpg"),
        ({"batch_size": 0}, r"--batch-size must be >= 1"),
        ({"tau": 1.5}, r"tau in \(0, 1\].*got 1.5"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, monkeypatch, change, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=message):
        dqn.main(tiny_args(dqn, **change))
    assert not (tmp_path / "runs").exists()


def test_an_existing_run_directory_is_not_overwritten(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "metrics.jsonl").write_text("keep me\n")
    with pytest.raises(SystemExit, match="already exists"):
        dqn.main(tiny_args(dqn, run_name="taken"))
    assert (tmp_path / "runs" / "taken" / "metrics.jsonl").read_text() == "keep me\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a machine without CUDA")
def test_cuda_by_default_runs_on_the_cpu_without_a_warning(tmp_path, monkeypatch, capsys, recwarn):
    monkeypatch.chdir(tmp_path)
    summary = dqn.main(tiny_args(dqn, cuda=True))
    assert summary["global_step"] >= 400 and "on cpu" in capsys.readouterr().out
    assert not [w for w in recwarn if "CUDA" in str(w.message)]


def test_cartpole_smoke_run_leaves_a_complete_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    networks = []

    class Recorded(dqn.QNetwork):  # the first one main creates is the Q-network it trains
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            networks.append(self)

    monkeypatch.setattr(dqn, "QNetwork", Recorded)
    args = tiny_args(dqn, save_model=True, capture_video=True, num_envs=2, eval_frequency=200)
    summary = dqn.main(args)
    run = run_dir_of(tmp_path, args)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["env"] == "CartPole-v1" and config["batch_size"] == args.batch_size
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("global_step" in r for r in records)
    tags = {k for r in records for k in r}
    assert {"charts/episodic_return", "charts/episodic_length", "losses/td_loss", "eval/episodic_return"} <= tags
    saved = json.loads((run / "summary.json").read_text())
    assert saved["eval_episodes"] == args.eval_episodes == len(saved["eval_returns"])
    assert saved["global_step"] == summary["global_step"] == args.total_timesteps
    # One gradient step per multiple of train_frequency (2) after learning_starts (100); 2 envs reach 100 exactly.
    assert saved["updates"] == sum(1 for step in range(101, 401) if step % 2 == 0)
    assert saved["eval_return_mean"] == pytest.approx(sum(saved["eval_returns"]) / len(saved["eval_returns"]))
    assert [r["eval/episodic_return"] for r in records if "eval/episodic_return" in r][-1] == \
        pytest.approx(saved["eval_return_mean"])  # the final evaluation is the one logged last
    assert (run / "videos" / "eval-episode-0.mp4").stat().st_size > 1000

    # The saved weights rebuild the network a user would construct from the env's spaces.

    env = gym.make("CartPole-v1")
    net = dqn.QNetwork(env.observation_space, env.action_space)  # the plain network, as a user builds it
    net.load_state_dict(torch.load(run / "model.pt", weights_only=True))
    assert net(torch.zeros(3, 4)).shape == (3, 2)
    trained = networks[0].state_dict()  # model.pt holds the trained network's final weights
    assert all(torch.equal(value, trained[key]) for key, value in net.state_dict().items())
    initial = stacked(partial(dqn.QNetwork, env.observation_space, env.action_space), [args.seed])  # as main does
    assert not torch.equal(net.net[0].weight, initial.net[0].weight)  # which training changed


@pytest.mark.slow
def test_pong_smoke_run(tmp_path, monkeypatch):
    """The Atari path runs end to end: image observations, the CNN, gradient steps, and a final evaluation
    of one whole game: it ends when a side has 21 points, and its return is the score difference."""
    import importlib

    evaluate_module = importlib.import_module("envs.evaluate")  # envs.evaluate is also the function's name
    points = []

    class Recorded(evaluate_module.EpisodeStats):  # sees every evaluation step's raw reward
        def update(self, reward, done):
            points.extend(reward.tolist())
            return super().update(reward, done)

    monkeypatch.setattr(evaluate_module, "EpisodeStats", Recorded)
    monkeypatch.chdir(tmp_path)
    args = tiny_args(dqn, env="PongNoFrameskip-v4", total_timesteps=300, learning_starts=100, buffer_size=500,
                     batch_size=8, train_frequency=2, eval_episodes=1, target_network_frequency=50)
    summary = dqn.main(args)
    run = run_dir_of(tmp_path, args)
    assert summary["updates"] == (300 - 100) // 2
    won, lost = points.count(1.0), points.count(-1.0)
    assert max(won, lost) == 21 and won + lost == sum(p != 0 for p in points)
    assert summary["eval_returns"] == [won - lost]
    assert "losses/td_loss" in (run / "metrics.jsonl").read_text()


def test_track_writes_an_offline_wandb_run_with_the_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB__SERVICE_WAIT", "300")  # a loaded CI machine can be slow to start wandb-core
    args = tiny_args(dqn, track=True, wandb_project_name="test-project")
    dqn.main(args)
    runs = list((run_dir_of(tmp_path, args) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    # wandb-core writes the run file from its own process; on a loaded machine the last records
    # can land a moment after wandb.finish() returns, so wait for them (up to a minute).
    tags = (b"charts/episodic_return", b"losses/td_loss", b"eval/episodic_return")
    deadline = time.monotonic() + 60
    while True:
        log = b"".join(path.read_bytes() for path in runs[0].glob("*.wandb"))
        missing = [tag for tag in tags if tag not in log]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, f"{missing} not in {[p.name for p in runs[0].iterdir()]}"


def test_td_target_bootstraps_except_after_termination():
    from tensordict import TensorDict

    env = gym.make("CartPole-v1")
    net = dqn.QNetwork(env.observation_space, env.action_space)
    next_obs = torch.randn(4, 4)
    batch = TensorDict(reward=torch.tensor([1.0, 2.0, 3.0, 4.0]), next_obs=next_obs,
                       terminated=torch.tensor([False, True, False, True]), batch_size=[4])
    with torch.no_grad():
        best = net(next_obs).max(dim=-1).values
        target = dqn.td_target(net, batch, 0.9)
    assert torch.allclose(target, torch.tensor([1 + 0.9 * best[0], 2.0, 3 + 0.9 * best[2], 4.0]))
