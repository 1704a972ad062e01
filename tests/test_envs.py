"""Tests for envs: transition integrity, Atari preprocessing and life loss, seeding, evaluation."""

from __future__ import annotations

import os
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from envs import TransitionRecorder, env_state, evaluate, is_atari, load_env_state, make_vector_env
from envs.make import ATARI_SETTINGS, LifeLossInfo, atari_settings
from tests.probe_env import image_pixel

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
                step.append({"episodic_return": ret[i], "episodic_length": length[i], "env": i})
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
    # Pong's raw rewards are already -1, 0 or 1: reward clipping is tested on Space Invaders below.


def test_reward_clipping_keeps_raw_episode_stats():
    rec = TransitionRecorder(1, clip_reward=True)
    obs = np.zeros((1, 2), np.float32)
    f = np.array([False])
    td1, done1 = rec.record(obs, np.array([0]), np.array([21.0]), obs, f, f, {})
    final = {"final_obs": np.ones((1, 2), np.float32)}
    td2, done2 = rec.record(obs, np.array([0]), np.array([-5.0]), obs, np.array([True]), f, final)
    assert td1["reward"].tolist() == [1.0] and td2["reward"].tolist() == [-1.0]
    assert done1 == [] and done2 == [{"episodic_return": 16.0, "episodic_length": 2, "env": 0}]
    assert td2["next_obs"].tolist() == [[1.0, 1.0]] and td2["terminated"].tolist() == [True]


def test_atari_reward_clipping_on_a_game_with_big_rewards():
    """Space Invaders pays 5 to 30 points an alien: stored rewards are their sign, statistics are raw."""
    env = make_vector_env("SpaceInvadersNoFrameskip-v4", 2, seed=0)
    rec = TransitionRecorder(2, clip_reward=True)
    obs, _ = env.reset(seed=0)
    raw, stored = [], []
    for _ in range(150):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, info = env.step(action)
        td, finished = rec.record(obs, action, reward, next_obs, terminated, truncated, info)
        assert not (terminated | truncated).any() and finished == []  # one game each: running totals below
        raw.append(reward)
        stored.append(td["reward"].numpy())
        obs = next_obs
    env.close()
    raw, stored = np.array(raw), np.array(stored)
    assert raw.max() > 1
    assert stored.dtype == np.float32 and np.array_equal(stored, np.sign(raw))
    assert np.array_equal(rec.state_dict()["returns"].numpy(), raw.sum(0))  # the game score, unclipped


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
            [{"episodic_return": ret[i], "episodic_length": length[i], "env": i} for i in np.flatnonzero(over)]
        )
        ret[over], length[over] = 0, 0
    assert finished == expected
    whole_game = [ep["episodic_length"] for step in finished for ep in step]
    assert min(whole_game) > 50  # a game of 5 lives, not the length of one life

    _, _, raw = run("BreakoutNoFrameskip-v4", 1, 5, training=False)
    assert "life_loss" not in raw[0][4]


class ScriptedLives(gym.vector.VectorEnv):
    """A vector env that plays back (lives, terminated, truncated) rows as ale-py reports them.

    As in ale-py's SAME_STEP mode, a row where an episode ends already carries the new game's lives.
    """

    def __init__(self, start_lives: list[int], rows: list[tuple[list[int], list[bool], list[bool]]]) -> None:
        self.num_envs = len(start_lives)
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.start_lives = np.array(start_lives)
        self.rows = iter(rows)

    def reset(self, **kwargs):
        return np.zeros((self.num_envs, 1), np.float32), {"lives": self.start_lives.copy()}

    def step(self, actions):
        lives, terminated, truncated = next(self.rows)
        zeros = np.zeros(self.num_envs)
        return zeros[:, None], zeros, np.array(terminated), np.array(truncated), {"lives": np.array(lives)}


def life_losses(start_lives, rows) -> list[list[bool]]:
    env = LifeLossInfo(ScriptedLives(start_lives, rows))
    env.reset()
    return [env.step(np.zeros(len(start_lives), np.int64))[4]["life_loss"].tolist() for _ in rows]


