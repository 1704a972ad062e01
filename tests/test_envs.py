"""Tests for envs: transition integrity, Atari preprocessing and life loss, seeding, evaluation."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from envs import TransitionRecorder, evaluate, is_atari, make_vector_env

PROBE = "tests.probe_env:Probe-v0"


def run(env_id: str, num_envs: int, steps: int, seed: int = 0, clip_reward: bool = False, **kwargs):
    """Random play through the recorder: (list of step TensorDicts, list of finished, raw steps)."""
    env = make_vector_env(env_id, num_envs, seed, **kwargs)
    rec = TransitionRecorder(num_envs, clip_reward=clip_reward)
    obs, _ = env.reset(seed=seed)
    tds, finished, raw = [], [], []
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, info = env.step(action)
        td, done = rec.record(obs, action, reward, next_obs, terminated, truncated, info)
        tds.append(td)
        finished.append(done)
        raw.append((next_obs, reward, terminated, truncated, info))
        obs = next_obs
    env.close()
    return tds, finished, raw


def probe_errors(td: TensorDict) -> list[str]:
    """Rows of a ProbeEnv batch whose next_obs is not the step after obs in the same episode."""
    obs, next_obs = td["obs"], td["next_obs"]
    ok = (
        (next_obs[:, 0] == obs[:, 0])
        & (next_obs[:, 1] == obs[:, 1])
        & (next_obs[:, 2] == obs[:, 2] + 1)
        & (td["reward"] == next_obs[:, 2])
    )
    return [f"obs {obs[i].tolist()} -> next_obs {next_obs[i].tolist()}" for i in torch.nonzero(~ok).flatten()]


def test_probe_transitions_are_never_cross_episode():
    num_envs, steps = 4, 2000
    tds, finished, _ = run(PROBE, num_envs, steps)
    batch = torch.stack(tds)  # [steps, num_envs]
    assert batch.numel() == steps * num_envs
    assert batch["obs"].dtype == torch.float32 and batch["action"].dtype == torch.int64
    assert probe_errors(batch.reshape(-1)) == []
    assert batch["terminated"].any() and batch["truncated"].any()
    assert not (batch["terminated"] & batch["truncated"]).any()

    # Nothing lost: each row starts where the previous one ended, or at the next episode's reset.
    done = batch["terminated"] | batch["truncated"]
    prev_next, obs = batch["next_obs"][:-1], batch["obs"][1:]
    after_reset = torch.stack([prev_next[..., 0], prev_next[..., 1] + 1, torch.zeros_like(obs[..., 2])], -1)
    expected = torch.where(done[:-1, :, None], after_reset, prev_next)
    assert torch.equal(obs, expected)
    assert len(torch.unique(batch["obs"][..., 0])) == num_envs  # sub-envs are distinct instances

    # Episode statistics, recomputed by brute force from the stored rows.
    expected_finished, ret, length = [], [0.0] * num_envs, [0] * num_envs
    for t in range(steps):
        step = []
        for i in range(num_envs):
            ret[i] += float(batch["reward"][t, i])
            length[i] += 1
            if done[t, i]:
                step.append({"episodic_return": ret[i], "episodic_length": length[i]})
                ret[i], length[i] = 0.0, 0
        expected_finished.append(step)
    assert finished == expected_finished
    first = finished[next(t for t in range(steps) if finished[t])][0]
    assert type(first["episodic_return"]) is float and type(first["episodic_length"]) is int
    assert sum(map(len, finished)) == int(done.sum()) > 100


def test_naive_storage_is_detected_as_corrupt():
    tds, _, raw = run(PROBE, 4, 50)
    naive = [
        td.clone().set("next_obs", torch.from_numpy(next_obs))
        for td, (next_obs, *_) in zip(tds, raw, strict=True)
    ]
    assert probe_errors(torch.cat(naive)) != []
    assert probe_errors(torch.cat(tds)) == []


def test_atari_pong_shapes_and_recording():
    assert is_atari("PongNoFrameskip-v4") and is_atari("ALE/Pong-v5") and not is_atari("CartPole-v1")
    env = make_vector_env("PongNoFrameskip-v4", 2, seed=0)
    assert env.single_action_space.n == 6
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    env.close()
    tds, _, _ = run("PongNoFrameskip-v4", 2, 200, clip_reward=True)
    batch = torch.stack(tds)
    assert batch["obs"].dtype == torch.uint8 and batch["obs"].shape == (200, 2, 4, 84, 84)
    assert batch["action"].dtype == torch.int64
    assert torch.equal(batch["next_obs"][..., :3, :, :], batch["obs"][..., 1:, :, :])  # frame stack shifts
    assert (batch["reward"] != 0).any() and batch["reward"].abs().max() <= 1


def test_reward_clipping_keeps_raw_episode_stats():
    rec = TransitionRecorder(1, clip_reward=True)
    obs = np.zeros((1, 2), np.float32)
    f = np.array([False])
    td1, done1 = rec.record(obs, np.array([0]), np.array([21.0]), obs, f, f, {})
    final = {"final_obs": np.ones((1, 2), np.float32)}
    td2, done2 = rec.record(obs, np.array([0]), np.array([-5.0]), obs, np.array([True]), f, final)
    assert td1["reward"].tolist() == [1.0] and td2["reward"].tolist() == [-1.0]
    assert done1 == [] and done2 == [{"episodic_return": 16.0, "episodic_length": 2}]
    assert td2["next_obs"].tolist() == [[1.0, 1.0]] and td2["terminated"].tolist() == [True]


def test_atari_life_loss_ends_bootstrap_not_episode():
    tds, finished, raw = run("BreakoutNoFrameskip-v4", 2, 400)
    life_loss = np.stack([info["life_loss"] for *_, info in raw])
    game_over = np.stack([te | tr for _, _, te, tr, _ in raw])
    assert life_loss.sum() >= 4 and game_over.sum() >= 1
    for i in range(2):  # Breakout has 5 lives: every complete game loses 4 before its game over
        games = np.split(life_loss[:, i], np.flatnonzero(game_over[:, i]) + 1)[:-1]
        assert [int(g.sum()) for g in games] == [4] * len(games)
    batch = torch.stack(tds)
    assert torch.equal(batch["terminated"], torch.from_numpy(life_loss | np.stack([r[2] for r in raw])))
    assert torch.equal(batch["next_obs"][..., :3, :, :], batch["obs"][..., 1:, :, :])  # incl. game overs

    ret, length, expected = np.zeros(2), np.zeros(2, int), []
    for (_, reward, _, _, _), over in zip(raw, game_over, strict=True):
        ret += reward
        length += 1
        expected.append(
            [{"episodic_return": ret[i], "episodic_length": length[i]} for i in np.flatnonzero(over)]
        )
        ret[over], length[over] = 0, 0
    assert finished == expected
    whole_game = [ep["episodic_length"] for step in finished for ep in step]
    assert min(whole_game) > 50  # a game of 5 lives, not the length of one life

    _, _, raw = run("BreakoutNoFrameskip-v4", 1, 5, training=False)
    assert "life_loss" not in raw[0][4]


@pytest.mark.parametrize(("env_id", "steps"), [("CartPole-v1", 300), ("PongNoFrameskip-v4", 100)])
def test_seeding_reproduces_trajectories(env_id: str, steps: int):
    def trajectory(seed: int) -> TensorDict:
        return torch.stack(run(env_id, 2, steps, seed=seed)[0])

    first, second, other = trajectory(3), trajectory(3), trajectory(4)
    assert (first == second).all()
    assert not torch.equal(first["obs"], other["obs"])
    assert not torch.equal(first["action"], other["action"])


def test_bad_ids_and_num_envs():
    with pytest.raises(ValueError, match="NoSuchEnv-v0.*not registered"):
        make_vector_env("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="no_such_module:Probe-v0.*not registered"):
        make_vector_env("no_such_module:Probe-v0")
    with pytest.raises(ValueError, match="num_envs"):
        make_vector_env("CartPole-v1", 0)
    with pytest.raises(ValueError, match="ALE/NoGame-v5.*not registered") as error:
        make_vector_env("ALE/NoGame-v5")
    assert "extra" not in str(error.value)  # ale-py is installed: no install hint


def test_missing_ale_py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # makes `import ale_py` fail
    with pytest.raises(ValueError, match="ALE/NoGame-v5.*not registered.*`atari` extra"):
        make_vector_env("ALE/NoGame-v5")
    with pytest.raises(ValueError, match="NoSuchEnv-v0.*not registered") as error:
        make_vector_env("NoSuchEnv-v0")
    assert "extra" not in str(error.value)


def test_module_env_id_form():
    env = make_vector_env(PROBE, 3)
    assert env.num_envs == 3 and env.reset(seed=0)[0].shape == (3, 3)
    env.close()


def zeros_policy(obs: np.ndarray) -> np.ndarray:
    return np.zeros(len(obs), dtype=np.int64)


def test_evaluate_cartpole(tmp_path):
    returns = evaluate("CartPole-v1", zeros_policy, 5, seed=1, num_envs=2)
    assert len(returns) == 5 and all(isinstance(r, float) and 5 <= r <= 20 for r in returns)
    assert returns == evaluate("CartPole-v1", zeros_policy, 5, seed=1, num_envs=2)

    pytest.importorskip("pygame")
    imageio = pytest.importorskip("imageio.v2")
    video_dir = tmp_path / "videos"
    returns = evaluate("CartPole-v1", zeros_policy, 1, seed=1, video_dir=str(video_dir))
    frames = imageio.mimread(video_dir / "eval-episode-0.mp4")
    assert len(frames) == returns[0]  # one frame per state before each step (reward 1 per step)
    assert frames[0].shape == (400, 600, 3)


def test_evaluate_atari_video(tmp_path):
    imageio = pytest.importorskip("imageio.v2")
    fire = lambda obs: np.ones(len(obs), dtype=np.int64)  # noqa: E731
    returns = evaluate("BreakoutNoFrameskip-v4", fire, 1, seed=0, video_dir=str(tmp_path))
    assert len(returns) == 1
    frames = imageio.mimread(tmp_path / "eval-episode-0.mp4")
    assert len(frames) > 20 and frames[0].shape[:2] == (84, 84)


def test_mujoco_smoke():
    pytest.importorskip("mujoco")
    tds, _, _ = run("HalfCheetah-v5", 2, 20)
    batch = torch.stack(tds)
    assert batch["obs"].dtype == torch.float32 and batch["obs"].shape == (20, 2, 17)
    assert batch["action"].dtype == torch.float32 and batch["action"].shape == (20, 2, 6)
    assert torch.equal(batch["obs"][1:], batch["next_obs"][:-1])  # no episode ends in 20 steps
