"""Proportional prioritized replay (Schaul et al. 2016) on vectorised, wide float64 sum and min trees.

Invariants kept here (tests/test_prioritized.py checks each):
- The stored priority of an item is (|p| + eps) ** alpha; P(i) = stored_i / total.
- New items get the largest stored priority seen so far (1.0 at the start).
- Every internal node is recomputed from its children on each update, never adjusted by a
  difference, so the trees cannot drift; float64 keeps items reachable at 1M capacity.
- Sampling is stratified: [0, total) is cut into batch_size equal segments, one draw in each.
- weight_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta = (stored_i / min_j stored_j) ** -beta,
  with the minimum over the whole buffer (a min tree keeps it), so weights lie in (0, 1].
- A priority update for an index whose slot was overwritten since is ignored; when one update
  names an index twice, the last value wins. Bad input raises before anything changes.
- Frame mode (frame_stack > 0): a transition whose frames were overwritten (see buffers/frames.py)
  gets stored priority 0 in the sum tree and inf in the min tree, and keeps them through priority
  updates, so P(i) and the largest weight are exact over the sampleable transitions.

Why wide trees: on small observations the cost of PER is the number of tiny tensor ops, not
the bytes they touch. A binary tree over 1M leaves takes 20 levels of ops per update and per
descent; rows of 32 children under a top level of at most 4096 entries take 3.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from tensordict import TensorDict

from .replay import ReplayBuffer


class SegmentTree:
    """Sums (op="sum") or minimums (op="min") of `capacity` float64 leaves, kept in a few levels.

    Layout: `levels[0]` holds the leaves (padded), and each level has `arity` times as many
    entries as the one above it, read as rows of `arity` children: `levels[l + 1][r]` is the sum
    (or min) of row r of `levels[l].view(-1, arity)`. So every entry, padding included, has a full
    row of children, and a descent can never step outside a level. The top level, the first with
    at most `top` entries, is not grouped further; its sum (or min) is the root. Padding and
    leaves never written hold the identity of `op` (0 or inf), so they change no sum or min.

    No drift: a parent is always recomputed as `reduce(row of its children, dim=1)`, the same
    torch reduction over the same values whichever update wrote it, so every level equals the
    reduction of the level below exactly, as if the tree had been rebuilt from its leaves.

    Cost: on small tensors each torch op costs a few microseconds whatever its size, and an
    update takes four ops per level, a descent eight; a wide `arity` and `top` keep the levels
    few (1M leaves with arity 32 and top 4096: 3 levels, against 20 in a binary tree).
    """

    def __init__(self, capacity: int, op: str, device: str | torch.device = "cpu", arity: int = 32,
                 top: int = 4096):
        if op not in ("sum", "min"):
            raise ValueError(f"op must be 'sum' or 'min', got {op!r}")
        if int(arity) < 2 or int(top) < 1:
            raise ValueError(f"arity must be >= 2 and top >= 1, got arity={arity}, top={top}")
        self.capacity, self.op, self.arity, self.top = int(capacity), op, int(arity), int(top)
        self.identity = 0.0 if op == "sum" else math.inf
        self.reduce = torch.sum if op == "sum" else torch.amin
        depth = 0  # levels above the leaves
        while -(-self.capacity // self.arity**depth) > self.top:
            depth += 1
        width = -(-self.capacity // self.arity**depth)  # entries in the top level
        sizes = [width * self.arity**d for d in range(depth, -1, -1)]  # leaves first
        self.levels = [torch.full((n,), self.identity, dtype=torch.float64, device=device) for n in sizes]

    @property
    def root(self) -> torch.Tensor:
        """The sum (or min) of all leaves, as a 0-d tensor (no host sync)."""
        return self.reduce(self.levels[-1])

    def leaves(self, slots: torch.Tensor) -> torch.Tensor:
        return self.levels[0].index_select(0, slots)

    def update(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves[slots] = values, then recompute their ancestors, one level at a time.

        A slot may repeat only with equal values (index_copy_ keeps one of the copies, unspecified
        which). Above the leaves repeats are harmless: each copy of a parent is reduced from the
        already-final row of its children, so all copies write the same value.
        """
        self.levels[0].index_copy_(0, slots, values)
        node = slots
        for children, parents in pairwise(self.levels):
            node = node.div(self.arity, rounding_mode="floor")
            row = children.view(-1, self.arity).index_select(0, node)
            parents.index_copy_(0, node, self.reduce(row, dim=1))

    def assign(self, leaves: torch.Tensor) -> None:
        """Set all `capacity` leaves at once and rebuild every level from them."""
        self.levels[0][: self.capacity].copy_(leaves)
        for children, parents in pairwise(self.levels):
            self.reduce(children.view(-1, self.arity), dim=1, out=parents)

    def find_prefix(self, mass: torch.Tensor) -> torch.Tensor:
        """For each mass (float64) in [0, root), the leaf j with sum(leaves[:j]) <= mass < sum(leaves[:j+1]).

        The descent searches the top level as one row, then the row of each chosen node's
        children: it picks the entry whose cumulative-sum interval holds the mass, subtracts the
        mass of the entries before it, and goes down. With exact partial sums (e.g. integer
        leaves) the answer is exact and never a zero leaf. Otherwise a mass within rounding of a
        boundary may go to a neighbour, and a mass at or past the end of a row goes to its last
        entry: in a buffer, where zero leaves only follow the last item, the caller clamps that
        back into the filled range.
        """
        top = self.levels[-1]
        upper = top.cumsum(0)  # mass up to and including each entry
        mass = mass.unsqueeze(1)  # [B, 1]: one search per row
        node = torch.searchsorted(upper, mass, right=True).clamp_(max=top.numel() - 1)
        mass = mass - torch.take(upper - top, node)  # minus the mass before the entry
        node = node.view(-1)
        for level in reversed(self.levels[:-1]):
            row = level.view(-1, self.arity).index_select(0, node)  # [B, arity]: each node's children
            upper = row.cumsum(1)
            child = torch.searchsorted(upper, mass, right=True).clamp_(max=self.arity - 1)
            mass = mass - (upper - row).gather(1, child)
            node = child.view(-1).add_(node, alpha=self.arity)  # index of the child in this level
        return node


