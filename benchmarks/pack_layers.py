"""What each kind of layer costs in a pack: one training step (forward, backward, Adam) of N seeds' Q-networks as
one stacked module, against the same N plain networks stepped one after another in the same process (what N lone
runs compute), for dqn.py's CartPole MLP and for the same MLP with a LayerNorm after each hidden layer (the
per-seed path of harness/seeds.py), on batches of 64.

    python benchmarks/pack_layers.py --seeds 10 --out benchmarks/results/pack_layers.json
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
import torch.nn as nn

from harness import adam, stacked


def mlp(layer_norm: bool) -> nn.Sequential:
    norm = (lambda: nn.LayerNorm(256)) if layer_norm else nn.Identity
    return nn.Sequential(nn.Linear(4, 256), norm(), nn.ReLU(), nn.Linear(256, 256), norm(), nn.ReLU(),
                         nn.Linear(256, 2))


def step_time(networks: list[nn.Module], x: torch.Tensor, repeats: int) -> float:
    """Seconds per training step of all the seeds (x [seeds, batch, 4]): one pack, or one plain network a seed."""
    pack = len(networks) == 1
    optimizers = [adam(network.parameters(), len(x) if pack else 1, lr=1e-4) for network in networks]

    def step():
        for i, (network, optimizer) in enumerate(zip(networks, optimizers, strict=True)):
            optimizer.zero_grad()
            out = network(x if pack else x[i])
            out.square().flatten(-2).mean(-1).sum().backward()
            optimizer.step()

    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = list(range(1, args.seeds + 1))
    x = torch.randn(args.seeds, 64, 4, generator=torch.Generator().manual_seed(0))
    rows = []
    for name, layer_norm in (("MLP 256-256", False), ("MLP 256-256 + 2 LayerNorm", True)):
        make = partial(mlp, layer_norm)
        pack = step_time([stacked(make, seeds)], x, args.repeats)
        alone = step_time([stacked(make, [seed]) for seed in seeds], x, args.repeats)
        rows.append({"network": name, "seeds": args.seeds, "pack_ms": pack * 1e3, "alone_ms": alone * 1e3,
                     "alone_over_pack": alone / pack})
    print(f"| network | {args.seeds} seeds as a pack (ms/step) | {args.seeds} plain networks (ms/step) | "
          "plain / pack |\n| --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['network']} | {row['pack_ms']:.2f} | {row['alone_ms']:.2f} | {row['alone_over_pack']:.2f}x |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "threads": 1, "batch": 64, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
