"""Batches from a replay buffer in host memory for a learner on a GPU, copied while it computes.

    loader = Prefetcher(rb, batch_size=256, device="cuda")
    batch = loader.next()                                   # TensorDict on the GPU
    td_error = q_value(batch) - td_target(batch)            # the forward pass
    loader.update_priority(batch["index"], td_error.abs())  # PER: queues the copy of the priorities
    loss.backward(); optimizer.step()                       # queued on the GPU
    batch = loader.next()                                   # writes them; draws and sends the next batch

Ordering invariant (prioritized buffers): the indices of batch k + 1 are drawn only after the
priorities from batch k are written into the buffer. So sampling ahead is out (TorchRL's
prefetch draws batch k + 1 from the priorities before update k); the overlap comes instead from
splitting the update: `update_priority` is called right after the forward pass and only queues
a copy of the TD errors to pinned host memory, ordered after the forward pass by the stream;
the learner then queues its backward pass and optimizer step; `next()` waits for that copy
(the forward pass, not the backward pass), writes the priorities, draws batch k + 1, gathers it
into pinned memory and starts its copy to the GPU on a side stream, while the GPU still runs
update k's backward pass. `next()` raises if the priorities of the previous batch were not given.
Priorities reach the buffer at the next `next()` or `flush()` (call it before a checkpoint).

Uniform buffers have no such order: `next()` hands over the batch drawn and sent during the
previous call and draws the following one at once (the batch was gathered when drawn, so it
never mixes old indices with new data, but it does not see items added since).

On the CPU, or when the buffer already lives on `device`, the same calls run without streams
or pinned memory (and the order is the same: that is what tests/test_prefetch.py checks).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


class Prefetcher:
    """Serve `buffer.sample(batch_size)` on `device`, overlapping the host work with the GPU's."""

    def __init__(self, buffer, batch_size: int, device: str | torch.device = "cuda"):
        self.buffer = buffer
        self.batch_size = int(batch_size)
        self.device = torch.device(device)
        self.prioritized = hasattr(buffer, "update_priority")
        # Streams and pinned memory only for the host-to-GPU case.
        self._streams = self.device.type == "cuda" and buffer.device.type == "cpu"
        self._copy_stream = torch.cuda.Stream(self.device) if self._streams else None
        # Two pinned host batches, alternating: one can be read by a copy in flight while the
        # other is filled. Each has an event recorded after its last copy to the device.
        self._staging: list[TensorDict | None] = [None, None]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._ahead: TensorDict | None = None  # uniform: the next batch, already sent
        self._handed: tuple[torch.Tensor, torch.Tensor] | None = None  # PER: (device, host) indices of the batch out
        self._pending: tuple | None = None  # PER: (host indices, host priorities, copy event or None)

    def next(self) -> TensorDict:
        """The next batch, on `device` (for PER, drawn after the last batch's priorities are written)."""
        if not self.prioritized:
            batch = self._ahead if self._ahead is not None else self._send(self.buffer.sample(self.batch_size))
            batch = self._receive(batch)
            self._ahead = self._send(self.buffer.sample(self.batch_size))
            return batch
        if self._handed is not None:
            raise RuntimeError("call update_priority(batch['index'], td_error) for the last batch before next()")
        self.flush()
        host = self.buffer.sample(self.batch_size)
        batch = self._receive(self._send(host))
        self._handed = batch["index"], host["index"]
        return batch

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Queue the priorities of the last batch for the buffer (written by the next `next()` or `flush()`).

        Call it right after the forward pass that gives them, before the backward pass: their
        copy to the host is ordered after what the current stream has queued so far.
        """
        if not self.prioritized:
            raise TypeError(f"{type(self.buffer).__name__} has no priorities")
        if self._handed is None:
            raise RuntimeError("update_priority before next(): there is no batch to give priorities for")
        device_index, host_index = self._handed
        if index is not device_index:  # another index tensor than the batch's: bring it over too
            host_index = index.detach().to("cpu")
        priority = priority.detach()
        if not self._streams:
            self._pending = host_index, priority.to(self.buffer.device), None
        else:
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._copy_stream):
                host = torch.empty(priority.shape, dtype=priority.dtype, pin_memory=True)
                host.copy_(priority, non_blocking=True)
                priority.record_stream(self._copy_stream)  # keep its memory until the copy is done
                copied = torch.cuda.Event()
                copied.record(self._copy_stream)
            self._pending = host_index, host, copied
        self._handed = None

    def flush(self) -> None:
        """Write the priorities given to update_priority into the buffer now (waits for their copy)."""
        if self._pending is None:
            return
        index, priority, copied = self._pending
        self._pending = None
        if copied is not None:
            copied.synchronize()
        self.buffer.update_priority(index, priority)

    def _send(self, batch: TensorDict) -> TensorDict:
        """Start moving a host batch to `device`: through pinned memory, on the copy stream."""
        if not self._streams:
            return batch.to(self.device)
        turn, self._turn = self._turn, 1 - self._turn
        staging = self._staging[turn]
        if staging is None:
            staging = self._staging[turn] = batch.apply(lambda x: torch.empty_like(x, pin_memory=True))
        else:
            self._copied[turn].synchronize()  # its previous copy to the device has finished (long ago)
        staging.update_(batch)
        with torch.cuda.stream(self._copy_stream):
            on_device = staging.to(self.device, non_blocking=True)
            self._copied[turn] = torch.cuda.Event()
            self._copied[turn].record(self._copy_stream)
        return on_device

    def _receive(self, batch: TensorDict) -> TensorDict:
        """Make the current stream wait for a batch's copy, and tie its memory to that stream."""
        if self._streams:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._copy_stream)
            for value in batch.values(True, True):
                value.record_stream(current)
        return batch
