"""Env state for exact resume: a snapshot loaded into a fresh env continues bit for bit."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch

import tests.probe_env  # noqa: F401  (registers the probe envs)
from envs import TransitionRecorder, env_state, load_env_state, make_vector_env

# (id, kwargs): the time limits are short so the continuation crosses truncations too.
FAMILIES = [
    ("CartPole-v1", {"max_episode_steps": 30}),
    ("Pendulum-v1", {"max_episode_steps": 50}),
    ("Acrobot-v1", {"max_episode_steps": 40}),
    ("MountainCarContinuous-v0", {"max_episode_steps": 40}),
    ("HalfCheetah-v5", {"max_episode_steps": 40}),
    ("Hopper-v5", {}),  # random actions topple it (termination) within ~20-60 steps
]


def saved_and_loaded(state: dict[str, Any]) -> dict[str, Any]:
    """`state` through torch.save and torch.load(weights_only=True), as a checkpoint takes it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def continuation(env, actions) -> list[tuple]:
    """(obs, reward, terminated, truncated, final_obs per env or None) for each action."""
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        ended = terminated | truncated
        final = [np.array(info["final_obs"][i]) if ended[i] else None for i in range(env.num_envs)]
        steps.append((obs, reward, terminated, truncated, final))
    return steps


def assert_identical(first: list[tuple], second: list[tuple]) -> None:
    assert len(first) == len(second)
    for t, (a, b) in enumerate(zip(first, second, strict=True)):
        for name, x, y in zip(("obs", "reward", "terminated", "truncated"), a[:4], b[:4], strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), f"step {t}: {name} differs"
        for i, (x, y) in enumerate(zip(a[4], b[4], strict=True)):
            assert (x is None) == (y is None), f"step {t}: env {i} ended in one run only"
            assert x is None or np.array_equal(x, y), f"step {t}: env {i} final_obs differs"


