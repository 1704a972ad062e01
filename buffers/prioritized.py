"""Proportional prioritized replay (Schaul et al. 2016) on one vectorised, wide float64 sum-and-min tree.

Invariants kept here (tests/test_prioritized.py checks each):
- The stored priority of an item is (|p| + eps) ** alpha; P(i) = stored_i / total.
- New items get the largest stored priority seen so far (1.0 at the start).
- Every internal node is recomputed from its children on each update, never adjusted by a
  difference, so the tree cannot drift; float64 keeps items reachable at 1M capacity.
- One order for every sum: each sum the tree stores, and its total, is the pairwise sum of a row
  of children, made of elementwise adds only, so the same leaves give the same tree, bit for bit,
  on the CPU and on CUDA, whatever the path to them (updates of any size, a rebuild on
  load_state_dict, an ignored stale update, a seed's part of a stacked tree), eager or compiled.
  What CUDA does not promise: the descent's cumulative sums are torch.cumsum's, left to right on
  the CPU and in the kernel's order on CUDA, so a draw within rounding of a boundary of the
  cumulative mass may go to the other neighbour there (see SegmentTree.find_prefix).
- Sampling is stratified: [0, total) is cut into batch_size equal segments, one draw in each.
- weight_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta = (stored_i / min_j stored_j) ** -beta,
  with the minimum over the whole buffer (the tree keeps it), so weights lie in (0, 1].
- A priority update for an index whose slot was overwritten since is ignored; when one update
  names an index twice, the last value wins. Bad input (NaN, inf or negative priorities, negative
  or never-written indices) never reaches the tree: it raises before anything changes
  (validation="immediate"), or is dropped and reported later (validation="deferred", see
  PrioritizedReplayBuffer).
- Frame mode (frame_stack > 0): a transition whose frames were overwritten (see buffers/frames.py)
  gets stored priority 0, which removes it from the sum and the minimum, and keeps it through
  priority updates, so P(i) and the largest weight are exact over the sampleable transitions.
- Many seeds (num_seeds=N): each seed's tree is a slice of one tree (SegmentTree.stacked), with its
  own largest priority and minimum; one descent samples every seed, each with its own draws, and one
  update writes every seed's priorities: the same leaves, draws and weights, bit for bit, as N buffers
  (on CUDA a draw within rounding of a boundary may differ, as above).

Why wide trees: on small observations the cost of PER is the number of tiny tensor ops (and the
cache misses of the leaves), not the bytes they touch. A binary tree over 1M leaves takes 20
levels of ops per update and per descent; rows of 32 children under a top level of at most 32768
entries take 2. Sums and minimums share each level (row 0 and row 1 of one [2, n] tensor), so one
gather and one write serve both.

Why no host reads in sample and update (deferred validation): on a GPU a value read back to the
CPU makes it wait for every queued kernel, and graph capture (CUDA graphs, torch.compile's
"reduce-overhead") forbids it. So everything sample and update read is a tensor on the buffer's
device, including the write count and beta, and no Python branch depends on a device value.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tensordict import TensorDict

from .replay import ReplayBuffer


class SegmentTree:
    """Sums, and minimums of the positive values, of `capacity` float64 leaves, in a few wide levels.

    Layout: `leaves` (padded) is read as rows of `arity` children. `levels[0]` is a [2, n] tensor
    whose entry r holds the sum (row 0) and the minimum of the positive values (row 1) of leaf
    row r; each level above holds the same for the rows of `arity` entries of the level below
    (`levels[l + 1][0, r]` sums `levels[l][0].view(-1, arity)[r]`, `levels[l + 1][1, r]` is the
    min of `levels[l][1].view(-1, arity)[r]`). So every entry, padding included, has a full row of
    children, and a descent can never step outside a level. The top level, the first with at most
    `top` entries (there is always one level above the leaves), is not grouped further; its sum
    and min are the roots. A leaf of 0 is an empty slot: padding and leaves never set are 0, and
    the minimums skip them (inf where a row has no positive leaf), so an empty slot changes
    neither root. Sums and minimums share each level so that one gather and one write serve both,
    and the leaves are stored once.

    No drift, and one answer on every path and device: a parent is always recomputed from its
    row of children, never adjusted by a difference, and every sum, the total too, is the row's
    pairwise sum: adjacent entries added in pairs, then those sums in pairs, and so on, a row
    padded with zeros to a power of two (_pairwise_adds). These are elementwise adds of two
    numbers, each exactly rounded on any device, where a `sum` or `cumsum` leaves the order to its
    kernel (torch's CUDA cumsum is a parallel scan whose order depends on the tensor's shape, and
    inductor reorders a `sum`). So every level equals the reduction of the level below bit for
    bit, as if rebuilt from the leaves, on the CPU and CUDA, for any number of rows updated at
    once, in a lone tree and in a part of a stacked one, eager and compiled.

    The descent (find_prefix) does not use the stored order: it searches each row with
    torch.cumsum, one op, where a cumulative sum in the pairwise order would take about ten. See
    find_prefix for what that leaves to rounding and to the device.

    Cost: on small tensors each torch op costs a few microseconds whatever its size, and cache
    misses on the leaves cost about as much again; an update takes a gather, log2(arity) adds
    (into memory kept per batch size, so each add is one op), the minimums and a write per level,
    a descent seven ops per level. A wide `arity` and `top` keep the levels few: 1M leaves with
    arity 32 and top 32768 take 2 levels (against 20 in a binary tree); a third level, or a top
    searched in two steps, measured slower.
    """

    def __init__(self, capacity: int, device: str | torch.device = "cpu", arity: int = 32, top: int = 32768):
        if int(arity) < 2 or int(top) < 1:
            raise ValueError(f"arity must be >= 2 and top >= 1, got arity={arity}, top={top}")
        self.capacity, self.arity, self.top = int(capacity), int(arity), int(top)
        depth = 1  # levels above the leaves
        while -(-self.capacity // self.arity**depth) > self.top:
            depth += 1
        width = -(-self.capacity // self.arity**depth)  # entries in the top level
        self.leaves = torch.zeros(width * self.arity**depth, dtype=torch.float64, device=device)
        identities = torch.tensor([[0.0], [math.inf]], dtype=torch.float64, device=device)  # of sum, of min
        self.levels = [identities.repeat(1, width * self.arity**d) for d in range(depth - 1, -1, -1)]
        # Views made once (everything is written in place only, so they stay valid): the leaves as
        # rows; each level below the top as [2, entries above, arity]; the sums the descent
        # searches, the top's children first.
        self._leaf_rows = self.leaves.view(-1, self.arity)
        self._rows = [level.view(2, -1, self.arity) for level in self.levels[:-1]]
        self._descent_rows = [rows[0] for rows in reversed(self._rows)] + [self._leaf_rows]
        # Scratch, no state (a copy of the tree need not match it): see _tree_scratch.
        self._scratch = _tree_scratch(width, device)

    @property
    def total(self) -> torch.Tensor:
        """The sum of all leaves (the pairwise sum of the top level), as a 0-d tensor (no host read)."""
        return _row_sums(self.levels[-1][0])

    @property
    def minimum(self) -> torch.Tensor:
        """The minimum of the positive leaves (inf if none), as a 0-d tensor."""
        return self.levels[-1][1].amin()

    def update(self, slots: torch.Tensor, values: torch.Tensor, full_rows: bool = False) -> None:
        """Set leaves[slots] = values (>= 0), then recompute their ancestors, one level at a time.

        A slot may repeat only with equal values (index_copy_ keeps one of the copies, unspecified
        which). Above the leaves repeats are harmless: each copy of a parent is reduced from the
        already-final row of its children, so all copies write the same value.

        `full_rows` promises that no leaf in the rows of `slots` is 0 after the update (true of
        every slot of a full buffer whose capacity is a multiple of `arity`); the minimums then
        skip the two ops that keep empty leaves out of them. A broken promise makes the minimum 0.
        """
        self.leaves.index_copy_(0, slots, values)
        node = slots
        below = [self._leaf_rows, *self._rows]  # [n, arity] leaves, then [2, n, arity] sums and minimums
        scratch = self._update_scratch(slots.numel())
        for depth, (children, level, memory) in enumerate(zip(below, self.levels, scratch, strict=True)):
            rows, adds, mins_of, parents, minimums = memory
            node = node.div(self.arity, rounding_mode="floor")
            torch.index_select(children, children.dim() - 2, node, out=rows)  # each node's row of children
            _run_adds(adds)  # their sums, into parents[0]
            if depth == 0 and not full_rows:
                mins_of = rows.where(rows > 0, math.inf)  # an empty leaf is no minimum
            torch.amin(mins_of, -1, out=minimums)
            level.index_copy_(1, node, parents)

    def _update_scratch(self, count: int) -> list[tuple]:
        """update's memory for `count` slots, per level: the gathered rows of children, the adds of their pairwise
        sums, the rows whose minimum is taken, and the [2, count] sums and minimums (and a view of the minimums).
        Kept for up to 32 sizes of at most 4096 slots (a training loop has a few: its batch, its envs), so that
        each add is one op with no view to make, and never dropped: a captured CUDA graph may write into it.
        Other sizes get new memory on each call."""
        kept = self._scratch["update"]
        scratch = kept.get(count)
        if scratch is None:
            scratch = []
            for depth in range(len(self.levels)):
                rows = self.leaves.new_empty((count, self.arity) if depth == 0 else (2, count, self.arity))
                parents = self.leaves.new_empty(2, count)
                sums_of, mins_of = (rows, rows) if depth == 0 else rows
                scratch.append((rows, _pairwise_adds(sums_of, parents[0]), mins_of, parents, parents[1]))
            if count <= 4096 and len(kept) < 32:
                kept[count] = scratch
        return scratch

    def assign(self, leaves: torch.Tensor) -> None:
        """Set all `capacity` leaves at once and rebuild every level from them."""
        self.leaves[: self.capacity].copy_(leaves)
        self.levels[0].copy_(torch.stack([_row_sums(self._leaf_rows), _positive_min(self._leaf_rows)]))
        for rows, parents in zip(self._rows, self.levels[1:], strict=True):
            parents.copy_(torch.stack([_row_sums(rows[0]), rows[1].amin(1)]))

    def find_prefix(self, mass: torch.Tensor, relative: bool = False) -> torch.Tensor:
        """For each mass (float64) in [0, total), the leaf j with sum(leaves[:j]) <= mass < sum(leaves[:j+1]).

        With `relative`, `mass` is given as fractions, in [0, 1), of the top level's cumulative
        sum, which the descent computes anyway (the total up to rounding; the same bits when the
        sums are exact, e.g. on integer leaves).

        The descent searches the top level as one row, then the row of each chosen node's
        children: it picks the entry whose cumulative-sum interval holds the mass, subtracts the
        mass of the entries before it, and goes down. With exact partial sums (e.g. integer
        leaves) the answer is exact and never a zero leaf. Otherwise a mass within rounding of a
        boundary may go to a neighbour, and a mass at or past the end of a row (a row's cumulative
        sum and the pairwise sum its parent stores differ by rounding) goes to its last entry: in a
        buffer, where zero leaves only follow the last item, the caller clamps that back into the
        filled range (frame mode redraws a dropped one).

        The cumulative sums are torch.cumsum's: left to right on the CPU, so a zero leaf has an
        empty interval there; on CUDA the kernel's order, so for a mass within rounding of a
        boundary the leaf found may differ from the CPU's, and may be a zero leaf next to the
        boundary. Elsewhere both find the same leaf. Clamping the mass into each row (which would
        rule out a zero leaf on the CPU) cost 20% of find_prefix, and a binary search in the
        pairwise order (the same leaf on every device) 12 times its time at 1M leaves
        (measured: benchmarks/README.md, replay buffers), so neither is done.
        """
        # upper[j + 1] = the mass up to and including top entry j; upper[0] = 0, the mass before entry 0.
        upper, upper_tail, upper_inner, total = self._scratch["upper"]
        torch.cumsum(self.levels[-1][0], 0, out=upper_tail)
        if relative:
            mass = mass * total
        # Searching all but the last boundary puts a mass at or past the end on the last entry.
        node = torch.searchsorted(upper_inner, mass, right=True)
        return self._descend(node, mass - upper.index_select(0, node))

    @classmethod
    def stacked(cls, like: SegmentTree, parts: int) -> tuple[SegmentTree, list[SegmentTree]]:
        """One tree of `parts` copies of `like`'s shape side by side (empty), and `parts` trees that are views
        of its slices, each shaped as `like` (writes to a view are writes to the whole), for
        `find_prefix_parts`: one descent that samples every part."""
        width = like.levels[-1].shape[1]
        whole = cls(parts * like.leaves.numel(), like.leaves.device, like.arity, top=parts * width)
        views = []
        for i in range(parts):
            part = cls.__new__(cls)
            part.capacity, part.arity, part.top = like.capacity, like.arity, like.top
            size = like.leaves.numel()
            part.leaves = whole.leaves[i * size: (i + 1) * size]
            part.levels = [level[:, i * (level.shape[1] // parts): (i + 1) * (level.shape[1] // parts)]
                           for level in whole.levels]
            if [level.shape for level in part.levels] != [level.shape for level in like.levels]:
                raise AssertionError("a part of the stacked tree is not shaped as the tree it copies")
            part._leaf_rows = part.leaves.view(-1, like.arity)
            part._rows = [level.view(2, -1, like.arity) for level in part.levels[:-1]]
            part._descent_rows = [rows[0] for rows in reversed(part._rows)] + [part._leaf_rows]
            part._scratch = _tree_scratch(width, like.leaves.device)
            views.append(part)
        return whole, views

    def find_prefix_parts(self, fraction: torch.Tensor) -> torch.Tensor:
        """find_prefix(relative=True) of each part of a `stacked` tree at once: row i of `fraction` [parts, B] is
        searched in part i; returns each draw's leaf within its part [parts, B]. The same leaves, bit for bit,
        as each part's own find_prefix (the same cumulative sums, then one descent for all parts); on CUDA a
        mass within rounding of a boundary may go to the other neighbour (a scan of [parts, width] is not the
        kernel of a lone tree's scan of [width]; see find_prefix)."""
        parts, width = fraction.shape[0], self.levels[-1].shape[1] // fraction.shape[0]
        upper = self.levels[-1][0].view(parts, width).cumsum(1)  # each part's top level on its own
        mass = fraction * upper[:, -1:]
        node = torch.searchsorted(upper[:, :-1].contiguous(), mass, right=True)
        before = torch.where(node > 0, upper.gather(1, (node - 1).clamp_(min=0)), 0.0)
        offset = torch.arange(parts, device=node.device).unsqueeze(1) * width
        leaf = self._descend((node + offset).flatten(), (mass - before).flatten()).view(parts, -1)
        return leaf - offset * (self.leaves.numel() // self.levels[-1].shape[1])

    def _descend(self, node: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
        """From top entries `node` with `mass` left in each, down to the leaves (see find_prefix)."""
        mass = mass.unsqueeze(1)  # [B, 1]: one search per row below
        for depth, rows in enumerate(self._descent_rows, start=1):
            row = rows.index_select(0, node)  # [B, arity]: each node's children
            upper = row.cumsum(1)
            child = torch.searchsorted(upper, mass, right=True).clamp_(max=self.arity - 1)
            node = torch.add(child.view(-1), node, alpha=self.arity)  # index of the child in this level
            if depth < len(self._descent_rows):  # the mass left below the chosen child, for the level below
                mass = mass - (upper - row).gather(1, child)
        return node


def _lane_pow_(x: torch.Tensor, exponent: float | torch.Tensor | list, out: torch.Tensor | None = None) -> torch.Tensor:
    """x ** exponent along the last dimension (in place, or into `out`), each row padded to a multiple of 16
    entries so that every entry goes through the CPU's vectorised pow: the scalar pow that takes a row's last few
    entries otherwise rounds differently, so a seed's row of a pack would not equal the same values alone (many
    seeds, bit for bit). Rows of a multiple of 16 entries, and CUDA tensors, take the plain pow."""
    if isinstance(exponent, list):  # row i's own exponent (a pack's seeds differ): each row as it is alone
        for row, row_out, e in zip(x, x if out is None else out, exponent, strict=True):
            _lane_pow_(row, e, None if out is None else row_out)
        return x if out is None else out
    n = x.shape[-1]
    padded = -(-n // 16) * 16
    if x.device.type != "cpu" or padded == n and x.is_contiguous():
        return x.pow_(exponent) if out is None else torch.pow(x, exponent, out=out)
    rows = x.new_ones((*x.shape[:-1], padded))
    rows[..., :n] = x
    result = rows.pow_(exponent)[..., :n]
    return x.copy_(result) if out is None else out.copy_(result)


def _tree_scratch(width: int, device: str | torch.device) -> dict:
    """A tree's scratch: find_prefix's cumulative sums of a top level of `width` entries after a 0, as (whole,
    written part, searched part, total) views; update's memory, by the number of slots updated."""
    upper = torch.zeros(width + 1, dtype=torch.float64, device=device)
    return {"upper": (upper, upper[1:], upper[1:-1], upper[-1]), "update": {}}


def _row_sums(rows: torch.Tensor) -> torch.Tensor:
    """The sum of each row (the last dimension) in pairwise order (see _pairwise_adds)."""
    sums = rows.new_empty(rows.shape[:-1])
    _run_adds(_pairwise_adds(rows, sums))
    return sums


def _pairwise_adds(rows: torch.Tensor, out: torch.Tensor) -> list[tuple]:
    """The adds that write the sum of each row of `rows` (the last dimension) into `out`, in pairwise order:
    adjacent entries added in pairs, then those sums in pairs, and so on; a row of odd length passes its last
    entry up unchanged, which is what padding it with zeros to a power of two would give (x + 0 == x).

    Each step (a, b, into) means into = a + b, or into = a where b is None; a, b and into are views of `rows`,
    `out` and memory allocated here, so the steps can be run again whenever `rows` holds new values (update
    does, with one op per step). Only elementwise adds of two numbers: every device, every number of rows and
    every compiler gives the same bits, which a `sum` or `cumsum` (whose order is the kernel's) does not.
    """
    steps = []
    while rows.shape[-1] > 1:
        half, odd = divmod(rows.shape[-1], 2)
        into = out.unsqueeze(-1) if half + odd == 1 else rows.new_empty((*rows.shape[:-1], half + odd))
        steps.append((*rows[..., : 2 * half].unflatten(-1, (half, 2)).unbind(-1), into[..., :half]))
        if odd:
            steps.append((rows[..., -1:], None, into[..., half:]))
        rows = into
    if not steps:  # rows of one entry
        steps.append((rows.squeeze(-1), None, out))
    return steps


def _run_adds(steps: list[tuple]) -> None:
    for a, b, into in steps:
        if b is None:
            into.copy_(a)
        else:
            torch.add(a, b, out=into)


def _positive_min(rows: torch.Tensor, full_rows: bool = False) -> torch.Tensor:
    """The minimum of the positive values of each row (inf if none); `full_rows`: none is 0."""
    return (rows if full_rows else rows.where(rows > 0, math.inf)).amin(-1)


class PrioritizedReplayBuffer(ReplayBuffer):
    """ReplayBuffer whose `sample` draws proportionally to priority and adds "weight".

    validation: what `update_priority` does with bad entries (NaN, inf or negative priorities,
    negative indices, indices never written):
    - "immediate" (the default on the CPU): it reads the extremes of the call's indices and
      priorities back to the host (one sync on a GPU) and raises ValueError, naming the problem,
      before anything changes; the call's valid entries are not applied either.
    - "deferred" (the default on CUDA): it queues device work only. Bad entries are masked out
      (their items keep the priority they had, so they never reach the tree) and counted on the
      device; the valid entries of the same call are applied. The counts are read back, and a
      ValueError naming them raised (once; the counts then restart from 0), `check_interval` eager
      calls after the last read (a call whose entries are all stale counts too), by `check()`, and
      by `state_dict()` (so a buffer saved and loaded counts its calls from 0 on both sides).
      Inside torch.compile or CUDA graph capture the periodic read is skipped (a host read is not
      allowed there): call `check()` yourself at a low rate, e.g. when logging.
    A wrong dtype or a count of priorities that differs from the count of indices is known without
    reading the device and raises at once in both modes, changing nothing. Indices of items
    overwritten since they were sampled are dropped silently in both modes (that is not an error).

    Capture: with validation="deferred", `sample` and `update_priority` read only tensors on the
    buffer's device (the tree, the write count, beta, max_priority, the generator) and take no
    Python branch on their values, and every shape depends only on batch_size. So torch.compile
    traces them without recompiling as the buffer fills and beta changes (one graph break: the
    uniform draw, from a Generator it cannot trace, stays eager), and a CUDA graph of sample +
    update replays correctly (register the generator: graph.register_generator_state(prb.generator)),
    as `extend`, `beta = ...` and `load_state_dict` write those tensors in place. A captured graph
    keeps the Python values it saw (alpha, eps, and whether the buffer was full): capture after
    load_state_dict. benchmarks/gpu_tree.py does all of this.
    """

    # Shape of the tree (see SegmentTree); the tests shrink it to get deep trees on small buffers.
    tree_arity = 32
    tree_top = 32768
    # Deferred validation reads its error counts back every this many update_priority calls.
    check_interval = 100

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        frame_stack: int = 0,
        validation: str | None = None,
        num_seeds: int = 1,
    ):
        super().__init__(capacity, device, seed, frame_stack, num_seeds)
        a, e = (torch.as_tensor(x, dtype=torch.float64) for x in (alpha, eps))  # one, or one per seed [N, 1]
        if not (a >= 0).all():
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not (e > 0).all():
            raise ValueError(f"eps must be > 0 (it keeps every item sampleable), got {eps}")
        if not (e**a > 0).all():
            raise ValueError(f"eps ** alpha, the smallest stored priority, underflows to 0: {eps} ** {alpha}")
        if validation is None:
            validation = "deferred" if self.device.type == "cuda" else "immediate"
        if validation not in ("immediate", "deferred"):
            raise ValueError(f"validation must be 'immediate' or 'deferred', got {validation!r}")
        self.validation = validation
        # A pack whose members differ in alpha or eps: alpha a float per seed, eps a float64 [N, 1] tensor.
        self.alpha = float(a) if a.numel() == 1 else a.view(-1).tolist()
        self.eps = float(e) if e.numel() == 1 else e.to(self.device).view(-1, 1)
        # Leaves are the stored priorities, 0 for a slot never written. Stored priorities are
        # >= eps ** alpha > 0, so the zero leaves are exactly the slots >= len(self), all after the
        # last item, and the tree's minimum is the minimum over the items.
        self.tree = SegmentTree(self.capacity, self.device, self.tree_arity, self.tree_top)
        self.trees = [self.tree]  # many seeds: self.tree holds them all, trees[i] is seed i's (a view)
        if self.num_seeds > 1:
            self.tree, self.trees = SegmentTree.stacked(self.tree, self.num_seeds)
        self._leaves_per_seed = self.trees[0].leaves.numel()  # seed i's leaf j is self.tree's i * this + j
        # Tensors, not Python numbers, so that sample and update never wait for the GPU and a
        # captured graph reads their current values; all are written in place only, and have
        # shape [1] ([num_seeds]), not []: torch.compile (2.13) drops in-place writes to 0-d tensor attributes.
        seeds = self.num_seeds
        self.max_priority = torch.ones(seeds, dtype=torch.float64, device=self.device)
        self._last_index = torch.full((seeds,), -1, dtype=torch.int64, device=self.device)  # written - 1
        self._last_slot = torch.full((seeds,), -1, dtype=torch.int64, device=self.device)  # len(self) - 1
        self._neg_beta = torch.zeros(1, dtype=torch.float64, device=self.device)  # -beta
        self._neg_betas = torch.zeros(seeds, 1, dtype=torch.float64, device=self.device)  # each seed's, if they differ
        self._set_write_count(self.written)
        self.beta = beta
        # Scratch, reused to save ops; it holds no state (a copy of the buffer need not match it):
        # last_copy[slot] = position in the current update_priority call of the slot's last valid
        # copy; strata = arange(B) / B and positions = arange(k) for the last batch sizes seen.
        self._scratch = {
            "last_copy": torch.empty(self.tree.leaves.numel(), dtype=torch.int32, device=self.device),
            "strata": torch.empty(0, dtype=torch.float64, device=self.device),
            "positions": torch.empty(0, dtype=torch.int32, device=self.device),
        }
        # Deferred validation: counts of dropped entries, by reason (see _REJECTED), and calls so far.
        self._rejected = torch.zeros(len(_REJECTED), dtype=torch.int64, device=self.device)
        self._calls = 0

    @property
    def capturable(self) -> bool:
        """With deferred validation, sample and update_priority read only device tensors (see the class docstring);
        not yet a pack's frames, whose redraws of dropped transitions are made seed by seed on the host's word."""
        return self.validation == "deferred" and (self.frame_store is None or self.num_seeds == 1)

    @property
    def beta(self) -> float | torch.Tensor:
        return self._beta

    @beta.setter
    def beta(self, value: float | torch.Tensor) -> None:
        """One beta, or one per seed ([N, 1], float64)."""
        if not (value >= 0 if isinstance(value, float | int) else bool((value >= 0).all())):
            raise ValueError(f"beta must be >= 0, got {value}")
        self._beta = value.to(self.device, torch.float64).view(-1, 1) if isinstance(value, torch.Tensor) \
            else float(value)
        if isinstance(value, torch.Tensor):
            self._neg_betas.copy_(-self._beta)
        else:
            self._neg_beta.fill_(-self._beta)

    def _exponent(self) -> torch.Tensor | list[torch.Tensor]:
        """-beta for the weights' pow: one tensor, or each seed's when they differ (a pack's members)."""
        return self._neg_beta if isinstance(self._beta, float) else list(self._neg_betas)

    def _on_write(self, index: torch.Tensor) -> None:
        self._set_write_count(self.written + index.numel())
        slots = index.remainder(self.capacity)
        self.tree.update(slots, self.max_priority.expand(slots.shape), self._full_rows)

    def _set_write_count(self, written: int | np.ndarray) -> None:
        """Mirror the write count (many seeds: counts) where sample and update read it: device tensors, a flag."""
        if self.num_seeds == 1:
            self._last_index.fill_(written - 1)
            self._last_slot.fill_(min(written, self.capacity) - 1)
        else:
            self._last_index.copy_(torch.from_numpy(written - 1))
            self._last_slot.copy_(torch.from_numpy(np.minimum(written, self.capacity) - 1))
        # No empty leaf is left in any row of the tree (see SegmentTree.update). Under CUDA graph
        # capture this flag, like alpha and eps, is read once: capture after load_state_dict.
        self._full_rows = bool(np.all(written >= self.capacity)) and self.capacity % self.tree.arity == 0 \
            and self.frame_store is None  # frame mode may drop items: zero leaves mid-buffer

    def _on_write_seeds(self, index: torch.Tensor, seed: torch.Tensor, counts: np.ndarray) -> None:
        self._set_write_count(self.written + counts)
        slots = seed * self._leaves_per_seed + index.remainder(self.capacity)
        self.tree.update(slots, self.max_priority.index_select(0, seed), self._full_rows)

    def _tree_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """Many seeds: the tree's leaves of storage slots (seed i's slot j: i * capacity + j)."""
        if self.num_seeds == 1:
            return slots
        return slots.div(self.capacity, rounding_mode="floor") * self._leaves_per_seed + slots.remainder(self.capacity)

    def _index_of(self, slots: torch.Tensor) -> torch.Tensor:
        # As ReplayBuffer._index_of, from the device copy of the write count (many seeds: slots [N, B]).
        last = self._last_index if self.num_seeds == 1 else self._last_index.unsqueeze(1)
        return last - torch.remainder(last - slots, self.capacity)

    # ---- sampling ----------------------------------------------------------------------------------

    def _on_drop(self, slots: torch.Tensor) -> None:
        self.tree.update(self._tree_slots(slots), torch.zeros(slots.shape, dtype=torch.float64, device=self.device))

    def sample(self, batch_size: int) -> TensorDict:
        """Stratified proportional sample; adds "index" and "weight" (float32, in (0, 1]). Many seeds:
        [N, batch_size], each seed's draws from its own generator and tree, in one descent."""
        if self.num_seeds > 1:
            return self._sample_seeds(batch_size)
        return self._sample_at(self.tree.find_prefix(self._fractions(batch_size), relative=True))

    def _fractions(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Where the draws fall, as fractions of the total mass: draw i is uniform in [i, i + 1) / batch_size."""
        self._check_sample(batch_size)
        strata = self._scratch["strata"]
        if strata.numel() != batch_size:
            strata = torch.arange(batch_size, dtype=torch.float64, device=self.device) / batch_size
            self._scratch["strata"] = strata
        return torch.add(strata, self._uniforms(batch_size, generator), alpha=1 / batch_size)

    def _sample_seeds(self, batch_size: int) -> TensorDict:
        fractions = torch.stack([self._fractions(batch_size, generator) for generator in self.generators])
        slots = torch.minimum(self.tree.find_prefix_parts(fractions), self._last_slot.unsqueeze(1))
        if self.frame_store is not None:
            slots = self._redraw_seeds(slots, lambda i, row: self._redraw_dropped(row, i))
        leaves = slots + self._leaves_per_seed * torch.arange(self.num_seeds, device=self.device).unsqueeze(1)
        stored = self.tree.leaves.index_select(0, leaves.view(-1)).view(slots.shape)
        minimum = self.tree.levels[-1][1].view(self.num_seeds, -1).amin(1, keepdim=True)  # each seed's
        weight = _lane_pow_(stored.div_(minimum), self._exponent(), torch.empty_like(stored, dtype=torch.float32))
        return self._gather_seeds(slots, weight=weight)

    def _sample_at(self, slots: torch.Tensor) -> TensorDict:
        """The batch at the slots the descent found, with weights."""
        # Rounding can carry a draw past the last item, into the zero leaves after it; clamp it back.
        slots = slots.clamp_(max=self._last_slot)
        if self.frame_store is not None and self._capturing():  # a graph replays later, whatever the host saw now
            slots = self._redraw_dropped_on_device(slots)
        elif self.frame_store is not None and self.frame_store.may_hold_dropped(self.written - self.capacity):
            slots = self._redraw_dropped(slots)
        stored = self.tree.leaves.index_select(0, slots)
        weight = torch.empty(slots.shape, dtype=torch.float32, device=self.device)
        _lane_pow_(stored.div_(self.tree.minimum), self._neg_beta, weight)
        return self._gather(slots, weight=weight)

    @torch.compiler.disable  # torch.compile cannot trace a Generator held by an object: draw eagerly
    def _uniforms(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.rand(n, generator=generator or self.generator, device=self.device, dtype=torch.float64)

    # ---- priority updates ----------------------------------------------------------------------------

    def _redraw_dropped(self, slots: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """Frame mode: replace draws that landed on a dropped transition (priority 0), of seed `seed`.

        The descent only does so by rounding at a boundary next to a zero leaf, or through the
        clamp in `sample` when the last item was dropped. Such a draw is redrawn over the whole
        mass; a draw that still fails after a few rounds descends over the positive leaves alone.
        """
        tree, generator, last_slot = self.trees[seed], self.generators[seed], self._last_slot[seed : seed + 1]
        if not bool(tree.minimum < math.inf):  # no positive leaf (the minimum is one op, the total several)
            raise RuntimeError("no transition can be sampled: the frames of every stored one were overwritten")
        for _ in range(4):
            bad = tree.leaves.index_select(0, slots) == 0
            if not bool(bad.any()):
                return slots
            fraction = torch.rand(slots.shape, generator=generator, device=self.device, dtype=torch.float64)
            fresh = tree.find_prefix(fraction, relative=True).clamp_(max=last_slot)
            slots = torch.where(bad, fresh, slots)
        bad = tree.leaves.index_select(0, slots) == 0
        leaves = tree.leaves[: int(last_slot) + 1]
        positive = (leaves > 0).nonzero().flatten()
        upper = leaves.index_select(0, positive).cumsum(0)
        mass = torch.rand(slots.shape, generator=generator, device=self.device, dtype=torch.float64)
        pick = torch.searchsorted(upper, mass.mul_(upper[-1]), right=True).clamp_(max=positive.numel() - 1)
        return torch.where(bad, positive.index_select(0, pick), slots)

    def _redraw_dropped_on_device(self, slots: torch.Tensor) -> torch.Tensor:
        """_redraw_dropped with no host read, for CUDA graph capture: always a few rounds of redraws over the whole
        mass; a draw that still lands on a dropped transition then takes the newest item, whose frames were just
        written (a bias of that item's probability by the chance of failing every round: negligible)."""
        for _ in range(4):
            bad = self.tree.leaves.index_select(0, slots) == 0
            fresh = self.tree.find_prefix(self._uniforms(slots.numel()), relative=True).clamp_(max=self._last_slot)
            slots = torch.where(bad, fresh, slots)
        newest = self._last_index.remainder(self.capacity)
        return torch.where(self.tree.leaves.index_select(0, slots) == 0, newest, slots)

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Set the priorities of sampled items from their raw |TD error| (one per index).

        Bad entries raise before anything changes, or are dropped and reported later, as
        `validation` says (see the class docstring). Many seeds: index and priority [N, B], row i seed i's.
        """
        if self.num_seeds > 1:
            return self._update_priority_seeds(index, priority)
        index = torch.as_tensor(index, device=self.device)
        priority = torch.as_tensor(priority, device=self.device)
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise ValueError(f"indices must be integers, got dtype {index.dtype}")
        if priority.numel() != index.numel():
            raise ValueError(f"got {index.numel()} indices but {priority.numel()} priorities")
        if index.numel() == 0:
            return
        # Each conversion only when needed: on small batches every op call costs microseconds.
        if index.dim() != 1 or index.dtype != torch.int64:
            index = index.reshape(-1).long()
        if priority.requires_grad:
            priority = priority.detach()
        if priority.dim() != 1:
            priority = priority.reshape(-1)
        if priority.dtype != torch.float64:
            priority = priority.to(torch.float64)
        if self.validation == "immediate":
            index, priority = self._checked(index, priority)
            if index.numel() > 0:
                self._write_priorities(index.remainder(self.capacity), priority, None)
            return
        self._write_priorities(index.remainder(self.capacity), priority, self._valid(index, priority))
        self._count_call()

    def _count_call(self) -> None:
        """Deferred validation: read the error counts back every check_interval eager calls."""
        if not (torch.compiler.is_compiling() or self._capturing()):
            self._calls += 1
            if self._calls % self.check_interval == 0:
                self.check()

    def _update_priority_seeds(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """update_priority for many seeds: row i of index and priority [N, B] for seed i, in one tree update."""
        index = torch.as_tensor(index, device=self.device)
        priority = torch.as_tensor(priority, device=self.device)
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise ValueError(f"indices must be integers, got dtype {index.dtype}")
        if index.shape != priority.shape or index.dim() < 1 or index.shape[0] != self.num_seeds:
            raise ValueError(f"need indices and priorities [N, B] of one shape with N = {self.num_seeds} seeds, got "
                             f"{tuple(index.shape)} and {tuple(priority.shape)}")
        if index.numel() == 0:
            return
        index = index.reshape(self.num_seeds, -1).long()
        priority = priority.detach().reshape(self.num_seeds, -1).to(torch.float64)
        last_index = self._last_index.unsqueeze(1)
        if self.validation == "immediate":
            smallest, largest = torch.aminmax(priority)
            if not (math.isfinite(smallest.item()) and math.isfinite(largest.item())):
                raise ValueError("priorities must be finite; got NaN or inf")
            if smallest.item() < 0:
                raise ValueError("priorities must be >= 0 (pass the absolute TD error)")
            if bool((index < 0).any()):
                raise ValueError(f"negative indices: {index[index < 0].tolist()[:8]}")
            unwritten = index > last_index
            if bool(unwritten.any()):
                raise ValueError(f"indices never written (seeds wrote {(self._last_index + 1).tolist()} items so "
                                 f"far): {index[unwritten].tolist()[:8]}")
            valid = index > last_index - self.capacity  # overwritten since they were sampled: dropped
        else:
            valid = self._valid(index, priority, last_index)
        seed = torch.arange(self.num_seeds, device=self.device).unsqueeze(1)
        slots = seed * self._leaves_per_seed + index.remainder(self.capacity)
        self._write_priorities(slots.view(-1), priority.view(-1), valid.view(-1))
        if self.validation == "deferred":
            self._count_call()

    def _checked(self, index: torch.Tensor, priority: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Immediate validation: raise on bad entries (one host read); drop stale ones."""
        smallest, largest = torch.aminmax(priority)  # NaN makes both NaN
        lowest, highest = torch.aminmax(index)
        smallest, largest, lowest, highest = smallest.item(), largest.item(), lowest.item(), highest.item()
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
        return index, priority

    def _valid(self, index: torch.Tensor, priority: torch.Tensor,
               last_index: torch.Tensor | None = None) -> torch.Tensor:
        """Deferred validation: a mask of the entries to apply; counts the bad ones on the device. `last_index`:
        the last index written (many seeds: each row's seed's, [N, 1])."""
        last_index = self._last_index if last_index is None else last_index
        bad = torch.stack([
            ~priority.isfinite(),
            priority < 0,
            index < 0,
            index > last_index,
        ])  # one row per reason in _REJECTED
        self._rejected.add_(bad.flatten(1).sum(1))
        stale = index <= last_index - self.capacity  # overwritten since: dropped, not an error
        return ~(bad.any(0) | stale)

    def _write_priorities(self, slots: torch.Tensor, priority: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Write (|p| + eps) ** alpha at the tree's leaves `slots` for the valid entries (all when `valid` is
        None); last copy wins. Many seeds: the slots of every seed, seed by seed, B each.

        Each copy of a slot in the call takes the value of its last valid copy, found with a
        scatter of positions reduced by max (deterministic on every device), so the tree only sees
        repeated slots with equal values. A slot with no valid copy keeps its leaves.
        """
        # slots are in range even for the bad indices, which are masked
        position, last_copy = self._scratch["positions"], self._scratch["last_copy"]
        if position.numel() != slots.numel():
            position = torch.arange(slots.numel(), dtype=torch.int32, device=self.device)
            self._scratch["positions"] = position
        if valid is not None:
            position = torch.where(valid, position, -1)
        last_copy.scatter_reduce_(0, slots, position, "amax", include_self=False)
        last = last_copy.index_select(0, slots)  # -1 where no copy of the slot is valid
        value = priority.index_select(0, last if valid is None else last.clamp(min=0))
        stored = _lane_pow_(value.view(self.num_seeds, -1).add_(self.eps), self.alpha).view(-1)  # (|p|+eps)**alpha
        if valid is not None:  # a slot with no valid copy keeps its leaf
            stored = torch.where(last >= 0, stored, self.tree.leaves.index_select(0, slots))
        if self.frame_store is not None and self.frame_store.may_hold_dropped(self.written - self.capacity):
            stored = torch.where(self.tree.leaves.index_select(0, slots) > 0, stored, 0.0)  # dropped stay 0
        self.tree.update(slots, stored, self._full_rows)
        largest = stored.amax() if self.num_seeds == 1 else stored.view(self.num_seeds, -1).amax(1)
        torch.maximum(self.max_priority, largest, out=self.max_priority)

    def _capturing(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _priorities(self) -> torch.Tensor:
        """The stored priorities, a copy: [capacity] (many seeds: [N, capacity])."""
        leaves = torch.stack([tree.leaves[: self.capacity] for tree in self.trees])
        return leaves[0].clone() if self.num_seeds == 1 else leaves

    def check(self) -> None:
        """Raise ValueError if deferred validation dropped entries since the last check (one host read); the
        next periodic check is `check_interval` calls after this one."""
        counts = self._rejected.tolist()
        self._calls = 0
        if not any(counts):
            return
        self._rejected.zero_()
        found = ", ".join(f"{n} {reason}" for n, reason in zip(counts, _REJECTED, strict=True) if n)
        raise ValueError(
            f"update_priority dropped bad entries since the last check: {found} (the items kept their "
            f"previous priorities; {self.written} items written so far). Pass the absolute TD error, "
            "finite, with the indices from sample()."
        )

    # ---- checkpointing -------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """As ReplayBuffer's, plus the priorities; raises first if deferred validation found bad entries."""
        self.check()
        state = super().state_dict()
        state.update(
            alpha=self.alpha,
            beta=self.beta,
            eps=self.eps,
            priority=self._priorities(),  # 0 for slots never written
            max_priority=self.max_priority.clone(),
        )
        return state

    def members_state(self, state: dict, rows: list[int]) -> dict:
        """As ReplayBuffer's, plus each kept seed's priorities; alpha and eps are this buffer's own (its seeds')."""
        out = super().members_state(state, rows)
        pick = (lambda x: x[rows[0]]) if self.num_seeds == 1 else (lambda x: x[rows])
        beta = state["beta"]
        if isinstance(beta, torch.Tensor) and beta.numel() > 1:  # one per seed
            beta = float(beta.reshape(-1)[rows[0]]) if self.num_seeds == 1 else beta.reshape(len(beta), -1)[rows]
        return {**out, "alpha": self.alpha, "eps": self.eps, "beta": beta, "priority": pick(state["priority"]),
                "max_priority": pick(state["max_priority"].reshape(-1))}

    def load_state_dict(self, state: dict, copy: bool = True) -> None:
        super().load_state_dict(state, copy)
        self.alpha, self.beta, eps = state["alpha"], state["beta"], state["eps"]
        self.eps = eps.to(self.device, copy=True) if isinstance(eps, torch.Tensor) else eps
        priority = state["priority"].to(self.device, torch.float64)
        # The tree is a function of its leaves (no drift), so rebuilding it restores it exactly.
        for tree, leaves in zip(self.trees, priority.view(self.num_seeds, -1), strict=True):
            tree.assign(leaves)
        self.max_priority.copy_(state["max_priority"].reshape(self.num_seeds))
        self._set_write_count(self.written)
        self._rejected.zero_()


# Why deferred validation drops an entry, in the order of PrioritizedReplayBuffer._rejected.
_REJECTED = (
    "with NaN or inf priorities",
    "with negative priorities",
    "with negative indices",
    "with indices never written",
)
