"""PrioritizedReplayBuffer and its SegmentTree, against brute-force float64 numpy references.

Storage behaviour shared with ReplayBuffer (ring order, layout checks, empty batches, seeding,
checkpoints of the storage) is tested for both classes in test_replay.py.

The buffers here are small, and at the default tree shape (arity 32, top 32768) a tree over at
most 2^20 leaves has a single level above them; so the buffer tests also run on smaller shapes,
with several levels over 1000 leaves, through the `tree_shape` fixture. The last section covers
deferred validation (no host reads) and capture (torch.compile; CUDA graphs on a GPU).
"""

from __future__ import annotations

import contextlib
import json
import math
from itertools import pairwise

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from buffers import PrioritizedReplayBuffer, SegmentTree

pytestmark = pytest.mark.usefixtures("single_thread")

# (arity, top): the default (one level above the leaves here); rows of 32 under a small top (2-3
# levels here); a binary tree down to a single root; a ternary one whose leaves need padding
# (6-7 levels over 1000 leaves).
TREE_SHAPES = {"default": (32, 32768), "wide": (32, 16), "binary": (2, 1), "deep": (3, 4)}
assert TREE_SHAPES["default"] == (PrioritizedReplayBuffer.tree_arity, PrioritizedReplayBuffer.tree_top)


def make_tree(capacity: int, device, shape: str) -> SegmentTree:
    return SegmentTree(capacity, device, *TREE_SHAPES[shape])


@pytest.fixture(params=["default", "wide", "deep"])
def tree_shape(request, monkeypatch):
    """Run a buffer test with the default tree and with deeper ones."""
    arity, top = TREE_SHAPES[request.param]
    monkeypatch.setattr(PrioritizedReplayBuffer, "tree_arity", arity)
    monkeypatch.setattr(PrioritizedReplayBuffer, "tree_top", top)
    return arity, top


def items(index) -> TensorDict:
    index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
    return TensorDict({"obs": index.float().unsqueeze(1), "action": index}, batch_size=[index.numel()])


def fill(buf, count: int, start: int = 0, chunk: int = 64) -> None:
    for lo in range(start, start + count, chunk):
        buf.extend(items(torch.arange(lo, min(lo + chunk, start + count))))


def positive_min(values: np.ndarray, axis=None) -> np.ndarray:
    """The minimum of the positive values (inf where there are none): what the tree's minimums keep."""
    return np.where(values > 0, values, np.inf).min(axis=axis)


def pairwise_sums(rows: np.ndarray) -> np.ndarray:
    """Reference for the tree's sums: the sum of each row (last axis), the row padded with zeros to a power of
    two, then adjacent entries added in pairs, those sums in pairs, and so on (numpy's elementwise adds)."""
    width = 1 << (rows.shape[-1] - 1).bit_length()
    rows = np.concatenate([rows, np.zeros((*rows.shape[:-1], width - rows.shape[-1]))], axis=-1)
    while rows.shape[-1] > 1:
        rows = rows[..., 0::2] + rows[..., 1::2]
    return rows[..., 0]


def assert_tree_exact(tree: SegmentTree, leaves: np.ndarray | None = None) -> None:
    """No drift, and the sums in their one order: every level equals, bit for bit, the numpy reference
    reductions of the rows of the level below: pairwise sums (pairwise_sums), and minimums (over the
    positive leaves for the level above the leaves). Each level is [2, n] float64 (sums, minimums), with
    `arity` entries per entry of the level above; the top has at most `top` entries. With `leaves`, the
    leaves must equal them exactly, and the padding leaves are 0. The roots, `total` and `minimum`, are
    the pairwise sum and the minimum of the top level. The reference runs on the CPU whatever the tree's
    device, so this also checks that a tree on CUDA holds the CPU's bits.
    """
    arity = tree.arity
    levels = tree.levels
    assert tree.leaves.dtype == torch.float64 and tree.leaves.shape == (tree.leaves.numel(),)
    assert all(level.dtype == torch.float64 and level.shape[0] == 2 for level in levels)
    assert levels[-1].shape[1] <= tree.top and tree.leaves.numel() >= tree.capacity
    sizes = [tree.leaves.numel()] + [level.shape[1] for level in levels]
    assert all(children == arity * parents for children, parents in pairwise(sizes))
    stored = tree.leaves.cpu().numpy()
    if leaves is not None:
        assert np.array_equal(stored[: tree.capacity], leaves)
        assert (stored[tree.capacity :] == 0).all()
    below = stored, stored  # over the leaves, the minimum skips the empty (zero) ones
    for depth, parents in enumerate(levels, start=1):
        sums, minimums = parents.cpu().numpy()
        for name, got, expected in [("sums", sums, pairwise_sums(below[0].reshape(-1, arity))),
                                    ("minimums", minimums, positive_min(below[1].reshape(-1, arity), axis=1))]:
            mismatch = np.flatnonzero(got != expected).tolist()
            assert not mismatch, f"level {depth}: the {name} of nodes {mismatch[:8]} differ from their children's"
        below = sums, minimums
    assert tree.total.dtype == torch.float64 and tree.total.shape == ()
    assert tree.total.item() == pairwise_sums(below[0])
    assert tree.minimum.item() == positive_min(below[1])


def leaves_of(prb: PrioritizedReplayBuffer) -> np.ndarray:
    return prb.tree.leaves[: prb.capacity].cpu().numpy()


# ---- the segment tree --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capacity, arity, top, sizes",
    [
        (1, 32, 32768, [32, 1]),
        (2**20, 32, 32768, [2**20, 2**15]),
        (2**20 + 1, 32, 32768, [1025 * 1024, 1025 * 32, 1025]),
        (10**6, 32, 32768, [10**6, 31250]),
        (10**6, 32, 4096, [977 * 32 * 32, 977 * 32, 977]),
        (3000, 32, 16, [3072, 96, 3]),
        (7, 2, 1, [8, 4, 2, 1]),
        (1000, 2, 1, [2**k for k in range(10, -1, -1)]),
        (10, 3, 4, [12, 4]),
        (10, 3, 3, [18, 6, 2]),
    ],
)
def test_segment_tree_layout(capacity, arity, top, sizes):
    """Leaves, then each level with `arity` times fewer entries; at least one level above the
    leaves, and the top, the first with at most `top` entries."""
    tree = SegmentTree(capacity, "cpu", arity, top)
    assert [tree.leaves.numel()] + [level.shape[1] for level in tree.levels] == sizes
    assert all(level.shape[0] == 2 for level in tree.levels)