def test_life_loss_at_game_over_truncation_and_after_reset():
    # env 0: a bonus life (3 -> 4), then game over: the new game's 3 are fewer lives than before.
    # env 1: the same at a truncation; then a loss on the first step of the new game.
    # env 2: a loss on the very first step after the reset, and on the first step of its 2nd game.
    rows = [
        ([4, 4, 2], [False, False, False], [False, False, False]),
        ([3, 3, 2], [True, False, False], [False, True, False]),
        ([2, 2, 1], [False, False, False], [False, False, False]),
        ([2, 2, 3], [False, False, True], [False, False, False]),
        ([2, 2, 2], [False, False, False], [False, False, False]),
    ]
    assert life_losses([3, 3, 3], rows) == [
        [False, False, True],
        [False, False, False],  # game over / truncation with fewer lives than before: not a life loss
        [True, True, True],  # the first step of a new game compares with that game's start
        [False, False, False],
        [False, False, True],
    ]


@st.composite
def scripted_games(draw):
    """Random games: per step and env a life lost, a bonus life, a game over, a truncation or nothing.

    Returns (start lives, rows for ScriptedLives, the expected life_loss per step) where the
    expectation comes from the script itself: True exactly where a life was lost in a game going on.
    """
    num_envs = draw(st.integers(1, 3))
    start = draw(st.lists(st.integers(1, 5), min_size=num_envs, max_size=num_envs))
    steps = draw(st.integers(1, 30))
    events = draw(st.lists(st.lists(st.sampled_from("-+.GT"), min_size=num_envs, max_size=num_envs),
                           min_size=steps, max_size=steps))
    lives, rows, expected = list(start), [], []
    for row in events:
        terminated, truncated, lost = [], [], []
        for i, event in enumerate(row):
            if event == "-" and lives[i] == 1:
                event = "G"  # the last life lost is a game over
            lost.append(event == "-")
            lives[i] = {"-": lives[i] - 1, "+": lives[i] + 1, ".": lives[i]}.get(event, start[i])
            terminated.append(event == "G")
            truncated.append(event == "T")
        rows.append((list(lives), terminated, truncated))
        expected.append(lost)
    return start, rows, expected


@settings(max_examples=200, deadline=None)
@given(scripted_games())
def test_life_loss_is_exactly_the_lives_lost_in_a_game_going_on(game):
    start, rows, expected = game
    assert life_losses(start, rows) == expected


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


def test_atari_ids_keep_their_registry_settings(monkeypatch):
    import ale_py.vector_env

    made = {}
    real = ale_py.vector_env.AtariVectorEnv

    def recording(game, num_envs, **kwargs):
        made[game] = kwargs
        return real(game, num_envs, **kwargs)

    monkeypatch.setattr(ale_py.vector_env, "AtariVectorEnv", recording)
    preprocessing = {k: v for k, v in ATARI_SETTINGS.items() if k != "frameskip"}
    for env_id, game, sticky in [("PongNoFrameskip-v4", "pong", 0.0), ("ALE/Breakout-v5", "breakout", 0.25)]:
        make_vector_env(env_id, 1).close()
        assert made[game] == {
            **preprocessing,
            "frameskip": 4,  # NoFrameskip: the preprocessing's 4; v5: its own 4
            "repeat_action_probability": sticky,  # v5 keeps Machado et al.'s sticky actions
            "full_action_space": False,
            "max_num_frames_per_episode": 108_000,
            "num_threads": 1,
        }, env_id
    make_vector_env("ALE/Breakout-v5", 1, repeat_action_probability=0.0, noop_max=0).close()
    assert made["breakout"]["repeat_action_probability"] == 0.0 and made["breakout"]["noop_max"] == 0
    assert atari_settings("ALE/Pong-v5")["repeat_action_probability"] == 0.25
    with pytest.raises(ValueError, match="random number of frames.*PongNoFrameskip-v4.*ALE/Pong-v5"):
        make_vector_env("Pong-v4")
    with pytest.raises(ValueError, match="not an Atari id"):
        atari_settings("CartPole-v1")