@pytest.mark.parametrize(("env_id", "kwargs"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_loaded_state_continues_bit_for_bit(env_id: str, kwargs: dict[str, Any]):
    if env_id.endswith("-v5"):
        pytest.importorskip("mujoco")
    num_envs, before, after = 3, 25, 120
    env = make_vector_env(env_id, num_envs, seed=1, **kwargs)
    env.reset(seed=1)
    for _ in range(before):  # mid-episode: time-limit counters and generators are under way
        env.step(env.action_space.sample())
    state = saved_and_loaded(env_state(env))

    # The original continues: exploration draws, then the env stepped with them.
    actions = [env.action_space.sample() for _ in range(after)]
    single_draws = [env.single_action_space.sample() for _ in range(5)]
    expected = continuation(env, actions)
    ended = np.array([[x is not None for x in step[4]] for step in expected])
    assert ended.sum() >= 2, "the continuation should cross episode ends"
    if "max_episode_steps" in kwargs:
        assert np.stack([step[3] for step in expected]).any(), "the continuation should cross a truncation"

    # A fresh env with another seed, already played a little, then loaded: all of it is replaced.
    fresh = make_vector_env(env_id, num_envs, seed=7, **kwargs)
    fresh.reset(seed=7)
    for _ in range(3):
        fresh.step(fresh.action_space.sample())
    assert load_env_state(fresh, state) is None  # exact: the caller continues from its saved obs
    replayed_actions = [fresh.action_space.sample() for _ in range(after)]
    assert all(np.array_equal(a, b) for a, b in zip(actions, replayed_actions, strict=True))
    assert all(np.array_equal(a, fresh.single_action_space.sample()) for a in single_draws)
    assert_identical(expected, continuation(fresh, actions))
    env.close()
    fresh.close()


def test_state_is_plain_data_and_reading_it_changes_nothing():
    env = make_vector_env("CartPole-v1", 2, seed=0)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    first = env_state(env)
    second = env_state(env)
    assert_same_state(first, second)
    assert_same_state(first, saved_and_loaded(first))  # weights_only loads it, with no allow-listing

    def plain(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return all(plain(v) for v in value)
        if isinstance(value, dict):
            return all(type(k) is str and plain(v) for k, v in value.items())
        return value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor)

    assert plain(first)


def assert_same_state(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_state(x, y)
    else:
        assert a == b


def played(env_id: str, num_envs: int, seed: int, steps: int = 4, **kwargs: Any):
    env = make_vector_env(env_id, num_envs, seed, **kwargs)
    env.reset(seed=seed)
    for _ in range(steps):
        env.step(env.action_space.sample())
    return env


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (lambda: played("Acrobot-v1", 2, 5), "env_id is 'CartPole-v1' in the state and 'Acrobot-v1' here"),
        (lambda: played("CartPole-v1", 3, 5), "num_envs is 2 in the state and 3 here"),
        (lambda: played("CartPole-v1", 2, 5, training=False), None),  # same layers: accepted
    ],
)
def test_mismatched_state_is_refused_and_changes_nothing(target, message):
    state = saved_and_loaded(env_state(played("CartPole-v1", 2, 0)))
    env = target()
    before = env_state(env)
    if message is None:
        load_env_state(env, state)
        assert_same_state(env_state(env), state)
        return
    with pytest.raises(ValueError, match=message):
        load_env_state(env, state)
    assert_same_state(env_state(env), before)


def test_other_spaces_are_refused():
    state = env_state(played("tests.probe_env:Image-v0", 2, 0))
    for kwargs, name in [({"shape": (6, 4, 3)}, "observation_space"), ({"actions": 3}, "action_space")]:
        env = played("tests.probe_env:Image-v0", 2, 1, **kwargs)
        before = env_state(env)
        with pytest.raises(ValueError, match=f"{name} is 'Box|{name} is 'Discrete"):
            load_env_state(env, state)
        assert_same_state(env_state(env), before)


def test_a_bad_value_deep_inside_changes_nothing():
    """Every value is decoded before the first is set: a bad last one leaves the env as it was."""
    state = saved_and_loaded(env_state(played("Acrobot-v1", 2, 0)))  # a SyncVectorEnv of AcrobotEnv
    state["sub_envs"][-1][-1]["attrs"]["state"] = ("ndarray", "not a tensor")
    env = played("Acrobot-v1", 2, 3)
    before = env_state(env)
    with pytest.raises(ValueError, match="sub-env 1 AcrobotEnv.state: malformed"):
        load_env_state(env, state)
    assert_same_state(env_state(env), before)
    state["sub_envs"][-1][-1]["type"] = "CartPoleEnv"
    with pytest.raises(ValueError, match="sub-env 1 AcrobotEnv was a CartPoleEnv"):
        load_env_state(env, state)
    assert_same_state(env_state(env), before)


def test_atari_resets_deterministically_and_keeps_exploration():
    """ale-py's vector env cannot restore emulators: the state reseeds them, the same way every time."""
    env = played("BreakoutNoFrameskip-v4", 2, 3, steps=30)
    state = saved_and_loaded(env_state(env))
    assert state["exact"] is False
    # The reset seed is a function of the run: the same run gives the same state.
    assert_same_state(env_state(played("BreakoutNoFrameskip-v4", 2, 3, steps=30)), state)
    draws = [env.action_space.sample() for _ in range(20)]
    actions = [np.array([1, 3]), *draws]

    runs = []
    for seed in (8, 9):
        fresh = make_vector_env("BreakoutNoFrameskip-v4", 2, seed=seed)
        obs = load_env_state(fresh, state)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert all(np.array_equal(d, fresh.action_space.sample()) for d in draws)  # exploration continues
        runs.append((obs, continuation(fresh, actions)))
        fresh.close()
    assert np.array_equal(runs[0][0], runs[1][0])
    assert_identical(runs[0][1], runs[1][1])

    with pytest.raises(ValueError, match="vector_layers"):  # an evaluation env has no LifeLossInfo
        load_env_state(make_vector_env("BreakoutNoFrameskip-v4", 2, training=False), state)
    with pytest.raises(ValueError, match="env_id is 'BreakoutNoFrameskip-v4' in the state and 'CartPole-v1'"):
        load_env_state(make_vector_env("CartPole-v1", 2), state)


def test_recorder_state_continues_episode_statistics():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(60, 3)) * 10
    ended = rng.random((60, 3)) < 0.1
    obs = np.zeros((3, 2), np.float32)
    info = {"final_obs": np.zeros((3, 2), np.float32)}

    def feed(recorder: TransitionRecorder, steps: range) -> list:
        no = np.zeros(3, bool)
        return [recorder.record(obs, np.zeros(3), rewards[t], obs, ended[t], no, info)[1] for t in steps]

    original = TransitionRecorder(3, clip_reward=True)
    feed(original, range(30))
    state = saved_and_loaded(original.state_dict())
    resumed = TransitionRecorder(3, clip_reward=True)
    resumed.load_state_dict(state)
    expected, got = feed(original, range(30, 60)), feed(resumed, range(30, 60))
    assert got == expected and any(got)
    # The running totals matter: a fresh recorder reports other first returns.
    assert feed(TransitionRecorder(3), range(30, 60)) != expected

    wrong = {"returns": torch.zeros(2, dtype=torch.float64), "lengths": torch.zeros(2, dtype=torch.int64)}
    with pytest.raises(ValueError, match="returns: expected a float64 tensor of shape"):
        resumed.load_state_dict(wrong)
    assert resumed.state_dict()["returns"].shape == (3,)
