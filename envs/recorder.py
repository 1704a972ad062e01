"""The one place where a vector-env step becomes stored transitions and episode statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


class EpisodeStats:
    """Per-env running return and length; a finished episode's totals come out once."""

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def update(self, reward: np.ndarray, done: np.ndarray) -> list[tuple[int, float, int]]:
        """Adds one step; returns (env index, return, length) per episode that ended, by env."""
        self.returns += reward
        self.lengths += 1
        if not done.any():  # most steps: nothing to report or reset
            return []
        finished = [(int(i), float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(done)]
        self.returns[done] = 0.0
        self.lengths[done] = 0
        return finished

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The running return and length of each env's episode in progress."""
        return {"returns": torch.from_numpy(self.returns.copy()), "lengths": torch.from_numpy(self.lengths.copy())}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Checks both arrays (shape, dtype) before setting either."""
        returns, lengths = state["returns"], state["lengths"]
        for name, value, like in (("returns", returns, self.returns), ("lengths", lengths, self.lengths)):
            if not isinstance(value, torch.Tensor) or value.shape != like.shape or value.numpy().dtype != like.dtype:
                raise ValueError(f"EpisodeStats {name}: expected a {like.dtype} tensor of shape {like.shape}")
        self.returns = returns.numpy().copy()
        self.lengths = lengths.numpy().copy()


def real_next_obs(next_obs: np.ndarray, done: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """`next_obs` with the reset observations of ended episodes replaced by their final ones.

    Works for both final_obs layouts: gymnasium's object array (rows None where not done) and
    ale-py's dense array (rows meaningless where not done); only `done` rows are read.
    """
    if not done.any():
        return next_obs
    out = next_obs.copy()  # the caller keeps the reset observations as its next `obs`
    for i in np.flatnonzero(done):
        out[i] = info["final_obs"][i]
    return out


class TransitionRecorder:
    """Turns vector-env steps (SAME_STEP autoreset) into a TensorDict of transitions.

    Invariants, for every row of the returned TensorDict:
    - next_obs belongs to the same episode as obs: where terminated | truncated, next_obs is
      info["final_obs"] (the reset observation is never a next_obs), so a truncated step
      bootstraps from the real final observation;
    - terminated = env termination | info["life_loss"] (a lost life ends the bootstrap,
      not the game);
    - reward is float32, clipped to [-1, 1] if `clip_reward`; episode statistics always use
      the raw reward and count agent steps of the whole game (all lives).

    Tensors share memory with the arrays passed in (no copy): both env paths hand out fresh
    arrays each step (gymnasium SyncVectorEnv copies; ale-py 0.12 allocates new outputs), and
    the replay buffer copies into its own storage. float64 observations become float32.
    """

    def __init__(self, num_envs: int, clip_reward: bool = False) -> None:
        self.num_envs = num_envs
        self.clip_reward = clip_reward
        self.stats = EpisodeStats(num_envs)

    def record(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any],
    ) -> tuple[TensorDict, list[dict[str, Any]]]:
        """Returns the transitions [num_envs] and the episodes that ended this step (return, length, env)."""
        done = terminated | truncated
        finished = [
            {"episodic_return": ret, "episodic_length": length, "env": env}
            for env, ret, length in self.stats.update(reward, done)
        ]
        stored_reward = np.clip(reward, -1.0, 1.0) if self.clip_reward else reward
        stop = terminated | info["life_loss"] if "life_loss" in info else terminated
        transitions = {
            "obs": _obs_tensor(obs),
            "action": torch.from_numpy(np.asarray(action)),  # from_numpy: a third of as_tensor's cost, per env step
            "reward": torch.from_numpy(np.asarray(stored_reward, dtype=np.float32)),
            "next_obs": _obs_tensor(real_next_obs(next_obs, done, info)),
            "terminated": torch.from_numpy(np.asarray(stop, dtype=bool)),
            "truncated": torch.from_numpy(np.asarray(truncated, dtype=bool)),
        }
        return _tensordict(transitions, self.num_envs), finished

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The episode statistics in progress (running returns and lengths per env)."""
        return self.stats.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.stats.load_state_dict(state)


def _obs_tensor(obs: np.ndarray) -> torch.Tensor:
    # float64 vector observations would double replay memory and mismatch float32 networks
    if obs.dtype == np.float64:
        obs = obs.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(obs))


def _tensordict(values: dict[str, torch.Tensor], size: int) -> TensorDict:
    """TensorDict(values, [size]) for CPU tensors known to have that batch size; once per env step, so
    TensorDict._new_unsafe (no checks: 3-5x cheaper) where this tensordict version has it."""
    new_unsafe = getattr(TensorDict, "_new_unsafe", None)
    if new_unsafe is None:
        return TensorDict(values, batch_size=[size])
    return new_unsafe(values, batch_size=torch.Size([size]))