def test_channels_last_images_are_transposed():
    env = make_vector_env("tests.probe_env:Image-v0", 2, seed=0)
    assert env.single_observation_space.shape == (3, 6, 5) and env.observation_space.shape == (2, 3, 6, 5)
    c, h, w = np.indices((3, 6, 5))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 3, 6, 5) and np.array_equal(obs[1], image_pixel(h, w, c, 0))
    for t in (1, 2, 3):
        obs, _, terminated, _, info = env.step(env.action_space.sample())
        assert np.array_equal(obs[0], image_pixel(h, w, c, 0 if terminated[0] else t))
    assert terminated.all()
    assert all(np.array_equal(info["final_obs"][i], image_pixel(h, w, c, 3)) for i in range(2))
    assert env.single_observation_space.contains(obs[0])
    env.close()
    # One channel (grayscale kept as (H, W, 1)) is channels-last too.
    env = make_vector_env("tests.probe_env:Image-v0", 1, shape=(6, 5, 1))
    assert env.single_observation_space.shape == (1, 6, 5)
    assert np.array_equal(env.reset(seed=0)[0][0], image_pixel(*np.indices((6, 5, 1)), 0).transpose(2, 0, 1))
    env.close()
    # Already channels-first (last axis longer than 4): left as it is.
    env = make_vector_env("tests.probe_env:Image-v0", 1, shape=(3, 6, 5))
    assert env.single_observation_space.shape == (3, 6, 5)
    assert np.array_equal(env.reset(seed=0)[0][0], image_pixel(*np.indices((3, 6, 5)), 0))
    env.close()


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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the mirror that films the episode must not leave it
        returns = evaluate("CartPole-v1", zeros_policy, 1, seed=1, video_dir=str(video_dir))
    frames = imageio.mimread(video_dir / "eval-episode-0.mp4")
    assert len(frames) == returns[0] + 1  # the first state and one after each step, the terminal one included
    assert frames[0].shape == (400, 600, 3)
    # the pole falls: the last frame (the terminal state) differs from the one before it
    assert np.abs(frames[-1].astype(int) - frames[-2].astype(int)).sum() > 0


def test_evaluate_plays_a_fixed_share_per_env():
    """Sub-env 0 plays 2-step episodes, sub-env 1 20-step ones: "the first 4 to end" would be all 2s."""
    returns = evaluate("tests.probe_env:Lengths-v0", zeros_policy, 4, seed=0, num_envs=2)
    assert returns == [2.0, 2.0, 20.0, 20.0]
    assert evaluate("tests.probe_env:Lengths-v0", zeros_policy, 5, seed=0, num_envs=2) == [2.0] * 3 + [20.0] * 2


def test_evaluate_caps_episodes_and_resets_the_capped_env():
    seen = []

    def watching(obs):
        seen.append(obs[:, 0].copy())  # obs = (t,)
        return zeros_policy(obs)

    returns = evaluate("tests.probe_env:Lengths-v0", watching, 4, seed=0, num_envs=2, max_episode_steps=10)
    assert returns == [2.0, 2.0, 10.0, 10.0]  # env 1's 20-step episodes are cut at 10 steps and count as ended
    assert [t[1] for t in seen] == list(range(10)) * 2  # after the cap, env 1 starts a new episode
    with pytest.raises(ValueError, match="max_episode_steps"):
        evaluate("CartPole-v1", zeros_policy, 1, seed=0, max_episode_steps=0)


def test_evaluate_caps_atari_episodes_by_default(monkeypatch):
    """A policy that never presses FIRE stalls Breakout: the default Atari cap ends its episodes."""
    monkeypatch.setattr(sys.modules["envs.evaluate"], "ATARI_MAX_EPISODE_STEPS", 100)  # 27,000 by default
    calls = []

    def noop(obs):
        calls.append(len(obs))
        return np.zeros(len(obs), dtype=np.int64)

    returns = evaluate("BreakoutNoFrameskip-v4", noop, 3, seed=0, num_envs=2)
    assert len(returns) == 3 and len(calls) == 200  # env 0 plays two capped episodes, env 1 one

    rng = np.random.default_rng(0)
    fire = 1  # an epsilon-greedy policy (epsilon 0.05) whose greedy action is FIRE
    epsilon_greedy = lambda obs: np.where(rng.random(len(obs)) < 0.05, rng.integers(0, 6, len(obs)), fire)  # noqa: E731
    first = evaluate("SpaceInvadersNoFrameskip-v4", epsilon_greedy, 3, seed=0, num_envs=2)
    rng = np.random.default_rng(0)
    assert evaluate("SpaceInvadersNoFrameskip-v4", epsilon_greedy, 3, seed=0, num_envs=2) == first
    assert max(first) > 1 and all(r % 5 == 0 for r in first)  # raw game score, not clipped


