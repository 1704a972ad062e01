"""Stacked-frame observations stored one frame at a time, and the memory check every buffer makes.

An Atari observation is a stack of the last k frames (uint8 [4, 84, 84]), and one step's obs
and next_obs share k - 1 of them, so storing both stacks per transition stores every frame 2k
times (56 KB a transition, 56 GB for the papers' 1M). FrameStore keeps each frame once (about
7 GB per 1M) and a transition keeps two int64 "positions" that name its stacks.

    step = rb.add_frames(transitions)   # one vector-env step [E]; obs/next_obs become positions [E]
    rb.extend(nstep.push(step))         # positions pass through NStepReturns like any other key
    batch = rb.sample(32)               # obs/next_obs come back as the stacks the env returned

Layout and invariants (tests/test_frames.py checks each):
- One ring of L frames per env, in `frames` [E * L, *frame_shape]: env e's frame number c
  (counted from 0) lives in row e * L + c % L. `count[e]` frames were written to env e, and
  frame c is still stored exactly when count[e] - L <= c < count[e].
- A position p = c * E + e names the stack of env e's frames c - k + 1, ..., c (oldest first).
  Every stack `add` receives is written as such a run of k consecutive frames of its env, so a
  stack read back is, bit for bit, what was written, as long as its first frame is stored.
- `add`, per env: obs takes the position of the env's previous next_obs when it equals it byte
  for byte (the usual continuation); otherwise its k frames are written. next_obs is written as
  its last frame when next_obs[:-1] equals obs[1:] byte for byte (the usual shift), as all k
  frames otherwise. Data is compared, never assumed, so episode starts, ends, life losses and
  anything unusual are stored exactly. After `add`, env e's newest frame ends its last next_obs.
- A transition is sampleable while the first frame of its obs is stored (its next_obs frames are
  newer). `owner[e, c % L]` is the index of the live transition whose obs starts at frame c, or
  -1; when `add` overwrites that frame, the transition is dropped: the buffer makes it
  unsampleable (uniform sampling rejects it, prioritized sampling zeroes its priority).
- Each position is stored at most once while live (extend refuses a repeat), so one owner per
  frame is enough.

Many seeds (a buffer with num_seeds=N): one store for the N * E envs of all seeds (seed i's envs are
rows i * E ... of each step), each env's ring as above and L sized from each seed's capacity and E
envs, so every seed's frames, positions' frames and dropped transitions are those of a buffer of its
own; the transition indices it keeps and reports are each seed's own, with the seed beside them.

Sizing: L = ceil(capacity * (1 + slack) / E) + 4k. Each step stores one frame per env and each
episode start k more, so transitions are dropped early only when episodes are shorter than about
k / slack = 200 steps (k = 4) on average over the buffer; then the oldest transitions go first.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

POSITION_KEYS = ("obs", "next_obs")


# ---- memory ------------------------------------------------------------------------------------


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes that can still be allocated on `device`, where that number comes from), or None if unknown.

    CPU: MemAvailable from /proc/meminfo, lowered to the cgroup's headroom (limit - usage) when a
    memory limit is set. CUDA: free device memory plus what torch's caching allocator holds unused.
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + cached, "torch.cuda.mem_get_info plus torch's unused cache"
    if device.type != "cpu":
        return None
    found = []
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        found.append((kib * 1024, "MemAvailable in /proc/meminfo"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    cgroups = [("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
               ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")]
    for limit_file, usage_file in cgroups:
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit() and int(limit) < 1 << 60:  # "max" or a huge number: no limit
            found.append((max(0, int(limit) - int(usage)), f"cgroup limit minus usage ({limit_file})"))
    return min(found) if found else None


class TooLarge(MemoryError):
    """check_fits' refusal: the bytes `needed`, those `available` (and where that number comes from, `source`),
    and the largest capacity that fits (`fits`, with its bytes `fits_bytes`; None where not asked)."""

    def __init__(self, message: str, needed: int, available: tuple[int, str], fits: int | None, fits_bytes: float):
        super().__init__(message)
        self.needed, (self.available, self.source), self.fits, self.fits_bytes = needed, available, fits, fits_bytes


def check_fits(nbytes: int, device: torch.device, what: str, per_item: float | None = None) -> None:
    """Raise TooLarge (a MemoryError), naming the bytes needed and available, unless `nbytes` more fit on `device`.

    Called before allocating storage: torch.empty does not touch its pages, so without this
    check a buffer too big for the machine fails late (an allocator error, or the kernel's
    out-of-memory kill hours into a run, once the buffer has filled). Where the available
    memory is unknown, nothing is checked. Given the bytes of one item, the refusal also names the
    largest capacity, in tens of thousands, that fits in 90% of what is available (the rest of the
    process needs some too).
    """
    available = available_memory(device)
    if available is None or nbytes <= available[0]:
        return
    fits = None if per_item is None else int(0.9 * available[0] / per_item) // 10_000 * 10_000
    raise TooLarge(
        f"{what} needs {nbytes:,} bytes ({nbytes / 2**30:.2f} GiB) on {device}, but only "
        f"{available[0]:,} bytes ({available[0] / 2**30:.2f} GiB) are available ({available[1]}); "
        + ("use a smaller capacity or free memory" if fits is None else
           f"a capacity of {fits:,} transitions fits ({fits * per_item / 2**30:.2f} GiB), or free memory"),
        nbytes, available, fits, (fits or 0) * (per_item or 0),
    )


# ---- bytes ---------------------------------------------------------------------------------------

WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


def word_type(nbytes: int) -> torch.dtype:
    """The widest integer type that tiles `nbytes` (84 x 84 = 7056 bytes: 882 int64 words).

    Frames are copied and compared as such words: torch's index_copy_ and == on uint8 work byte
    by byte, several times slower than on int64 words.
    """
    return next(word for word in WORDS if nbytes % word.itemsize == 0)


# ---- the frame store ---------------------------------------------------------------------------


class FrameStore:
    """Per-env rings of frames for stacked observations; see the module docstring for the invariants.

    Bookkeeping (count, owner, the last next_obs) lives on the CPU, where vector-env steps come
    from, so writing never waits for a GPU; the frames live on `device`.
    """

    slack = 0.02  # spare frames per env, as a fraction of capacity / E (see Sizing above)

    def __init__(self, frame_stack: int, capacity: int, device: str | torch.device = "cpu", num_seeds: int = 1):
        if int(frame_stack) < 1:
            raise ValueError(f"frame_stack must be a positive integer, got {frame_stack}")
        self.frame_stack, self.capacity, self.device = int(frame_stack), int(capacity), torch.device(device)
        self.num_seeds = int(num_seeds)  # capacity is each seed's
        self.num_envs = 0  # E, set by the first step (many seeds: N * E, all seeds' envs)
        self.frames_per_env = 0  # L
        self.envs_per_seed = 0  # E of each seed (num_envs / num_seeds)
        self.frames: torch.Tensor | None = None  # [E * L, *frame_shape] on device
        self._rows: torch.Tensor | None = None  # set with frames by _set_frames, with a few constants
        self.count: torch.Tensor | None = None  # int64 [E]: frames written per env
        self.count_on_device: torch.Tensor | None = None  # a copy of count on device, for sampling
        self.owner: torch.Tensor | None = None  # int64 [E, L]: see the module docstring
        self.last_next_obs: torch.Tensor | None = None  # [E, k, *frame_shape]: each env's latest next_obs
        # Largest index dropped so far: no live transition was dropped while it is below the
        # first live index (then sampling needs no check).
        # Many seeds: one per seed, as are the first live indices these are compared with.
        self.last_dropped = -1 if self.num_seeds == 1 else np.full(self.num_seeds, -1, dtype=np.int64)
        # Largest index whose next_obs is not its obs shifted by one frame: while it is below the
        # first live index, a sample reads k + 1 frames per transition instead of 2k.
        self.last_irregular = -1 if self.num_seeds == 1 else np.full(self.num_seeds, -1, dtype=np.int64)

    def __repr__(self) -> str:
        return (f"FrameStore(frame_stack={self.frame_stack}, num_envs={self.num_envs}, "
                f"frames_per_env={self.frames_per_env})")

    # ---- writing ---------------------------------------------------------------------------------

    def add(self, transitions: TensorDict, first_live: int | np.ndarray) -> tuple[TensorDict, Any]:
        """Store one vector-env step's new frames: (the step with int64 positions, indices dropped).

        `transitions` is a TensorDict [E] of one step, in step order, with obs and next_obs
        stacks [E, k, *frame_shape] (any device; they are compared on the CPU). The dropped
        indices are the live transitions (index >= first_live) whose obs frames were overwritten.
        Many seeds: first_live per seed, and the dropped indices come with their seeds (index, seed).
        Bad input raises before anything changes.
        """
        obs, next_obs = self._check_step(transitions)
        if self.frames is None:
            self._allocate(transitions, obs)
        k, length, envs = self.frame_stack, self.frames_per_env, np.arange(self.num_envs)
        # Bookkeeping in numpy, on views of the CPU tensors as [E, k, words per frame]: a few
        # small ops per step (torch would take dozens of calls at several microseconds each).
        o, n, last = self._words(obs), self._words(next_obs), self._words(self.last_next_obs)
        count = self.count.numpy()  # each env's next frame number
        started = count[0] > 0  # every step writes to every env, so all envs have started or none
        continues = (o == last).all(axis=(1, 2)) if started else np.zeros(len(count), dtype=bool)
        shifted = (n[:, :-1] == o[:, 1:]).all(axis=(1, 2))
        if continues.all() and shifted.all():  # the usual step: one new frame per env
            obs_last, next_last = count - 1, count
            rows, dest = n[:, -1], envs * length + count % length
        else:
            next_start = np.where(continues, count, count + k)  # next_obs's first new frame
            obs_last, next_last = next_start - 1, np.where(shifted, next_start, next_start + k - 1)
            steps, new_obs, full_next = np.arange(k), ~continues, ~shifted
            rows = np.concatenate([o[new_obs].reshape(-1, o.shape[2]), n[shifted, -1],
                                   n[full_next].reshape(-1, o.shape[2])])
            frame = np.concatenate([(count[new_obs, None] + steps).ravel(), next_start[shifted],
                                    (next_start[full_next, None] + steps).ravel()])
            env = np.concatenate([envs[new_obs].repeat(k), envs[shifted], envs[full_next].repeat(k)])
            dest = env * length + frame % length  # distinct: an env writes at most 2k <= L frames a step

        owner = self.owner.numpy().reshape(-1)
        owners = owner[dest]
        seed = dest // (length * self.envs_per_seed)  # the seed of each frame written
        live = owners >= (max(first_live, 0) if self.num_seeds == 1 else np.maximum(first_live, 0)[seed])
        dropped, dropped_seed = owners[live], seed[live]  # -1: no owner
        owner[dest] = -1
        if self.device.type == "cpu":  # numpy's row assignment: no tensors to wrap, 10% of a step faster
            self._rows.numpy()[dest] = rows
        else:
            self._rows.index_copy_(0, torch.from_numpy(dest).to(self.device), torch.from_numpy(rows).to(self.device))
        self.count = torch.from_numpy(next_last + 1)
        self.count_on_device = self.count.to(self.device)
        np.copyto(last, n)
        self._dropped(dropped, dropped_seed)

        step = transitions.exclude(*POSITION_KEYS)
        step.set("obs", torch.from_numpy(obs_last * len(envs) + envs).to(transitions.device))
        step.set("next_obs", torch.from_numpy(next_last * len(envs) + envs).to(transitions.device))
        return step, self._report(dropped, dropped_seed)

    def _dropped(self, index: np.ndarray, seed: np.ndarray) -> None:
        """Note transitions dropped (their indices, with their seeds) in last_dropped."""
        if not index.size:
            return
        if self.num_seeds == 1:
            self.last_dropped = max(self.last_dropped, int(index.max()))
        else:
            np.maximum.at(self.last_dropped, seed, index)

    def _report(self, index: np.ndarray, seed: np.ndarray) -> Any:
        """Dropped indices for the buffer: a tensor (many seeds: a tensor of indices and one of their seeds)."""
        return torch.from_numpy(index) if self.num_seeds == 1 else (torch.from_numpy(index), torch.from_numpy(seed))

    def _words(self, stacks: torch.Tensor) -> np.ndarray:
        """CPU stacks [E, k, *frame_shape] as a numpy [E, k, words per frame] (a view when contiguous)."""
        return stacks.numpy().reshape(*stacks.shape[:2], -1).view(np.uint8).view(self._word)

    def _check_step(self, transitions: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        obs, next_obs = transitions.get("obs", None), transitions.get("next_obs", None)
        if obs is None or next_obs is None:
            missing = [key for key, v in zip(POSITION_KEYS, (obs, next_obs), strict=True) if v is None]
            raise ValueError(f"add_frames needs obs and next_obs stacks; missing {missing}")
        obs, next_obs = obs.cpu(), next_obs.cpu()
        if (self.frames is not None and len(transitions.batch_size) == 1 and obs.shape == next_obs.shape
                and obs.shape == self._stack_shape and obs.dtype == next_obs.dtype == self.frames.dtype):
            return obs, next_obs  # the usual case, checked in one go
        if len(transitions.batch_size) != 1:
            raise ValueError(f"add_frames expects one vector-env step [E], got batch size {transitions.batch_size}")
        k = self.frame_stack
        if obs.dim() < 2 or obs.shape[1] != k or obs.shape != next_obs.shape or obs.dtype != next_obs.dtype:
            raise ValueError(
                f"add_frames expects obs and next_obs stacks [E, {k}, ...] of one shape and dtype (frame_stack={k}), "
                f"got obs {tuple(obs.shape)} {obs.dtype} and next_obs {tuple(next_obs.shape)} {next_obs.dtype}"
            )
        if self.frames is not None:
            raise ValueError(
                f"add_frames got stacks {tuple(obs.shape)} {obs.dtype}; this buffer stores "
                f"{tuple(self._stack_shape)} {self.frames.dtype} (one step of the same {self.num_envs} envs)"
            )
        return obs, next_obs

    def check_memory(self, obs: torch.Tensor, other: int = 64) -> None:
        """Raise TooLarge unless this store and its transition ring fit, for one step's obs stacks [E, k, ...]
        and `other` bytes per transition besides its positions (64: more than a DQN step's keys and a sum tree's)."""
        self._check_fits(obs, other)

    def _check_fits(self, obs: torch.Tensor, other: int) -> int:
        """check_memory; returns the frames per env the store would have."""
        num_envs, k, frame_shape = obs.shape[0], self.frame_stack, obs.shape[2:]
        if num_envs % self.num_seeds:
            raise ValueError(f"a step of {num_envs} envs does not split evenly over {self.num_seeds} seeds")
        length = math.ceil(self.capacity * (1 + self.slack) / (num_envs // self.num_seeds)) + 4 * k
        frame_bytes = obs[0, 0].numel() * obs.element_size()
        per_item = self.num_seeds * ((1 + self.slack) * (frame_bytes + 8) + 16 + other)
        check_fits(num_envs * length * (frame_bytes + 8) + self.num_seeds * self.capacity * (16 + other), self.device,
                   f"a frame store of {num_envs} x {length:,} frames of {tuple(frame_shape)} {obs.dtype} "
                   f"(capacity {self.capacity:,} transitions)", per_item)
        return length

    def _allocate(self, transitions: TensorDict, obs: torch.Tensor) -> None:
        num_envs, frame_shape = obs.shape[0], obs.shape[2:]
        # The transition ring is allocated by the buffer's first extend; count it here too, so that a
        # buffer that cannot fit is refused at once: two int64 positions plus the step's other keys.
        other = sum(v[0].numel() * v.element_size() for k_, v in transitions.items(True, True)
                    if k_ not in POSITION_KEYS)
        length = self._check_fits(obs, other)
        self.num_envs, self.frames_per_env, self.envs_per_seed = num_envs, length, num_envs // self.num_seeds
        # torch.empty leaves pages untouched until written, so the store costs memory as it fills.
        self._set_frames(torch.empty((num_envs * length, *frame_shape), dtype=obs.dtype, device=self.device))
        self.count = torch.zeros(num_envs, dtype=torch.int64)
        self.count_on_device = self.count.to(self.device)
        self.owner = torch.full((num_envs, length), -1, dtype=torch.int64)
        self.last_next_obs = torch.empty_like(obs)

    def _set_frames(self, frames: torch.Tensor) -> None:
        """Take `frames` [E * L, *frame_shape] as the store, with the views and constants derived from it."""
        self.frames = frames
        rows = frames.view(len(frames), -1).view(torch.uint8)
        self._rows = rows.view(word_type(rows.shape[1]))  # the same memory as [E * L, words per frame]
        self._word = np.dtype(str(self._rows.dtype).removeprefix("torch."))
        self._stack_shape = torch.Size((self.num_envs, self.frame_stack, *frames.shape[1:]))

    # ---- the buffer's side: storing positions ------------------------------------------------------

    def check_positions(self, data: TensorDict, first_live: int | np.ndarray,
                        seed: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Raise unless a batch for extend holds positions this store gave out and that are not stored
        yet; return what `register` needs: (obs, next_obs, env, first frame, whether it is stored).

        `first_live` is the first index still stored once the batch is written (many seeds: per seed,
        with `seed` the seed of each row, whose positions must be of that seed's envs).
        """
        given = {key: data.get(key, None) for key in POSITION_KEYS}
        bad = {key: v for key, v in given.items() if v is None or v.dtype != torch.int64 or v.dim() != 1}
        if bad:
            shapes = ", ".join(f"{key} {'missing' if v is None else f'{tuple(v.shape[1:])} {v.dtype}'}"
                               for key, v in bad.items())
            raise ValueError(
                f"this buffer stores frames (frame_stack={self.frame_stack}): extend takes obs and next_obs as "
                f"the int64 positions that add_frames returns, got {shapes}. "
                "Call rb.add_frames(transitions) on each vector-env step first and extend with what it returns."
            )
        obs, next_obs = given["obs"].cpu().numpy(), given["next_obs"].cpu().numpy()
        if obs.size == 0:
            return obs, next_obs, obs, obs, obs.astype(bool)
        if self.frames is None:
            raise ValueError("positions given before any add_frames: call rb.add_frames(transitions) first")
        num_envs, count = self.num_envs, self.count.numpy()
        env, last = obs % num_envs, obs // num_envs
        ok = (obs >= 0) & (next_obs % num_envs == env) & (next_obs > obs) & (next_obs // num_envs < count[env])
        if not ok.all():
            raise ValueError(f"positions this buffer's add_frames never returned: obs {obs[~ok].tolist()[:8]}, "
                             f"next_obs {next_obs[~ok].tolist()[:8]}")
        if seed is not None and (env // self.envs_per_seed != seed).any():
            raise ValueError("positions of one seed's envs given as another seed's rows")
        first = last - (self.frame_stack - 1)
        stored = first >= count[env] - self.frames_per_env  # else dropped while it waited to be stored
        held = self.owner.numpy()[env, first % self.frames_per_env]
        repeated = (held >= (max(first_live, 0) if seed is None else np.maximum(first_live, 0)[seed])) & stored
        if repeated.any() or np.unique(obs).size != obs.size:
            raise ValueError(
                "obs positions already stored in this buffer (each add_frames step may be stored once while it "
                f"is live): {obs[repeated].tolist()[:8] or 'repeated within the batch'}"
            )
        return obs, next_obs, env, first, stored

    def register(self, index: np.ndarray, obs: np.ndarray, next_obs: np.ndarray, env: np.ndarray,
                 first: np.ndarray, stored: np.ndarray) -> Any:
        """Record the owners of the transitions stored at `index` (the other arrays come from
        check_positions); return the indices of those that arrive already dropped (many seeds: with
        their seeds, as `add` does).

        A transition is dropped on arrival when its obs frames were overwritten while it waited
        (in NStepReturns' window, say): possible only when L is small next to n.
        """
        self.owner.numpy()[env[stored], first[stored] % self.frames_per_env] = index[stored]
        seed = env // max(self.envs_per_seed, 1)
        irregular = next_obs - obs != self.num_envs  # next_obs is not obs shifted by one frame
        if irregular.any():
            if self.num_seeds == 1:
                self.last_irregular = max(self.last_irregular, int(index[irregular].max()))
            else:
                np.maximum.at(self.last_irregular, seed[irregular], index[irregular])
        self._dropped(index[~stored], seed[~stored])
        return self._report(index[~stored], seed[~stored])

    # ---- the buffer's side: sampling --------------------------------------------------------------

    def may_hold_dropped(self, first_live: int | np.ndarray) -> bool:
        """False when no live transition (index >= first_live) has been dropped: no check needed."""
        return bool(np.any(self.last_dropped >= first_live))

    def sampleable(self, obs: torch.Tensor) -> torch.Tensor:
        """Whether each obs position (on device) still has its first frame stored."""
        env = obs % self.num_envs
        first = obs // self.num_envs - (self.frame_stack - 1)
        return first >= self.count_on_device.index_select(0, env) - self.frames_per_env

    def redraw_uniform(self, slots: torch.Tensor, obs: torch.Tensor, size: int,
                       generator: torch.Generator) -> torch.Tensor:
        """Replace each draw of an unsampleable transition by a uniform draw over the sampleable ones.

        `obs` is the stored positions, slots < size are drawn uniformly. Rejection: a rejected
        draw is redrawn from all `size` slots until it lands on a sampleable one, so every returned
        draw is independent and uniform over the sampleable transitions. Draws still rejected after
        a few rounds (when most transitions were dropped) pick from the explicit list of
        sampleable slots, uniformly again.
        """
        for _ in range(16):
            bad = ~self.sampleable(obs.index_select(0, slots))
            if not bool(bad.any()):
                return slots
            fresh = torch.randint(size, slots.shape, generator=generator, device=slots.device)
            slots = torch.where(bad, fresh, slots)
        bad = ~self.sampleable(obs.index_select(0, slots))
        valid = self.sampleable(obs[:size]).nonzero().flatten()
        if valid.numel() == 0:
            raise RuntimeError("no transition can be sampled: the frames of every stored one were overwritten")
        pick = valid[torch.randint(valid.numel(), slots.shape, generator=generator, device=slots.device)]
        return torch.where(bad, pick, slots)

    def stacks(self, obs: torch.Tensor, next_obs: torch.Tensor,
               first_live: int | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The obs and next_obs stacks [B, k, *frame_shape] of positions [B] (on device).

        While every live next_obs is its obs shifted by one frame (one-step transitions), both come
        from one gather of k + 1 frames per transition, as two overlapping views of one tensor
        (so they are not contiguous, and writing into one writes into the other). Otherwise one
        gather of 2k frames fills a [2, B, k, ...] tensor whose halves are the two stacks.
        """
        k = self.frame_stack
        capturing = obs.device.type == "cuda" and torch.cuda.is_current_stream_capturing()  # replayed later: general
        if not capturing and np.all(self.last_irregular < first_live):
            window = self._window(obs, k + 1)
            return window[:, :k], window[:, 1:]
        both = self._window(torch.stack([obs, next_obs]), k)
        return both[0], both[1]

    def _window(self, position: torch.Tensor, length: int) -> torch.Tensor:
        """`length` consecutive frames of each position's env from the first frame of its stack on."""
        env = position % self.num_envs
        first = position // self.num_envs - (self.frame_stack - 1)
        frame = first.unsqueeze(-1) + torch.arange(length, device=position.device)
        rows = (env * self.frames_per_env).unsqueeze(-1) + frame.remainder_(self.frames_per_env)
        out = torch.index_select(self._rows, 0, rows.view(-1))
        return out.view(self.frames.dtype).view(*rows.shape, *self.frames.shape[1:])

    # ---- checkpointing -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The store's state. The frames and owners are the live tensors, not copies (at 1M
        transitions a copy would double 7 GB): save the state before writing to the buffer again.
        Until every env's ring has wrapped, the frames are a list of each env's rows written so far,
        views of the same memory: a checkpoint holds the frames stored, not the capacity."""
        frames = self.frames
        if frames is not None and bool((self.count < self.frames_per_env).any()):
            frames = [self._written_rows(env) for env in range(self.num_envs)]
        return {
            "frame_stack": self.frame_stack,
            "num_envs": self.num_envs,
            "frames_per_env": self.frames_per_env,
            "frames": frames,
            "owner": self.owner,
            "count": None if self.count is None else self.count.clone(),
            "last_next_obs": None if self.last_next_obs is None else self.last_next_obs.clone(),
            "num_seeds": self.num_seeds,
            "last_dropped": np.asarray(self.last_dropped).tolist(),
            "last_irregular": np.asarray(self.last_irregular).tolist(),
        }

    def _written_rows(self, env: int) -> torch.Tensor:
        """Env `env`'s frames written so far, [min(count, L), *frame_shape], on a storage of their own bytes
        that aliases the store's (torch.save writes a view's whole storage; this one is only these rows)."""
        rows, shape = min(int(self.count[env]), self.frames_per_env), self.frames.shape[1:]
        row_bytes = self.frames[0].numel() * self.frames.element_size()
        start = self.frames.storage_offset() * self.frames.element_size() + env * self.frames_per_env * row_bytes
        storage = self.frames.untyped_storage()[start:start + rows * row_bytes]
        return torch.empty(0, dtype=self.frames.dtype, device=self.frames.device).set_(storage, 0, (rows, *shape))

    def load_state_dict(self, state: dict, copy: bool = True) -> None:
        """Restore a state; with copy=False the frames and owners are adopted without a copy when they
        are already on the right device (e.g. tensors of a checkpoint loaded with mmap=True)."""
        if state["frame_stack"] != self.frame_stack:
            raise ValueError(f"state is for frame_stack {state['frame_stack']}, this buffer has {self.frame_stack}")
        if state.get("num_seeds", 1) != self.num_seeds:
            raise ValueError(f"state is for {state.get('num_seeds', 1)} seeds, this store has {self.num_seeds}")
        self.num_envs, self.frames_per_env = int(state["num_envs"]), int(state["frames_per_env"])
        self.envs_per_seed = self.num_envs // self.num_seeds
        if state["frames"] is None:
            self.frames = self._rows = self.count = self.count_on_device = self.owner = self.last_next_obs = None
        else:
            self._set_frames(self._loaded_frames(state, copy))
            self.owner = state["owner"].to("cpu", torch.int64, copy=copy)
            self.count = state["count"].to("cpu", torch.int64, copy=True)
            self.count_on_device = self.count.to(self.device)
            self.last_next_obs = state["last_next_obs"].to("cpu", copy=True)
        if self.num_seeds == 1:
            self.last_dropped, self.last_irregular = int(state["last_dropped"]), int(state["last_irregular"])
        else:
            self.last_dropped = np.array(state["last_dropped"], dtype=np.int64)
            self.last_irregular = np.array(state["last_irregular"], dtype=np.int64)

    def _loaded_frames(self, state: dict, copy: bool) -> torch.Tensor:
        """The state's frames as the store [E * L, *frame_shape] on device, checked against its envs and rings;
        each env's rows written so far (a store not yet wrapped) go to the start of its ring."""
        frames, count, envs, length = state["frames"], state["count"], self.num_envs, self.frames_per_env
        if tuple(state["owner"].shape) != (envs, length):
            raise ValueError(f"state's owners {tuple(state['owner'].shape)} do not match {envs} envs x {length} frames")
        if not isinstance(frames, list):
            if frames.shape[0] != envs * length:
                raise ValueError(f"state's frames {tuple(frames.shape)} do not match {envs} envs x {length} frames")
            return frames.to(self.device, copy=copy).contiguous()
        written = [min(int(c), length) for c in count]
        if [len(rows) for rows in frames] != written or len({(rows.shape[1:], rows.dtype) for rows in frames}) != 1:
            raise ValueError(f"state's frames hold {[tuple(rows.shape) for rows in frames]} rows per env; its "
                             f"counts say {written} (of {length}), in one shape and dtype")
        store = torch.empty((envs * length, *frames[0].shape[1:]), dtype=frames[0].dtype, device=self.device)
        for env, rows in enumerate(frames):
            store[env * length:env * length + len(rows)] = rows.to(self.device)
        return store
