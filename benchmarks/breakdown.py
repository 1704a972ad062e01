"""Where a training run's time goes: timers around the calls the loop makes, inside a real run.

    python benchmarks/breakdown.py                    # algos/dqn.py, configs/dqn/cartpole.yaml, 20k steps
    python benchmarks/breakdown.py --algo ddpg        # algos/ddpg.py, configs/ddpg/pendulum.yaml, 6k steps
    python benchmarks/breakdown.py --num-seeds 10     # a pack of 10 seeds in one process

Runs the algorithm file's main() once, on one torch thread with periodic evaluations off, after wrapping
(in this process only) the calls that its loop makes: the vector env's step, TransitionRecorder.record,
NStepReturns.push, ReplayBuffer.extend and .sample, the networks' forward passes (acting, under inference
mode; the update), Tensor.backward, the gradient clipping, Adam's zero_grad and step, and the target update
(TensorDict.lerp_). With --num-seeds N every call serves the N seeds of a pack; times are per environment step
of the pack (N seed-steps). Prints each call's median and total time per environment step and its share
of the training loop; what is left is the Python between the calls. Each timer adds about a
microsecond per call. Writes benchmarks/results/breakdown_<algo>.json.

The same calls timed alone in a tight loop are 2-6x faster than here (zero_grad of DQN's six tensors:
about 20 us alone, 120 us in the loop): between two updates the loop runs the env, the recorder and
the buffer, which push the update's code and data out of the caches. So a microbenchmark of a piece
understates what it costs in a run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDictBase  # noqa: E402

import harness.run  # noqa: E402
from buffers import NStepReturns, ReplayBuffer  # noqa: E402
from envs import TransitionRecorder  # noqa: E402
from envs.cartpole import CartPoleArray  # noqa: E402
from harness import SeedAdam  # noqa: E402
from tests.algo_utils import load_algo, parse  # noqa: E402  (algos/<name>.py as a module, as the tests load it)

DEFAULTS = {"dqn": ("configs/dqn/cartpole.yaml", 20_000), "ddpg": ("configs/ddpg/pendulum.yaml", 6_000)}
SAMPLES: dict[str, list[float]] = {}
TIMING = [True]  # off during the final evaluation, which is not part of the loop


def timed(owner: object, name: str, label=None) -> None:
    """Replace owner.name by a wrapper that records each call's wall time under label(args) (or name)."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            if TIMING[0]:
                SAMPLES.setdefault(label(args) if label else name, []).append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=list(DEFAULTS), default="dqn")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-seeds", type=int, default=1, help="seeds in the pack (default: 1)")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    config, steps = ROOT / DEFAULTS[options.algo][0], options.steps or DEFAULTS[options.algo][1]
    algo = load_algo(options.algo)

    def forward_label(prefix: str):  # acting runs under inference mode, the update does not
        return lambda args: f"{prefix} forward, {'act' if torch.is_inference_mode_enabled() else 'update'}"

    evaluate = harness.run.evaluate

    def untimed_evaluate(*args, **kwargs):
        TIMING[0] = False
        try:
            return evaluate(*args, **kwargs)
        finally:
            TIMING[0] = True

    harness.run.evaluate = untimed_evaluate
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # installs the profiling hook on Adam.step: timed too
    timed(gym.vector.SyncVectorEnv, "step", lambda args: "env step")
    timed(CartPoleArray, "step", lambda args: "env step")
    timed(TransitionRecorder, "record")
    timed(NStepReturns, "push")
    timed(ReplayBuffer, "extend")
    timed(ReplayBuffer, "sample")
    for network in ("QNetwork", "Actor"):
        if hasattr(algo, network):
            timed(getattr(algo, network), "forward", forward_label(network))
    timed(torch.Tensor, "backward")
    if hasattr(algo, "clip_grad_norm"):  # the update looks it up in the module when it runs
        timed(algo, "clip_grad_norm")
    timed(torch.optim.Adam, "zero_grad", lambda args: "Adam zero_grad")
    timed(torch.optim.Adam, "step", lambda args: "Adam step")
    timed(SeedAdam, "step", lambda args: "Adam step")
    timed(TensorDictBase, "lerp_", lambda args: "target lerp_")

    os.environ.setdefault("WANDB_MODE", "disabled")
    args = parse(algo, ["--config", str(config), "--total-timesteps", str(steps), "--seed", str(options.seed),
                        "--num-seeds", str(options.num_seeds), "--threads", "1", "--no-cuda", "--eval-frequency", "0",
                        "--run-name", "breakdown"])
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the run directory is runs/breakdown under the working directory
        try:
            summary = algo.main(args)
        finally:
            os.chdir(cwd)
    summary = summary[0] if isinstance(summary, list) else summary
    loop_s = summary["global_step"] / summary["train_sps"]
    rows = []
    for label, times in SAMPLES.items():
        rows.append({"call": label, "calls_per_step": len(times) / steps, "median_us": statistics.median(times) * 1e6,
                     "us_per_step": sum(times) / steps * 1e6})
    rows.sort(key=lambda row: -row["us_per_step"])
    rest = loop_s / steps * 1e6 - sum(row["us_per_step"] for row in rows)
    rows.append({"call": "the rest: Python between the calls", "calls_per_step": 1.0, "median_us": None,
                 "us_per_step": rest})
    print(f"{options.algo}, {options.num_seeds} seed(s), {steps} steps, loop {loop_s:.1f} s = "
          f"{loop_s / steps * 1e6:.0f} us per env step (torch {torch.__version__}, one thread)")
    print(f"{'call':42s} {'per step':>9s} {'median us':>10s} {'us/step':>8s} {'share':>6s}")
    for row in rows:
        median = "-" if row["median_us"] is None else f"{row['median_us']:.1f}"
        print(f"{row['call']:42s} {row['calls_per_step']:9.3f} {median:>10s} {row['us_per_step']:8.1f} "
              f"{row['us_per_step'] * steps / 1e6 / loop_s:6.1%}")
    pack = f"_{options.num_seeds}seeds" if options.num_seeds > 1 else ""
    out = options.out or ROOT / "benchmarks" / "results" / f"breakdown_{options.algo}{pack}.json"
    out.write_text(json.dumps({"algo": options.algo, "num_seeds": options.num_seeds, "steps": steps, "loop_s": loop_s,
                               "torch": torch.__version__, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
