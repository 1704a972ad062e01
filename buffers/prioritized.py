"""Proportional prioritized replay (Schaul et al. 2016) on a vectorised float64 sum tree.

Invariants kept here (tests/test_prioritized.py checks each):
- The stored priority of an item is (|p| + eps) ** alpha; P(i) = stored_i / total.
- New items get the largest stored priority seen so far (1.0 at the start).
- Every internal node is recomputed from its two children on each update, never adjusted by
  a difference, so the tree cannot drift; float64 keeps items reachable at 1M capacity.
- Sampling is stratified: [0, total) is cut into batch_size equal segments, one draw in each.
- weight_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta = (stored_i / min_j stored_j) ** -beta,
  with the minimum over the whole buffer (a min tree keeps it), so weights lie in (0, 1].
- A priority update for an index whose slot was overwritten since is ignored; when one update
  names an index twice, the last value wins.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from buffers.replay import ReplayBuffer


class SegmentTree:
    """A complete binary tree over `capacity` leaves held in one tensor.

    Node 1 is the root, node i has children 2i and 2i+1, and leaf j is node size + j, where size
    is the next power of two >= capacity. Unused leaves hold the identity of `op`.
    """

    def __init__(self, capacity: int, op: str, device: torch.device):
        if op not in ("sum", "min"):
            raise ValueError(f"op must be 'sum' or 'min', got {op!r}")
        self.size = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.combine = torch.add if op == "sum" else torch.minimum
        fill = 0.0 if op == "sum" else float("inf")
        self.nodes = torch.full((2 * self.size,), fill, dtype=torch.float64, device=device)

    @property
    def root(self) -> torch.Tensor:
        return self.nodes[1]

    def leaves(self, slots: torch.Tensor) -> torch.Tensor:
        return self.nodes[self.size + slots]

    def update(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves (slots must be unique), then recompute their ancestors level by level.

        Two slots may share a parent; both writes then store the same value, read from the
        already-final children, so no de-duplication is needed above the leaves.
        """
        node = self.size + slots
        self.nodes[node] = values
        for _ in range(self.depth):
            node = node // 2
            self.nodes[node] = self.combine(self.nodes[2 * node], self.nodes[2 * node + 1])

    def find_prefix(self, mass: torch.Tensor) -> torch.Tensor:
        """For each mass in [0, root), the leaf j with sum(leaves[:j]) <= mass < sum(leaves[:j+1])."""
        node = torch.ones_like(mass, dtype=torch.int64)
        for _ in range(self.depth):
            left = self.nodes[2 * node]
            go_right = mass >= left
            mass = torch.where(go_right, mass - left, mass)
            node = 2 * node + go_right
        return node - self.size


class PrioritizedReplayBuffer(ReplayBuffer):
    """ReplayBuffer whose `sample` draws proportionally to priority and adds "weight"."""

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        device: str | torch.device = "cpu",
        seed: int | None = None,
    ):
        super().__init__(capacity, device, seed)
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0 (it keeps every item sampleable), got {eps}")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.beta = beta
        self.sum_tree = SegmentTree(self.capacity, "sum", self.device)
        self.min_tree = SegmentTree(self.capacity, "min", self.device)
        # A tensor, not a float, so that writing and updating never wait for the GPU.
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"beta must be >= 0, got {value}")
        self._beta = float(value)

    def _on_write(self, slots: torch.Tensor) -> None:
        priority = self.max_priority.expand(slots.shape)
        self.sum_tree.update(slots, priority)
        self.min_tree.update(slots, priority)

    def sample(self, batch_size: int) -> TensorDict:
        """Stratified proportional sample; adds "index" and "weight" (float32, in (0, 1])."""
        self._check_sample(batch_size)
        offsets = torch.rand(batch_size, generator=self.generator, device=self.device, dtype=torch.float64)
        segment = self.sum_tree.root / batch_size
        mass = (torch.arange(batch_size, device=self.device, dtype=torch.float64) + offsets) * segment
        # Rounding in the descent can step past the last filled leaf; empty leaves are all at the end.
        slots = self.sum_tree.find_prefix(mass).clamp_(max=len(self) - 1)
        batch = self._gather(slots)
        ratio = self.sum_tree.leaves(slots) / self.min_tree.root
        batch["weight"] = ratio.pow(-self.beta).float()
        return batch

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Set the priorities of sampled items from their raw |TD error| (one per index)."""
        priority = torch.as_tensor(priority, device=self.device).detach().reshape(-1).to(torch.float64)
        count = torch.as_tensor(index).numel()
        if priority.numel() != count:
            raise ValueError(f"got {count} indices but {priority.numel()} priorities")
        if not bool(torch.isfinite(priority).all()):
            raise ValueError("priorities must be finite; got NaN or inf")
        if bool((priority < 0).any()):
            raise ValueError("priorities must be >= 0 (pass the absolute TD error)")
        slots, live = self._slots_of(index)
        slots, priority = slots[live], priority[live]
        if slots.numel() == 0:
            return
        # Keep the last value given for each slot: a stable sort keeps the order of equal slots.
        order = torch.argsort(slots, stable=True)
        ordered = slots[order]
        is_last = torch.ones_like(ordered, dtype=torch.bool)
        is_last[:-1] = ordered[1:] != ordered[:-1]
        chosen = order[is_last]
        stored = (priority[chosen] + self.eps).pow(self.alpha)
        self.sum_tree.update(slots[chosen], stored)
        self.min_tree.update(slots[chosen], stored)
        self.max_priority = torch.maximum(self.max_priority, stored.max())

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            alpha=self.alpha,
            beta=self.beta,
            eps=self.eps,
            sum_tree=self.sum_tree.nodes.clone(),
            min_tree=self.min_tree.nodes.clone(),
            max_priority=self.max_priority.clone(),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.alpha, self.beta, self.eps = state["alpha"], state["beta"], state["eps"]
        self.sum_tree.nodes.copy_(state["sum_tree"])
        self.min_tree.nodes.copy_(state["min_tree"])
        self.max_priority = state["max_priority"].to(self.device)
