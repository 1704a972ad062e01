"""n-step returns folded at write time, per environment.

A transition that starts at step t and covers m <= n steps of one episode is stored as
    reward     = sum_{k<m} gamma**k r_{t+k}
    next_obs   = the observation after step t+m-1 (the real final one at an episode end)
    terminated = whether the episode terminated at step t+m-1
    discount   = 0 if terminated else gamma**m
so every algorithm's target is reward + discount * V(next_obs). Windows never cross an episode
end: when an environment's episode ends (terminated or truncated), every window still pending
for it is emitted with its shorter m. Truncation keeps discount = gamma**m, so the target
bootstraps from the real final observation; termination does not bootstrap.

Many seeds (num_seeds=N): the N * E envs of a vector env laid out seed by seed (seed i's E envs in rows
i * E ...) are folded together, each env on its own as always; with n > 1 each emitted transition says its
seed in a "seed" entry, which ReplayBuffer(num_seeds=N).extend reads (n = 1 emits every env's step, seed by
seed, and needs none). Seed i's transitions, in order, are what NStepReturns(n, gamma, E) emits for its envs.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

REQUIRED = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
END_KEYS = ("next_obs", "terminated", "truncated")  # taken from a window's last step


class NStepReturns:
    """Keeps the last n steps of each environment and emits n-step transitions as they finish."""

    def __init__(self, n: int, gamma: float | torch.Tensor, num_envs: int, num_seeds: int = 1):
        """gamma: one for all seeds, or one per seed ([num_seeds, 1]: a pack whose members differ in it)."""
        if int(n) < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not ((torch.as_tensor(gamma) >= 0.0) & (torch.as_tensor(gamma) <= 1.0)).all():
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if int(num_seeds) < 1:
            raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
        self.n, self.num_seeds = int(n), int(num_seeds)
        self.gamma = float(gamma) if torch.as_tensor(gamma).numel() == 1 else torch.as_tensor(gamma).view(-1).tolist()
        self.num_envs = int(num_envs) * self.num_seeds  # all seeds' envs
        self.ring: TensorDict | None = None  # [n, num_envs]: start-of-window keys of the last n steps
        self.age = torch.zeros(self.num_envs, dtype=torch.int64)  # current-episode steps in the ring
        self.t = 0  # steps pushed; step t sits in ring row t % n
        # The one-step discount, as stored (float32); one per env row, seed by seed, when the seeds' gammas differ.
        self._gamma32 = torch.tensor(self.gamma, dtype=torch.float32)
        if isinstance(self.gamma, list):
            self._gamma32 = self._gamma32.repeat_interleave(self.num_envs // self.num_seeds)

    def push(self, step: TensorDict) -> TensorDict:
        """Add one vector-env step (batch [num_envs], many seeds: [num_seeds * num_envs]); return the transitions
        that finished with it."""
        missing = [key for key in REQUIRED if key not in step.keys()]  # noqa: SIM118 (TensorDict)
        if missing:
            raise ValueError(f"step is missing keys {missing}; it needs {list(REQUIRED)}")
        if tuple(step.batch_size) != (self.num_envs,):
            raise ValueError(f"step has batch size {tuple(step.batch_size)}, expected ({self.num_envs},)")
        if step.device is None or step.device.type != "cpu":
            step = step.to("cpu")
        if self.n == 1:  # every step is a finished one-step window: no ring needed
            ready = step.copy()
            ready["discount"] = torch.where(step["terminated"].bool(), 0.0, self._gamma32)
            self.t += 1
            return ready
        start = step.exclude(*END_KEYS)
        if self.ring is None:
            self.ring = start.unsqueeze(0).expand(self.n, self.num_envs).clone()
        self.ring[self.t % self.n] = start
        self.age = (self.age + 1).clamp_(max=self.n)

        # returns[m-1, e]: folded reward of env e's window of length m that ends at this step.
        rewards = self.ring["reward"]
        returns = torch.empty_like(rewards)
        folded = torch.zeros_like(rewards[0])
        for m in range(1, self.n + 1):
            folded = rewards[(self.t - m + 1) % self.n] + self._gamma32 * folded  # (a float times float32: these bits)
            returns[m - 1] = folded

        terminated, truncated = step["terminated"].bool(), step["truncated"].bool()
        done = terminated | truncated
        length = torch.arange(1, self.n + 1).unsqueeze(1)  # [n, 1]
        emit = (length <= self.age) & (done | (length == self.n))
        row, env = emit.nonzero(as_tuple=True)
        slot = (self.t - row) % self.n
        ready = self.ring.apply(lambda x: x[slot, env], batch_size=[row.numel()])
        ready["reward"] = returns[row, env]
        for key in END_KEYS:
            ready[key] = step[key][env]
        discount = self._gamma32.expand(self.num_envs)[env].pow(row + 1)
        ready["discount"] = torch.where(terminated[env], 0.0, discount)
        if self.num_seeds > 1:
            ready["seed"] = env.div(self.num_envs // self.num_seeds, rounding_mode="floor")

        self.age[done] = 0
        self.t += 1
        return ready

    def state_dict(self) -> dict:
        """The windows in flight: the ring of the last n steps, each env's episode age and the step count."""
        return {"n": self.n, "gamma": self.gamma, "num_envs": self.num_envs, "num_seeds": self.num_seeds, "t": self.t,
                "age": self.age.clone(),
                "ring": None if self.ring is None else self.ring.to_dict()}

    def members_state(self, state: dict, rows: list[int]) -> dict:
        """A state of these windows for a pack of seeds cut to the seeds `rows`, for this object (built for
        len(rows) seeds, with their gammas): each kept seed's env columns of the ring and ages, in order."""
        envs = state["num_envs"] // state.get("num_seeds", 1)
        index = torch.tensor([i * envs + j for i in rows for j in range(envs)])
        ring = state["ring"] and {key: value.index_select(1, index) for key, value in state["ring"].items()}
        return {**state, "gamma": self.gamma, "num_envs": self.num_envs, "num_seeds": self.num_seeds, "ring": ring,
                "age": state["age"].index_select(0, index)}

    def load_state_dict(self, state: dict) -> None:
        saved = (state["n"], state["gamma"], state["num_envs"], state.get("num_seeds", 1))
        if saved != (self.n, self.gamma, self.num_envs, self.num_seeds):
            raise ValueError(f"state is for n, gamma, envs, seeds = {saved}; this has "
                             f"{(self.n, self.gamma, self.num_envs, self.num_seeds)}")
        ring = state["ring"]
        self.ring = None if ring is None else TensorDict(ring, batch_size=[self.n, self.num_envs]).clone()
        self.age, self.t = state["age"].clone(), int(state["t"])
