"""Host buffer, GPU learner: steps per second with and without buffers.Prefetcher.

A PER learner step on a batch of 256 float32[4] transitions from a PrioritizedReplayBuffer of 10^6
items in host memory: forward pass of an MLP, priorities from the TD errors, backward pass and
Adam step. "plain" samples on the host, copies the batch to the GPU and writes the priorities back
with blocking calls; "prefetch" uses Prefetcher, which writes priorities and sends the next batch
through pinned memory on a side stream while the GPU runs the backward pass. Both draw batch k + 1
after writing the priorities of batch k.

    python benchmarks/prefetch.py                       # CUDA
    python benchmarks/prefetch.py --device cpu --capacity 10000 --steps 50   # CPU smoke run (no overlap)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != HERE]  # see buffers.py
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from buffers import Prefetcher, PrioritizedReplayBuffer  # noqa: E402


def host_buffer(capacity: int) -> PrioritizedReplayBuffer:
    prb = PrioritizedReplayBuffer(capacity, device="cpu", seed=0)
    generator = torch.Generator().manual_seed(0)
    prb.extend(TensorDict({
        "obs": torch.randn(capacity, 4, generator=generator),
        "action": torch.randint(0, 2, (capacity,), generator=generator),
        "reward": torch.randn(capacity, generator=generator),
    }, batch_size=[capacity]))
    return prb


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--capacity", type=int, default=10**6)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=2048, help="MLP width: sets how long the GPU computes")
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if device.type == "cpu":
        torch.set_num_threads(1)
    width = args.hidden
    net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                              torch.nn.ReLU(), torch.nn.Linear(width, 2)).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)

    def forward(batch: TensorDict) -> torch.Tensor:
        q = net(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
        return q - batch["reward"]  # a stand-in TD error

    def backward(td_error: torch.Tensor, weight: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        (weight * td_error.square()).mean().backward()
        optimizer.step()

    def plain(rb: PrioritizedReplayBuffer) -> None:
        batch = rb.sample(args.batch_size).to(device)
        td_error = forward(batch)
        rb.update_priority(batch["index"].cpu(), td_error.detach().abs().cpu())
        backward(td_error, batch["weight"])

    loader_of = {}

    def prefetch(rb: PrioritizedReplayBuffer) -> None:
        loader = loader_of.setdefault(id(rb), Prefetcher(rb, args.batch_size, device))
        batch = loader.next()
        td_error = forward(batch)
        loader.update_priority(batch["index"], td_error.detach().abs())
        backward(td_error, batch["weight"])

    rows = {}
    for name, step in (("plain", plain), ("prefetch", prefetch)):
        rb = host_buffer(args.capacity)
        for _ in range(10):
            step(rb)
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step(rb)
        sync()
        rows[name] = args.steps / (time.perf_counter() - start)
        print(f"{name:<9} {rows[name]:8.1f} steps/s", flush=True)
    print(f"prefetch / plain: {rows['prefetch'] / rows['plain']:.2f}x on {device}")
    return rows


if __name__ == "__main__":
    main()
