"""PER sample + priority update on a GPU: eager vs torch.compile vs CUDA graph replay.

One step is `batch = prb.sample(256)` then `prb.update_priority(batch["index"], td_error)` on a
full PrioritizedReplayBuffer (validation="deferred": no host reads) of float32[4] observations.
Modes:
    eager            the step as written
    compile          torch.compile(step) (inductor; the uniform draw stays eager, see
                     PrioritizedReplayBuffer._uniforms)
    graph            the eager step captured once in a torch.cuda.CUDAGraph and replayed
    compile+graph    the compiled step captured in a CUDAGraph and replayed (fused kernels, one launch)
    reduce-overhead  torch.compile(step, mode="reduce-overhead") (inductor + CUDA graph trees)
The graph modes need CUDA and are skipped elsewhere. Each mode gets its own buffer, built the same
way. With "graph", a replayed graph is also checked to leave the same tree as the same number of
eager steps, bit for bit (the same kernels, and the buffer's generator registered with the graph).

    python benchmarks/gpu_tree.py                                   # CUDA, capacity 2^20
    python benchmarks/gpu_tree.py --device cpu --capacity 4096      # CPU smoke run, graph modes skipped

Goal: sample + update of 256 at 2^20 in <= 0.05 ms, compiled and graph-replayed, on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != HERE]  # see buffers.py
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from buffers import PrioritizedReplayBuffer  # noqa: E402

MODES = ("eager", "compile", "graph", "compile+graph", "reduce-overhead")
GRAPH_MODES = ("graph", "compile+graph", "reduce-overhead")
GOAL_MS = 0.05


def make_buffer(capacity: int, device: torch.device) -> PrioritizedReplayBuffer:
    """A full buffer with random priorities, the same for every mode."""
    prb = PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4, eps=1e-6, device=device, seed=0,
                                  validation="deferred")
    generator = torch.Generator().manual_seed(1)
    chunk = min(capacity, 1 << 18)
    for start in range(0, capacity, chunk):
        size = min(chunk, capacity - start)
        prb.extend(TensorDict({
            "obs": torch.randn(size, 4, generator=generator),
            "next_obs": torch.randn(size, 4, generator=generator),
            "action": torch.randint(0, 6, (size,), generator=generator),
            "reward": torch.randn(size, generator=generator),
            "terminated": torch.rand(size, generator=generator) < 0.01,
        }, batch_size=[size]).to(device))
    prb.update_priority(torch.arange(capacity, device=device), torch.rand(capacity, generator=generator).to(device))
    prb.check()
    return prb


def step_of(prb: PrioritizedReplayBuffer, td_error: torch.Tensor) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        batch = prb.sample(td_error.numel())
        prb.update_priority(batch["index"], td_error)
        return batch["index"]

    return step


def captured(step: Callable[[], torch.Tensor], prb: PrioritizedReplayBuffer) -> Callable[[], None]:
    """`step` captured in a CUDA graph; returns its replay. The buffer's generator is registered
    with the graph, so each replay draws new uniforms, as an eager call would."""
    graph = torch.cuda.CUDAGraph()
    if not hasattr(graph, "register_generator_state"):
        raise RuntimeError(f"torch {torch.__version__} cannot register a generator with a CUDA graph (needs >= 2.5)")
    graph.register_generator_state(prb.generator)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as capture requires
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def graph_matches_eager(capacity: int, device: torch.device, td_error: torch.Tensor, steps: int = 20) -> bool:
    """Does a replayed CUDA graph of the step leave the tree that as many eager steps leave?"""
    eager, replayed = make_buffer(capacity, device), make_buffer(capacity, device)
    for _ in range(steps):
        step_of(eager, td_error)()
    replay = captured(step_of(replayed, td_error), replayed)  # runs 3 eager warm-up steps
    for _ in range(steps - 3):
        replay()
    torch.cuda.synchronize(device)
    return torch.equal(eager.tree.leaves, replayed.tree.leaves) and all(
        torch.equal(a, b) for a, b in zip(eager.tree.levels, replayed.tree.levels, strict=True))


def timed(run: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Milliseconds per call, after 10 warm-up calls."""
    for _ in range(10):
        run()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    sync()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--capacity", type=int, default=1 << 20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1000, help="timed steps per mode")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--out", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    if not cuda:
        torch.set_num_threads(1)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    td_error = torch.rand(args.batch_size, generator=torch.Generator().manual_seed(2)).to(device)
    print(f"PER sample + update of {args.batch_size} at capacity {args.capacity:,} on {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if cuda else "") + f", torch {torch.__version__}")

    rows = {}
    for mode in modes:
        if mode in GRAPH_MODES and not cuda:
            print(f"  {mode:<16} skipped: needs CUDA")
            continue
        torch._dynamo.reset()
        prb = make_buffer(args.capacity, device)
        step = step_of(prb, td_error)
        t0 = time.perf_counter()
        if mode == "compile":
            run = torch.compile(step)
            run()
        elif mode == "graph":
            run = captured(step, prb)
        elif mode == "compile+graph":
            run = captured(torch.compile(step), prb)
        elif mode == "reduce-overhead":
            run = torch.compile(step, mode="reduce-overhead")
            run()
        else:
            run = step
        sync()
        setup_s = time.perf_counter() - t0
        ms = timed(run, args.repeats, sync)
        prb.check()  # the timed steps dropped no entry
        rows[mode] = {"ms_per_step": ms, "setup_s": setup_s}
        print(f"  {mode:<16} {ms:8.4f} ms per step   (setup {setup_s:5.1f} s)", flush=True)

    if "eager" in rows:
        for row in rows.values():
            row["speedup_vs_eager"] = rows["eager"]["ms_per_step"] / row["ms_per_step"]
    if "graph" in rows:
        rows["graph"]["same_tree_as_eager"] = graph_matches_eager(args.capacity, device, td_error)
        print(f"graph replay leaves the tree eager steps leave, bit for bit: {rows['graph']['same_tree_as_eager']}")
    best = min(rows.values(), key=lambda r: r["ms_per_step"]) if rows else None
    if best is not None and args.capacity == 1 << 20 and args.batch_size == 256 and cuda:
        name = next(m for m, r in rows.items() if r is best)
        verdict = "met" if best["ms_per_step"] <= GOAL_MS else "MISSED"
        print(f"goal: <= {GOAL_MS} ms per step: {verdict} by {name} ({best['ms_per_step']:.4f} ms)")
    result = {
        "benchmark": "PER sample + update_priority: eager vs torch.compile vs CUDA graph replay",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
                    "gpu": torch.cuda.get_device_name(device) if cuda else None,
                    "cpu_threads": torch.get_num_threads()},
        "settings": {"capacity": args.capacity, "batch_size": args.batch_size, "repeats": args.repeats,
                     "validation": "deferred", "goal_ms": GOAL_MS},
        "results": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
