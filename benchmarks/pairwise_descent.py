"""SegmentTree.find_prefix against a descent in the tree's own pairwise order, on the CPU.

find_prefix searches the top level and each chosen row with torch.cumsum: one op per row, left to right on
the CPU, in the kernel's order on CUDA. A descent that found the same leaf on every device would search in
the order the tree stores its sums: the pairwise sums of the top level (padded with zeros to a power of two),
then of each chosen row, and at each of their levels a binary choice (left, unless the mass reaches the left
sum and the right one is not empty). This times both on the same tree and draws, alternating, and counts the
draws on which they agree (they differ only within rounding of a boundary).

    python benchmarks/pairwise_descent.py                    # 10^6 leaves (a top of 31250 entries), 256 draws
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != HERE]  # see buffers.py
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from buffers import SegmentTree  # noqa: E402


def pairwise_levels(rows: torch.Tensor) -> list[torch.Tensor]:
    """[rows padded to a power of two, their pair sums, ..., the sums]: the order the tree stores its sums in."""
    width = 1 << (rows.shape[-1] - 1).bit_length()
    levels = [torch.cat([rows, rows.new_zeros(*rows.shape[:-1], width - rows.shape[-1])], -1)]
    while levels[-1].shape[-1] > 1:
        levels.append(levels[-1][..., 0::2] + levels[-1][..., 1::2])
    return levels


def binary_descent(levels: list[torch.Tensor], mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Down pairwise_levels of one row (1-D) or of one row per draw ([B, n]): each draw's entry and mass left."""
    position = torch.zeros(mass.shape, dtype=torch.int64)
    for level in reversed(levels[:-1]):
        if level.dim() == 1:
            left, right = level.view(-1, 2).index_select(0, position).unbind(-1)
        else:
            pair = level.unflatten(-1, (-1, 2)).gather(1, position.view(-1, 1, 1).expand(-1, 1, 2))
            left, right = pair.view(-1, 2).unbind(-1)
        right_side = (mass >= left) & (right > 0)
        mass = torch.where(right_side, mass - left, mass)
        position = torch.add(right_side, position, alpha=2)
    return position, mass


def find_prefix_pairwise(tree: SegmentTree, fraction: torch.Tensor) -> torch.Tensor:
    """find_prefix(fraction, relative=True) in the pairwise order."""
    levels = pairwise_levels(tree.levels[-1][0])
    node, mass = binary_descent(levels, fraction * levels[-1][0])
    for rows in tree._descent_rows:
        child, mass = binary_descent(pairwise_levels(rows.index_select(0, node)), mass)
        node = torch.add(child, node, alpha=tree.arity)
    return node


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=10**6)
    parser.add_argument("--draws", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=30, help="alternating blocks of --calls calls each")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    tree = SegmentTree(args.capacity)
    tree.assign(torch.rand(args.capacity, generator=generator, dtype=torch.float64).pow(4))
    fraction = torch.rand(args.draws, generator=generator, dtype=torch.float64)
    agree = (tree.find_prefix(fraction, relative=True) == find_prefix_pairwise(tree, fraction)).double().mean().item()
    calls = {"find_prefix": lambda: tree.find_prefix(fraction, relative=True),
             "pairwise": lambda: find_prefix_pairwise(tree, fraction)}
    times = {name: [] for name in calls}
    for block in range(args.blocks):
        for name in calls if block % 2 == 0 else reversed(calls):
            start = time.thread_time()
            for _ in range(args.calls):
                calls[name]()
            times[name].append((time.thread_time() - start) / args.calls * 1e6)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.capacity} leaves, {args.draws} draws, one thread; thread CPU time, median per call: find_prefix "
          f"{median['find_prefix']:.0f} us, pairwise {median['pairwise']:.0f} us "
          f"({median['pairwise'] / median['find_prefix']:.1f}x); the same leaf for {agree:.1%} of the draws")
    return {"us": median, "agree": agree}


if __name__ == "__main__":
    main()