@pytest.mark.parametrize("shape", TREE_SHAPES)
@pytest.mark.parametrize("capacity", [1, 5, 1000, 1024, 3000])
def test_segment_tree_matches_a_numpy_reference(device, capacity, shape):
    """Hundreds of calls of random leaf writes, with repeated slots (each repeat carrying the same
    value, as update requires) and zeros (empty slots, which the minimums skip); after each call
    every level is checked exactly against the reference reductions of its children
    (assert_tree_exact), and at the end the roots against the reference and the tree against one
    rebuilt from the reference leaves with assign."""
    rng = np.random.default_rng(capacity)
    tree = make_tree(capacity, device, shape)
    reference = np.zeros(capacity)
    repeats = 0
    for _ in range(200):
        count = int(rng.integers(1, min(capacity, 64) + 1))
        slots = rng.choice(rng.integers(0, capacity, size=max(1, count // 2)), size=count)  # with repeats
        unique, first = np.unique(slots, return_inverse=True)
        values = rng.exponential(size=unique.size) * 10.0 ** rng.uniform(-6, 6, size=unique.size)
        values[rng.random(unique.size) < 0.1] = 0.0
        repeats += slots.size - unique.size
        tree.update(torch.as_tensor(slots, device=device), torch.as_tensor(values[first], device=device))
        reference[unique] = values
        assert_tree_exact(tree, reference)
    assert capacity == 1 or repeats > 100
    assert tree.total.item() == pytest.approx(math.fsum(reference.tolist()), rel=1e-12)
    assert tree.minimum.item() == positive_min(reference)
    rebuilt = make_tree(capacity, device, shape)
    rebuilt.assign(torch.as_tensor(reference, device=device))
    assert torch.equal(tree.leaves, rebuilt.leaves)
    assert all(torch.equal(a, b) for a, b in zip(tree.levels, rebuilt.levels, strict=True))


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_full_rows_skips_only_work_that_changes_nothing(device, shape):
    """update(..., full_rows=True) on a tree whose leaf rows hold no zero gives the same tree, bit
    for bit, as the default update; and the promise matters: broken, the minimum becomes 0."""
    arity = TREE_SHAPES[shape][0]
    capacity = arity * 37
    rng = np.random.default_rng(7)
    trees = [make_tree(capacity, device, shape) for _ in range(2)]
    start = torch.as_tensor(rng.exponential(size=capacity) + 0.1, device=device)
    for tree in trees:
        tree.assign(start)
    for _ in range(50):
        slots = torch.as_tensor(rng.integers(0, capacity, size=40), device=device)
        values = torch.as_tensor(rng.exponential(size=40) + 1e-3, device=device).index_select(
            0, torch.unique(slots, return_inverse=True)[1])  # equal values for repeated slots
        trees[0].update(slots, values)
        trees[1].update(slots, values, full_rows=True)
        assert torch.equal(trees[0].leaves, trees[1].leaves)
        assert all(torch.equal(a, b) for a, b in zip(trees[0].levels, trees[1].levels, strict=True))
    assert_tree_exact(trees[1])
    trees[1].update(torch.tensor([0], device=device), torch.zeros(1, dtype=torch.float64, device=device), True)
    assert trees[1].minimum.item() == 0.0


@pytest.mark.parametrize("shape", TREE_SHAPES)
@pytest.mark.parametrize("capacity", [1, 7, 1000, 1024, 3000])
def test_find_prefix_on_integer_leaves_equals_searchsorted(device, capacity, shape):
    """Integer-valued leaves make every partial sum exact, so the descent must agree with
    np.searchsorted(cumsum, mass, side="right") everywhere: on boundaries, and past zero leaves.
    Masses given as fractions of the total (relative=True) land where fraction * total does."""
    rng = np.random.default_rng(capacity + 1)
    tree = make_tree(capacity, device, shape)
    leaves = rng.integers(0, 4, size=capacity).astype(np.float64)  # about a quarter are zero
    leaves[rng.integers(capacity)] = 5.0
    tree.update(torch.arange(capacity, device=device), torch.as_tensor(leaves, device=device))
    cumsum = np.cumsum(leaves)
    total = cumsum[-1]
    mass = np.concatenate(
        [
            np.arange(total),  # every boundary
            np.arange(total) + 0.5,
            rng.uniform(0, total, size=1000),
            [np.nextafter(total, 0.0)],
        ]
    )
    found = tree.find_prefix(torch.as_tensor(mass, device=device)).cpu().numpy()
    expected = np.searchsorted(cumsum, mass, side="right")
    assert np.array_equal(found, expected)
    assert (leaves[found] > 0).all()
    fraction = torch.as_tensor(rng.uniform(0, 1, size=1000), device=device)
    assert torch.equal(tree.find_prefix(fraction, relative=True), tree.find_prefix(fraction * tree.total))


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_find_prefix_on_float_leaves(device, shape):
    """Random float leaves over 12 orders of magnitude: away from the boundaries of the cumulative
    sum (further than 1e-9 of the total, which float64 rounding cannot bridge), the descent agrees
    with np.searchsorted; it never lands on a zero leaf. Seed 11."""
    rng = np.random.default_rng(11)
    capacity = 3000
    tree = make_tree(capacity, device, shape)
    leaves = rng.exponential(size=capacity) * 10.0 ** rng.uniform(-6, 6, size=capacity)
    leaves[rng.random(capacity) < 0.2] = 0.0
    tree.update(torch.arange(capacity, device=device), torch.as_tensor(leaves, device=device))
    cumsum = np.cumsum(leaves)
    total = tree.total.item()
    mass = rng.uniform(0, total, size=20000)
    found = tree.find_prefix(torch.as_tensor(mass, device=device)).cpu().numpy()
    expected = np.searchsorted(cumsum, mass, side="right")
    boundary = np.concatenate([[0.0], cumsum])  # leaf j covers [boundary[j], boundary[j + 1])
    j = np.minimum(expected, capacity - 1)
    gap = np.minimum(np.abs(mass - boundary[j]), np.abs(mass - boundary[j + 1]))
    clear = gap > 1e-9 * total
    assert clear.mean() > 0.99
    assert np.array_equal(found[clear], expected[clear])
    assert (leaves[found] > 0).all()


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_find_prefix_at_or_past_the_total_lands_at_or_after_the_last_positive_leaf(device, shape):
    """The rounding guard's contract: positive leaves then zero leaves (a buffer that is not full).
    A mass just below, at, or past the total (which rounding in the descent can reach) never
    lands before the last positive leaf, so the buffer's clamp to len - 1 maps it onto the last
    item."""
    capacity, filled = 1000, 617
    rng = np.random.default_rng(5)
    tree = make_tree(capacity, device, shape)
    leaves = np.zeros(capacity)
    leaves[:filled] = rng.exponential(size=filled) * 10.0 ** rng.uniform(-3, 3, size=filled)
    leaves[filled - 1] = 1.0  # far above the rounding error of the total
    tree.update(torch.arange(capacity, device=device), torch.as_tensor(leaves, device=device))
    total = tree.total.item()
    mass = np.array([total, np.nextafter(total, 0.0), np.nextafter(total, np.inf), total * (1 + 1e-12)])
    found = tree.find_prefix(torch.as_tensor(mass, device=device)).cpu().numpy()
    assert (found >= filled - 1).all()
    assert (found < tree.leaves.numel()).all()


def test_root_stays_the_sum_of_the_leaves_after_a_million_updates(device):
    """Capacity 2^20, 1000 SegmentTree.update calls of 1000 random slots each (de-duplicated, so
    about 10^6 leaf writes) with values over 6 orders of magnitude. Seed 0. The root must equal
    the exactly rounded sum of the leaves (math.fsum) to 1e-9 relative, and every node the sum
    of its children exactly. (About 1 s on two CPU cores.)"""
    capacity = 1 << 20
    rng = np.random.default_rng(0)
    tree = SegmentTree(capacity, device)
    assert len(tree.levels) == 1
    writes = 0
    for _ in range(1000):
        slots = np.unique(rng.integers(0, capacity, size=1000))
        values = 10.0 ** rng.uniform(-4, 2, size=slots.size)
        tree.update(torch.as_tensor(slots, device=device), torch.as_tensor(values, device=device))
        writes += slots.size
    assert writes > 990_000
    leaves = tree.leaves.cpu().numpy()
    assert tree.total.item() == pytest.approx(math.fsum(leaves.tolist()), rel=1e-9, abs=0)
    assert_tree_exact(tree)


def random_leaves(rng: np.random.Generator, size: int) -> np.ndarray:
    """Float leaves over 12 orders of magnitude, a tenth of them 0: where the order of the adds shows."""
    leaves = rng.exponential(size=size) * 10.0 ** rng.uniform(-6, 6, size=size)
    leaves[rng.random(size) < 0.1] = 0.0
    return leaves


def assert_same_tree(a: SegmentTree, b: SegmentTree) -> None:
    assert torch.equal(a.leaves, b.leaves)
    assert all(torch.equal(x, y) for x, y in zip(a.levels, b.levels, strict=True))
    assert torch.equal(a.total, b.total) and torch.equal(a.minimum, b.minimum)


def test_pairwise_sums_are_not_the_left_to_right_sums():
    """The reference order differs from a left-to-right sum on these leaves (seed 3), so the tests
    comparing trees with pairwise_sums would catch sums taken in the other order."""
    rows = random_leaves(np.random.default_rng(3), 32 * 100).reshape(100, 32)
    assert not np.array_equal(pairwise_sums(rows), np.cumsum(rows, axis=1)[:, -1])
    assert np.array_equal(pairwise_sums(np.array([[1.0, 2.0, 3.0]])), [(1.0 + 2.0) + 3.0])


@pytest.mark.parametrize("shape", TREE_SHAPES)
@pytest.mark.parametrize("capacity", [1000, 3000])
def test_every_path_to_the_same_leaves_gives_the_same_tree(device, capacity, shape):
    """The same leaves, reached by different paths, give one tree, bit for bit, equal to the
    reference: assign; one update of every slot ([n, arity] rows); one update per slot ([1, arity]
    rows); updates in batches of 1 to 300 slots in random order, over other values written first;
    and a rewrite of some slots with the values they hold (what an ignored stale update does). The
    same fractions then find the same leaves in all of them. Seed 4."""
    rng = np.random.default_rng(4)
    leaves = random_leaves(rng, capacity)
    values = torch.as_tensor(leaves, device=device)
    trees = [make_tree(capacity, device, shape) for _ in range(4)]
    trees[0].assign(values)
    trees[1].update(torch.arange(capacity, device=device), values)
    for slot in range(capacity):
        trees[2].update(torch.tensor([slot], device=device), values[slot : slot + 1])
    trees[3].assign(torch.as_tensor(random_leaves(rng, capacity), device=device))
    order = torch.as_tensor(rng.permutation(capacity), device=device)
    sizes = iter(rng.choice([1, 2, 7, 32, 33, 256, 300], size=capacity))
    start = 0
    while start < capacity:
        slots = order[start : start + next(sizes)]
        trees[3].update(slots, values.index_select(0, slots))
        start += slots.numel()
    again = torch.as_tensor(rng.integers(0, capacity, size=50), device=device)
    trees[3].update(again, values.index_select(0, again))
    assert_tree_exact(trees[0], leaves)
    fraction = torch.as_tensor(rng.uniform(0, 1, size=500), device=device)
    found = trees[0].find_prefix(fraction, relative=True)
    for tree in trees[1:]:
        assert_same_tree(tree, trees[0])
        assert torch.equal(tree.find_prefix(fraction, relative=True), found)


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_parts_of_a_stacked_tree_equal_lone_trees(device, shape):
    """SegmentTree.stacked (a tree per seed as slices of one tree): parts written through the whole
    tree's updates, in batches that mix the parts, or rebuilt each with assign (as load_state_dict
    does), equal lone trees given the same leaves, bit for bit (levels, total, minimum), and one
    descent of all parts finds the leaves each lone tree finds. Seed 5."""
    rng = np.random.default_rng(5)
    capacity, parts = 1000, 3
    lone = [make_tree(capacity, device, shape) for _ in range(parts)]
    whole, views = SegmentTree.stacked(lone[0], parts)
    rebuilt_whole, rebuilt = SegmentTree.stacked(lone[0], parts)
    size = views[0].leaves.numel()
    leaves = [random_leaves(rng, capacity) for _ in range(parts)]
    for part, tree in enumerate(lone):
        tree.update(torch.arange(capacity, device=device), torch.as_tensor(leaves[part], device=device))
        rebuilt[part].assign(torch.as_tensor(leaves[part], device=device))
    everything = np.concatenate([part * size + np.arange(capacity) for part in range(parts)])
    for slots in np.array_split(rng.permutation(everything), 37):
        values = np.concatenate(leaves)[(slots // size) * capacity + slots % size]
        whole.update(torch.as_tensor(slots, device=device), torch.as_tensor(values, device=device))
    fraction = torch.as_tensor(rng.uniform(0, 1, size=(parts, 200)), device=device)
    found = whole.find_prefix_parts(fraction)
    for part, tree in enumerate(lone):
        assert_tree_exact(tree, leaves[part])
        assert_same_tree(views[part], tree)
        assert_same_tree(rebuilt[part], tree)
        assert torch.equal(found[part], tree.find_prefix(fraction[part], relative=True))
    assert_same_tree(rebuilt_whole, whole)


class ScanInAnotherOrder(torch.overrides.TorchFunctionMode):
    """Stands in, on the CPU, for a device whose cumsum adds in another order (as CUDA's parallel scan
    does): every cumsum becomes a Hillis-Steele scan (log2(n) rounds of y[j] += y[j - k])."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") != "cumsum":
            return func(*args, **kwargs)
        x, dim = args[0], kwargs.get("dim", args[1] if len(args) > 1 else None)
        scan, step = x.movedim(dim, -1), 1
        while step < scan.shape[-1]:
            scan = torch.cat([scan[..., :step], scan[..., step:] + scan[..., :-step]], -1)
            step *= 2
        scan = scan.movedim(-1, dim)
        return scan if kwargs.get("out") is None else kwargs["out"].copy_(scan)


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_the_sums_do_not_depend_on_the_order_of_a_scan(shape):
    """Trees built with every cumsum adding in another order (ScanInAnotherOrder), by updates and by
    assign, equal the tree built with the CPU's own, bit for bit: no sum the tree stores, nor its
    total, comes from a scan or a reduction whose order a device chooses. Seed 6."""
    rng = np.random.default_rng(6)
    capacity = 3000
    leaves = torch.as_tensor(random_leaves(rng, capacity))
    batches = np.array_split(rng.permutation(capacity), 23)
    x = torch.rand(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    with ScanInAnotherOrder():
        assert not torch.equal(x.cumsum(1), torch.from_numpy(np.cumsum(x.numpy(), axis=1)))  # another order
    trees = []
    for order in (ScanInAnotherOrder, contextlib.nullcontext):
        with order():
            updated, assigned = make_tree(capacity, "cpu", shape), make_tree(capacity, "cpu", shape)
            for slots in batches:
                updated.update(torch.as_tensor(slots), leaves[slots])
            assigned.assign(leaves)
            trees += [(updated, updated.total), (assigned, assigned.total)]
    for tree, total in trees[1:]:
        assert_same_tree(tree, trees[0][0])
        assert torch.equal(total, trees[0][1])


def test_update_keeps_its_memory_for_a_few_sizes_and_never_drops_it(device):
    """update's memory (for the adds of the pairwise sums) is kept for up to 32 sizes of at most 4096
    slots and never dropped, since a CUDA graph captured over an update writes into it on each replay:
    after updates of 100 other sizes, the first size's memory is the same, no more sizes are kept,
    and the tree is still exact. Seed 7."""
    rng = np.random.default_rng(7)
    capacity = 5000
    tree = make_tree(capacity, device, "wide")
    reference = np.zeros(capacity)

    def update(count: int) -> None:
        slots = rng.choice(capacity, size=count, replace=False)
        reference[slots] = random_leaves(rng, count)
        tree.update(torch.as_tensor(slots, device=device), torch.as_tensor(reference[slots], device=device))

    update(256)
    memory = [rows.data_ptr() for rows, *_ in tree._scratch["update"][256]]
    for count in [*range(1, 100), 4097]:
        update(count)
    update(256)
    kept = tree._scratch["update"]
    assert [rows.data_ptr() for rows, *_ in kept[256]] == memory
    assert len(kept) == 32 and max(kept) <= 4096 and 4097 not in kept
    assert_tree_exact(tree, reference)


def test_bad_segment_tree_arguments():
    with pytest.raises(ValueError, match="arity must be >= 2"):
        SegmentTree(4, arity=1)
    with pytest.raises(ValueError, match="top >= 1"):
        SegmentTree(4, top=0)


# ---- priorities --------------------------------------------------------------------------------


class Reference:
    """Brute-force model of the priorities: a float64 array per slot, updated one index at a time."""

    def __init__(self, capacity: int, alpha: float, eps: float):
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.stored = np.zeros(capacity)
        self.written = 0
        self.max_priority = 1.0

    def extend(self, count: int) -> None:
        for k in range(self.written, self.written + count):
            self.stored[k % self.capacity] = self.max_priority
        self.written += count

    def update(self, index, priority) -> None:
        last = {}  # slot -> value; a later value for the same index replaces an earlier one
        for i, p in zip(index, priority, strict=True):
            if i >= self.written - self.capacity:  # stale indices are ignored
                last[i % self.capacity] = (abs(p) + self.eps) ** self.alpha
        for slot, value in last.items():
            self.stored[slot] = value
            self.max_priority = max(self.max_priority, value)  # only values that were stored count

    @property
    def live(self) -> np.ndarray:
        return self.stored[: min(self.written, self.capacity)]


@pytest.mark.parametrize("validation", ["immediate", "deferred"])
def test_priorities_match_a_reference_with_duplicates_stale_indices_and_overwrites(device, tree_shape, validation):
    """~150 rounds of extends and update_priority calls; indices drawn with replacement (so one
    call names the same index several times, and the last value must win) from a range that
    includes overwritten items (which must be ignored). Seed 2; leaves compared to 1e-13
    relative (torch's and numpy's pow may differ in the last bit), the trees exactly. Both
    validation modes (stale indices are not errors in either)."""
    rng = np.random.default_rng(2)
    capacity, alpha, eps = 1000, 0.6, 1e-3
    prb = PrioritizedReplayBuffer(capacity, alpha=alpha, eps=eps, device=device, seed=0, validation=validation)
    assert len(prb.tree.levels) == {(32, 32768): 1, (32, 16): 2, (3, 4): 6}[tree_shape]
    ref = Reference(capacity, alpha, eps)
    duplicates = stale = 0
    for _ in range(150):
        if rng.random() < 0.3:
            count = int(rng.integers(0, 300))
            fill(prb, count, start=prb.written, chunk=count or 1)
            ref.extend(count)
        if prb.written == 0:
            continue
        low = max(0, prb.written - capacity - 100)  # some indices are stale
        index = rng.integers(low, prb.written, size=int(rng.integers(1, 200)))
        priority = rng.exponential(size=index.size) * 10.0 ** rng.uniform(-3, 1)
        priority[rng.random(index.size) < 0.05] = 0.0
        duplicates += index.size - np.unique(index).size
        stale += int((index < prb.written - capacity).sum())
        prb.update_priority(torch.as_tensor(index, device=device), torch.as_tensor(priority, device=device))
        ref.update(index.tolist(), priority.tolist())
        size = len(prb)
        np.testing.assert_allclose(leaves_of(prb)[:size], ref.live, rtol=1e-13, atol=0)
        assert prb.max_priority.item() == pytest.approx(ref.max_priority, rel=1e-13)
        assert_tree_exact(prb.tree)  # the minimum too, exactly, from the leaves
        assert (leaves_of(prb)[size:] == 0).all()
        assert prb.tree.minimum.item() == pytest.approx(ref.live.min(), rel=1e-13)  # pow as the leaves
    assert prb.written > capacity and duplicates > 1000 and stale > 100
    prb.check()  # nothing was rejected


def test_new_items_get_the_largest_priority_stored_so_far(device):
    alpha, eps = 0.6, 1e-6
    prb = PrioritizedReplayBuffer(4, alpha=alpha, eps=eps, device=device)
    fill(prb, 3)
    assert leaves_of(prb)[:3].tolist() == [1.0, 1.0, 1.0]  # 1.0 at the start

    # Updates below 1.0 do not lower it...
    prb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([0.2, 0.3, 0.0]))
    fill(prb, 1, start=3)
    assert leaves_of(prb)[3] == 1.0

    # ...nor does a value that a later one for the same index replaced in the same call...
    prb.update_priority(torch.tensor([2, 3, 2]), torch.tensor([9.0, 0.5, 0.1], dtype=torch.float64))
    assert prb.max_priority.item() == 1.0
    assert leaves_of(prb)[2] == pytest.approx((0.1 + eps) ** alpha, rel=1e-14)

    # ...a larger one raises it to (|p| + eps) ** alpha...
    prb.update_priority(torch.tensor([1]), torch.tensor([4.0]))
    big = (4.0 + eps) ** alpha
    assert leaves_of(prb)[1] == pytest.approx(big, rel=1e-14)
    fill(prb, 1, start=4)  # overwrites slot 0: the new item gets the max, not the old item's priority
    assert leaves_of(prb)[0] == leaves_of(prb)[1]

    # ...and it stays the largest seen so far when that item's own priority drops again.
    prb.update_priority(torch.tensor([1, 4]), torch.tensor([0.1, 0.1]))
    fill(prb, 2, start=5)  # slots 1 and 2
    assert leaves_of(prb)[1] == leaves_of(prb)[2] == pytest.approx(big, rel=1e-14)
    assert prb.max_priority.item() == leaves_of(prb)[1]
    assert_tree_exact(prb.tree)


@pytest.mark.parametrize("validation", ["immediate", "deferred"])
def test_a_stale_update_is_ignored(device, snapshot, tree_shape, validation):
    """A call whose indices are all stale changes nothing, the tree included (its parents are
    recomputed from unchanged leaves: the same bits); with deferred validation (the default on
    CUDA) it still counts as a call toward the next periodic check (it cannot know, without a host
    read, that nothing was applied)."""
    prb = PrioritizedReplayBuffer(8, alpha=0.6, device=device, seed=0, validation=validation)
    fill(prb, 8)
    index = prb.sample(32)["index"]
    assert set(index.tolist()) <= set(range(8))
    fill(prb, 5, start=8)  # items 0..4 are overwritten by 8..12; 5..7 are still stored
    stale = index[index < 5]
    assert stale.numel() > 0
    kind, before = snapshot(prb)
    prb.update_priority(stale, torch.full((stale.numel(),), 50.0))
    kind, after = snapshot(prb)
    assert after.pop("_calls") == before.pop("_calls") + (validation == "deferred")
    assert after == before  # the new items in those slots keep their priority

    # In a mixed call the live indices are updated and the stale ones still ignored.
    prb.update_priority(torch.tensor([0, 6, 3, 12]), torch.tensor([50.0, 2.0, 50.0, 3.0]))
    leaves = leaves_of(prb)
    expected = np.ones(8)
    expected[6], expected[12 % 8] = (2.0 + 1e-6) ** 0.6, (3.0 + 1e-6) ** 0.6
    np.testing.assert_allclose(leaves, expected, rtol=1e-14)
    assert_tree_exact(prb.tree)


# ---- sampling ----------------------------------------------------------------------------------


def prioritized(device, capacity, written, alpha=0.6, beta=0.4, seed=0, eps=1e-2, validation=None):
    """A buffer with `written` items whose live ones have random priorities; and its Reference."""
    rng = np.random.default_rng(seed)
    prb = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=beta, eps=eps, device=device, seed=seed,
                                  validation=validation)
    ref = Reference(capacity, alpha, eps)
    fill(prb, written, chunk=min(17, capacity))
    ref.extend(written)
    index = np.arange(max(0, written - capacity), written)
    priority = rng.exponential(size=index.size) * 10.0 ** rng.uniform(-2, 1, size=index.size)
    priority[: max(1, index.size // 10)] = 0.0
    prb.update_priority(torch.as_tensor(index), torch.as_tensor(priority))
    ref.update(index.tolist(), priority.tolist())
    return prb, ref


def sample_counts(prb, batches: int, batch_size: int) -> np.ndarray:
    index = torch.cat([prb.sample(batch_size)["index"] for _ in range(batches)]).cpu()
    first = prb.written - len(prb)
    assert bool((index >= first).all()) and bool((index < prb.written).all())
    return torch.bincount(index - first, minlength=len(prb)).numpy()


def test_sampling_frequencies_follow_priorities_chi_square(device, chi_square, tree_shape):
    """Counts over 200,000 draws fit P(i) = (p_i + eps)^alpha / sum, and do not fit uniform.

    Seed 0; Pearson chi-square at significance 1e-3 (critical value from the Wilson–Hilferty
    approximation, tests/conftest.py). Stratification only lowers the statistic's variance."""
    prb, ref = prioritized(device, capacity=40, written=100)
    probs = ref.live[(np.arange(40) + 100) % 40]  # in index order: item 60 + k sits in slot (60 + k) % 40
    counts = sample_counts(prb, batches=1000, batch_size=200)
    stat, critical = chi_square(counts, probs)
    assert stat < critical, (stat, critical)
    stat, critical = chi_square(counts, np.ones(40))
    assert stat > critical, (stat, critical)  # the test has the power to tell them apart


def test_alpha_zero_samples_uniformly_chi_square(device, chi_square):
    """alpha = 0: every stored priority is 1 whatever the update, so sampling is uniform.
    Seed 4, 100,000 draws, Pearson chi-square at significance 1e-3 (Wilson–Hilferty)."""
    prb, ref = prioritized(device, capacity=50, written=70, alpha=0.0, seed=4)
    assert (leaves_of(prb) == 1.0).all()
    counts = sample_counts(prb, batches=500, batch_size=200)
    stat, critical = chi_square(counts, np.ones(50))
    assert stat < critical, (stat, critical)


@pytest.mark.parametrize(
    "capacity, written, batch_size",
    [(50, 50, 16), (37, 120, 64), (20, 13, 100), (1000, 2500, 256), (3000, 2000, 256)],
    ids=["full", "wrapped", "more-draws-than-items", "large", "partly-filled"],
)
def test_sampling_is_stratified(device, tree_shape, capacity, written, batch_size):
    """Sample i's item covers part of the i-th of batch_size equal segments of the total mass:
    its cumulative interval [c_{j-1}, c_j) intersects [i T / B, (i+1) T / B) (to 1e-9 T)."""
    prb, _ = prioritized(device, capacity, written, seed=capacity)
    # A few heavy items that span several segments.
    heavy = torch.arange(written - 3, written)
    prb.update_priority(heavy, torch.full((3,), 40.0))
    leaves = leaves_of(prb)[: len(prb)]
    upper = np.cumsum(leaves)
    lower = upper - leaves
    total = upper[-1]
    tol = 1e-9 * total
    segment_lo = np.arange(batch_size) * total / batch_size
    segment_hi = segment_lo + total / batch_size
    for _ in range(20):
        slot = (prb.sample(batch_size)["index"] % capacity).cpu().numpy()
        assert (upper[slot] > segment_lo - tol).all() and (lower[slot] < segment_hi + tol).all()
        assert (leaves[slot] > 0).all()


def test_a_draw_past_the_last_item_is_clamped_onto_it(device, monkeypatch):
    """The guard in sample: should rounding carry a draw into the zero leaves after the last item
    (forced here), the draw becomes the last item, with its own weight."""
    prb, ref = prioritized(device, capacity=100, written=60, beta=1.0)
    padding = prb.tree.leaves.numel() - 1
    monkeypatch.setattr(prb.tree, "find_prefix",
                        lambda mass, relative=False: torch.full_like(mass, padding, dtype=torch.int64))
    batch = prb.sample(8)
    assert batch["index"].tolist() == [59] * 8
    expected = ref.live.min() / ref.live[59]  # beta = 1
    np.testing.assert_allclose(batch["weight"].cpu().numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("beta", [0.4, 1.0, 2.5])
def test_importance_weights(device, tree_shape, beta):
    """weight_i = (N P(i))^-beta / max_j (N P(j))^-beta, the max over the whole buffer, to 1e-6,
    with P from the reference priorities; also after changing beta through the setter."""
    prb, ref = prioritized(device, capacity=30, written=75, beta=beta, seed=5)
    n = len(prb)
    probs = ref.live / ref.live.sum()

    def expected(slot, beta):
        return (n * probs[slot]) ** -beta / ((n * probs) ** -beta).max()

    for b in (beta, 0.7):
        prb.beta = b
        for _ in range(5):
            batch = prb.sample(64)
            weight = batch["weight"]
            assert weight.dtype == torch.float32 and weight.device.type == device.type
            slot = (batch["index"] % 30).cpu().numpy()
            np.testing.assert_allclose(weight.cpu().numpy(), expected(slot, b), rtol=1e-6, atol=0)
            assert bool((weight > 0).all()) and bool((weight <= 1).all())


def test_beta_zero_gives_weights_of_exactly_one(device):
    prb, _ = prioritized(device, capacity=30, written=45, beta=0.0)
    assert bool((prb.sample(100)["weight"] == 1).all())
    prb.beta = 0.5
    assert not bool((prb.sample(100)["weight"] == 1).all())  # the priorities do differ
    prb.beta = 0
    assert bool((prb.sample(100)["weight"] == 1).all())


def test_same_seed_same_samples_and_weights(device):
    def run(seed):
        prb, _ = prioritized(device, capacity=64, written=150, seed=1)
        prb.generator.manual_seed(seed)
        out = []
        for _ in range(4):
            batch = prb.sample(32)
            out.append(batch)
            prb.update_priority(batch["index"], batch["index"].double().remainder(7))
        return torch.cat(out)

    a, b, c = run(10), run(10), run(11)
    assert (a == b).all()
    assert not torch.equal(a["index"], c["index"])


# ---- checkpoints -------------------------------------------------------------------------------


@pytest.mark.parametrize("validation", ["immediate", "deferred"])
@pytest.mark.parametrize("capacity, written", [(40, 90), (3000, 2000)], ids=["wrapped", "partly-filled"])
def test_state_dict_round_trip_through_a_file(device, tmp_path, snapshot, tree_shape, capacity, written, validation):
    """The trees are saved as their leaves and rebuilt on load; the copy must be bit-identical, in
    both validation modes (deferred: state_dict's check restarts the count of calls to the next
    periodic check, which the copy starts from 0).

    Compared with `written_part`: in a buffer that is not full, the storage rows never written
    hold uninitialised memory (torch.empty), whose NaN bit patterns a copy need not keep."""

    def written_part(prb):
        kind, attributes = snapshot(prb)
        return kind, {**attributes, "storage": snapshot(prb.storage[: len(prb)])}

    original, _ = prioritized(device, capacity=capacity, written=written, alpha=0.7, beta=0.3, eps=1e-3, seed=6,
                              validation=validation)
    original.sample(16)
    path = tmp_path / "prb.pt"
    torch.save(original.state_dict(), path)

    copy = PrioritizedReplayBuffer(capacity, alpha=0.1, beta=0.9, eps=0.5, device=device, seed=123,
                                   validation=validation)
    copy.load_state_dict(torch.load(path, weights_only=True))
    assert (copy.alpha, copy.beta, copy.eps) == (0.7, 0.3, 1e-3)
    assert written_part(copy) == written_part(original)  # storage, trees, max priority, generator, ...

    for _ in range(3):
        a, b = original.sample(32), copy.sample(32)
        assert (a == b).all()
        for prb in (original, copy):
            prb.update_priority(a["index"], a["index"].double() / 10)
    fill(original, 5, start=written)
    fill(copy, 5, start=written)
    assert written_part(copy) == written_part(original)

    before = written_part(copy)
    original.update_priority(torch.tensor([written + 4, written + 3]), torch.tensor([100.0, 0.0]))
    fill(original, 7, start=written + 5)
    assert written_part(copy) == before
    before = written_part(original)
    copy.update_priority(torch.tensor([written + 4]), torch.tensor([3.0]))
    copy.beta = 1.0
    assert written_part(original) == before


# ---- bad input ---------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "index, priority, match",
    [
        ([3, 4], [0.5, NAN], "finite"),
        ([3, 4], [INF, 0.5], "finite"),
        ([3, 4], [0.5, -INF], "finite"),
        ([3, 4], [0.5, -0.1], ">= 0"),
        ([3, 4, 5], [0.5, 0.5], "3 indices but 2 priorities"),
        ([3], [0.5, 0.5], "1 indices but 2 priorities"),
        ([3, -1], [0.5, 0.5], r"negative indices: \[-1\]"),
        ([3, 30], [0.5, 0.5], r"never written \(only 30 items so far\): \[30\]"),
        ([3.0, 4.0], [0.5, 0.5], "integers"),
        ([True, False], [0.5, 0.5], "integers"),
    ],
    ids=["nan", "inf", "-inf", "negative", "more-indices", "more-priorities", "negative-index",
         "never-written", "float-index", "bool-index"],
)
def test_bad_priority_updates_raise_and_change_nothing(device, snapshot, index, priority, match):
    prb, _ = prioritized(device, capacity=20, written=30, validation="immediate")
    before = snapshot(prb)
    with pytest.raises(ValueError, match=match):
        prb.update_priority(torch.tensor(index, device=device), torch.tensor(priority, device=device))
    assert snapshot(prb) == before  # the valid entries of the call were not applied either


def test_updating_an_empty_buffer_raises(device, snapshot):
    prb = PrioritizedReplayBuffer(4, device=device, validation="immediate")
    before = snapshot(prb)
    with pytest.raises(ValueError, match=r"never written \(only 0 items"):
        prb.update_priority(torch.tensor([0]), torch.tensor([1.0]))
    assert snapshot(prb) == before


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": -0.1}, "alpha must be >= 0, got -0.1"),
        ({"alpha": NAN}, "alpha must be >= 0"),
        ({"beta": -0.5}, "beta must be >= 0, got -0.5"),
        ({"beta": NAN}, "beta must be >= 0"),
        ({"eps": 0.0}, "eps must be > 0"),
        ({"eps": -1e-6}, "eps must be > 0"),
        ({"eps": 1e-6, "alpha": 60.0}, "underflows to 0"),
        ({"capacity": 0}, "capacity must be a positive integer, got 0"),
    ],
)
def test_bad_constructor_arguments(device, kwargs, match):
    kwargs = {"capacity": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        PrioritizedReplayBuffer(device=device, **kwargs)


@pytest.mark.parametrize("beta", [-0.5, NAN])
def test_bad_beta_through_the_setter_changes_nothing(device, snapshot, beta):
    prb, _ = prioritized(device, capacity=10, written=12, beta=0.4)
    before = snapshot(prb)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        prb.beta = beta
    assert snapshot(prb) == before
    assert prb.beta == 0.4


# ---- deferred validation: no host reads, and capture --------------------------------------------


@pytest.mark.parametrize(
    "bad_index, bad_priority, reason",
    [
        (14, NAN, "1 with NaN or inf priorities"),
        (14, INF, "1 with NaN or inf priorities"),
        (14, -0.5, "1 with negative priorities"),
        (-6, 0.5, "1 with negative indices"),  # its slot, 14, holds live item 14
        (34, 0.5, "1 with indices never written"),  # its slot, 14, holds live item 14
    ],
    ids=["nan", "inf", "negative", "negative-index", "never-written"],
)
def test_deferred_validation_drops_bad_entries_applies_the_rest_and_reports_once(
    device, bad_index, bad_priority, reason
):
    """validation="deferred": no raise during the call; the bad entry never reaches the tree (its
    slot keeps its priority), the valid entries of the same call are applied; check() then
    raises once, naming the reason and the count, and the next check() passes."""
    prb, ref = prioritized(device, capacity=20, written=30, validation="deferred")
    before = leaves_of(prb).copy()
    prb.update_priority(torch.tensor([12, bad_index, 25], device=device),
                        torch.tensor([2.0, bad_priority, 3.0], device=device))
    ref.update([12, 25], [2.0, 3.0])
    leaves = leaves_of(prb)
    np.testing.assert_allclose(leaves, ref.stored, rtol=1e-13, atol=0)
    assert leaves[14] == before[14]
    assert_tree_exact(prb.tree)
    assert prb.max_priority.item() == pytest.approx(ref.max_priority, rel=1e-13)
    with pytest.raises(ValueError, match=reason):
        prb.check()
    prb.check()  # reported once


def test_deferred_validation_last_valid_copy_wins(device):
    """Among copies of one index, the last valid one wins; a later bad copy is dropped."""
    prb, ref = prioritized(device, capacity=20, written=30, validation="deferred")
    prb.update_priority(torch.tensor([12, 12, 12, 13], device=device),
                        torch.tensor([1.0, 2.0, NAN, -1.0], device=device, dtype=torch.float64))
    ref.update([12], [2.0])
    np.testing.assert_allclose(leaves_of(prb), ref.stored, rtol=1e-13, atol=0)
    with pytest.raises(ValueError, match="1 with NaN or inf priorities, 1 with negative priorities"):
        prb.check()


def test_deferred_validation_reads_its_counts_every_check_interval_calls(device, monkeypatch):
    monkeypatch.setattr(PrioritizedReplayBuffer, "check_interval", 5)
    prb = PrioritizedReplayBuffer(20, device=device, validation="deferred")
    fill(prb, 30, chunk=10)
    good = torch.tensor([20, 21], device=device), torch.tensor([1.0, 2.0], device=device)
    prb.update_priority(*good)
    prb.update_priority(torch.tensor([20], device=device), torch.tensor([NAN], device=device))
    for _ in range(2):
        prb.update_priority(*good)
    with pytest.raises(ValueError, match="1 with NaN or inf priorities"):
        prb.update_priority(*good)  # the 5th call
    for _ in range(5):
        prb.update_priority(*good)  # reported once


def test_state_dict_refuses_while_bad_entries_are_unreported(device):
    prb, _ = prioritized(device, capacity=20, written=30, validation="deferred")
    prb.update_priority(torch.tensor([31], device=device), torch.tensor([0.5], device=device))  # never written
    with pytest.raises(ValueError, match="1 with indices never written"):
        prb.state_dict()
    assert prb.state_dict()["written"] == 30


class NoHostReads(torch.overrides.TorchFunctionMode):
    """Raise on any call that reads a tensor's value back to the host (a sync on a GPU)."""

    READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "__repr__",
             "__format__"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            raise AssertionError(f"host read: {func.__name__}")
        return func(*args, **(kwargs or {}))


def test_deferred_mode_reads_nothing_back_from_the_device(device, monkeypatch, tree_shape):
    """With validation="deferred", extend, sample, update_priority (with bad and stale entries
    too) and beta changes make no call that reads a tensor's value on the host; check() does."""
    monkeypatch.setattr(PrioritizedReplayBuffer, "check_interval", 10**9)
    prb = PrioritizedReplayBuffer(300, device=device, seed=0, validation="deferred")
    with NoHostReads():
        for step in range(40):
            prb.extend(items(torch.arange(step * 16, (step + 1) * 16)).to(device))
            batch = prb.sample(32)
            index = batch["index"]
            if step % 5 == 0:  # a stale index and a NaN
                index = torch.cat([index, torch.zeros(1, dtype=torch.int64, device=device)])
                priority = torch.cat([batch["weight"], torch.full((1,), NAN, device=device)])
            else:
                priority = batch["weight"] * 2
            prb.update_priority(index, priority)
            prb.beta = 0.4 + step / 100
        with pytest.raises(AssertionError, match="host read"):
            prb.check()
    with pytest.raises(ValueError, match="8 with NaN or inf priorities"):
        prb.check()
    assert_tree_exact(prb.tree)


def _sample_and_update(prb: PrioritizedReplayBuffer, td_error: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch = prb.sample(td_error.numel())
    prb.update_priority(batch["index"], td_error.abs())
    return batch["index"], batch["weight"]


def _trace_of_steps(prb, step, errors) -> list:
    """Run `step` on each error vector, extending and changing beta between calls; everything it
    returned and the buffer's state after each call."""
    out = []
    for k, error in enumerate(errors):
        out.append((*step(prb, error), prb.tree.leaves.clone(), *(level.clone() for level in prb.tree.levels),
                    prb.max_priority.clone(), prb._rejected.clone()))
        prb.extend(items(torch.arange(prb.written, prb.written + 3)))
        prb.beta = 0.4 + 0.05 * k
    return out


@pytest.mark.slow
def test_torch_compile_of_sample_and_update_equals_eager_bit_for_bit(monkeypatch):
    """torch.compile (inductor, CPU) of sample + update_priority in deferred mode gives the same
    indices, weights, leaves, tree levels, max priority and error counts as eager code, bit for
    bit, over 8 calls with extends, beta changes and a NaN between them; after its first calls it
    never recompiles (the write count and beta are device tensors, not guarded Python numbers).
    Compiling takes 15-60 s on two CPU cores."""
    import torch._dynamo

    monkeypatch.setattr(PrioritizedReplayBuffer, "tree_top", 64)  # 2 levels above the leaves
    torch._dynamo.reset()
    errors = [torch.randn(32, generator=torch.Generator().manual_seed(k), dtype=torch.float64) for k in range(8)]
    errors[5][3] = NAN
    buffers = []
    for _ in range(2):
        prb = PrioritizedReplayBuffer(3000, device="cpu", seed=0, validation="deferred")
        fill(prb, 2500)
        _sample_and_update(prb, errors[0])  # first call: sets up the scratch
        buffers.append(prb)
    compiled = torch.compile(_sample_and_update)
    expected = _trace_of_steps(buffers[0], _sample_and_update, errors[:2])
    got = _trace_of_steps(buffers[1], compiled, errors[:2])  # compiles (maybe twice)
    with torch._dynamo.config.patch(error_on_recompile=True):
        expected += _trace_of_steps(buffers[0], _sample_and_update, errors[2:])
        got += _trace_of_steps(buffers[1], compiled, errors[2:])
    for k, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"call {k} differs"
    assert expected[-1][-1].tolist() == [1, 0, 0, 0]  # the NaN was counted, in both
    assert len(expected[0][2]) == 3000 + 72  # leaves padded to a whole row of the top


def test_gpu_tree_benchmark_runs_on_the_cpu(capsys):
    """benchmarks/gpu_tree.py on the CPU, small: times eager steps and skips the graph modes."""
    from benchmarks import gpu_tree

    result = gpu_tree.main(["--device", "cpu", "--capacity", "4096", "--repeats", "20", "--modes", "eager,graph"])
    assert list(result["results"]) == ["eager"]
    assert result["results"]["eager"]["ms_per_step"] > 0
    assert "graph            skipped: needs CUDA" in capsys.readouterr().out


@pytest.mark.slow
def test_gpu_tree_benchmark_compiles_on_the_cpu(tmp_path):
    """Its default modes on the CPU (eager and compile; the graph modes skipped), writing JSON. 20-60 s."""
    from benchmarks import gpu_tree

    out = tmp_path / "gpu_tree.json"
    gpu_tree.main(["--device", "cpu", "--capacity", "4096", "--repeats", "20", "--out", str(out)])
    assert set(json.loads(out.read_text())["results"]) == {"eager", "compile"}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_of_sample_and_update_equals_eager_steps():
    """sample + update captured once in a CUDA graph and replayed leave the tree that the same
    number of eager steps leave, bit for bit (same kernels; the generator advances per replay)."""
    from benchmarks import gpu_tree

    td_error = torch.rand(256, generator=torch.Generator().manual_seed(0)).cuda()
    assert gpu_tree.graph_matches_eager(1 << 16, torch.device("cuda"), td_error)
