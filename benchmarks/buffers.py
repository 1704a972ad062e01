"""Replay-buffer speed: this repository's `buffers` against TorchRL, measured in the same process.

Cases, each with a full buffer (the ring wraps on every extend):
    (a) "vector":   obs/next_obs float32[4], action int64, reward float32, terminated bool; capacity 1e6
    (b) "atari":    obs/next_obs uint8[4, 84, 84], action, reward, terminated, truncated;  capacity 5e4
    (c) "atari-1M": case (b) at capacity 1e6, ours alone (its frames take about 7.2 GB)
    (d) "image":    case (b)'s keys as random full stacks, both libraries storing both stacks (no
                    frame_stack: the generic write path); extend only, capacity 5e4. Its extend rows
                    also give bytes per second against a plain copy_ of the same bytes (the memory floor)
In the Atari cases both libraries get the same stream of 8-env steps (each next_obs is its obs
shifted by one new frame; episodes of 500 steps on average start from a zero-padded stack as in
ale-py). Ours stores frames once (frame_stack=4: add_frames, then extend); TorchRL stores the full
stacks, as its LazyTensorStorage does.
Ops: extend 8 and 128 items (Atari: 1 and 16 steps of 8 envs), uniform sample, prioritized sample,
and the PER loop (sample + priority update from random |TD errors|), batch size 256, one torch
thread, median of repeated timings after a warm-up. The peer is TorchRL's
TensorDict(Prioritized)ReplayBuffer over a LazyTensorStorage, the library's own fast path for
TensorDicts.

    .venv-bench/bin/python benchmarks/buffers.py            # full run, writes results/buffers.json
    python benchmarks/buffers.py --quick                        # small capacities, a smoke test
    python benchmarks/buffers.py --device cuda                  # our buffers on a GPU, case (a)
    python benchmarks/buffers.py --no-1m                        # skip case (c)
    .venv-bench/bin/python benchmarks/buffers.py --cases image   # case (d) alone
    .venv-bench/bin/python benchmarks/buffers.py --side-by-side --other ../before --runs 3 [--tree]

--side-by-side times the PER loop of case (a) for this checkout's buffers, optionally another checkout's (--other,
its `buffers` imported under another name: `git worktree add ../before <commit>`) and TorchRL's, all built and filled
first with the same data and priorities, then their calls alternating in blocks (which goes first alternates too), so
background load and the machine's state hit every version alike: a steadier comparison than separate runs (TorchRL's
time moved by 40% between two runs on a quiet machine). Prints thread CPU time, median per call, per run, and the
speed-ups against TorchRL; --tree also times the sum tree's parts, ours and the other's: `update` of 256 slots and
`find_prefix` of 256 draws. Writes nothing.

TorchRL's compiled segment tree needs the torch it was built against (torchrl 0.14.1: torch 2.14.1),
so the comparison runs in its own virtual environment; see benchmarks/README.md. Without TorchRL,
or without its segment tree, ours are timed alone and the ratios read "n/a".
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# `python benchmarks/buffers.py` puts benchmarks/ first on sys.path, where this very file would
# shadow the `buffers` package; put the repository root there instead, so any venv finds it.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != HERE]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tensordict  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from buffers import PrioritizedReplayBuffer, ReplayBuffer  # noqa: E402

BATCH = 256
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
FILL_CHUNK_BYTES = 64 << 20  # prefill in pieces of about this size
# Goals, as speed-up = torchrl time / our time, keyed by (op, case).
GOALS = {("PER sample + update", "vector"): 1.5, ("PER sample + update", "atari"): 8.0,
         ("uniform sample", "atari"): 8.0, ("PER sample", "atari"): 8.0,
         ("uniform extend 128", "image"): 5.0, ("PER extend 128", "image"): 5.0}
NUM_ENVS = 8  # envs per step in the Atari stream


@dataclass(frozen=True)
class Case:
    name: str
    capacity: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    frames: bool = False  # a stream of stacked frames; ours stores each frame once
    extend_only: bool = False  # time extend 8 / 128 only, and a plain copy_ of their bytes

    def batch(self, size: int, generator: torch.Generator) -> TensorDict:
        """`size` random transitions (same layout for both libraries)."""

        def observation() -> torch.Tensor:
            if self.obs_dtype == torch.uint8:
                return torch.randint(0, 256, (size, *self.obs_shape), dtype=torch.uint8, generator=generator)
            return torch.randn((size, *self.obs_shape), generator=generator)

        return TensorDict(
            {
                "obs": observation(),
                "next_obs": observation(),
                "action": torch.randint(0, 6, (size,), generator=generator),
                "reward": torch.randn(size, generator=generator),
                "terminated": torch.rand(size, generator=generator) < 0.01,
            },
            batch_size=[size],
        )

    @property
    def item_bytes(self) -> int:
        """Bytes per stored transition with both stacks (TorchRL's, and ours outside frame mode)."""
        obs = int(np.prod(self.obs_shape)) * torch.empty((), dtype=self.obs_dtype).element_size()
        return 2 * obs + 8 + 4 + 1 + self.frames

    @property
    def our_item_bytes(self) -> int:
        """Ours: one frame per transition (plus the frame store's 2% slack) and two int64 positions."""
        if not self.frames:
            return self.item_bytes
        frame = int(np.prod(self.obs_shape[1:])) * torch.empty((), dtype=self.obs_dtype).element_size()
        return int(1.02 * (frame + 8)) + 2 * 8 + 8 + 4 + 1 + 1


class FrameStream:
    """Consecutive steps of NUM_ENVS Atari-like envs, TensorDicts [E] with obs/next_obs stacks [E, k, 84, 84].

    Frames are drawn from a pool of random ones. Each next_obs is its obs shifted by one new frame
    (also at an episode's end: the real final stack); episodes last 500 steps on average
    (geometric), and the next one starts from a zero-padded stack [0, 0, 0, f0], as in ale-py.
    """

    def __init__(self, case: Case, generator: torch.Generator, pool: int = 1024):
        self.generator, self.num_envs = generator, NUM_ENVS
        self.pool = torch.randint(0, 256, (pool, *case.obs_shape[1:]), dtype=case.obs_dtype, generator=generator)
        self.stack = torch.zeros((self.num_envs, *case.obs_shape), dtype=case.obs_dtype)
        self.stack[:, -1] = self._frames()

    def _frames(self) -> torch.Tensor:
        return self.pool[torch.randint(len(self.pool), (self.num_envs,), generator=self.generator)]

    def step(self) -> TensorDict:
        obs = self.stack
        next_obs = torch.cat([obs[:, 1:], self._frames().unsqueeze(1)], dim=1)
        done = torch.rand(self.num_envs, generator=self.generator) < 1 / 500
        terminated = done & (torch.rand(self.num_envs, generator=self.generator) < 0.5)
        self.stack = next_obs.clone()
        self.stack[done] = 0
        self.stack[done, -1] = self._frames()[done]
        return TensorDict(
            {
                "obs": obs,
                "next_obs": next_obs,
                "action": torch.randint(0, 6, (self.num_envs,), generator=self.generator),
                "reward": torch.randn(self.num_envs, generator=self.generator),
                "terminated": terminated,
                "truncated": done & ~terminated,
            },
            batch_size=[self.num_envs],
        )

    def steps(self, count: int) -> list[TensorDict]:
        return [self.step() for _ in range(count)]


# ---- the two libraries behind one small interface ------------------------------------------------


class Ours:
    library = "ours"
    buffers = (ReplayBuffer, PrioritizedReplayBuffer)  # (uniform, prioritized): --other swaps them

    def __init__(self, capacity: int, prioritized: bool, device: torch.device, frames: bool = False):
        frame_stack = 4 if frames else 0
        uniform, prioritized_class = self.buffers
        if prioritized:
            self.rb = prioritized_class(
                capacity, alpha=ALPHA, beta=BETA, eps=EPS, device=device, seed=0, frame_stack=frame_stack)
        else:
            self.rb = uniform(capacity, device=device, seed=0, frame_stack=frame_stack)

    def steps(self, steps: list[TensorDict]) -> TensorDict | list[TensorDict]:
        """The input to `extend` for these consecutive vector-env steps."""
        return steps if self.rb.frame_store is not None else torch.cat(steps)

    def extend(self, data: TensorDict | list[TensorDict]) -> None:
        if isinstance(data, list):  # frame mode: one add_frames per vector-env step
            for step in data:
                self.rb.extend(self.rb.add_frames(step))
        else:
            self.rb.extend(data)

    def set_priorities(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        self.rb.update_priority(index, priority)

    def sample(self) -> TensorDict:
        return self.rb.sample(BATCH)

    def sample_and_update(self, td_error: torch.Tensor) -> None:
        batch = self.rb.sample(BATCH)
        self.rb.update_priority(batch["index"], td_error)


class TorchRL:
    library = "torchrl"

    def __init__(self, capacity: int, prioritized: bool, device: torch.device, frames: bool = False):
        from torchrl.data import (
            LazyTensorStorage,
            TensorDictPrioritizedReplayBuffer,
            TensorDictReplayBuffer,
        )

        storage = LazyTensorStorage(capacity, device=device)
        if prioritized:
            self.rb = TensorDictPrioritizedReplayBuffer(
                alpha=ALPHA, beta=BETA, eps=EPS, storage=storage, batch_size=BATCH, priority_key="td_error"
            )
        else:
            self.rb = TensorDictReplayBuffer(storage=storage, batch_size=BATCH)

    def steps(self, steps: list[TensorDict]) -> TensorDict:
        return torch.cat(steps)

    def extend(self, data: TensorDict) -> None:
        self.rb.extend(data)

    def set_priorities(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        self.rb.update_priority(index, priority)

    def sample(self) -> TensorDict:
        return self.rb.sample()

    def sample_and_update(self, td_error: torch.Tensor) -> None:
        # rb.update_priority(index, priority) is TorchRL's public per-index update; it measured about
        # 5% faster than setting batch["td_error"] and calling rb.update_tensordict_priority(batch),
        # which reduces the key and then makes this same call.
        batch = self.rb.sample()
        self.rb.update_priority(batch["index"], td_error)


def torchrl_status(device: torch.device) -> tuple[str | None, bool, bool, str]:
    """(version, uniform usable, prioritized usable, message) for TorchRL on `device`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torchrl
            from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer  # noqa: F401
        except Exception as err:  # ImportError, or a torch/torchrl ABI mismatch
            return None, False, False, (
                f"TorchRL is not importable here ({type(err).__name__}: {err}); timing our buffers "
                "alone, ratios are n/a. See benchmarks/README.md for the venv with torch==2.14.1 and "
                "torchrl==0.14.1.")
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # its storages log at INFO
    tiny = Case("probe", 16, (4,), torch.float32).batch(8, torch.Generator().manual_seed(0))
    reasons = {}
    for prioritized in (False, True):
        try:
            rb = TorchRL(16, prioritized, device)
            rb.extend(tiny.to(device))
            if prioritized:
                rb.sample_and_update(torch.rand(BATCH, device=device))
            else:
                rb.sample()
        except Exception as err:
            reasons[prioritized] = f"{type(err).__name__}: {err}"
    message = f"TorchRL {torchrl.__version__} on {device}"
    if True in reasons:
        hint = ""
        if "SegmentTree" in reasons[True]:
            import_warnings = "; ".join(str(w.message).splitlines()[0] for w in caught)[:300]
            hint = (" TorchRL's compiled segment tree did not load: it needs the exact torch it was built "
                    "against (torchrl 0.14.1 -> torch 2.14.1); see benchmarks/README.md."
                    + (f" Import warnings: {import_warnings}" if import_warnings else ""))
        message += (f": its prioritized buffer does not work here ({reasons[True]}).{hint} "
                    "Timing our PER buffer alone; PER ratios are n/a.")
    if False in reasons:
        message += f" Its uniform buffer does not work either ({reasons[False]}); uniform ratios are n/a."
    return torchrl.__version__, False not in reasons, True not in reasons, message


# ---- timing ----------------------------------------------------------------------------------------


def stats_us(times: list[tuple[float, float]]) -> dict:
    """Median and quartiles, in microseconds, of both clocks over (wall, thread cpu) samples."""
    out: dict = {"repeats": len(times)}
    for clock, values in zip(("wall", "cpu"), zip(*times, strict=True), strict=True):
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        out[clock] = {"median_us": median * 1e6, "q1_us": q1 * 1e6, "q3_us": q3 * 1e6}
    return out


def time_interleaved(ops: dict[str, Callable[[int], object]], sync: Callable[[], None], budget_s: float,
                     min_repeats: int = 30, max_repeats: int = 300, rounds: int = 10,
                     ) -> dict[str, list[tuple[float, float]]]:
    """Per-call (wall, thread CPU) times in seconds of each library's op, after a warm-up.

    Wall time is time.perf_counter. Thread CPU time (time.thread_time) leaves out the time this
    thread spent preempted by other processes, so it stays meaningful on a busy machine (with one
    torch thread all of an op's CPU work runs in this thread; on CUDA it means nothing).
    When several libraries are timed together, their calls alternate in `rounds` blocks (which one
    goes first alternates too), so a change in background load hits all of them alike.
    `op(i)` gets the call number so that callers can rotate pre-built inputs.
    """
    repeats = {}
    for name, op in ops.items():
        start, warm = time.perf_counter(), 0
        while warm < 5 or (time.perf_counter() - start < 0.1 * budget_s and warm < 50):
            op(warm)
            sync()
            warm += 1
        per_call = (time.perf_counter() - start) / warm
        repeats[name] = int(min(max_repeats, max(min_repeats, budget_s / max(per_call, 1e-9))))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ops}
    order = list(ops)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            op, done = ops[name], len(times[name])
            for i in range(done, repeats[name] * (r + 1) // rounds):
                c0, t0 = time.thread_time(), time.perf_counter()
                op(i)
                sync()
                t1, c1 = time.perf_counter(), time.thread_time()
                times[name].append((t1 - t0, c1 - c0))
    return times


def prefill(rb, case: Case, device: torch.device, generator: torch.Generator) -> None:
    """Fill to capacity, one chunk at a time (a few chunks are reused so filling stays cheap)."""
    if case.frames:  # a chunk of consecutive steps at a time
        stream, written = FrameStream(case, generator), 0
        per_chunk = max(1, FILL_CHUNK_BYTES // (case.item_bytes * NUM_ENVS))
        while written < case.capacity:
            steps = stream.steps(min(per_chunk, (case.capacity - written) // NUM_ENVS))
            rb.extend(rb.steps([step.to(device) for step in steps]))
            written += NUM_ENVS * len(steps)
        return
    chunk = max(1, min(case.capacity, FILL_CHUNK_BYTES // case.item_bytes))
    pieces = [case.batch(chunk, generator).to(device) for _ in range(2)]
    written = 0
    while written < case.capacity:
        size = min(chunk, case.capacity - written)
        piece = pieces[(written // chunk) % len(pieces)]
        rb.extend(piece if size == chunk else piece[:size])
        written += size


def measure(libraries: list, case: Case, prioritized: bool, device: torch.device, budget_s: float,
            sync: Callable[[], None]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Build and fill one buffer per library, time their ops side by side: {library: {op: times}}.

    The buffers are freed when this returns (the caller collects).
    """
    kind = "PER" if prioritized else "uniform"
    buffers, inputs, td_errors = {}, {}, {}
    for lib in libraries:
        generator = torch.Generator().manual_seed(1)  # the same data for every library
        t0 = time.perf_counter()
        rb = buffers[lib.library] = lib(case.capacity, prioritized, device, case.frames)
        prefill(rb, case, device, generator)
        if prioritized:  # a realistic, non-flat priority landscape, the same for every library
            priority = torch.rand(case.capacity, generator=generator).pow(4).to(device)
            rb.set_priorities(torch.arange(case.capacity, device=device), priority)
        sync()
        print(f"  {lib.library:>7} {kind:>7} {case.name}: filled {case.capacity:,} items in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
        if case.frames:  # consecutive steps, cycled: call i of "extend 8" stores step i % 256
            steps = [step.to(device) for step in FrameStream(case, generator).steps(256)]
            inputs[lib.library] = {8: [rb.steps(steps[i : i + 1]) for i in range(256)],
                                   128: [rb.steps(steps[i : i + 16]) for i in range(0, 256, 16)]}
        else:
            inputs[lib.library] = {size: [case.batch(size, generator).to(device) for _ in range(4)]
                                   for size in (8, 128)}
        td_errors[lib.library] = [torch.rand(BATCH, generator=generator).to(device) for _ in range(8)]

    def extend(name: str, size: int) -> Callable[[int], object]:
        return lambda i: buffers[name].extend(inputs[name][size][i % len(inputs[name][size])])

    def per_loop(name: str) -> Callable[[int], object]:
        return lambda i: buffers[name].sample_and_update(td_errors[name][i % 8])

    op_makers: dict[str, Callable[[str], Callable[[int], object]]] = {
        f"{kind} extend 8": lambda name: extend(name, 8),
        f"{kind} extend 128": lambda name: extend(name, 128),
        f"{kind} sample": lambda name: lambda i: buffers[name].sample(),
    }
    if case.extend_only:
        del op_makers[f"{kind} sample"]
    elif prioritized:
        op_makers["PER sample + update"] = per_loop
    results: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for name in buffers}
    for op, make in op_makers.items():
        timed = time_interleaved({name: make(name) for name in buffers}, sync, budget_s)
        for name, times in timed.items():
            results[name][op] = times
        print(f"    {op:<20} " + "  ".join(f"{name} {1e6 * statistics.median(w for w, _ in t):9.1f}us"
                                           for name, t in timed.items()), flush=True)
    return results


def measure_copy_floor(case: Case, device: torch.device, budget_s: float,
                       sync: Callable[[], None]) -> dict[int, list[tuple[float, float]]]:
    """{batch size: times} of one plain copy_ of an extend's bytes (size x item_bytes) into a ring of
    `capacity` items that was written once before (as a full buffer's is), at the slots an extend would
    use: the memory-speed floor of the write, with none of the buffer's bookkeeping."""
    ring = torch.zeros((case.capacity, case.item_bytes), dtype=torch.uint8, device=device)
    floor = {}
    for size in (8, 128):
        src = torch.randint(0, 256, (size, case.item_bytes), dtype=torch.uint8).to(device)

        def copy(i: int, size: int = size, src: torch.Tensor = src) -> None:
            start = (i * size) % (case.capacity - size)
            ring[start : start + size].copy_(src)

        floor[size] = time_interleaved({"copy": copy}, sync, budget_s)["copy"]
        print(f"    plain copy_ {size:<8} {1e6 * statistics.median(w for w, _ in floor[size]):9.1f}us", flush=True)
    return floor


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def measure_ours_alone(case: Case, device: torch.device, budget_s: float,
                       sync: Callable[[], None]) -> tuple[dict[str, list[tuple[float, float]]], dict]:
    """Our prioritized frame-mode buffer alone, filled once: ({op: times}, facts about the fill).

    "uniform sample" is ReplayBuffer.sample called on this same buffer (uniform draws, the same
    gather), so that one fill of the big buffer serves every op.
    """
    generator = torch.Generator().manual_seed(1)
    rss_before, t0 = rss_bytes(), time.perf_counter()
    ours = Ours(case.capacity, True, device, frames=True)
    prefill(ours, case, device, generator)
    ours.set_priorities(torch.arange(case.capacity, device=device),
                        torch.rand(case.capacity, generator=generator).pow(4).to(device))
    sync()
    store = ours.rb.frame_store
    facts = {"fill_seconds": time.perf_counter() - t0,
             "frame_store_bytes": store.frames.numel() * store.frames.element_size(),
             "rss_growth_bytes": None if rss_before is None else rss_bytes() - rss_before}
    growth = (facts["rss_growth_bytes"] or 0) / 1e9
    print(f"  ours PER {case.name}: filled {case.capacity:,} items in {facts['fill_seconds']:.1f}s; frames "
          f"{facts['frame_store_bytes'] / 1e9:.2f} GB, resident memory +{growth:.2f} GB", flush=True)
    steps = [step.to(device) for step in FrameStream(case, generator).steps(256)]
    td_errors = [torch.rand(BATCH, generator=generator).to(device) for _ in range(8)]
    ops = {
        "PER extend 8": lambda i: ours.extend([steps[i % 256]]),
        "uniform sample": lambda i: ReplayBuffer.sample(ours.rb, BATCH),
        "PER sample": lambda i: ours.sample(),
        "PER sample + update": lambda i: ours.sample_and_update(td_errors[i % 8]),
    }
    results = {}
    for op, fn in ops.items():
        results[op] = time_interleaved({"ours": fn}, sync, budget_s)["ours"]
        print(f"    {op:<20} ours {1e6 * statistics.median(w for w, _ in results[op]):9.1f}us", flush=True)
    return results, facts


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- reporting -------------------------------------------------------------------------------------


def machine_info(device: torch.device, torchrl_version: str | None) -> dict:
    cpu_model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                             cpu_model)
    except OSError:
        pass
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "numpy": np.__version__,
        "torchrl": torchrl_version,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def format_table(rows: list[dict], clock: str) -> str:
    header = ("op", "case", "ours (us)", "torchrl (us)", "speed-up", "goal",
              "GB/s: ours / torchrl / copy_ (ours % of copy_)")
    lines = []
    for r in rows:
        ours, theirs, ratio = r[clock]["ours_us"], r[clock]["torchrl_us"], r[clock]["speedup"]
        goal = ""
        if r["goal"] is not None:
            verdict = "n/a" if ratio is None else ("met" if ratio >= r["goal"] else "MISSED")
            goal = f">= {r['goal']}x {verdict}"
        speed = ""
        if "copy_GBps" in r[clock]:
            c = r[clock]
            theirs_gbps = "n/a" if c["torchrl_GBps"] is None else f"{c['torchrl_GBps']:.2f}"
            speed = (f"{c['ours_GBps']:.2f} / {theirs_gbps} / {c['copy_GBps']:.2f} "
                     f"({100 * c['ours_of_copy']:.0f}%)")
        lines.append((r["op"], r["case"], f"{ours:.1f}", "n/a" if theirs is None else f"{theirs:.1f}",
                      "n/a" if ratio is None else f"{ratio:.2f}x", goal, speed))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=True)]
    fmt = " | ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*header), "-+-".join("-" * w for w in widths)]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)


def table_rows(case: Case, raw: dict[str, dict[str, list[tuple[float, float]]]], clocks: list[str],
               floor: dict[int, list[tuple[float, float]]] | None = None) -> list[dict]:
    """One result row per op of a case: medians and quartiles of both libraries, and the speed-up;
    with `floor` (a plain copy_'s times per batch size), extend rows also get bytes per second."""
    timings = {name: {op: stats_us(times) for op, times in ops.items()} for name, ops in raw.items()}
    rows = []
    for op, ours in timings["ours"].items():
        theirs = timings["torchrl"].get(op)
        row = {"op": op, "case": case.name, "capacity": case.capacity, "goal": GOALS.get((op, case.name))}
        size = int(op.rsplit(" ", 1)[1]) if " extend " in op else None
        copy = stats_us(floor[size]) if floor and size in floor else None
        for clock in clocks:
            mine = ours[clock]["median_us"]
            other = None if theirs is None else theirs[clock]["median_us"]
            row[clock] = {"ours_us": mine, "torchrl_us": other, "speedup": None if other is None else other / mine}
            if copy is not None:  # bytes per microsecond = MB/s; /1e3: GB/s
                nbytes = size * case.item_bytes
                row[clock].update({
                    "bytes_per_call": nbytes, "copy_us": copy[clock]["median_us"],
                    "ours_GBps": nbytes / mine / 1e3, "copy_GBps": nbytes / copy[clock]["median_us"] / 1e3,
                    "torchrl_GBps": None if other is None else nbytes / other / 1e3,
                    "ours_of_copy": copy[clock]["median_us"] / mine})
        row["ours"], row["torchrl"], row["copy"] = ours, theirs, copy
        rows.append(row)
    return rows


def goal_summary(rows: list[dict], clock: str) -> str:
    goals = [r for r in rows if r["goal"] is not None]
    ratios = [r[clock]["speedup"] for r in goals]
    if all(x is None for x in ratios):
        return "goals (speed-up = torchrl / ours): n/a, no TorchRL timings"
    met = sum(x is not None and x >= r["goal"] for x, r in zip(ratios, goals, strict=True))
    return (f"goals (speed-up = torchrl / ours): {met} of {len(goals)} met"
            + ("" if None not in ratios else " (some n/a: no TorchRL timing)"))


def kept_rows(out: Path, cases_run: set[str], clocks: list[str]) -> dict | None:
    """The rows of the cases not run now from an earlier results file (and that run's date and
    command), so that a run of one case does not erase the other's numbers; None if there are none."""
    if not out.exists():
        return None
    earlier = json.loads(out.read_text())
    rows = [r for r in earlier.get("results", []) if r["case"] not in cases_run and all(c in r for c in clocks)]
    if not rows:
        return None
    return {"rows": rows, "cases": sorted({r["case"] for r in rows}), "date": earlier.get("date"),
            "command": earlier.get("command"), "machine": earlier.get("machine")}


def other_checkout(path: Path) -> type[Ours]:
    """Ours, with the buffers of another checkout of this repository (its package imported as `buffers_other`)."""
    init = path.resolve() / "buffers" / "__init__.py"
    if not init.is_file():
        sys.exit(f"error: --other {path}: no buffers/__init__.py there")
    spec = importlib.util.spec_from_file_location("buffers_other", init, submodule_search_locations=[str(init.parent)])
    other = importlib.util.module_from_spec(spec)
    sys.modules["buffers_other"] = other  # before exec: dataclasses and relative imports look the module up
    spec.loader.exec_module(other)

    class Other(Ours):
        library = "other"
        buffers = (other.ReplayBuffer, other.PrioritizedReplayBuffer)

    return Other


def side_by_side(args: argparse.Namespace) -> None:
    """The PER loop of the vector case: ours, --other's and TorchRL's in one process, calls alternating in blocks."""
    libraries = [Ours] + ([other_checkout(args.other)] if args.other is not None else [])
    version, _, prioritized_ok, message = torchrl_status(torch.device("cpu"))
    if prioritized_ok and not args.no_torchrl:
        libraries.append(TorchRL)
    else:
        print(f"TorchRL's prioritized buffer is not used ({message}): timing without it", flush=True)
    case, cpu = Case("vector", 10**4 if args.quick else 10**6, (4,), torch.float32), torch.device("cpu")
    buffers, td_errors = {}, {}
    for lib in libraries:
        generator = torch.Generator().manual_seed(1)  # the same data and priorities for every library
        rb = buffers[lib.library] = lib(case.capacity, True, cpu)
        prefill(rb, case, cpu, generator)
        rb.set_priorities(torch.arange(case.capacity), torch.rand(case.capacity, generator=generator).pow(4))
        td_errors[lib.library] = [torch.rand(BATCH, generator=generator) for _ in range(8)]
        print(f"filled {lib.library}", flush=True)
    ops = {name: (lambda i, name=name: buffers[name].sample_and_update(td_errors[name][i % 8])) for name in buffers}
    print(f"PER sample + update, vector case, {case.capacity} items, batch {BATCH}, one torch thread; thread CPU "
          f"time, median per call (us){'; torchrl ' + version if 'torchrl' in buffers else ''}")
    if args.tree:  # the same slots, values and fractions for every version
        generator = torch.Generator().manual_seed(2)
        slots = torch.randint(0, case.capacity, (BATCH,), generator=generator)
        values = torch.rand(BATCH, generator=generator, dtype=torch.float64)
        fraction = torch.rand(BATCH, generator=generator, dtype=torch.float64)
        for name in [name for name in buffers if name != "torchrl"]:
            tree = buffers[name].rb.tree
            ops[f"{name}:update"] = lambda i, tree=tree: tree.update(slots, values, True)
            ops[f"{name}:find_prefix"] = lambda i, tree=tree: tree.find_prefix(fraction, relative=True)
    for run in range(args.runs):
        times = time_interleaved(ops, lambda: None, 0.15 if args.quick else 10.0, rounds=3 if args.quick else 30,
                                 max_repeats=3000)
        median = {name: 1e6 * statistics.median(cpu_s for _, cpu_s in t) for name, t in times.items()}
        line = "  ".join(f"{name} {us:.1f}" for name, us in median.items() if ":" not in name)
        if "torchrl" in median:
            line += "  | speed-up (torchrl / x): " + "  ".join(
                f"{name} {median['torchrl'] / us:.2f}x" for name, us in median.items()
                if name != "torchrl" and ":" not in name)
        print(f"run {run + 1}: {line}", flush=True)
        if args.tree:
            print("  tree: " + "  ".join(f"{name} {us:.1f}" for name, us in median.items() if ":" in name), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: our buffers on the GPU, case (a) only")
    parser.add_argument("--quick", action="store_true",
                        help="small capacities and short timings (smoke test)")
    parser.add_argument("--out", default=None,
                        help="JSON path; default benchmarks/results/buffers.json (buffers_cuda.json with "
                             "--device cuda); --quick writes nothing unless --out is given")
    parser.add_argument("--no-torchrl", action="store_true", help="time our buffers only")
    parser.add_argument("--cases", nargs="+", default=["vector", "atari", "image", "atari-1M"],
                        choices=["vector", "atari", "image", "atari-1M"], help="which cases to run (default: all)")
    parser.add_argument("--no-1m", action="store_true", help="skip the atari-1M case (ours alone, ~7.2 GB)")
    parser.add_argument("--max-together-gb", type=float, default=4.0,
                        help="keep both libraries' buffers alive together (calls interleaved) when their "
                             "storage fits in this many GB; otherwise one library after the other")
    parser.add_argument("--side-by-side", action="store_true",
                        help="the PER loop of the vector case, ours, --other's and TorchRL's in one process")
    parser.add_argument("--other", type=Path, help="--side-by-side: another checkout of this repository, timed too")
    parser.add_argument("--runs", type=int, default=3, help="--side-by-side: repeat the timing this many times")
    parser.add_argument("--tree", action="store_true", help="--side-by-side: also time the sum tree's update and "
                                                            "find_prefix, ours and --other's")
    args = parser.parse_args()

    torch.set_num_threads(1)
    if args.side_by_side:
        return side_by_side(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available to this torch build")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clocks = ["wall"] if device.type == "cuda" else ["wall", "cpu"]

    cases = [Case("vector", 10**6, (4,), torch.float32), Case("atari", 50_000, (4, 84, 84), torch.uint8, True),
             Case("image", 50_000, (4, 84, 84), torch.uint8, extend_only=True)]
    cases = [c for c in cases if c.name in args.cases]
    if device.type == "cuda":
        cases = [c for c in cases if not c.frames]
    if args.quick:
        cases = [Case(c.name, c.capacity // 100, c.obs_shape, c.obs_dtype, extend_only=c.extend_only) for c in cases]
    budget_s = 0.15 if args.quick else 1.0

    if args.no_torchrl:
        torchrl_version, uniform_ok, per_ok, message = None, False, False, "TorchRL skipped (--no-torchrl)."
    else:
        torchrl_version, uniform_ok, per_ok, message = torchrl_status(device)
    print(message)
    info = machine_info(device, torchrl_version)
    load_before = os.getloadavg()
    print(f"torch {info['torch']}, tensordict {info['tensordict']}, {info['cpu_count']} CPUs "
          f"({info['cpu_model']}), {info['torch_threads']} torch thread, batch {BATCH}, device {device}, "
          f"load average {load_before[0]:.2f}\n")

    rows = []
    for case in cases:
        raw: dict[str, dict[str, list[tuple[float, float]]]] = {"ours": {}, "torchrl": {}}
        # Both libraries' buffers live side by side (and their calls interleave) when they fit in
        # memory together. Otherwise (the atari case, ~5.6 GB per library) they run one after the
        # other as ours, torchrl, ours, and our two passes are pooled, so that a drift in
        # background load over the run biases neither side.
        together = case.capacity * (case.item_bytes + case.our_item_bytes) <= args.max_together_gb * 2**30
        for prioritized in (False, True):
            libraries = [Ours] + ([TorchRL] if (per_ok if prioritized else uniform_ok) else [])
            groups = [libraries] if together or len(libraries) == 1 else [[Ours], [TorchRL], [Ours]]
            for group in groups:
                for name, ops in measure(group, case, prioritized, device, budget_s, sync).items():
                    for op, times in ops.items():
                        raw[name].setdefault(op, []).extend(times)
                free_memory(device)
        floor = measure_copy_floor(case, device, budget_s, sync) if case.extend_only else None
        free_memory(device)
        rows.extend(table_rows(case, raw, clocks, floor))
    large = None
    if "atari-1M" in args.cases and not args.no_1m and device.type == "cpu":
        case = Case("atari-1M", 10**4 if args.quick else 10**6, (4, 84, 84), torch.uint8, True)
        try:
            raw_large, facts = measure_ours_alone(case, device, budget_s, sync)
        except MemoryError as err:  # buffers' own check, before anything is allocated
            print(f"  skipping {case.name}: {err}")
        else:
            large = {"case": case.name, "capacity": case.capacity, **facts}
            rows.extend(table_rows(case, {"ours": raw_large, "torchrl": {}}, clocks))
        free_memory(device)
    load_after = os.getloadavg()

    tables = {}
    for clock in clocks:
        tables[clock] = format_table(rows, clock)
        title = ("wall time (time.perf_counter), median per call" if clock == "wall" else
                 "thread CPU time (time.thread_time), median per call: the same calls, less any time "
                 "spent preempted by other processes")
        print(f"\n{title}\n{tables[clock]}\n{goal_summary(rows, clock)}")
    busy = max(load_before[0], load_after[0]) > 0.75 * (os.cpu_count() or 1)
    if busy and "cpu" in clocks:
        print(f"\nnote: the machine was busy (load average {load_before[0]:.2f} -> {load_after[0]:.2f} on "
              f"{os.cpu_count()} CPUs); wall-clock medians then include preemption, which hits long calls "
              "more often than short ones. Trust the thread-CPU-time table, or rerun on a quiet machine.")

    out = args.out
    if out is None and not args.quick:
        out = HERE / "results" / ("buffers_cuda.json" if device.type == "cuda" else "buffers.json")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        kept = kept_rows(out, {c.name for c in cases}, clocks)
        if kept is not None:
            order = {"vector": 0, "atari": 1, "image": 2}
            rows = sorted(kept["rows"] + rows, key=lambda r: order.get(r["case"], 2))
            tables = {clock: format_table(rows, clock) for clock in clocks}
        goals = [r for r in rows if r["goal"] is not None]
        result = {
            "benchmark": "replay buffers: extend / sample / PER sample + update, ours vs TorchRL",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {**info, "load_average_before": load_before, "load_average_after": load_after},
            "settings": {
                "batch_size": BATCH, "alpha": ALPHA, "beta": BETA, "eps": EPS, "quick": args.quick,
                "statistic": "median per call after warm-up, microseconds; 'wall' = time.perf_counter, "
                             "'cpu' = time.thread_time (leaves out time preempted by other processes)",
                "interleaving": "libraries alternate in blocks when both buffers fit in memory together "
                                f"(<= {args.max_together_gb} GB); otherwise ours, torchrl, ours (pooled)",
                "cases": {c.name: {"capacity": c.capacity, "obs_shape": list(c.obs_shape),
                                   "obs_dtype": str(c.obs_dtype), "bytes_per_item": c.item_bytes,
                                   "our_bytes_per_item": c.our_item_bytes, "frames_stored_once": c.frames,
                                   "extend_only": c.extend_only}
                          for c in cases},
                "atari_stream": f"{NUM_ENVS} envs per step; each next_obs is its obs shifted by one new frame; "
                                "episodes of 500 steps on average start from a zero-padded stack; extend 8 / 128 "
                                "= 1 / 16 steps (ours: add_frames + extend per step; TorchRL: one extend of the "
                                "same transitions with full stacks)",
                "ours_setup": "ReplayBuffer(capacity) / PrioritizedReplayBuffer(capacity, alpha=0.6, "
                              "beta=0.4, eps=1e-6), frame_stack=4 in the atari cases; sample(256); "
                              "update_priority(batch['index'], td_error)",
                "torchrl_setup": "TensorDict(Prioritized)ReplayBuffer(storage=LazyTensorStorage(capacity), "
                                 "batch_size=256, alpha=0.6, beta=0.4, eps=1e-6, priority_key='td_error'); "
                                 "sample(); update_priority(batch['index'], td_error) (about 5% faster than "
                                 "update_tensordict_priority). Its priority trees are float32 (the default), "
                                 "ours float64.",
            },
            "torchrl_status": message,
            "speedup_definition": "torchrl_us / ours_us (> 1: ours is faster)",
            "copy_floor": "extend rows of extend-only cases: one torch copy_ of the same bytes (items x "
                          "bytes_per_item) into a once-written uint8 ring of capacity items, at rotating "
                          "slots; *_GBps = bytes_per_call / median time; ours_of_copy = copy_us / ours_us",
            "results": rows,
            "ours_alone_at_1M": large,
            "goals": [{"op": r["op"], "case": r["case"], "goal": r["goal"],
                       **{f"speedup_{clock}": r[clock]["speedup"] for clock in clocks},
                       **{f"met_{clock}": None if r[clock]["speedup"] is None
                          else r[clock]["speedup"] >= r["goal"] for clock in clocks}} for r in goals],
            "tables": {clock: table.splitlines() for clock, table in tables.items()},
        }
        if kept is not None:
            result["rows_kept_from_an_earlier_run"] = {k: v for k, v in kept.items() if k != "rows"}
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
