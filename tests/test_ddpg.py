"""Tests for algos/ddpg.py: the TD target, soft target updates, the actor's gradient, smoke and learning runs."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from harness import stacked
from tests.algo_utils import ROOT, load_algo, parse

ddpg = load_algo("ddpg")
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")


@pytest.fixture
def threads():
    """Restore the thread count main() sets (flush-to-zero: conftest's subnormals_kept)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def smoke_args(env: str, run_name: str, **overrides) -> ddpg.Args:
    """A budget that still makes real gradient steps: 200 of them after 100 random steps."""
    base = dict(env=env, run_name=run_name, total_timesteps=300, learning_starts=100, batch_size=32,
                buffer_size=1000, eval_episodes=2, save_model=True, cuda=False)
    return ddpg.Args(**{**base, **overrides})


def check_run_dir(run_dir: Path, env_id: str) -> dict:
    """A complete run directory; returns the summary."""
    assert (run_dir / "config.yaml").exists()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all("global_step" in m for m in metrics)
    losses = [m for m in metrics if "losses/qf_loss" in m]
    assert losses and all(np.isfinite(m["losses/qf_loss"]) and np.isfinite(m["losses/actor_loss"]) for m in losses)
    evaluations = [m["eval/episodic_return"] for m in metrics if "eval/episodic_return" in m]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 300 and summary["eval_episodes"] == 2 == len(summary["eval_returns"])
    # the final evaluation is the one logged last, and the summary's mean is its returns' mean
    assert evaluations[-1] == pytest.approx(summary["eval_return_mean"]) == np.mean(summary["eval_returns"])
    state = torch.load(run_dir / "model.pt", weights_only=True)
    env = gym.make(env_id)
    actor = ddpg.Actor(env.observation_space, env.action_space)  # the plain networks load model.pt
    qf = ddpg.QNetwork(env.observation_space, env.action_space)
    actor.load_state_dict(state["actor"])
    qf.load_state_dict(state["qf"])
    obs = torch.as_tensor(env.reset(seed=0)[0]).view(1, -1)
    action = actor(obs)
    assert env.action_space.contains(action[0].detach().numpy().astype(np.float32))
    assert qf(obs, action).shape == (1,)
    return summary


# ---- the pieces of the update ------------------------------------------------------------------


class ConstantActor(torch.nn.Module):
    """actor(next_obs) = 2 * next_obs[:, :1]: a known function, so the target can be computed by hand."""

    def forward(self, obs):
        return 2 * obs[:, :1]


class LinearQ(torch.nn.Module):
    """Q(s, a) = sum(s) + 3 a."""

    def forward(self, obs, action):
        return obs.sum(1) + 3 * action[:, 0]


def test_td_target_matches_hand_computation():
    next_obs = torch.tensor([[1.0, 2.0], [0.5, -1.0], [-1.0, 0.0]])
    reward = torch.tensor([1.0, -2.0, 0.5])
    discount = torch.tensor([0.9, 0.0, 0.81])  # middle: terminated; last: a 2-step return's gamma**2
    # Q'(s', mu'(s')) = s'_0 + s'_1 + 3 * 2 * s'_0 = 7 s'_0 + s'_1  ->  [9, 2.5, -7]
    expected = torch.tensor([1.0 + 0.9 * 9.0, -2.0, 0.5 + 0.81 * -7.0])
    with torch.no_grad():
        next_value = LinearQ()(next_obs, ConstantActor()(next_obs))
    ended = torch.tensor([False, True, False])
    target = ddpg.lambda_returns(reward[:, None], discount[:, None], ended[:, None], next_value[:, None], 0.9)
    torch.testing.assert_close(target[:, 0], expected)


@pytest.mark.parametrize("seeds", [[0], [0, 1]], ids=["plain", "pack"])
def test_actor_respects_action_bounds(seeds):
    actor = stacked(partial(ddpg.Actor, OBS, ACT), seeds)
    with torch.no_grad():
        actor.net[-1].bias.fill_(100.0)  # saturate tanh at +1
        obs = torch.rand(*([2] if len(seeds) > 1 else []), 4, 3)  # a pack: [seeds, batch, obs]
        high = actor(obs)
        actor.net[-1].bias.fill_(-100.0)
        low = actor(obs)
    torch.testing.assert_close(high, torch.tensor([2.0, 1.0]).expand(*obs.shape[:-1], 2))
    torch.testing.assert_close(low, torch.tensor([-2.0, 0.0]).expand(*obs.shape[:-1], 2))
    assert set(actor.state_dict()) >= {"action_scale", "action_bias"}


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 3))
    rms = ddpg.RunningMeanStd((3,))
    for chunk in np.array_split(data, 37):
        rms.update(torch.as_tensor(chunk))
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-4)
    normal = rms(torch.as_tensor(data, dtype=torch.float32))
    np.testing.assert_allclose(normal.mean(0).numpy(), 0.0, atol=1e-3)
    np.testing.assert_allclose(normal.std(0).numpy(), 1.0, atol=1e-2)


