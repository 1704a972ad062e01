"""PrioritizedReplayBuffer and its SegmentTree, against brute-force float64 numpy references.

Storage behaviour shared with ReplayBuffer (ring order, layout checks, empty batches, seeding,
checkpoints of the storage) is tested for both classes in test_replay.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from buffers import PrioritizedReplayBuffer, SegmentTree

pytestmark = pytest.mark.usefixtures("single_thread")


def items(index) -> TensorDict:
    index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
    return TensorDict({"obs": index.float().unsqueeze(1), "action": index}, batch_size=[index.numel()])


def fill(buf, count: int, start: int = 0, chunk: int = 64) -> None:
    for lo in range(start, start + count, chunk):
        buf.extend(items(torch.arange(lo, min(lo + chunk, start + count))))


def numpy_tree(leaves: np.ndarray, size: int, op: str) -> np.ndarray:
    """The node array a SegmentTree over `leaves` must hold: node 1 the root, children 2i and 2i+1."""
    identity = 0.0 if op == "sum" else np.inf
    combine = np.add if op == "sum" else np.minimum
    nodes = np.full(2 * size, identity)
    nodes[size : size + leaves.size] = leaves
    for level in range(size.bit_length() - 2, -1, -1):  # parents of the level below, bottom up
        lo, hi = 1 << level, 2 << level
        nodes[lo:hi] = combine(nodes[2 * lo : 2 * hi : 2], nodes[2 * lo + 1 : 2 * hi : 2])
    return nodes


def assert_tree_exact(tree: SegmentTree, op: str, leaves: np.ndarray | None = None) -> None:
    """Every node equals the sum/min of its children bit for bit (no drift), unused leaves the identity.

    With `leaves`, the leaves must also equal the reference leaves exactly.
    """
    nodes = tree.nodes.cpu().numpy()
    assert nodes.dtype == np.float64
    capacity = leaves.size if leaves is not None else None
    if leaves is None:
        leaves = nodes[tree.size :]
    expected = numpy_tree(leaves, tree.size, op)
    mismatch = np.flatnonzero(nodes[1:] != expected[1:]) + 1
    assert mismatch.size == 0, f"{op} tree nodes {mismatch[:8].tolist()} differ from their children's {op}"
    if capacity is not None:
        assert (nodes[tree.size + capacity :] == (0.0 if op == "sum" else np.inf)).all()


def leaves_of(prb: PrioritizedReplayBuffer) -> np.ndarray:
    return prb.sum_tree.nodes[prb.sum_tree.size : prb.sum_tree.size + prb.capacity].cpu().numpy()


# ---- the segment tree --------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 5, 1000, 1024])
@pytest.mark.parametrize("op", ["sum", "min"])
def test_segment_tree_matches_a_numpy_reference(device, capacity, op):
    """Thousands of random leaf writes (unique slots per call); after each call the whole tree is
    compared bit for bit with one rebuilt from scratch out of the reference leaves."""
    rng = np.random.default_rng(capacity)
    tree = SegmentTree(capacity, op, device)
    reference = np.full(capacity, 0.0 if op == "sum" else np.inf)
    for _ in range(200):
        slots = rng.choice(capacity, size=int(rng.integers(1, min(capacity, 64) + 1)), replace=False)
        values = rng.exponential(size=slots.size) * 10.0 ** rng.uniform(-6, 6, size=slots.size)
        values[rng.random(slots.size) < 0.1] = 0.0
        tree.update(torch.as_tensor(slots, device=device), torch.as_tensor(values, device=device))
        reference[slots] = values
        assert_tree_exact(tree, op, reference)
    combine = math.fsum if op == "sum" else min
    assert tree.root.item() == pytest.approx(combine(reference.tolist()), rel=1e-12)


@pytest.mark.parametrize("capacity", [1, 7, 1000, 1024])
def test_find_prefix_on_integer_leaves_equals_searchsorted(device, capacity):
    """Integer-valued leaves make every partial sum exact, so the descent must agree with
    np.searchsorted(cumsum, mass, side="right") everywhere: on boundaries, and past zero leaves."""
    rng = np.random.default_rng(capacity + 1)
    tree = SegmentTree(capacity, "sum", device)
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


def test_find_prefix_on_float_leaves(device):
    """Random float leaves over 12 orders of magnitude: away from the boundaries of the cumulative
    sum (further than 1e-9 of the total, which float64 rounding cannot bridge), the descent agrees
    with np.searchsorted; it never lands on a zero leaf. Seed 11."""
    rng = np.random.default_rng(11)
    capacity = 3000
    tree = SegmentTree(capacity, "sum", device)
    leaves = rng.exponential(size=capacity) * 10.0 ** rng.uniform(-6, 6, size=capacity)
    leaves[rng.random(capacity) < 0.2] = 0.0
    tree.update(torch.arange(capacity, device=device), torch.as_tensor(leaves, device=device))
    cumsum = np.cumsum(leaves)
    total = tree.root.item()
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


def test_root_stays_the_sum_of_the_leaves_after_a_million_updates(device):
    """Capacity 2^20, 1000 SegmentTree.update calls of 1000 random slots each (de-duplicated, so
    about 10^6 leaf writes) with values over 6 orders of magnitude. Seed 0. The root must equal
    the exactly rounded sum of the leaves (math.fsum) to 1e-9 relative, and every node the sum
    of its children exactly. (About 2-3 s on two CPU cores.)"""
    capacity = 1 << 20
    rng = np.random.default_rng(0)
    tree = SegmentTree(capacity, "sum", device)
    writes = 0
    for _ in range(1000):
        slots = np.unique(rng.integers(0, capacity, size=1000))
        values = 10.0 ** rng.uniform(-4, 2, size=slots.size)
        tree.update(torch.as_tensor(slots, device=device), torch.as_tensor(values, device=device))
        writes += slots.size
    assert writes > 990_000
    leaves = tree.nodes[tree.size :].cpu().numpy()
    assert tree.root.item() == pytest.approx(math.fsum(leaves.tolist()), rel=1e-9, abs=0)
    assert_tree_exact(tree, "sum")


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
        for i, p in zip(index, priority, strict=True):
            if i >= self.written - self.capacity:  # stale indices are ignored
                self.stored[i % self.capacity] = (abs(p) + self.eps) ** self.alpha
                self.max_priority = max(self.max_priority, self.stored[i % self.capacity])

    @property
    def live(self) -> np.ndarray:
        return self.stored[: min(self.written, self.capacity)]


def test_priorities_match_a_reference_with_duplicates_stale_indices_and_overwrites(device):
    """~150 rounds of extends and update_priority calls; indices drawn with replacement (so one
    call names the same index several times, and the last value must win) from a range that
    includes overwritten items (which must be ignored). Seed 2; leaves compared to 1e-13
    relative (torch's and numpy's pow may differ in the last bit), the trees exactly."""
    rng = np.random.default_rng(2)
    capacity, alpha, eps = 1000, 0.6, 1e-3
    prb = PrioritizedReplayBuffer(capacity, alpha=alpha, eps=eps, device=device, seed=0)
    ref = Reference(capacity, alpha, eps)
    duplicates = 0
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
        prb.update_priority(torch.as_tensor(index, device=device), torch.as_tensor(priority, device=device))
        ref.update(index.tolist(), priority.tolist())
        size = len(prb)
        np.testing.assert_allclose(leaves_of(prb)[:size], ref.live, rtol=1e-13, atol=0)
        assert prb.max_priority.item() == pytest.approx(ref.max_priority, rel=1e-13)
        assert_tree_exact(prb.sum_tree, "sum")
        assert_tree_exact(prb.min_tree, "min")
        min_leaves = prb.min_tree.nodes[prb.min_tree.size :].cpu().numpy()
        assert np.array_equal(min_leaves[:size], leaves_of(prb)[:size])
        assert np.isinf(min_leaves[size:]).all() and (leaves_of(prb)[size:] == 0).all()
    assert prb.written > capacity and duplicates > 1000


def test_new_items_get_the_largest_priority_stored_so_far(device):
    alpha, eps = 0.6, 1e-6
    prb = PrioritizedReplayBuffer(4, alpha=alpha, eps=eps, device=device)
    fill(prb, 3)
    assert leaves_of(prb)[:3].tolist() == [1.0, 1.0, 1.0]  # 1.0 at the start

    # Updates below 1.0 do not lower it...
    prb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([0.2, 0.3, 0.0]))
    fill(prb, 1, start=3)
    assert leaves_of(prb)[3] == 1.0

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
    assert_tree_exact(prb.sum_tree, "sum")
    assert_tree_exact(prb.min_tree, "min")


def test_a_stale_update_is_ignored(device, snapshot):
    prb = PrioritizedReplayBuffer(8, alpha=0.6, device=device, seed=0)
    fill(prb, 8)
    index = prb.sample(32)["index"]
    assert set(index.tolist()) <= set(range(8))
    fill(prb, 5, start=8)  # items 0..4 are overwritten by 8..12; 5..7 are still stored
    stale = index[index < 5]
    assert stale.numel() > 0
    before = snapshot(prb)
    prb.update_priority(stale, torch.full((stale.numel(),), 50.0))
    assert snapshot(prb) == before  # the new items in those slots keep their priority

    # In a mixed call the live indices are updated and the stale ones still ignored.
    prb.update_priority(torch.tensor([0, 6, 3, 12]), torch.tensor([50.0, 2.0, 50.0, 3.0]))
    leaves = leaves_of(prb)
    expected = np.ones(8)
    expected[6], expected[12 % 8] = (2.0 + 1e-6) ** 0.6, (3.0 + 1e-6) ** 0.6
    np.testing.assert_allclose(leaves, expected, rtol=1e-14)


# ---- sampling ----------------------------------------------------------------------------------


def prioritized(device, capacity, written, alpha=0.6, beta=0.4, seed=0, eps=1e-2):
    """A buffer with `written` items whose live ones have random priorities; and its Reference."""
    rng = np.random.default_rng(seed)
    prb = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=beta, eps=eps, device=device, seed=seed)
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


def test_sampling_frequencies_follow_priorities_chi_square(device, chi_square):
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
    [(50, 50, 16), (37, 120, 64), (20, 13, 100), (1000, 2500, 256)],
    ids=["full", "wrapped", "more-draws-than-items", "large"],
)
def test_sampling_is_stratified(device, capacity, written, batch_size):
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


@pytest.mark.parametrize("beta", [0.4, 1.0, 2.5])
def test_importance_weights(device, beta):
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


def test_state_dict_round_trip_through_a_file(device, tmp_path, snapshot):
    original, _ = prioritized(device, capacity=40, written=90, alpha=0.7, beta=0.3, eps=1e-3, seed=6)
    original.sample(16)
    path = tmp_path / "prb.pt"
    torch.save(original.state_dict(), path)

    copy = PrioritizedReplayBuffer(40, alpha=0.1, beta=0.9, eps=0.5, device=device, seed=123)
    copy.load_state_dict(torch.load(path, weights_only=True))
    assert (copy.alpha, copy.beta, copy.eps) == (0.7, 0.3, 1e-3)
    assert snapshot(copy) == snapshot(original)  # storage, trees, max priority, generator, ...

    for _ in range(3):
        a, b = original.sample(32), copy.sample(32)
        assert (a == b).all()
        for prb in (original, copy):
            prb.update_priority(a["index"], a["index"].double() / 10)
    fill(original, 5, start=90)
    fill(copy, 5, start=90)
    assert snapshot(copy) == snapshot(original)

    before = snapshot(copy)
    original.update_priority(torch.tensor([94, 93]), torch.tensor([100.0, 0.0]))
    fill(original, 7, start=95)
    assert snapshot(copy) == before
    before = snapshot(original)
    copy.update_priority(torch.tensor([94]), torch.tensor([3.0]))
    copy.beta = 1.0
    assert snapshot(original) == before


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
    ],
    ids=["nan", "inf", "-inf", "negative", "more-indices", "more-priorities", "negative-index",
         "never-written", "float-index"],
)
def test_bad_priority_updates_raise_and_change_nothing(device, snapshot, index, priority, match):
    prb, _ = prioritized(device, capacity=20, written=30)
    before = snapshot(prb)
    with pytest.raises(ValueError, match=match):
        prb.update_priority(torch.tensor(index, device=device), torch.tensor(priority, device=device))
    assert snapshot(prb) == before  # the valid entries of the call were not applied either


def test_updating_an_empty_buffer_raises(device, snapshot):
    prb = PrioritizedReplayBuffer(4, device=device)
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
    assert prb.beta == 0.4
    assert snapshot(prb) == before
