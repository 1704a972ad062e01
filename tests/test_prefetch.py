"""Prefetcher: the order of draws and priority writes, and the batches it serves."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from buffers import Prefetcher, PrioritizedReplayBuffer, ReplayBuffer

pytestmark = pytest.mark.usefixtures("single_thread")


def items(index) -> TensorDict:
    index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
    return TensorDict({"obs": index.float().unsqueeze(1) * 10, "action": index}, batch_size=[index.numel()])


def host_buffer(cls, capacity: int = 64, written: int = 100, **kwargs):
    """A buffer on the CPU whose item k (live: written - capacity <= k < written) holds obs 10 k, action k."""
    buf = cls(capacity, device="cpu", seed=0, **kwargs)
    for start in range(0, written, capacity // 2):
        buf.extend(items(torch.arange(start, min(start + capacity // 2, written))))
    return buf


class Log:
    """Record the buffer calls a Prefetcher makes, in order."""

    def __init__(self, buf, monkeypatch):
        self.calls = []
        for name in ("sample", "update_priority"):
            if hasattr(buf, name):
                method = getattr(buf, name)
                monkeypatch.setattr(buf, name, self._logged(name, method))

    def _logged(self, name, method):
        def call(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)

        return call


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def learner_device(request) -> torch.device:
    """Where the learner runs; the buffer stays in host memory."""
    return torch.device(request.param)


def test_prioritized_draws_only_after_the_last_priorities_are_written(learner_device, monkeypatch):
    """The invariant, as the order of calls into the buffer: sample, update, sample, update, ...
    (a loader that samples ahead would call sample twice before the first update)."""
    buf = host_buffer(PrioritizedReplayBuffer)
    log = Log(buf, monkeypatch)
    loader = Prefetcher(buf, 8, learner_device)
    for _ in range(5):
        batch = loader.next()
        loader.update_priority(batch["index"], torch.rand(8, device=learner_device))
        assert log.calls[-1] == "sample"  # the write waits for the next draw, or flush
    loader.flush()
    assert log.calls == ["sample", "update_priority"] * 5


def test_prioritized_batch_follows_the_priorities_of_the_batch_before(learner_device):
    """alpha = 1: after batch k gives one item of it priority 1e6 and the others 0, batch k + 1 is
    (almost) all that item. A loader that drew batch k + 1 before writing those priorities would
    draw from the old, uniform ones. Seed 0; the item has probability > 1 - 1e-5 per draw."""
    buf = host_buffer(PrioritizedReplayBuffer, alpha=1.0, eps=1e-3)
    loader = Prefetcher(buf, 32, learner_device)
    for _ in range(3):
        batch = loader.next()
        favourite = batch["index"][0]
        priority = torch.where(batch["index"] == favourite, 1e6, 0.0)
        loader.update_priority(batch["index"], priority)
        following = loader.next()["index"]
        assert (following == favourite).float().mean() > 0.9
        loader.update_priority(following, torch.ones(32, device=learner_device))  # the favourite back to 1


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer], ids=["uniform", "prioritized"])
def test_batches_hold_the_stored_items_on_the_learner_device(cls, learner_device):
    buf = host_buffer(cls)
    loader = Prefetcher(buf, 16, learner_device)
    for _ in range(4):
        batch = loader.next()
        assert batch.device.type == learner_device.type
        index = batch["index"].cpu()
        assert bool((index >= 36).all()) and bool((index < 100).all())
        assert torch.equal(batch["action"].cpu(), index)
        assert torch.equal(batch["obs"].cpu(), index.float().unsqueeze(1) * 10)
        if cls is PrioritizedReplayBuffer:
            assert batch["weight"].device.type == learner_device.type
            loader.update_priority(batch["index"], batch["weight"])


def test_uniform_samples_ahead_with_the_buffer_generator(learner_device, monkeypatch):
    """Uniform replay has no order to keep: each next() hands over the batch drawn by the one
    before and draws the following; the draws are the buffer's own, so the same seed gives the
    same batches as sampling the buffer directly."""
    buf, direct = host_buffer(ReplayBuffer), host_buffer(ReplayBuffer)
    log = Log(buf, monkeypatch)
    loader = Prefetcher(buf, 8, learner_device)
    for k in range(4):
        batch = loader.next()
        assert log.calls == ["sample"] * (k + 2)
        assert torch.equal(batch["index"].cpu(), direct.sample(8)["index"])


def test_priorities_reach_the_buffer_at_the_next_draw_or_flush(snapshot):
    buf = host_buffer(PrioritizedReplayBuffer)
    loader = Prefetcher(buf, 8, "cpu")
    batch = loader.next()
    before = snapshot(buf)
    loader.update_priority(batch["index"], torch.full((8,), 5.0))
    assert snapshot(buf) == before
    loader.flush()
    assert buf.tree.leaves[batch["index"] % 64].tolist() == [(5.0 + buf.eps) ** buf.alpha] * 8
    loader.flush()  # nothing pending: nothing happens


def test_an_index_other_than_the_batch_is_used_as_given():
    buf = host_buffer(PrioritizedReplayBuffer)
    loader = Prefetcher(buf, 8, "cpu")
    loader.next()
    loader.update_priority(torch.tensor([40, 41]), torch.tensor([3.0, 4.0]))
    loader.flush()
    assert buf.tree.leaves[[40 % 64, 41 % 64]].tolist() == [(p + buf.eps) ** buf.alpha for p in (3.0, 4.0)]


def test_misuse_is_refused():
    loader = Prefetcher(host_buffer(PrioritizedReplayBuffer), 8, "cpu")
    with pytest.raises(RuntimeError, match="update_priority before next"):
        loader.update_priority(torch.arange(8), torch.ones(8))
    loader.next()
    with pytest.raises(RuntimeError, match=r"call update_priority\(batch\['index'\], td_error\)"):
        loader.next()
    with pytest.raises(TypeError, match="ReplayBuffer has no priorities"):
        Prefetcher(host_buffer(ReplayBuffer), 8, "cpu").update_priority(torch.arange(8), torch.ones(8))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_host_batches_go_through_pinned_memory_on_a_side_stream():
    buf = host_buffer(PrioritizedReplayBuffer)
    loader = Prefetcher(buf, 8, "cuda")
    for _ in range(3):
        batch = loader.next()
        loader.update_priority(batch["index"], batch["weight"] * 2)
    assert all(value.is_pinned() for staging in loader._staging for value in staging.values(True, True))
    assert loader._copy_stream != torch.cuda.current_stream()


def test_prefetch_benchmark_runs_on_the_cpu():
    """benchmarks/prefetch.py, small, on the CPU (no streams there: a smoke run of both loops)."""
    from benchmarks import prefetch

    rows = prefetch.main(["--device", "cpu", "--capacity", "2000", "--steps", "5", "--hidden", "16"])
    assert set(rows) == {"plain", "prefetch"} and all(r > 0 for r in rows.values())
