"""ReplayBuffer: ring storage, write positions, uniform sampling, seeding, checkpoints, bad input.

The storage behaviour is shared by both buffers, so most tests run on ReplayBuffer and on
PrioritizedReplayBuffer (`buffer_cls`), and on every device of the `device` fixture.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from buffers import PrioritizedReplayBuffer, ReplayBuffer
from buffers.replay import INDEX_COPY_ELEMENTS

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(params=[ReplayBuffer, PrioritizedReplayBuffer], ids=["uniform", "prioritized"])
def buffer_cls(request):
    return request.param


def items(index) -> TensorDict:
    """Items whose every field is a function of their write position, nested keys and several dtypes."""
    index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
    x = index.float()
    return TensorDict(
        {
            "obs": torch.stack([x, -x, 0.5 * x], dim=1),
            "action": index * 7 % 1000,
            "done": index % 3 == 0,
            "next": {"reward": x / 4 - 1},
        },
        batch_size=[index.numel()],
    )


def assert_items(batch: TensorDict, index: torch.Tensor) -> None:
    """Every stored field of `batch` is what was written at `index`."""
    want = items(index.cpu())
    for key in want.keys(True, True):
        assert torch.equal(batch.get(key).cpu(), want.get(key)), key


def fill(buf, count: int, chunk: int = 5) -> None:
    for start in range(0, count, chunk):
        buf.extend(items(torch.arange(start, min(start + chunk, count))))


# ---- ring storage ------------------------------------------------------------------------------


def test_extend_returns_write_positions_and_each_slot_holds_its_newest_item(buffer_cls, device):
    capacity = 7
    buf = buffer_cls(capacity, device=device, seed=0)
    rng = np.random.default_rng(0)
    written = 0
    for _ in range(40):
        size = int(rng.integers(0, capacity + 1))  # empty batches and whole-capacity ones included
        index = buf.extend(items(torch.arange(written, written + size)))
        assert index.dtype == torch.int64
        assert index.device.type == device.type
        assert index.cpu().tolist() == list(range(written, written + size))
        written += size
        assert buf.written == written
        assert len(buf) == min(written, capacity)
        if written == 0:
            continue
        # Slot s holds the newest item k < written with k % capacity == s.
        newest = torch.tensor([max(k for k in range(written) if k % capacity == s) for s in range(len(buf))])
        stored = buf.storage[: len(buf)]
        assert stored.device.type == device.type
        assert_items(stored, newest)


def test_a_cpu_buffer_stores_batches_that_come_from_another_device(buffer_cls, device):
    """On CUDA this is the device-to-host path: the copy must have landed before it is stored."""
    capacity = 20_000
    buf = buffer_cls(capacity, device="cpu", seed=0)
    for start in range(0, 2 * capacity, capacity // 2):
        index = buf.extend(items(torch.arange(start, start + capacity // 2)).to(device))
        assert index.device.type == "cpu"
    assert_items(buf.storage, torch.arange(capacity, 2 * capacity))


def test_extend_stores_exactly_what_index_copy_would_for_image_and_small_rows(buffer_cls, device):
    """Keys on both sides of INDEX_COPY_ELEMENTS (index_copy_ vs slice copies), across many ring
    wraps, against a reference written with index_copy_ at the slots index % capacity."""
    capacity = 13
    gen = torch.Generator().manual_seed(0)

    def batch(size):
        return TensorDict({
            "obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8, generator=gen),
            "next_obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8, generator=gen),
            "at_limit": torch.randint(0, 256, (size, INDEX_COPY_ELEMENTS), dtype=torch.uint8, generator=gen),
            "past_limit": torch.randn((size, INDEX_COPY_ELEMENTS + 1), generator=gen),
            "action": torch.randint(0, 6, (size,), generator=gen),
            "done": torch.rand(size, generator=gen) < 0.5,
        }, batch_size=[size])

    buf = buffer_cls(capacity, device=device, seed=0)
    reference, written = None, 0
    sizes = [5, 8, 0, 1, 13, 12, 2, 13, 7, 6, 1, 11, 3, 13, 9, 4]  # wraps at many offsets, whole-ring batches
    for size in sizes:
        data = batch(size)
        if reference is None:
            reference = {key: torch.zeros((capacity, *v.shape[1:]), dtype=v.dtype) for key, v in data.items()}
        index = buf.extend(data.to(device))
        assert index.cpu().tolist() == list(range(written, written + size))
        slots = torch.arange(written, written + size) % capacity
        for key, value in data.items():
            reference[key].index_copy_(0, slots, value)
        written += size
        for key, want in reference.items():
            assert torch.equal(buf.storage[key][: len(buf)].cpu(), want[: len(buf)]), key
    assert buf._indexed == {"at_limit", "action", "done"}  # both write paths were exercised


@pytest.mark.parametrize("written", [4, 10, 37])
def test_sampled_indices_are_live_and_their_data_is_what_was_written_there(buffer_cls, device, written):
    capacity = 10
    buf = buffer_cls(capacity, device=device, seed=1)
    fill(buf, written, chunk=3)
    batch = buf.sample(500)
    assert batch.batch_size == torch.Size([500])
    assert batch.device.type == device.type
    index = batch["index"]
    assert index.dtype == torch.int64
    assert bool((index >= written - capacity).all()) and bool((index < written).all())
    assert_items(batch, index)
    # Every live item shows up in 500 draws (a miss has probability < 10 * 0.9**500).
    assert set(index.cpu().tolist()) == set(range(max(0, written - capacity), written))


@pytest.mark.parametrize("capacity, written", [(64, 40), (48, 100)])
def test_uniform_sampling_chi_square(device, chi_square, capacity, written):
    """Sample counts of the live items fit the uniform distribution.

    Seed 3, 100,000 draws, Pearson chi-square at significance 1e-3 (critical value from the
    Wilson–Hilferty approximation, tests/conftest.py).
    """
    buf = ReplayBuffer(capacity, device=device, seed=3)
    fill(buf, written, chunk=7)
    size = len(buf)
    index = torch.cat([buf.sample(1000)["index"] for _ in range(100)]).cpu()
    assert bool((index >= written - size).all()) and bool((index < written).all())
    counts = torch.bincount(index - (written - size), minlength=size).numpy()
    stat, critical = chi_square(counts, np.full(size, 1.0 / size))
    assert stat < critical, (stat, critical)


def test_same_seed_same_samples_and_different_seeds_differ(buffer_cls, device):
    a, b, c = (buffer_cls(20, device=device, seed=s) for s in (5, 5, 6))
    for buf in (a, b, c):
        fill(buf, 33)
    for _ in range(3):
        sa, sb, sc = a.sample(64), b.sample(64), c.sample(64)
        assert (sa == sb).all()
        assert torch.equal(sa["index"], sb["index"])
    assert not torch.equal(sa["index"], sc["index"])


# ---- checkpoints -------------------------------------------------------------------------------


def test_state_dict_round_trip_through_a_file(buffer_cls, device, tmp_path, snapshot):
    original = buffer_cls(12, device=device, seed=7)
    fill(original, 29)
    original.sample(8)  # move the generator on from its seed
    path = tmp_path / "buffer.pt"
    torch.save(original.state_dict(), path)

    copy = buffer_cls(12, device=device, seed=99)
    copy.load_state_dict(torch.load(path, weights_only=True))
    assert snapshot(copy) == snapshot(original)
    for _ in range(3):
        assert (copy.sample(16) == original.sample(16)).all()

    # Same writes, same future.
    for buf in (original, copy):
        buf.extend(items(torch.arange(100, 105)))
    assert (copy.sample(16) == original.sample(16)).all()

    # Writing to one leaves the other alone, both ways.
    before = snapshot(copy)
    original.extend(items(torch.arange(200, 211)))
    assert snapshot(copy) == before
    before = snapshot(original)
    copy.extend(items(torch.arange(300, 311)))
    assert snapshot(original) == before


def test_state_dict_loaded_in_memory_shares_no_storage(buffer_cls, device, snapshot):
    original = buffer_cls(6, device=device, seed=0)
    fill(original, 9)
    copy = buffer_cls(6, device=device, seed=1)
    copy.load_state_dict(original.state_dict())
    assert snapshot(copy) == snapshot(original)
    before = snapshot(copy)
    original.extend(items(torch.arange(50, 56)))
    original.sample(4)
    assert snapshot(copy) == before


def test_state_dict_of_an_empty_buffer(buffer_cls, device, snapshot):
    copy = buffer_cls(5, device=device, seed=2)
    copy.load_state_dict(buffer_cls(5, device=device, seed=3).state_dict())
    assert len(copy) == 0
    with pytest.raises(RuntimeError, match="empty"):
        copy.sample(1)
    assert copy.extend(items(torch.arange(2))).tolist() == [0, 1]
    batch = copy.sample(10)
    assert_items(batch, batch["index"])


def test_load_state_dict_rejects_another_capacity(buffer_cls, device):
    state = buffer_cls(5, device=device).state_dict()
    with pytest.raises(ValueError, match="capacity"):
        buffer_cls(6, device=device).load_state_dict(state)


# ---- empty batches and bad input ---------------------------------------------------------------


def test_extending_with_an_empty_batch_is_a_no_op(buffer_cls, device, snapshot):
    buf = buffer_cls(8, device=device, seed=0)
    before = snapshot(buf)
    index = buf.extend(items(torch.arange(0)))
    assert index.dtype == torch.int64 and index.numel() == 0 and index.device.type == device.type
    assert snapshot(buf) == before  # nothing allocated, nothing counted

    fill(buf, 11)
    before = snapshot(buf)
    index = buf.extend(items(torch.arange(0)))
    assert index.dtype == torch.int64 and index.numel() == 0
    assert snapshot(buf) == before


def _drop_key(td):
    return td.exclude("action")


def _extra_key(td):
    td = td.clone()
    td["extra"] = torch.zeros(td.batch_size[0])
    return td


def _item_shape(td):
    td = td.clone()
    td["obs"] = torch.zeros(td.batch_size[0], 4)
    return td


def _dtype(td):
    td = td.clone()
    td["action"] = td["action"].int()
    return td


def _nested_dtype(td):
    td = td.clone()
    td["next", "reward"] = td["next", "reward"].double()
    return td


def _two_batch_dims(td):
    return td.unsqueeze(0)


def _too_big(td):
    return items(torch.arange(9))


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (_drop_key, r"missing \['action'\]"),
        (_extra_key, r"unexpected \['extra'\]"),
        (_item_shape, r"'obs'.*item shape \(4,\)"),
        (_dtype, r"'action'.*torch\.int32"),
        (_nested_dtype, r"reward.*torch\.float64"),
        (_two_batch_dims, "one batch dimension"),
        (_too_big, "capacity 8"),
    ],
    ids=["missing-key", "extra-key", "item-shape", "dtype", "nested-dtype", "batch-dims", "too-big"],
)
def test_a_batch_unlike_the_stored_ones_raises_and_changes_nothing(
    buffer_cls, device, snapshot, corrupt, match
):
    buf = buffer_cls(8, device=device, seed=0)
    fill(buf, 11)
    before = snapshot(buf)
    with pytest.raises(ValueError, match=match):
        buf.extend(corrupt(items(torch.arange(11, 14))))
    assert snapshot(buf) == before
    # The empty-batch shortcut does not skip the check.
    with pytest.raises(ValueError, match=match):
        buf.extend(corrupt(items(torch.arange(0))))
    assert snapshot(buf) == before
    # A good batch still goes where it should.
    assert buf.extend(items(torch.arange(11, 14))).tolist() == [11, 12, 13]


def test_sampling_an_empty_buffer_raises_and_changes_nothing(buffer_cls, device, snapshot):
    buf = buffer_cls(4, device=device, seed=0)
    buf.extend(items(torch.arange(0)))
    before = snapshot(buf)
    with pytest.raises(RuntimeError, match="empty buffer"):
        buf.sample(2)
    assert snapshot(buf) == before


@pytest.mark.parametrize("batch_size", [0, -3])
def test_sample_size_must_be_positive(buffer_cls, device, snapshot, batch_size):
    buf = buffer_cls(4, device=device, seed=0)
    fill(buf, 3)
    before = snapshot(buf)
    with pytest.raises(ValueError, match=f"batch_size must be positive, got {batch_size}"):
        buf.sample(batch_size)
    assert snapshot(buf) == before


@pytest.mark.parametrize("capacity", [0, -5])
def test_capacity_must_be_positive(buffer_cls, device, capacity):
    with pytest.raises(ValueError, match=f"capacity must be a positive integer, got {capacity}"):
        buffer_cls(capacity, device=device)


def test_len_and_repr(buffer_cls, device):
    buf = buffer_cls(5, device=device)
    assert len(buf) == 0
    fill(buf, 3)
    assert len(buf) == 3
    buf.extend(items(torch.arange(3, 8)))
    assert len(buf) == 5
    text = repr(buf)
    assert f"{buffer_cls.__name__}(len=5, capacity=5" in text and "'action'" in text


# ---- slices (TD(lambda) over short trajectories) -------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cls=st.sampled_from([ReplayBuffer, PrioritizedReplayBuffer]),
    capacity=st.integers(1, 40),
    written=st.integers(1, 130),
    chunk=st.integers(1, 40),
    length=st.integers(1, 6),
    stride=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_slices_match_a_brute_force_reference(cls, capacity, written, chunk, length, stride, seed):
    """Against an enumeration of the valid starts (every item of the slice still stored), over
    capacities, write counts (wrap-around included), extend sizes, lengths and strides: each
    slice is start + stride * [0, length), the start is valid, every field is what was written
    at those indices, and enough draws reach every valid start (a miss has probability < e^-40);
    with no valid start the call raises and changes nothing."""
    buf = cls(capacity, seed=seed)
    for start in range(0, written, min(chunk, capacity)):
        buf.extend(items(torch.arange(start, min(start + min(chunk, capacity), written))))
    span = (length - 1) * stride
    valid = [i for i in range(written - len(buf), written) if i + span < written]
    if not valid:
        generator_state = buf.generator.get_state()
        with pytest.raises(ValueError, match=f"spans {span + 1} items; the buffer holds {len(buf)}"):
            buf.sample_slices(4, length, stride)
        assert torch.equal(buf.generator.get_state(), generator_state)
        return
    draws = 40 * len(valid) + 10
    batch = buf.sample_slices(draws, length, stride)
    assert batch.batch_size == torch.Size([draws, length])
    index = batch["index"]
    assert index.dtype == torch.int64
    assert torch.equal(index, index[:, :1] + stride * torch.arange(length))
    assert set(index[:, 0].tolist()) == set(valid)
    assert_items(batch.reshape(-1), index.reshape(-1))


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, PrioritizedReplayBuffer], ids=["uniform", "prioritized"])
def test_slices_of_a_vector_env_are_one_env_s_consecutive_steps(buffer_cls, device):
    """E = 3 envs writing one transition each per step: stride 3 keeps to one env, in step order."""
    num_envs, steps = 3, 30
    buf = buffer_cls(64, device=device, seed=0)
    for t in range(steps):
        env = torch.arange(num_envs)
        buf.extend(TensorDict({"env": env, "step": torch.full((num_envs,), t)}, batch_size=[num_envs]).to(device))
    batch = buf.sample_slices(200, 4, stride=num_envs)
    assert batch.device.type == device.type
    assert bool((batch["env"] == batch["env"][:, :1]).all())
    assert torch.equal(batch["step"] - batch["step"][:, :1], torch.arange(4, device=device).expand(200, 4))


def test_slice_starts_are_uniform_chi_square(device, chi_square):
    """Counts of the starts over 40,000 draws fit the uniform distribution over the valid starts.
    Seed 5; capacity 32 after wrap-around, slices of 3 items 4 apart: 24 valid starts. Pearson
    chi-square at significance 1e-3 (Wilson–Hilferty critical value)."""
    buf = ReplayBuffer(32, device=device, seed=5)
    fill(buf, 77)
    starts = torch.cat([buf.sample_slices(1000, 3, 4)["index"][:, 0] for _ in range(40)]).cpu()
    assert int(starts.min()) == 77 - 32 and int(starts.max()) == 76 - 8
    stat, critical = chi_square(torch.bincount(starts - 45, minlength=24).numpy(), np.ones(24))
    assert stat < critical, (stat, critical)


def test_slices_same_seed_same_draws(device):
    a, b = (ReplayBuffer(20, device=device, seed=9) for _ in range(2))
    for buf in (a, b):
        fill(buf, 33)
    assert (a.sample_slices(16, 3, 2) == b.sample_slices(16, 3, 2)).all()


@pytest.mark.parametrize(
    "batch_size, length, stride, match",
    [(0, 2, 1, "batch_size must be positive"), (4, 0, 1, "length and stride must be positive"),
     (4, 2, 0, "length and stride must be positive"), (4, 4, 3, "spans 10 items; the buffer holds 9")],
)
def test_bad_slice_requests_raise(device, batch_size, length, stride, match):
    buf = ReplayBuffer(12, device=device, seed=0)
    with pytest.raises(RuntimeError, match="empty buffer"):
        buf.sample_slices(4, 2, 1)
    fill(buf, 9)
    with pytest.raises(ValueError, match=match):
        buf.sample_slices(batch_size, length, stride)
