"""Ring-buffer replay storage with uniform sampling.

Invariants kept here (tests/test_replay.py checks each):
- Storage is one preallocated tensor per key, allocated from the first batch written.
- Item k (counted from 0 since creation) lives in slot k % capacity; when full, the oldest
  item is overwritten. `extend` returns these write positions ("indices"), and an index i is
  still stored exactly when written - capacity <= i < written.
- Bad input raises before anything is written, so a failed call leaves the buffer unchanged.
- Sampling draws from the buffer's own torch.Generator: same seed, same samples.
- With frame_stack=k, obs and next_obs are stored as positions in a FrameStore (buffers/frames.py,
  which states its own invariants): each frame once, the stacks rebuilt bit for bit at sampling.
  A transition whose frames were overwritten is "dropped": it stays stored (len counts it) but is
  never sampled again. Uniform sampling is then uniform over the sampleable transitions.
- Many seeds (num_seeds=N > 1): one tensor per key shaped [N, capacity, ...], one generator per
  seed (seeded seed, seed + 1, ..., or each its own: seed=[s0, s1, ...]), write counts per seed. Seed i's rows
  of everything that goes in reach seed i's slice only, and row i of everything that comes out equals, bit for
  bit, what a buffer of one seed (seed + i) returns for the same calls: every invariant above holds per seed, and one
  `extend`, one draw per seed and one gather serve all seeds (tests/test_seeds.py checks it).
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from .frames import FrameStore, check_fits

# extend writes a key whose items have at most this many elements with one index_copy_ (the wrap
# included), the others as slice copies (two when the ring wraps). On the CPU a call costs about 5 us
# for index_copy_ and 7 us for a slice's copy_, but index_copy_ then pays per element, uint8 the most
# (128 image stacks of 4 x 84 x 84: 24 ms, against 0.3 ms as a slice copy). Measured on one thread:
# up to 16 elements index_copy_ is 1-2.5 us faster on batches of 1 to 32 items and within 1 us at 128
# (uint8: 2.7 us slower); from 32 elements on it loses at 128 items, by 1-7 us at 32 and by more as
# items grow, while it still wins by 1-2 us on a few items. Items of scalars and small vectors stay on
# index_copy_; anything larger, where the stakes are, is sliced.
INDEX_COPY_ELEMENTS = 16


class ReplayBuffer:
    """Uniform replay over a TensorDict of preallocated tensors on `device` (CPU or CUDA).

    frame_stack=k > 0 stores stacked-frame observations (obs [k, *frame_shape]) one frame at a
    time: pass each vector-env step through `add_frames` before extend (or NStepReturns).
    """

    def __init__(self, capacity: int, device: str | torch.device = "cpu", seed: int | list[int] | None = None,
                 frame_stack: int = 0, num_seeds: int = 1):
        if int(capacity) <= 0:
            raise ValueError(f"capacity must be a positive integer, got {capacity}")
        if int(num_seeds) < 1:
            raise ValueError(f"num_seeds must be a positive integer, got {num_seeds}")
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.num_seeds = int(num_seeds)
        self.storage: TensorDict | None = None  # [capacity]; many seeds: [num_seeds, capacity]
        self._stored_layout: dict | None = None  # {key: (item shape, dtype)} of the storage
        self._columns: dict | None = None  # {key: tensor} of the storage, for cheaper lookups than TensorDict's
        self._flat: dict | None = None  # many seeds: {key: [seeds * capacity, ...]}: seed i slot j at i * capacity + j
        self._indexed: frozenset = frozenset()  # keys that extend writes with index_copy_ (see INDEX_COPY_ELEMENTS)
        # Items written since creation; the next item's index. Many seeds: an int64 array, one count per seed.
        self.written = 0 if self.num_seeds == 1 else np.zeros(self.num_seeds, dtype=np.int64)
        self.generators = [torch.Generator(device=self.device) for _ in range(self.num_seeds)]
        for i, generator in enumerate(self.generators):  # seed: the first seed's (seed + i), or each seed's
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(int(seed[i]) if isinstance(seed, list | tuple) else int(seed) + i)
        self.generator = self.generators[0]  # one seed: its generator
        self.frame_store = FrameStore(frame_stack, self.capacity, self.device, self.num_seeds) if frame_stack else None

    @property
    def capturable(self) -> bool:
        """Whether sample (and a prioritized buffer's update_priority) read only device tensors, so a CUDA graph can
        capture them: not here, where a uniform draw takes its range from the host's count of items."""
        return False

    def __len__(self) -> int:
        """Items stored; many seeds: the fewest any seed holds (a batch can be drawn for every seed from this)."""
        return int(min(np.min(self.written), self.capacity))

    def __repr__(self) -> str:
        keys = [] if self.storage is None else sorted(map(str, self.storage.keys(True, True)))
        return f"{type(self).__name__}(len={len(self)}, capacity={self.capacity}, keys={keys})"

    def check_memory(self, obs: np.ndarray | torch.Tensor) -> None:
        """Raise TooLarge (a MemoryError that names the capacity that fits) unless a full buffer of frames will fit,
        given the first observations [E, k, ...] of the envs that fill it: before a run writes anything, where the
        first write would otherwise be refused. A buffer that does not store frames checks at its first write."""
        if self.frame_store is not None:
            self.frame_store.check_memory(torch.as_tensor(obs))

    # ---- writing -------------------------------------------------------------------------------

    def add_frames(self, transitions: TensorDict) -> TensorDict:
        """Store one vector-env step's new frames; return the step with obs/next_obs as int64 positions.

        `transitions` is a TensorDict [E] of ONE step, steps in the order they happened (what
        envs.TransitionRecorder returns). Extend with the result, directly or through NStepReturns.
        Returns `transitions` itself when this buffer does not store frames (frame_stack=0).
        """
        if self.frame_store is None:
            return transitions
        step, dropped = self.frame_store.add(transitions, self.written - self.capacity)
        self._drop(*dropped) if self.num_seeds > 1 else self._drop(dropped)
        return step

    def extend(self, data: TensorDict) -> torch.Tensor:
        """Append a batch (batch_size [B]); return the items' int64 indices [B].

        Many seeds: a batch [N, B] (row i: seed i's items), or [N * B] laid out seed by seed (a vector env of
        N * E envs, seed i's in rows i * E ...), or [K] rows with an int64 "seed" entry naming each row's seed
        (what NStepReturns(num_seeds=N) emits; a seed's rows keep their order); returns the indices in the
        batch's layout, each counted in its seed's buffer.
        """
        if self.num_seeds > 1:
            return self._extend_seeds(data)
        if data.batch_dims != 1:
            raise ValueError(f"extend expects a TensorDict with one batch dimension, got {data.batch_size}")
        size = data.batch_size[0]
        if size > self.capacity:
            raise ValueError(f"batch of {size} items does not fit a buffer of capacity {self.capacity}")
        if self.frame_store is not None:
            positions = self.frame_store.check_positions(data, self.written + size - self.capacity)
        items = list(data.items(True, True))
        if self.storage is not None:
            self._check_layout(items)  # an empty batch too
        elif size > 0:
            self._set_storage(self._allocate(data))
        if size == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        index = torch.arange(self.written, self.written + size, device=self.device)
        slots = index.remainder(self.capacity) if self._indexed else None  # unique: index_copy_ is deterministic
        moved = data.device != self.device  # a TensorDict with a device holds every tensor there
        for key, src in items:
            # Blocking unless to a GPU: a CPU copy must not read an unfinished one.
            if moved and src.device != self.device:
                src = src.to(self.device, non_blocking=self.device.type == "cuda")
            if key in self._indexed:
                self._columns[key].index_copy_(0, slots, src)
            else:
                self._copy_runs(self._columns[key], src)
        self._on_write(index)
        self.written += size
        if self.frame_store is not None:
            self._drop(self.frame_store.register(np.arange(self.written - size, self.written), *positions))
        return index

    def _copy_runs(self, column: torch.Tensor, src: torch.Tensor) -> None:
        """Write `src` into the slots from written % capacity on, as one slice copy, or two when the ring wraps."""
        start, size = self.written % self.capacity, len(src)
        head = min(size, self.capacity - start)  # items before the ring wraps to slot 0
        column[start : start + head].copy_(src[:head])
        if head < size:
            column[: size - head].copy_(src[head:])

    def _allocate(self, data: TensorDict) -> TensorDict:
        """Empty storage for items like those of `data` (batch [B]): [capacity] ([num_seeds, capacity])."""
        item_bytes = sum(x[0].numel() * x.element_size() for x in data.values(True, True))
        seeds = f"{self.num_seeds} x " if self.num_seeds > 1 else ""
        check_fits(self.num_seeds * self.capacity * item_bytes, self.device,
                   f"a replay buffer of {seeds}{self.capacity:,} items")
        shape = [self.capacity] if self.num_seeds == 1 else [self.num_seeds, self.capacity]
        # torch.empty leaves pages untouched until written, so a large buffer costs memory as it fills.
        return data.apply(
            lambda x: torch.empty((*shape, *x.shape[1:]), dtype=x.dtype, device=self.device),
            batch_size=shape,
            device=self.device,
        )

    def _set_storage(self, storage: TensorDict | None) -> None:
        """Take `storage` as the buffer's, with what extend and sampling derive from it."""
        self.storage = storage
        self._stored_layout = None if storage is None else _layout(storage)
        self._columns = None if storage is None else dict(storage.items(True, True))
        self._flat = None if storage is None or self.num_seeds == 1 else {
            key: value.flatten(0, 1) for key, value in self._columns.items()}
        self._indexed = frozenset() if storage is None else frozenset(
            key for key, value in self._columns.items()
            if value.shape[storage.batch_dims:].numel() <= INDEX_COPY_ELEMENTS)

    def _check_layout(self, items: list) -> None:
        """Raise, naming what differs, unless the batch's (key, tensor) `items` have the stored keys, item
        shapes and dtypes."""
        given = {key: (value.shape[1:], value.dtype) for key, value in items}  # items [B, ...]
        if given == self._stored_layout:  # the common case: one pass over the batch, no lookups
            return
        stored = self._stored_layout
        if stored.keys() != given.keys():
            raise ValueError(
                f"batch keys differ from the stored ones: missing {sorted(map(str, stored.keys() - given.keys()))}, "
                f"unexpected {sorted(map(str, given.keys() - stored.keys()))}"
            )
        for key, (shape, dtype) in stored.items():
            if given[key] != (shape, dtype):
                raise ValueError(
                    f"key {key!r}: batch has item shape {tuple(given[key][0])} and dtype {given[key][1]}, "
                    f"the buffer stores {tuple(shape)} and {dtype}"
                )

    def _on_write(self, index: torch.Tensor) -> None:
        """Hook for subclasses that keep per-slot data (priorities): the indices just written."""

    def _drop(self, index: torch.Tensor, seed: torch.Tensor | None = None) -> None:
        """Frame mode: live items (CPU indices; many seeds: with their seeds) whose frames were overwritten;
        never sample them again.

        Uniform sampling finds them from their positions (FrameStore.sampleable); subclasses that
        keep per-slot data hear of them through _on_drop (many seeds: seed i's slot j as i * capacity + j).
        """
        if index.numel():
            slots = index.remainder(self.capacity)
            self._on_drop((slots if seed is None else seed * self.capacity + slots).to(self.device))

    def _on_drop(self, slots: torch.Tensor) -> None:
        """Hook for subclasses that keep per-slot data (a prioritized buffer zeroes the priorities)."""

    # ---- reading -------------------------------------------------------------------------------

    def sample(self, batch_size: int) -> TensorDict:
        """Draw `batch_size` items uniformly with replacement; adds "index". Many seeds: [N, batch_size], each
        seed's draws from its own generator and items."""
        if self.num_seeds > 1:
            return self._sample_seeds(batch_size)
        self._check_sample(batch_size)
        slots = torch.randint(len(self), (batch_size,), generator=self.generator, device=self.device)
        if self.frame_store is not None and self.frame_store.may_hold_dropped(self.written - self.capacity):
            slots = self.frame_store.redraw_uniform(slots, self.storage["obs"], len(self), self.generator)
        return self._gather(slots)

    def sample_slices(self, batch_size: int, length: int, stride: int = 1) -> TensorDict:
        """Draw `batch_size` slices of `length` items each: TensorDict [batch_size, length], plus "index".

        Slice b holds the items i_b, i_b + stride, ..., i_b + (length - 1) * stride. A vector env of
        E envs that writes one transition per env per step (n = 1, in env order, as the
        TransitionRecorder does) puts one env's consecutive steps `stride = E` apart, so a slice
        is a short trajectory of one env. Starts are drawn uniformly, with replacement, with the
        buffer's generator (PrioritizedReplayBuffer too: priorities play no part), among those
        whose whole slice is stored: written - len(self) <= i and i + (length - 1) * stride < written.

        Slices are not cut at episode ends: "terminated" and "truncated" come back as stored, and
        the caller masks every step after the first end in a slice.

        Many seeds: [N, batch_size, length], each seed's starts drawn from its own generator.
        """
        self._check_sample(batch_size)
        if int(length) < 1 or int(stride) < 1:
            raise ValueError(f"length and stride must be positive, got length={length}, stride={stride}")
        span = (length - 1) * stride  # from the first item of a slice to its last
        starts = len(self) - span  # how many start indices have their whole slice stored (the fewest of any seed)
        if starts <= 0:
            raise ValueError(f"a slice of {length} items {stride} apart spans {span + 1} items; "
                             f"the buffer holds {len(self)}")
        steps = stride * torch.arange(length, device=self.device)
        if self.num_seeds == 1:
            first = torch.randint(starts, (batch_size, 1), generator=self.generator, device=self.device)
            index = first + (self.written - len(self)) + steps
            slots = index.remainder(self.capacity).view(-1)
            batch = {key: torch.index_select(value, 0, slots).view(batch_size, length, *value.shape[1:])
                     for key, value in self.storage.items(True, True)}
            batch["index"] = index
            return TensorDict(batch, batch_size=[batch_size, length], device=self.device)
        stored = np.minimum(self.written, self.capacity)
        first = torch.stack([torch.randint(int(size) - span, (batch_size, 1), generator=generator, device=self.device)
                             for size, generator in zip(stored, self.generators, strict=True)])
        index = first + torch.as_tensor(self.written - stored, device=self.device).view(-1, 1, 1) + steps
        slots = (index.remainder(self.capacity) + self._offsets().view(-1, 1, 1)).view(-1)
        shape = (self.num_seeds, batch_size, length)
        batch = {key: torch.index_select(value, 0, slots).view(*shape, *value.shape[1:])
                 for key, value in self._flat.items()}
        batch["index"] = index
        return TensorDict(batch, batch_size=shape, device=self.device)

    def _check_sample(self, batch_size: int) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if self.storage is None:  # as written == 0, but not a Python int that torch.compile would guard on
            raise RuntimeError("cannot sample from an empty buffer: extend it first")
        if self.num_seeds > 1 and len(self) == 0:
            raise RuntimeError(f"cannot sample: seeds {np.flatnonzero(self.written == 0).tolist()} hold no items yet")

    def _gather(self, slots: torch.Tensor, **extra: torch.Tensor) -> TensorDict:
        """The items in `slots`, plus "index" and any `extra` per-item tensors (e.g. "weight")."""
        batch = {key: torch.index_select(value, 0, slots) for key, value in self._columns.items()}
        if self.frame_store is not None:  # positions -> stacks
            first_live = self.written - self.capacity
            batch["obs"], batch["next_obs"] = self.frame_store.stacks(batch["obs"], batch["next_obs"], first_live)
        batch["index"] = self._index_of(slots)
        batch.update(extra)
        return _tensordict(batch, slots.numel(), self.device)

    def _index_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The write position of the item now in each slot: the latest k < written with k % capacity == slot
        (many seeds: slots [N, B], each row in its seed's count)."""
        last = self.written - 1
        if self.num_seeds > 1:
            last = torch.as_tensor(last, device=self.device).unsqueeze(1)
        return last - torch.remainder(last - slots, self.capacity)

    # ---- checkpointing ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: storage, write count and the generator's state.

        The storage (and a frame store's frames) are the live tensors, not copies, so saving a
        large buffer does not double its memory: save the state before writing again.
        """
        state = {
            "capacity": self.capacity,
            "num_seeds": self.num_seeds,
            "written": self.written if self.num_seeds == 1 else self.written.tolist(),
            "storage": None if self.storage is None else self.storage.to_dict(),
            "generator": self.generator.get_state(),
        }
        if self.num_seeds > 1:
            state["generators"] = [generator.get_state() for generator in self.generators]
        if self.frame_store is not None:
            state["frames"] = self.frame_store.state_dict()
        return state

    def members_state(self, state: dict, rows: list[int]) -> dict:
        """A state of a buffer with a seed dimension cut to the seeds `rows` (in order), for this buffer, built for
        len(rows) seeds (one: no seed dimension, its generator the kept seed's); the settings are this buffer's."""
        if state.get("frames") is not None:
            raise ValueError("a buffer that stores frames once cannot be cut to some of its seeds")
        one = self.num_seeds == 1
        pick = (lambda x: x[rows[0]]) if one else (lambda x: x[rows])

        def cut(value):
            return {key: cut(item) for key, item in value.items()} if isinstance(value, dict) else pick(value)

        generators = [state["generators"][i] for i in rows]
        out = {**state, "num_seeds": self.num_seeds, "generator": generators[0],
               "written": state["written"][rows[0]] if one else [state["written"][i] for i in rows],
               "storage": None if state["storage"] is None else cut(state["storage"])}
        out.pop("generators")
        return out if one else {**out, "generators": generators}

    def load_state_dict(self, state: dict, copy: bool = True) -> None:
        """Restore a state_dict. copy=True (the default) copies every tensor, so that this buffer and the
        one the state came from never share memory; copy=False adopts the storage tensors that are
        already on this buffer's device (e.g. from torch.load(..., mmap=True)) instead of copying them."""
        if state["capacity"] != self.capacity:
            raise ValueError(f"state is for capacity {state['capacity']}, this buffer has {self.capacity}")
        if state.get("num_seeds", 1) != self.num_seeds:
            raise ValueError(f"state is for {state.get('num_seeds', 1)} seeds, this buffer has {self.num_seeds}")
        given = state["frames"]["frame_stack"] if "frames" in state else 0
        mine = 0 if self.frame_store is None else self.frame_store.frame_stack
        if given != mine:
            raise ValueError(f"state is for frame_stack={given}, this buffer has frame_stack={mine}")
        if self.frame_store is not None:
            self.frame_store.load_state_dict(state["frames"], copy=copy)
        storage = state["storage"]
        if storage is not None:
            shape = [self.capacity] if self.num_seeds == 1 else [self.num_seeds, self.capacity]
            storage = TensorDict(storage, batch_size=shape).to(self.device)
        self._set_storage(storage.clone() if copy and storage is not None else storage)
        if self.num_seeds == 1:
            self.written = int(state["written"])
            self.generator.set_state(state["generator"])
        else:
            self.written = np.array(state["written"], dtype=np.int64)
            for generator, generator_state in zip(self.generators, state["generators"], strict=True):
                generator.set_state(generator_state)

    # ---- many seeds --------------------------------------------------------------------------------

    def _offsets(self) -> torch.Tensor:
        """Where each seed's slots start in the flat storage: i * capacity, [num_seeds] on device."""
        return torch.arange(self.num_seeds, device=self.device) * self.capacity

    def _seed_rows(self, data: TensorDict) -> tuple[TensorDict, np.ndarray | None, int]:
        """(the rows [K] seed by seed or in any order, each row's seed or None when the rows are seed by seed
        with `per_seed` each, per_seed) for extend's layouts (see extend)."""
        if data.batch_dims == 2:
            if data.batch_size[0] != self.num_seeds:
                raise ValueError(f"a batch [N, B] needs one row per seed ({self.num_seeds}), got {data.batch_size}")
            return data.reshape(-1), None, data.batch_size[1]
        if data.batch_dims != 1:
            raise ValueError(f"extend expects a batch [N, B] or [K] for {self.num_seeds} seeds, got {data.batch_size}")
        seed = data.get("seed", None)
        if seed is None:
            if len(data) % self.num_seeds:
                raise ValueError(f"{len(data)} rows do not split evenly over {self.num_seeds} seeds; give each row "
                                 "its seed in a 'seed' entry")
            return data, None, len(data) // self.num_seeds
        seed = seed.cpu().numpy().astype(np.int64)
        if seed.size and (seed.min() < 0 or seed.max() >= self.num_seeds):
            raise ValueError(f"'seed' entries must be in [0, {self.num_seeds}), got {sorted(set(seed.tolist()))[:8]}")
        return data.exclude("seed"), seed, 0

    def _extend_seeds(self, data: TensorDict) -> torch.Tensor:
        """extend for many seeds: one write per key for every seed's rows (see extend)."""
        layout = data.batch_size
        rows, seed, per_seed = self._seed_rows(data)
        if seed is None:
            seed, rank = np.repeat(np.arange(self.num_seeds), per_seed), np.tile(np.arange(per_seed), self.num_seeds)
            counts = np.full(self.num_seeds, per_seed)
        else:  # each row's place among its seed's rows, in order
            counts = np.bincount(seed, minlength=self.num_seeds)
            order = np.argsort(seed, kind="stable")
            rank = np.empty_like(seed)
            rank[order] = np.arange(seed.size) - np.repeat(np.cumsum(counts) - counts, counts)
        if counts.max(initial=0) > self.capacity:
            raise ValueError(f"batch of {counts.max()} items for one seed does not fit a buffer of capacity "
                             f"{self.capacity}")
        index = self.written[seed] + rank
        if self.frame_store is not None:
            positions = self.frame_store.check_positions(rows, self.written + counts - self.capacity, seed)
        items = list(rows.items(True, True))
        if self.storage is not None:
            self._check_layout(items)
        elif len(rows) > 0:
            self._set_storage(self._allocate(rows))
        if len(rows) == 0:
            return torch.empty(layout, dtype=torch.int64, device=self.device)
        equal = per_seed and (self.written == self.written[0]).all()  # the usual step: one slice of every seed
        slots = None if equal else torch.from_numpy(seed * self.capacity + index % self.capacity).to(self.device)
        moved = rows.device != self.device
        for key, src in items:
            if moved and src.device != self.device:
                src = src.to(self.device, non_blocking=self.device.type == "cuda")
            if equal:
                self._copy_seed_runs(self._columns[key], src.view(self.num_seeds, per_seed, *src.shape[1:]))
            else:
                self._flat[key].index_copy_(0, slots, src)
        index = torch.from_numpy(index).to(self.device)
        self._on_write_seeds(index, torch.from_numpy(seed).to(self.device), counts)
        self.written = self.written + counts
        if self.frame_store is not None:
            self._drop(*self.frame_store.register(index.cpu().numpy(), *positions))
        return index.view(layout)

    def _copy_seed_runs(self, column: torch.Tensor, src: torch.Tensor) -> None:
        """Write src [N, B, ...] into every seed's slots from written % capacity on (all seeds' counts equal)."""
        start, size = int(self.written[0] % self.capacity), src.shape[1]
        head = min(size, self.capacity - start)
        column[:, start : start + head].copy_(src[:, :head])
        if head < size:
            column[:, : size - head].copy_(src[:, head:])

    def _on_write_seeds(self, index: torch.Tensor, seed: torch.Tensor, counts: np.ndarray) -> None:
        """Hook for subclasses that keep per-slot data: the indices just written, with their seeds."""

    def _sample_seeds(self, batch_size: int) -> TensorDict:
        self._check_sample(batch_size)
        stored = np.minimum(self.written, self.capacity)
        slots = torch.stack([torch.randint(int(size), (batch_size,), generator=generator, device=self.device)
                             for size, generator in zip(stored, self.generators, strict=True)])
        if self.frame_store is not None:
            slots = self._redraw_seeds(slots, lambda i, row: self.frame_store.redraw_uniform(
                row, self._columns["obs"][i], int(stored[i]), self.generators[i]))
        return self._gather_seeds(slots)

    def _redraw_seeds(self, slots: torch.Tensor, redraw) -> torch.Tensor:
        """Frame mode: each seed's draws [N, B] with those of dropped transitions replaced by redraw(i, row)."""
        first_live = self.written - self.capacity
        if not self.frame_store.may_hold_dropped(first_live):
            return slots
        dropped = self.frame_store.last_dropped >= first_live
        return torch.stack([redraw(i, row) if dropped[i] else row for i, row in enumerate(slots)])

    def _gather_seeds(self, slots: torch.Tensor, **extra: torch.Tensor) -> TensorDict:
        """Each seed's items at its slots [N, B], plus "index" and `extra`: TensorDict [N, B]."""
        shape = slots.shape
        flat = (slots + self._offsets().unsqueeze(1)).view(-1)
        batch = {key: torch.index_select(value, 0, flat).view(*shape, *value.shape[1:])
                 for key, value in self._flat.items()}
        if self.frame_store is not None:
            obs, next_obs = self.frame_store.stacks(batch["obs"].view(-1), batch["next_obs"].view(-1),
                                                    self.written - self.capacity)
            batch["obs"], batch["next_obs"] = obs.view(*shape, *obs.shape[1:]), next_obs.view(*shape, *obs.shape[1:])
        batch["index"] = self._index_of(slots)
        batch.update(extra)
        return TensorDict(batch, batch_size=shape, device=self.device)


def _tensordict(batch: dict, size: int, device: torch.device) -> TensorDict:
    """TensorDict(batch, [size], device) for values known to be [size, ...] tensors on `device`.

    With flat keys it skips the constructor's checks of that (TensorDict._new_unsafe, 3-5x
    cheaper on a small batch: 4 against 9-19 us); nested keys (tuples) take the constructor.
    """
    new_unsafe = getattr(TensorDict, "_new_unsafe", None)
    if new_unsafe is not None and all(type(key) is str for key in batch):
        return new_unsafe(batch, batch_size=torch.Size([size]), device=device)
    return TensorDict(batch, batch_size=[size], device=device)


def _layout(data: TensorDict) -> dict:
    """{key: (item shape, dtype)} of a batch or of the storage: what must match the stored tensors."""
    return {key: (value.shape[data.batch_dims:], value.dtype) for key, value in data.items(True, True)}
