"""ProbeEnv: observations that say which episode and step they come from.

obs = (instance, episode, t) as float32: `instance` is unique per env object, `episode` counts
its resets and `t` its steps in the episode. reward = t after the step, so a transition is
checkable from its own row. Episodes last 1-8 steps and end by termination or truncation at
random (drawn from `np_random`, so seeding works). Importing this module registers "Probe-v0",
which makes `make_vector_env("tests.probe_env:Probe-v0")` work.
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
