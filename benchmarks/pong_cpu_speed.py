"""Agent steps/s of the user's Pong command on the CPU, before and after, and where an agent step's time goes.

    python benchmarks/pong_cpu_speed.py                      # the ladder below, 3000 learning steps each
    python benchmarks/pong_cpu_speed.py --rounds 2 --only before after

Runs algos/per_dqn.py's main() on PongNoFrameskip-v4 in this process, one configuration after another, each from
learning step 1000 for `--steps` agent steps of learning (evaluations replaced by a no-op: their games are not the
training's speed). The configurations climb from the code before to the Atari preset a user's
`python algos/per_dqn.py --env PongNoFrameskip-v4` now takes, one change at a time:

    before        --precision fp32 --threads 1 --num-envs 1 --train-frequency 1   (the preset and code before)
    bf16          --precision bf16 --threads 1 --num-envs 1 --train-frequency 1
    bf16_2t       --precision bf16 --threads 2 --num-envs 1 --train-frequency 1
    bf16_2t_8e    --precision bf16 --threads 2 --num-envs 8 --train-frequency 1   (the book's replay ratio)
    after         the preset: auto (bf16 here), 2 threads, 8 envs, train_frequency 2
    after_1t      the preset on one thread (--threads 1: the choice when other work shares the cores)

and one that is not the preset (other numbers: a quarter of the updates, each on 4x the samples), run only when named
in --only:

    after_b128    the preset with --batch-size 128 --train-frequency 8 (the same samples per agent step)

Timers around the loop's calls split an agent step (global_step counts agent steps over the envs) into the learner
(`learn`: sampling, the update, priorities, target moves), the emulator (AtariVectorEnv.step), acting's Q-network
forward, storing (add_frames, n-step push, extend) and the rest (recorder, logging, Python). --rounds repeats the
ladder so a slow spell of the machine falls on every configuration. Writes benchmarks/results/pong_cpu_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from ale_py.vector_env import AtariVectorEnv  # noqa: E402

import harness.run  # noqa: E402
from benchmarks.host_time import TIMES, timed  # noqa: E402
from buffers import NStepReturns, PrioritizedReplayBuffer  # noqa: E402
from harness.precision import cpu_flags  # noqa: E402
from tests.algo_utils import load_algo, parse  # noqa: E402

LADDER = {
    "before": ["--precision", "fp32", "--threads", "1", "--num-envs", "1", "--train-frequency", "1"],
    "bf16": ["--precision", "bf16", "--threads", "1", "--num-envs", "1", "--train-frequency", "1"],
    "bf16_2t": ["--precision", "bf16", "--threads", "2", "--num-envs", "1", "--train-frequency", "1"],
    "bf16_2t_8e": ["--precision", "bf16", "--threads", "2", "--num-envs", "8", "--train-frequency", "1"],
    "after": [],
    "after_1t": ["--threads", "1"],
    "after_b128": ["--batch-size", "128", "--train-frequency", "8"],
}
CLIMB = [name for name in LADDER if name != "after_b128"]
LEARNING_STARTS = 1000


def measure(algo, flags: list[str], steps: int) -> dict:
    """One run of `steps` learning agent steps: agent steps/s while learning and ms per agent step by call."""
    TIMES.clear()
    marks = {}
    end_of_step = harness.run.Run.end_of_step

    def marked(run, previous, step, obs, counts):  # the clock at the first and the last step of learning
        if previous <= LEARNING_STARTS < step:
            TIMES.clear()
            marks["start"] = (time.perf_counter(), step)
        marks["end"] = (time.perf_counter(), step)
        return end_of_step(run, previous, step, obs, counts)

    harness.run.Run.end_of_step = marked
    args = parse(algo, ["--env", "PongNoFrameskip-v4", "--no-cuda", "--learning-starts", str(LEARNING_STARTS),
                        "--total-timesteps", str(LEARNING_STARTS + steps), "--eval-frequency", "0",
                        "--checkpoint-frequency", "0", "--no-save-model", "--run-name", "speed", *flags])
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            algo.main(args)
        finally:
            os.chdir(cwd)
            harness.run.Run.end_of_step = end_of_step
    (t0, s0), (t1, s1) = marks["start"], marks["end"]
    per_step = {label: total / (s1 - s0) * 1e3 for label, total in TIMES.items()}
    loop_ms = (t1 - t0) / (s1 - s0) * 1e3
    per_step["rest (recorder, logging, Python)"] = loop_ms - sum(per_step.values())
    return {"agent_steps_per_s": (s1 - s0) / (t1 - t0), "ms_per_agent_step": loop_ms, "calls_ms": per_step,
            "precision": args.precision, "threads": args.threads, "num_envs": args.num_envs,
            "train_frequency": args.train_frequency}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000, help="agent steps of learning per measurement")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=list(LADDER), default=CLIMB)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "pong_cpu_speed.json")
    options = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    harness.run.evaluate = lambda *args, **kwargs: [[0.0]]
    algo = load_algo("per_dqn")
    learner = algo.make_learner

    def timed_learner(*args, **kwargs):
        learn = learner(*args, **kwargs)

        def learn_timed(steps: int, moves: int):
            start = time.perf_counter()
            try:
                return learn(steps, moves)
            finally:
                TIMES["learner"] = TIMES.get("learner", 0.0) + time.perf_counter() - start

        return learn_timed

    algo.make_learner = timed_learner
    timed(AtariVectorEnv, "step", "emulator")
    timed(algo.QNetwork, "forward", "acting's forward", when=torch.is_inference_mode_enabled)
    for owner, name in ((PrioritizedReplayBuffer, "add_frames"), (NStepReturns, "push"),
                        (PrioritizedReplayBuffer, "extend")):
        timed(owner, name, "storing")
    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "avx512f"})
    print(f"{os.cpu_count()} cores, flags {' '.join(flags)}, torch {torch.__version__}", flush=True)
    runs = {name: [] for name in options.only}
    for _ in range(options.rounds):
        for name in options.only:
            row = measure(algo, LADDER[name], options.steps)
            runs[name].append(row)
            calls = ", ".join(f"{label} {ms:.2f}" for label, ms in row["calls_ms"].items())
            print(f"{name:11s} {row['agent_steps_per_s']:6.1f} agent steps/s  {row['ms_per_agent_step']:6.2f} ms per "
                  f"agent step ({calls})", flush=True)
    medians = {name: statistics.median(r["agent_steps_per_s"] for r in rows) for name, rows in runs.items()}
    if "before" in medians:
        for name, sps in medians.items():
            print(f"{name:11s} median {sps:6.1f} agent steps/s, {sps / medians['before']:.2f}x before")
    options.out.write_text(json.dumps({"cores": os.cpu_count(), "flags": flags, "torch": torch.__version__,
                                       "learning_steps": options.steps, "ladder": LADDER, "runs": runs,
                                       "median_agent_steps_per_s": medians}, indent=2))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
