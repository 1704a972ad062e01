"""The host's share of a PER-DQN Pong step: what an agent step costs outside the learner, with 1, 4, 8 and 16 envs.

    python benchmarks/host_time.py                       # N = 1, 4, 8, 16; 4000 agent steps each
    python benchmarks/host_time.py --envs 8 --steps 8000

Runs algos/per_dqn.py's main() with its Atari preset on PongNoFrameskip-v4 (CPU, one torch thread), with the learner
step (`make_learner`'s learn: sampling, the gradient step, priorities, target moves) replaced by a no-op of the same
signature that returns fixed metrics, and learning from step 1000, so the loop does everything else it does while
learning: the emulator (ale-py's AtariVectorEnv, one thread per env up to the cores), acting (the Q-network's forward
on the envs' stacks, epsilon-greedy), the recorder, storing frames once, n-step folding, writing to the buffer,
logging and Python. Timers around those calls give each one's time per agent step (global_step counts agent steps
over all envs). On a GPU the Q-network's forward in acting runs on the device; the rest is the host's, so the
host time per agent step is the loop's time without the learner minus that forward (both are printed). Writes
benchmarks/results/host_time.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from ale_py.vector_env import AtariVectorEnv  # noqa: E402
from tensordict import TensorDict  # noqa: E402

import harness.run  # noqa: E402
from buffers import NStepReturns, PrioritizedReplayBuffer  # noqa: E402
from envs import TransitionRecorder  # noqa: E402
from tests.algo_utils import load_algo, parse  # noqa: E402

TIMES: dict[str, float] = {}


def timed(owner: object, name: str, label: str, when=lambda: True) -> None:
    """Wrap owner.name so that its calls' wall time adds up under `label` (when `when()` holds at the call)."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if not when():
            return function(*args, **kwargs)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            TIMES[label] = TIMES.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


def measure(algo, num_envs: int, steps: int) -> dict:
    TIMES.clear()
    args = parse(algo, ["--env", "PongNoFrameskip-v4", "--num-envs", str(num_envs), "--total-timesteps", str(steps),
                        "--learning-starts", "1000", "--no-cuda", "--threads", "1", "--eval-frequency", "0",
                        "--checkpoint-frequency", "0", "--no-save-model", "--run-name", f"host{num_envs}"])
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            summary = algo.main(args)
        finally:
            os.chdir(cwd)
    loop_s = summary["global_step"] / summary["train_sps"]
    per_step = {label: total / summary["global_step"] * 1e3 for label, total in TIMES.items()}  # ms per agent step
    loop_ms = loop_s / summary["global_step"] * 1e3
    accounted = sum(v for k, v in per_step.items() if k != "learner (no-op)")
    return {"num_envs": num_envs, "agent_steps": summary["global_step"], "loop_ms_per_step": loop_ms,
            "host_ms_per_step": loop_ms - per_step.get("act: Q-network forward", 0.0),
            "calls_ms_per_step": per_step, "python_between_ms_per_step": loop_ms - accounted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=4000, help="agent steps per measurement (1000 before learning)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "host_time.json")
    options = parser.parse_args()
    algo = load_algo("per_dqn")
    os.environ.setdefault("WANDB_MODE", "disabled")
    harness.run.evaluate = lambda *args, **kwargs: [[0.0]]  # the final evaluation is not part of the loop

    metrics = TensorDict(td_loss=torch.zeros(()), q_values=torch.zeros(()), grad_norm=torch.zeros(()),
                         abs_td_error=torch.zeros(32))

    def no_op_learner(*args, **kwargs):
        def learn(steps: int, moves: int) -> TensorDict:  # learn's signature, no work
            return metrics

        return learn

    algo.make_learner = no_op_learner
    timed(AtariVectorEnv, "step", "emulator: AtariVectorEnv.step")
    timed(algo.QNetwork, "forward", "act: Q-network forward", when=torch.is_inference_mode_enabled)
    timed(TransitionRecorder, "record", "record")
    timed(PrioritizedReplayBuffer, "add_frames", "store: add_frames (frames once)")
    timed(NStepReturns, "push", "store: n-step push")
    timed(PrioritizedReplayBuffer, "extend", "store: extend (+ priorities)")
    rows = []
    for num_envs in options.envs:
        row = measure(algo, num_envs, options.steps)
        rows.append(row)
        print(f"N = {num_envs:2d}: {row['loop_ms_per_step']:.3f} ms per agent step without the learner, "
              f"{row['host_ms_per_step']:.3f} ms without acting's forward (the host's on a GPU)", flush=True)
        for label, ms in sorted(row["calls_ms_per_step"].items(), key=lambda item: -item[1]):
            print(f"    {label:36s} {ms:.3f} ms")
        print(f"    {'Python between the calls':36s} {row['python_between_ms_per_step']:.3f} ms", flush=True)
    options.out.write_text(json.dumps({"torch": torch.__version__, "cores": os.cpu_count(), "steps": options.steps,
                                       "rows": rows}, indent=2))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
