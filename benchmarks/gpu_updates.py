"""Time one gradient update of DQN (Nature CNN, Atari batch) and DDPG (MLPs), eager vs torch.compile vs a CUDA graph.

    python benchmarks/gpu_updates.py                   # on CUDA: eager, compile, compile + CUDA graph
    python benchmarks/gpu_updates.py --device cpu --quick   # a smoke run (what CI can do)

The updates are the algorithm files' own: dqn.py's q_loss with its QNetwork, and ddpg.py's networks
with buffers.lambda_returns, written as the closures main() builds (a TensorDict in, a TensorDict of
metrics out) and wrapped the same way as --compile and --cudagraphs wrap them. Times are medians of
CUDA-event (or wall-clock on the CPU) timings per update after warm-up; the JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tensordict import TensorDict, from_module  # noqa: E402
from tensordict.nn import CudaGraphModule  # noqa: E402

from buffers import lambda_returns  # noqa: E402
from tests.algo_utils import load_algo  # noqa: E402


def dqn_update(device: torch.device, capturable: bool, batch_size: int):
    dqn = load_algo("dqn")
    obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    act_space = gym.spaces.Discrete(6)
    args = dqn.Args(loss="huber")
    q = dqn.QNetwork(obs_space, act_space).to(device)
    target_params = from_module(q).data.clone()
    with torch.device("meta"):
        target = dqn.QNetwork(obs_space, act_space)
    target_params.to_module(target)
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-4, fused=True, capturable=capturable)

    def update(batch: TensorDict) -> TensorDict:
        loss, qv = dqn.q_loss(q, target, batch, args)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(q.parameters(), args.max_grad_norm)
        optimizer.step()
        return TensorDict(td_loss=loss.detach(), q_values=qv.mean(), grad_norm=grad_norm)

    batch = TensorDict(obs=torch.randint(0, 255, (batch_size, 4, 84, 84), dtype=torch.uint8),
                       next_obs=torch.randint(0, 255, (batch_size, 4, 84, 84), dtype=torch.uint8),
                       action=torch.randint(6, (batch_size,)), reward=torch.randn(batch_size),
                       terminated=torch.zeros(batch_size, dtype=torch.bool), batch_size=[batch_size]).to(device)
    return (update,), batch, lambda: None


def ddpg_update(device: torch.device, capturable: bool, batch_size: int):
    ddpg = load_algo("ddpg")
    obs_space = gym.spaces.Box(-1, 1, (17,), np.float32)  # HalfCheetah's sizes
    act_space = gym.spaces.Box(-1, 1, (6,), np.float32)
    actor, qf = ddpg.Actor(obs_space, act_space).to(device), ddpg.QNetwork(obs_space, act_space).to(device)
    params = TensorDict(actor=from_module(actor).data, qf=from_module(qf).data)
    target_params = params.clone()
    with torch.device("meta"):
        actor_target, qf_target = ddpg.Actor(obs_space, act_space), ddpg.QNetwork(obs_space, act_space)
    target_params["actor"].to_module(actor_target)
    target_params["qf"].to_module(qf_target)
    qf_optimizer = torch.optim.Adam(qf.parameters(), lr=3e-4, fused=True, capturable=capturable)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True, capturable=capturable)

    def update_critic(batch: TensorDict) -> TensorDict:  # as ddpg.py's, without observation normalisation
        flat = batch.flatten(0, 1)
        with torch.no_grad():
            next_obs = flat["next_obs"]
            next_value = qf_target(next_obs, actor_target(next_obs)).view(batch.shape)
            target = lambda_returns(batch["reward"], batch["discount"], batch["terminated"] | batch["truncated"],
                                    next_value, 0.0).flatten()
        q = qf(flat["obs"], flat["action"])
        qf_loss = F.mse_loss(q, target)
        qf_optimizer.zero_grad()
        qf_loss.backward()
        qf_optimizer.step()
        return TensorDict(qf_loss=qf_loss.detach(), qf_values=q.detach().mean())

    def update_actor(batch: TensorDict) -> TensorDict:
        obs = batch["obs"].flatten(0, 1)
        actor_loss = -qf(obs, actor(obs)).mean()
        actor_optimizer.zero_grad()
        actor_loss.backward(inputs=list(actor.parameters()))
        actor_optimizer.step()
        return TensorDict(actor_loss=actor_loss.detach())

    batch = TensorDict(obs=torch.randn(batch_size, 1, 17), next_obs=torch.randn(batch_size, 1, 17),
                       action=torch.rand(batch_size, 1, 6) * 2 - 1, reward=torch.randn(batch_size, 1),
                       discount=torch.full((batch_size, 1), 0.99), batch_size=[batch_size, 1])
    batch["terminated"] = batch["truncated"] = torch.zeros(batch_size, 1, dtype=torch.bool)
    batch = batch.to(device)
    return (update_critic, update_actor), batch, lambda: target_params.lerp_(params, 0.005)


def median_ms(update, batch, device: torch.device, warmup: int, iterations: int) -> float:
    """Median time of one call of update(batch)."""
    for _ in range(warmup):
        update(batch)
    times = []
    for _ in range(iterations):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            update(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            tick = time.perf_counter()
            update(batch)
            times.append((time.perf_counter() - tick) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="few iterations and small batches: a smoke run")
    parser.add_argument("--modes", nargs="+", default=["eager", "compile", "compile+cudagraphs"],
                        help="which of eager, compile, compile+cudagraphs (the last on CUDA only)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gpu_updates.json")
    options = parser.parse_args()
    device = torch.device(options.device)
    warmup, iterations = (3, 5) if options.quick else (20, 200)
    rows = []
    for name, build, batch_size in (("dqn_nature_cnn", dqn_update, 32), ("ddpg_mlp", ddpg_update, 256)):
        batch_size = 4 if options.quick else batch_size
        for mode in [m for m in options.modes if device.type == "cuda" or m != "compile+cudagraphs"]:
            parts, batch, target_update = build(device, mode == "compile+cudagraphs", batch_size)
            if mode != "eager":
                parts = [torch.compile(part) for part in parts]
            if mode == "compile+cudagraphs":
                parts = [CudaGraphModule(part, in_keys=[], out_keys=[], warmup=5) for part in parts]

            def update(batch: TensorDict, parts=parts, target_update=target_update) -> None:
                for part in parts:  # critic then actor for DDPG (policy_frequency 1), then the targets
                    part(batch)
                target_update()

            tick = time.perf_counter()
            update(batch)  # compiles (or captures) here
            first_s = time.perf_counter() - tick
            ms = median_ms(update, batch, device, warmup, iterations)
            rows.append({"update": name, "batch": batch_size, "mode": mode, "median_ms": ms, "first_call_s": first_s})
            print(f"{name:16s} batch {batch_size:4d}  {mode:20s} {ms:8.3f} ms per update  (first call {first_s:.1f} s)")
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({**info, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
