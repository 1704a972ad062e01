"""ProbeEnv: observations that say which episode and step they come from.

obs = (instance, episode, t) as float32: `instance` is unique per env object, `episode` counts
its resets and `t` its steps in the episode. reward = t after the step, so a transition is
checkable from its own row. Episodes last 1-8 steps and end by termination or truncation at
random (drawn from `np_random`, so seeding works). Importing this module registers "Probe-v0",
which makes `make_vector_env("tests.probe_env:Probe-v0")` work.

More probes: "Lengths-v0" (episode length set by the sub-env's index), "Image-v0" (channels-last
uint8 images whose pixels say where they are) and "ContinuousProbe-v0" (ProbeEnv with Box actions).
"""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np


class ProbeEnv(gym.Env[np.ndarray, np.int64]):
    observation_space = gym.spaces.Box(0.0, np.inf, shape=(3,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)
    _instances = itertools.count()

    def __init__(self) -> None:
        self.instance = next(self._instances)
        self.episode = -1
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.instance, self.episode, self.t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.length = int(self.np_random.integers(1, 9))
        self.truncates = bool(self.np_random.random() < 0.5)
        return self._obs(), {}

    def step(self, action: np.int64):
        assert self.action_space.contains(action)
        self.t += 1
        end = self.t == self.length
        return self._obs(), float(self.t), end and not self.truncates, end and self.truncates, {}


gym.register(id="Probe-v0", entry_point=ProbeEnv)


class LengthsEnv(gym.Env[np.ndarray, np.int64]):
    """Episodes of a fixed length chosen by the sub-env: `lengths[seed % len(lengths)]`.

    A vector env seeds sub-env i with seed + i, so with `reset(seed=0)` sub-env i plays episodes
    of lengths[i % len(lengths)] steps. Reward 1 per step (a return is the episode's length),
    then termination; obs = (t,).
    """

    observation_space = gym.spaces.Box(0.0, np.inf, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, lengths: tuple[int, ...] = (2, 20)) -> None:
        self.lengths = lengths
        self.length = lengths[0]
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.length = self.lengths[seed % len(self.lengths)]
        self.t = 0
        return np.array([self.t], dtype=np.float32), {}

    def step(self, action: np.int64):
        self.t += 1
        return np.array([self.t], dtype=np.float32), 1.0, self.t == self.length, False, {}


def image_pixel(h: np.ndarray, w: np.ndarray, c: np.ndarray, t: int) -> np.ndarray:
    """ImageEnv's pixel (h, w, c) at step t: each position of a frame has its own value."""
    return ((h * 31 + w * 7 + c * 3 + t * 11) % 251).astype(np.uint8)


class ImageEnv(gym.Env[np.ndarray, np.int64]):
    """uint8 images laid out (H, W, C), pixel (h, w, c) = image_pixel(h, w, c, t); episodes of 3 steps."""

    def __init__(self, shape: tuple[int, int, int] = (6, 5, 3), actions: int = 2) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(actions)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return image_pixel(*np.indices(self.observation_space.shape), self.t)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.int64):
        self.t += 1
        return self._obs(), 0.0, self.t == 3, False, {}


gym.register(id="Lengths-v0", entry_point=LengthsEnv)
gym.register(id="Image-v0", entry_point=ImageEnv)


class ContinuousProbeEnv(ProbeEnv):
    """ProbeEnv with continuous actions: the same observations (instance, episode, t), rewards (t after
    the step) and random episode ends (1-8 steps, terminated or truncated), and a Box action space
    x in [-2, 2], y in [0, 1] (asymmetric, so that a centred or symmetric bound is wrong). Actions are
    not checked, so a test can see one outside the box instead of an error from inside the env.
    """

    action_space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))

    def step(self, action: np.ndarray):
        self.t += 1
        end = self.t == self.length
        return self._obs(), float(self.t), end and not self.truncates, end and self.truncates, {}


gym.register(id="ContinuousProbe-v0", entry_point=ContinuousProbeEnv)
