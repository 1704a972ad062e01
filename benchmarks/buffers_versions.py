"""PER sample + update (buffers.py's vector case: 1M items of float32[4], batch 256) of this checkout's
`buffers`, optionally another checkout's, and TorchRL's, side by side in one process.

    git worktree add ../other <commit>                                  # the version to compare with
    /work/venv-peer/bin/python benchmarks/buffers_versions.py --other ../other --runs 3

All buffers are built and filled first (the same data and priorities), then their calls alternate in
blocks (buffers.time_interleaved: which one goes first alternates too), so background load and the
machine's state hit every version alike; a separate run of buffers.py per version does not (TorchRL's
time moved by 40% between two such runs on a quiet machine). Prints thread CPU time, median per call,
for each run, and the speed-ups against TorchRL. The other checkout's `buffers` is imported under
another name, so it needs the same dependencies as this one's. `--tree` also times the sum tree's parts,
ours and the other's, in the same blocks: `update` of 256 slots (full_rows) and `find_prefix` of 256 draws.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def load(name: str, path: Path, package: bool = False):
    """Import the file (or the package whose __init__.py it is) at `path` as module `name`."""
    locations = [str(path.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses and relative imports look the module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, help="another checkout of this repository, to time its buffers too")
    parser.add_argument("--runs", type=int, default=3, help="repeat the side-by-side timing this many times")
    parser.add_argument("--rounds", type=int, default=30, help="alternating blocks per run")
    parser.add_argument("--tree", action="store_true",
                        help="also time the sum tree's parts, ours and the other checkout's: an update of 256 slots "
                             "and a descent of 256 draws")
    args = parser.parse_args()
    bench = load("buffers_bench", HERE / "buffers.py")  # puts this checkout's root first on sys.path
    torch.set_num_threads(1)
    libraries = [bench.Ours]
    if args.other is not None:
        init = args.other.resolve() / "buffers" / "__init__.py"
        if not init.is_file():
            raise SystemExit(f"error: --other {args.other}: no buffers/__init__.py there")
        other = load("buffers_other", init, package=True)

        class Other(bench.Ours):
            library = "other"
            buffers = (other.ReplayBuffer, other.PrioritizedReplayBuffer)

        libraries.append(Other)
    version, _, prioritized_ok, message = bench.torchrl_status(torch.device("cpu"))
    if prioritized_ok:
        libraries.append(bench.TorchRL)
    else:
        print(f"TorchRL's prioritized buffer is not usable here ({message}): timing without it", flush=True)

    case = bench.Case("vector", 1_000_000, (4,), torch.float32)
    cpu = torch.device("cpu")
    buffers, td_errors = {}, {}
    for lib in libraries:
        generator = torch.Generator().manual_seed(1)  # the same data and priorities for every library
        rb = buffers[lib.library] = lib(case.capacity, True, cpu)
        bench.prefill(rb, case, cpu, generator)
        rb.set_priorities(torch.arange(case.capacity), torch.rand(case.capacity, generator=generator).pow(4))
        td_errors[lib.library] = [torch.rand(bench.BATCH, generator=generator) for _ in range(8)]
        print(f"filled {lib.library}", flush=True)
    ops = {name: (lambda i, name=name: buffers[name].sample_and_update(td_errors[name][i % 8])) for name in buffers}
    print(f"PER sample + update, vector case, 1M items, batch {bench.BATCH}, one torch thread; thread CPU time, "
          f"median per call (us){'; torchrl ' + version if prioritized_ok else ''}")
    if args.tree:  # the same slots, values and fractions for every version
        generator = torch.Generator().manual_seed(2)
        slots = torch.randint(0, case.capacity, (bench.BATCH,), generator=generator)
        values = torch.rand(bench.BATCH, generator=generator, dtype=torch.float64)
        fraction = torch.rand(bench.BATCH, generator=generator, dtype=torch.float64)
        for name in [name for name in buffers if name != "torchrl"]:
            tree = buffers[name].rb.tree
            ops[f"{name}:update"] = lambda i, tree=tree: tree.update(slots, values, True)
            ops[f"{name}:find_prefix"] = lambda i, tree=tree: tree.find_prefix(fraction, relative=True)
    for run in range(args.runs):
        times = bench.time_interleaved(ops, lambda: None, 10.0, rounds=args.rounds, max_repeats=3000)
        median = {name: 1e6 * statistics.median(cpu_s for _, cpu_s in t) for name, t in times.items()}
        line = "  ".join(f"{name} {us:.1f}" for name, us in median.items() if ":" not in name)
        if "torchrl" in median:
            line += "  | speed-up (torchrl / x): " + "  ".join(
                f"{name} {median['torchrl'] / us:.2f}x" for name, us in median.items() if name != "torchrl"
                and ":" not in name)
        print(f"run {run + 1}: {line}", flush=True)
        if args.tree:
            print("  tree: " + "  ".join(f"{name} {us:.1f}" for name, us in median.items() if ":" in name), flush=True)


if __name__ == "__main__":
    main()
