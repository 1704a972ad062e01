"""per_dqn's Pong learner step on the CPU, in each number format and layout, on 1 and 2 threads.

    python benchmarks/cpu_learner.py                         # every variant, threads 1 and 2, batch 32
    python benchmarks/cpu_learner.py --variants fp32 bf16 --threads 2 --batch-sizes 32 64 128
    python benchmarks/cpu_learner.py --variants bf16 --threads 1 --buffer-sizes 100000 1000000 --full

One learner step is what algos/per_dqn.py's `learn(1, 0)` does on the Atari preset: sample 32 frame stacks from a
100k prioritized replay (PER, 3-step), the target network's forward, the Q-network's forward and backward, gradient
clipping, fused Adam and the priorities written back. The buffer is filled with 3000 real Pong transitions of random
play (PongNoFrameskip-v4 through the file's own recorder, n-step folding and frame storage); the networks, update and
learner are the file's own (QNetwork, make_update, make_learner), wrapped as the run wraps them. --buffer-sizes
times the step with replays of other capacities (each its own row); --full fills each to its capacity, the 3000
transitions written again and again, so that sampling meets a tree and a frame store of that size (a 1M replay
takes about 7 GB). Variants:

    fp32           the plain update (the code before --precision)
    channels_last  the networks' weights in channels_last layout (oneDNN's preferred one)
    bf16           bf16 autocast in the update (harness/precision.py: what --precision auto takes on a bf16 CPU); the
                   network takes obs / 255 in bf16 and channels_last there (precision.pixels)
    bf16_fp32_in   bf16 autocast with the network fed obs.float() / 255 in the default layout (autocast casts it to
                   bf16 in each convolution, oneDNN reorders it): the same numbers as bf16, bit for bit, computed as
                   before pixels()
    bf16_cl        bf16 autocast and channels_last
    compile        torch.compile(update) in fp32 (inductor on the CPU)
    compile_bf16   torch.compile of the bf16 autocast update

Each variant is warmed up (3 steps; compile: until compiled), then the variants are timed in turn, `--rounds`
rounds of `--steps` learner steps each, so a slow spell of the machine falls on all of them; the table gives each
variant's median ms per learner step and its speed-up over fp32 at the same thread count and batch size (larger
batches: ms per 32 samples too, the price of replaying the same number of samples). Writes
benchmarks/results/cpu_learner.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tensordict import from_module  # noqa: E402

from buffers import NStepReturns, PrioritizedReplayBuffer  # noqa: E402
from envs import TransitionRecorder, make_vector_env  # noqa: E402
from harness.optim import adam  # noqa: E402
from harness.precision import autocast, cpu_flags  # noqa: E402
from tests.algo_utils import load_algo, parse  # noqa: E402

VARIANTS = ("fp32", "channels_last", "bf16", "bf16_fp32_in", "bf16_cl", "compile", "compile_bf16")


def pong_buffer(algo, args, transitions: int = 3000, full: bool = False) -> tuple[PrioritizedReplayBuffer, object]:
    """A PER buffer of args.buffer_size (frames once, 3-step) holding `transitions` steps of random Pong play, or
    with `full` those steps again and again until it holds its capacity; and the env."""
    env = make_vector_env(args.env, 1, 1)
    rb = PrioritizedReplayBuffer(args.buffer_size, args.alpha, args.beta_start, args.prio_eps, "cpu", [1], 4,
                                 num_seeds=1)
    nstep = NStepReturns(args.n_step, args.gamma, 1, num_seeds=1)
    recorder = TransitionRecorder(1, clip_reward=True)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=1)
    played = []
    for _ in range(transitions):
        action = rng.integers(env.single_action_space.n, size=1)
        next_obs, reward, terminated, truncated, info = env.step(action)
        steps, _ = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        played.append(steps)
        rb.extend(nstep.push(rb.add_frames(steps)))
        obs = next_obs
    while full and len(rb) < rb.capacity:  # the replayed steps' first obs starts a new episode in the store
        for steps in played:
            rb.extend(nstep.push(rb.add_frames(steps)))
    return rb, env


def learner(algo, args, rb, env, variant: str):
    """The file's learn(steps, moves) with fresh networks, wrapped as `variant` says."""
    torch.manual_seed(1)

    class FedFp32(algo.QNetwork):  # the quotient in fp32, in the default layout
        def forward(self, obs):
            return self.net(obs.float() / 255.0).float()

    cls = FedFp32 if variant == "bf16_fp32_in" else algo.QNetwork
    network = partial(cls, env.single_observation_space, env.single_action_space)
    q_network = network()
    if variant in ("channels_last", "bf16_cl"):
        q_network = q_network.to(memory_format=torch.channels_last)
    params = from_module(q_network).data
    target_params = params.clone()
    with torch.device("meta"):
        target_network = network()
    target_params.to_module(target_network)
    lr = torch.as_tensor(args.learning_rate, dtype=torch.float32)
    optimizer = adam(q_network.parameters(), lr=lr, eps=args.adam_eps)
    update = algo.make_update(q_network, target_network, optimizer, args)
    update = autocast(update, "bf16" if "bf16" in variant else "fp32", torch.device("cpu"))
    if variant.startswith("compile"):
        update = torch.compile(update, dynamic=False)
    return algo.make_learner(update, rb, params, target_params, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32])
    parser.add_argument("--buffer-sizes", type=int, nargs="+", default=[100_000], help="replay capacities")
    parser.add_argument("--full", action="store_true", help="fill each replay to its capacity")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="learner steps per round")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cpu_learner.json")
    options = parser.parse_args()
    algo = load_algo("per_dqn")
    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "avx512f", "avx2", "avx512_vnni", "amx_tile"})
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    print(f"CPU: {model}, {os.cpu_count()} cores, flags {' '.join(flags)}; torch {torch.__version__}", flush=True)
    rows = []
    for batch_size in options.batch_sizes:
        replays = {}  # every capacity's replay at once, so that their steps are timed in turn
        for buffer_size in options.buffer_sizes:
            args = parse(algo, ["--env", "PongNoFrameskip-v4", "--batch-size", str(batch_size), "--no-cuda",
                                "--buffer-size", str(buffer_size)])
            replays[buffer_size] = (args, *pong_buffer(algo, args, full=options.full))
        for threads in options.threads:
            torch.set_num_threads(threads)
            learns = {(size, variant): learner(algo, args, rb, env, variant)
                      for size, (args, rb, env) in replays.items() for variant in options.variants}
            for learn in learns.values():
                for _ in range(3):
                    learn(1, 0)
            times = {key: [] for key in learns}
            for _ in range(options.rounds):
                for key, learn in learns.items():
                    start = time.perf_counter()
                    for _ in range(options.steps):
                        learn(1, 0)
                    times[key].append((time.perf_counter() - start) / options.steps * 1e3)
            for (size, variant), ms in times.items():
                median, stored = statistics.median(ms), len(replays[size][1])
                base = statistics.median(times[size, "fp32"]) if (size, "fp32") in times else None
                first = statistics.median(times[options.buffer_sizes[0], variant])
                rows.append({"batch_size": batch_size, "buffer_size": size, "stored": stored, "threads": threads,
                             "variant": variant, "ms_median": median, "ms_min": min(ms),
                             "ms_per_32_samples": median * 32 / batch_size,
                             "speedup_vs_fp32": base / median if base else None,
                             "time_vs_first_buffer_size": median / first})
                ratio = f"{base / median:5.2f}x fp32" if base else ""
                print(f"batch {batch_size:3d}  replay {stored:,}/{size:,}  threads {threads}  {variant:14s} "
                      f"{median:7.2f} ms per learner step (min {min(ms):6.2f}; {median * 32 / batch_size:6.2f} ms "
                      f"per 32 samples; {median / first:5.3f}x the first replay's)  {ratio}", flush=True)
        for _, _, env in replays.values():
            env.close()
        del replays  # before the next batch size's replays are filled
    options.out.write_text(json.dumps({"cpu": model, "flags": flags, "cores": os.cpu_count(),
                                       "torch": torch.__version__, "rounds": options.rounds,
                                       "steps_per_round": options.steps, "rows": rows}, indent=2))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