class PrioritizedReplayBuffer(ReplayBuffer):
    """ReplayBuffer whose `sample` draws proportionally to priority and adds "weight"."""

    # Shape of both trees (see SegmentTree); the tests shrink them to get deep trees on small buffers.
    tree_arity = 32
    tree_top = 4096

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        frame_stack: int = 0,
    ):
        super().__init__(capacity, device, seed, frame_stack)
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0 (it keeps every item sampleable), got {eps}")
        if not eps**alpha > 0:
            raise ValueError(f"eps ** alpha, the smallest stored priority, underflows to 0: {eps} ** {alpha}")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.beta = beta
        # Leaves of both trees are the stored priorities; an unwritten slot holds 0 in the sum
        # tree and inf in the min tree. Stored priorities are >= eps ** alpha > 0, so the sum
        # tree's zero leaves are exactly the slots >= len(self), all after the last item, and
        # in frame mode the dropped transitions (_on_drop).
        self.sum_tree = SegmentTree(self.capacity, "sum", self.device, self.tree_arity, self.tree_top)
        self.min_tree = SegmentTree(self.capacity, "min", self.device, self.tree_arity, self.tree_top)
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

    def _on_drop(self, slots: torch.Tensor) -> None:
        self.sum_tree.update(slots, torch.zeros(slots.shape, dtype=torch.float64, device=self.device))
        self.min_tree.update(slots, torch.full(slots.shape, math.inf, dtype=torch.float64, device=self.device))

    def sample(self, batch_size: int) -> TensorDict:
        """Stratified proportional sample; adds "index" and "weight" (float32, in (0, 1])."""
        self._check_sample(batch_size)
        # Draw i is uniform in [i, i + 1) * total / batch_size.
        mass = torch.rand(batch_size, generator=self.generator, device=self.device, dtype=torch.float64)
        mass.add_(torch.arange(batch_size, device=self.device, dtype=torch.float64))
        mass.mul_(self.sum_tree.root / batch_size)
        # Rounding can carry a draw past the last item, into the zero leaves after it; clamp it back.
        slots = self.sum_tree.find_prefix(mass).clamp_(max=len(self) - 1)
        if self.frame_store is not None and self.frame_store.may_hold_dropped(self.written - self.capacity):
            slots = self._redraw_dropped(slots)
        weight = (self.sum_tree.leaves(slots) / self.min_tree.root).pow_(-self.beta)
        return self._gather(slots, weight=weight.float())

    def _redraw_dropped(self, slots: torch.Tensor) -> torch.Tensor:
        """Frame mode: replace draws that landed on a dropped transition (priority 0).

        The descent only does so by rounding at a boundary next to a zero leaf, or through the
        clamp in `sample` when the last item was dropped. Such a draw is redrawn over the whole
        mass; a draw that still fails after a few rounds descends over the positive leaves alone.
        """
        total = self.sum_tree.root
        if not bool(total > 0):
            raise RuntimeError("no transition can be sampled: the frames of every stored one were overwritten")
        for _ in range(4):
            bad = self.sum_tree.leaves(slots) == 0
            if not bool(bad.any()):
                return slots
            mass = torch.rand(slots.shape, generator=self.generator, device=self.device, dtype=torch.float64)
            fresh = self.sum_tree.find_prefix(mass.mul_(total)).clamp_(max=len(self) - 1)
            slots = torch.where(bad, fresh, slots)
        bad = self.sum_tree.leaves(slots) == 0
        leaves = self.sum_tree.levels[0][: len(self)]
        positive = (leaves > 0).nonzero().flatten()
        upper = leaves.index_select(0, positive).cumsum(0)
        mass = torch.rand(slots.shape, generator=self.generator, device=self.device, dtype=torch.float64)
        pick = torch.searchsorted(upper, mass.mul_(upper[-1]), right=True).clamp_(max=positive.numel() - 1)
        return torch.where(bad, positive.index_select(0, pick), slots)

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Set the priorities of sampled items from their raw |TD error| (one per index).

        All checks read back one small tensor (a single host sync on a GPU) before anything
        is written, so bad input raises and changes nothing.
        """
        index = torch.as_tensor(index, device=self.device).reshape(-1)
        priority = torch.as_tensor(priority, device=self.device).detach().reshape(-1).to(torch.float64)
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise ValueError(f"indices must be integers, got dtype {index.dtype}")
        if priority.numel() != index.numel():
            raise ValueError(f"got {index.numel()} indices but {priority.numel()} priorities")
        if index.numel() == 0:
            return
        index = index.long()
        # Row 0 bounds the indices, row 1 the priorities; NaN makes a priority's min and max NaN.
        bounds = torch.stack(torch.stack([index.double(), priority]).aminmax(dim=1), dim=1)
        (lowest, highest), (smallest, largest) = bounds.tolist()
        if not (math.isfinite(smallest) and math.isfinite(largest)):
            raise ValueError("priorities must be finite; got NaN or inf")
        if smallest < 0:
            raise ValueError("priorities must be >= 0 (pass the absolute TD error)")
        if lowest < 0:
            raise ValueError(f"negative indices: {index[index < 0].tolist()[:8]}")
        if highest >= self.written:
            raise ValueError(
                f"indices never written (only {self.written} items so far): "
                f"{index[index >= self.written].tolist()[:8]}"
            )
        first_live = self.written - self.capacity
        if lowest < first_live:  # some items were overwritten since they were sampled: drop them
            live = index >= first_live
            index, priority = index[live], priority[live]
            if index.numel() == 0:
                return
        # Last value wins: a stable sort lines up the copies of a slot in call order, and every
        # copy takes the value of the last one (so the trees see only equal repeated writes).
        slots, order = torch.sort(index.remainder(self.capacity), stable=True)
        last = torch.searchsorted(slots, slots, right=True).sub_(1)  # last copy of each slot, in sorted order
        value = priority.index_select(0, order.index_select(0, last))
        stored = value.add_(self.eps).pow_(self.alpha)  # (|p| + eps) ** alpha, as p >= 0
        low = stored  # the min tree's leaves
        if self.frame_store is not None and self.frame_store.may_hold_dropped(first_live):
            kept = self.sum_tree.leaves(slots) > 0  # a dropped transition keeps priority 0
            stored, low = torch.where(kept, stored, 0.0), torch.where(kept, stored, math.inf)
        self.sum_tree.update(slots, stored)
        self.min_tree.update(slots, low)
        self.max_priority = torch.maximum(self.max_priority, stored.amax())

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            alpha=self.alpha,
            beta=self.beta,
            eps=self.eps,
            priority=self.sum_tree.levels[0][: self.capacity].clone(),  # 0 for slots never written
            max_priority=self.max_priority.clone(),
        )
        return state

    def load_state_dict(self, state: dict, copy: bool = True) -> None:
        super().load_state_dict(state, copy)
        self.alpha, self.beta, self.eps = state["alpha"], state["beta"], state["eps"]
        priority = state["priority"].to(self.device, torch.float64)
        # The trees are a function of their leaves (no drift), so rebuilding them restores them exactly.
        self.sum_tree.assign(priority)
        # Stored priorities are > 0; 0 marks a slot never written or a dropped transition.
        self.min_tree.assign(torch.where(priority > 0, priority, math.inf))
        self.max_priority = state["max_priority"].to(self.device, torch.float64).clone()