def test_ou_noise_is_correlated_and_resets_per_env():
    """Seed 0, 5000 samples: lag-1 correlation 1 - theta within 0.05, white noise's within 0.05 of 0, its std
    within 0.01 of sigma."""
    noise = ddpg.ExplorationNoise((2, 1), theta=0.15, sigma=0.2, rngs=[np.random.default_rng(0)])
    samples = np.array([noise.sample()[0, 0] for _ in range(5000)])
    lag1 = np.corrcoef(samples[:-1], samples[1:])[0, 1]
    assert 0.8 < lag1 < 0.9  # 1 - theta = 0.85 for an AR(1) process
    noise.reset(np.array([True, False]))
    assert noise.state[0, 0] == 0.0 and noise.state[1, 0] != 0.0
    white = ddpg.ExplorationNoise((1, 1), theta=1.0, sigma=0.2, rngs=[np.random.default_rng(0)])
    samples = np.array([white.sample()[0, 0] for _ in range(5000)])
    assert abs(np.corrcoef(samples[:-1], samples[1:])[0, 1]) < 0.05
    assert abs(samples.std() - 0.2) < 0.01


# ---- whole runs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "HalfCheetah-v5"])
def test_smoke_run_leaves_a_complete_run_dir(env_id, tmp_path, monkeypatch, threads):
    monkeypatch.chdir(tmp_path)
    summary = ddpg.main(smoke_args(env_id, "smoke"))
    assert summary["updates"] == 200
    check_run_dir(tmp_path / "runs" / "smoke", env_id)


@pytest.mark.parametrize("overrides", [
    dict(n_step=3),
    dict(ou_theta=0.15, normalize_obs=True, policy_frequency=2),
    dict(updates_per_step=0.5),
    dict(updates_per_step=2.0, num_envs=2),
], ids=["n_step", "ou_normalize_delay", "half_update", "two_updates_two_envs"])
def test_smoke_variants(overrides, tmp_path, monkeypatch, threads):
    monkeypatch.chdir(tmp_path)
    summary = ddpg.main(smoke_args("Pendulum-v1", "variant", **overrides))
    steps_learning = 300 - 100
    assert summary["updates"] == int(steps_learning * overrides.get("updates_per_step", 1.0))
    check_run_dir(tmp_path / "runs" / "variant", "Pendulum-v1")
    if overrides.get("normalize_obs"):
        state = torch.load(tmp_path / "runs" / "variant" / "model.pt", weights_only=True)
        assert (state["obs_norm"]["count"] > 300).all()  # every collected observation went in
        assert not torch.allclose(state["obs_norm"]["mean"], torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("n_step", [1, 3])
def test_stored_discounts(n_step, tmp_path, monkeypatch, threads):
    """One-step transitions store gamma; n-step ones gamma**m (m = n, shorter only at an episode end)."""
    monkeypatch.chdir(tmp_path)
    stored = []
    original = ddpg.ReplayBuffer.extend

    def spy(self, data):
        stored.append(data["discount"].clone())
        return original(self, data)

    monkeypatch.setattr(ddpg.ReplayBuffer, "extend", spy)
    ddpg.main(smoke_args("Pendulum-v1", "discount", n_step=n_step, gamma=0.9, total_timesteps=450))
    discount = torch.cat(stored)
    # Pendulum never terminates: each step starts one transition; the last n - 1 windows are still open.
    assert discount.numel() == 450 - (n_step - 1)
    assert torch.allclose(discount[: 200 - n_step], torch.tensor(0.9**n_step))  # full windows in episode 1
    expected = sorted({round(0.9**m, 6) for m in range(1, n_step + 1)})
    assert sorted({round(x, 6) for x in discount.tolist()}) == expected


def test_normalizer_is_used_in_evaluation(tmp_path, monkeypatch, threads):
    """With --normalize-obs the evaluation policy sees observations through the normaliser."""
    monkeypatch.chdir(tmp_path)
    calls = []
    original = ddpg.RunningMeanStd.forward

    def spy(self, obs):
        calls.append(obs.shape[0])
        return original(self, obs)

    monkeypatch.setattr(ddpg.RunningMeanStd, "forward", spy)
    ddpg.main(smoke_args("Pendulum-v1", "norm", normalize_obs=True, total_timesteps=300))
    # Evaluation plays single observations after training: 2 episodes x 200 steps of batch 1.
    assert calls[-400:] == [1] * 400


def test_discrete_action_space_is_refused(tmp_path, monkeypatch, threads):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as error:
        ddpg.main(smoke_args("CartPole-v1", "discrete"))
    message = str(error.value)
    assert "CartPole-v1" in message and "continuous" in message and "algos/dqn.py" in message
    assert not (tmp_path / "runs").exists()


def test_bad_arguments_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="updates_per_step > 0"):
        ddpg.main(smoke_args("Pendulum-v1", "bad", updates_per_step=0.0))


def test_configs_load():
    """Each config names its file's env and every value in it reaches the parsed arguments."""
    import yaml

    envs = {"pendulum": "Pendulum-v1", "halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5",
            "walker2d": "Walker2d-v5"}
    paths = sorted((ROOT / "configs" / "ddpg").glob("*.yaml"))
    assert sorted(p.stem for p in paths) == sorted(envs)
    for path in paths:
        args = parse(ddpg, ["--config", str(path)])
        values = yaml.safe_load(path.read_text())
        assert values.pop("algo") == "ddpg" and args.env == envs[path.stem]
        assert {key: getattr(args, key) for key in values} == values