def test_evaluate_atari_video_shows_the_game_in_colour(tmp_path):
    """The video of an Atari evaluation is the game's screen (210x160, RGB), one frame per agent step from the
    first observation to the terminal one, of the episode whose return is reported (a mirror env that leaves
    it warns, and warnings are errors here). Fails if the video shows the 84x84 grayscale observations."""
    imageio = pytest.importorskip("imageio.v2")
    rng = np.random.default_rng(0)
    policy = lambda obs: rng.integers(0, 4, len(obs))  # noqa: E731  (Breakout: noop, fire, right, left)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        returns = evaluate("BreakoutNoFrameskip-v4", policy, 1, seed=0, video_dir=str(tmp_path))
    assert len(returns) == 1 and returns[0] > 0
    frames = np.stack(imageio.mimread(tmp_path / "eval-episode-0.mp4", memtest=False))
    assert frames.shape[1:] == (210, 160, 3) and len(frames) > 50
    colour = np.abs(frames[..., 0].astype(int) - frames[..., 2].astype(int)).mean()
    assert colour > 1  # grayscale frames have equal channels


def test_mujoco_smoke():
    pytest.importorskip("mujoco")
    tds, _, _ = run("HalfCheetah-v5", 2, 20)
    batch = torch.stack(tds)
    assert batch["obs"].dtype == torch.float32 and batch["obs"].shape == (20, 2, 17)
    assert batch["action"].dtype == torch.float32 and batch["action"].shape == (20, 2, 6)
    assert torch.equal(batch["obs"][1:], batch["next_obs"][:-1])  # no episode ends in 20 steps


def test_cartpole_steps_as_one_array_and_plays_the_episodes_of_gymnasiums_sync_env():
    """make_vector_env("CartPole-v1") steps every env in one numpy call (CartPoleVectorEnv in envs.cartpole's
    SAME_STEP wrapper); with the same seeds and actions it returns, step for step over 3000 steps and about 500
    episode ends, exactly what a SyncVectorEnv of gymnasium's CartPoleEnv returns: observations, rewards,
    terminations, truncations and the final observations (seed 0 for the actions). Env j seeded s plays the same
    whatever the other envs are (a pack's rows), and env_state in the middle continues exactly."""
    from gymnasium.vector import AutoresetMode

    from envs.cartpole import CartPoleArray

    seeds = [1, 2, 3, 1 + 2**20]
    ours = make_vector_env("CartPole-v1", 4, 1)
    assert isinstance(ours, CartPoleArray)
    sync = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    alone = make_vector_env("CartPole-v1", 1, 2)  # env 1 alone, seeded 2
    assert np.array_equal(ours.reset(seed=seeds)[0], sync.reset(seed=seeds)[0])
    alone.reset(seed=2)
    rng, ends = np.random.default_rng(0), 0
    for t in range(3000):
        action = rng.integers(0, 2, 4)
        mine, theirs, lone = ours.step(action), sync.step(action), alone.step(action[1:2])
        for a, b in zip(mine[:4], theirs[:4], strict=True):
            assert np.array_equal(a, b), t
        assert np.array_equal(mine[0][1:2], lone[0]) and mine[2][1] == lone[2][0]
        done = mine[2] | mine[3]
        ends += int(done.sum())
        for i in np.flatnonzero(done):
            assert np.array_equal(mine[4]["final_obs"][i], theirs[4]["final_obs"][i])
        if t == 1500:  # save and continue in a fresh env
            fresh = make_vector_env("CartPole-v1", 4, 1)
            fresh.reset(seed=[9, 9, 9, 9])
            assert load_env_state(fresh, env_state(ours)) is None
            ours = fresh
    assert ends > 400


@pytest.mark.usefixtures("main_in_tmp_path")
def test_a_box2d_env_without_box2d_names_the_extra_to_install(monkeypatch):
    """LunarLander without the Box2D package: one ImportError naming our extra (gymnasium's own message names swig
    and gymnasium[box2d]), which the algorithm files print as a one-line error, with --capture-video too (the
    video's env is made first) and before any run directory is written."""
    import sys

    from tests.algo_utils import load_algo, tiny_args

    monkeypatch.setitem(sys.modules, "Box2D", None)  # `import Box2D` raises ImportError
    for name in [name for name in sys.modules if name.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)
    message = r'LunarLander-v3 needs Box2D, which is not installed: pip install -e "\.\[box2d\]" \(or pip install ' \
        r'box2d\)$'
    with pytest.raises(ImportError, match="^" + message):
        make_vector_env("LunarLander-v3", 1)
    dqn = load_algo("dqn")
    for video in (False, True):
        with pytest.raises(SystemExit, match="^error: " + message):
            dqn.main(tiny_args(dqn, env="LunarLander-v3", capture_video=video))
    assert not os.path.exists("runs")
