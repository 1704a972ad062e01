"""CartPole as one numpy array of environments: gymnasium's CartPoleVectorEnv steps every env in one call, and
this wrapper gives it what the algorithms need from a vector env.

- SAME_STEP autoreset: an env whose episode ended is reset within the step that ended it; the step returns its
  reset observation and puts the real final one in info["final_obs"] (dense, valid in the rows where
  terminated | truncated, as ale-py's vector env does), so envs.TransitionRecorder stores clean transitions.
- A generator per env: env i reset with seed s draws its starts from np.random.default_rng(s), the generator
  gymnasium's own CartPoleEnv seeds with s. So env i plays the same episodes whatever vector env it is part of
  (a run's E envs or a pack's N x E), and the same as gymnasium's SyncVectorEnv of CartPoleEnv with the same
  seeds: the dynamics are the same float64 formulas (tests/test_envs.py compares the two step for step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorWrapper

START = 0.05  # an episode starts from a state drawn uniformly from [-START, START]^4, as CartPoleEnv's


class CartPoleArray(VectorWrapper):
    """gymnasium.envs.classic_control.cartpole.CartPoleVectorEnv with SAME_STEP autoreset and a generator per env."""

    def __init__(self, env):
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
        self.rngs = [np.random.default_rng() for _ in range(self.num_envs)]

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        """Reset every env (options={"reset_mask": mask}: those where mask is True), env i from its generator:
        seeded seed + i (an int) or seed[i] (a list), or continuing its stream (None)."""
        if seed is not None:
            seeds = [int(seed) + i for i in range(self.num_envs)] if np.isscalar(seed) else [int(s) for s in seed]
            if len(seeds) != self.num_envs:
                raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} envs")
            self.rngs = [np.random.default_rng(s) for s in seeds]
        env = self.env.unwrapped
        if env.state is None:  # the first reset: the inner env's arrays, then every env's start from its generator
            self.env.reset()
        mask = np.ones(self.num_envs, dtype=bool) if options is None or "reset_mask" not in options \
            else np.asarray(options["reset_mask"], dtype=bool)
        self._restart(mask)
        return env.state.T.astype(np.float32), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = terminated | truncated
        if done.any():
            info = {**info, "final_obs": obs, "_final_obs": done}
            self._restart(done)
            obs = self.env.unwrapped.state.T.astype(np.float32)
        return obs, reward, terminated, truncated, info

    def _restart(self, mask: np.ndarray) -> None:
        """New episodes in the envs where mask is True; the inner env's own (NEXT_STEP) autoreset never fires."""
        env = self.env.unwrapped
        for i in np.flatnonzero(mask):
            env.state[:, i] = self.rngs[i].uniform(low=-START, high=START, size=(4,))
        env.steps[mask] = 0
        env.prev_done[:] = False
