"""Agent steps/s of the user's Pong command on the CPU, before and after, and where an agent step's time goes.

    python benchmarks/pong_cpu_speed.py                      # the ladder below, 3000 learning steps each
    python benchmarks/pong_cpu_speed.py --rounds 2 --only before after
    python benchmarks/pong_cpu_speed.py --subnormals RUN_DIR --steps 2000 --rounds 2   # a late checkpoint, continued

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

--subnormals RUN_DIR measures a run late in training instead, where many of Adam's moments are subnormal floats (below
1.2e-38: a weight whose gradient stays 0 has moments that decay through that range, and x86 cores compute with them
many times slower; a fresh network's step does not show it). It copies the run's checkpoint twice per round and
continues each copy for --steps agent steps (`--resume COPY --stop-step`, the pause's evaluation a no-op), once with
subnormals kept (torch's default) and once flushed to zero (what harness.Run sets), in turn. It reports the run's own
agent steps/s (charts/SPS at the pause), how many moments are subnormal before and after, and how many weights of the
two copies differ at the pause. Writes benchmarks/results/pong_subnormals.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
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
FILES = ("checkpoint.pt", "config.yaml", "metrics.jsonl", "summary.json")  # a run's, for --subnormals
TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32
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


def subnormal(tensors) -> tuple[int, int]:
    """(subnormal, all) elements of the tensors."""
    tensors = list(tensors)
    return sum(int(((t != 0) & (t.abs() < TINY)).sum()) for t in tensors), sum(t.numel() for t in tensors)


def moments(checkpoint: dict) -> dict:
    """Subnormal counts of Adam's first and second moments in a checkpoint."""
    states = checkpoint["optimizer"]["state"].values()
    return {name: subnormal(state[name] for state in states) for name in ("exp_avg", "exp_avg_sq")}


def resumed(algo, run: Path, start: int, steps: int, flushed: bool) -> tuple[float, dict, dict]:
    """Continue a copy of `run` for `steps` agent steps -> (agent steps/s, its Q-network weights, moments' counts)."""
    set_flush = torch.set_flush_denormal
    set_flush(False)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run.name
        copy.mkdir()
        for name in FILES:
            shutil.copy2(run / name, copy / name)
        if not flushed:
            torch.set_flush_denormal = lambda on: False  # the run's call leaves subnormals as they are
        try:
            algo.main(parse(algo, ["--resume", str(copy), "--stop-step", str(start + steps)]))
        finally:
            torch.set_flush_denormal = set_flush
            set_flush(False)
        lines = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
        sps = next(line["charts/SPS"] for line in reversed(lines) if "charts/SPS" in line)
        checkpoint = torch.load(copy / "checkpoint.pt", map_location="cpu", weights_only=False)
    return sps, checkpoint["q_network"], moments(checkpoint)


def measure_subnormals(options: argparse.Namespace, algo, run: Path, flags: list[str]) -> dict:
    """Copies of the run's checkpoint continued with subnormals kept and flushed, in turn, `--rounds` times."""
    checkpoint = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    start, before = checkpoint["counts"][0], moments(checkpoint)
    weights_before = subnormal(v for v in checkpoint["q_network"].values() if v.is_floating_point())
    del checkpoint
    print(f"{options.subnormals} at step {start}: subnormal moments {before}, weights {weights_before}", flush=True)
    rows = {"kept": [], "flushed": []}
    ends = {}
    for _ in range(options.rounds):
        for name in rows:
            sps, weights, after = resumed(algo, run, start, options.steps, flushed=name == "flushed")
            rows[name].append({"agent_steps_per_s": sps, "subnormal_moments_after": after})
            ends.setdefault(name, weights)
            print(f"{name:8s} {sps:6.1f} agent steps/s, subnormal moments after: {after}", flush=True)
    differ = {key: int((ends["kept"][key] != ends["flushed"][key]).sum()) for key in ends["kept"]}
    medians = {name: statistics.median(r["agent_steps_per_s"] for r in runs) for name, runs in rows.items()}
    print(f"median agent steps/s: kept {medians['kept']:.1f}, flushed {medians['flushed']:.1f} "
          f"({medians['flushed'] / medians['kept']:.2f}x); weights that differ at the pause: "
          f"{sum(differ.values())} of {sum(v.numel() for v in ends['kept'].values())} {differ}")
    return {"run": options.subnormals.name, "start_step": start, "steps": options.steps, "cores": os.cpu_count(),
            "flags": flags, "torch": torch.__version__, "subnormal_moments_before": before,
            "subnormal_weights_before": weights_before, "runs": rows, "median_agent_steps_per_s": medians,
            "weights_differing_at_pause": differ}


def measure_ladder(options: argparse.Namespace, algo, flags: list[str]) -> dict:
    """The ladder's configurations in turn, `--rounds` times, with timers around the loop's calls."""
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
    return {"cores": os.cpu_count(), "flags": flags, "torch": torch.__version__, "learning_steps": options.steps,
            "ladder": LADDER, "runs": runs, "median_agent_steps_per_s": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="agent steps of learning per measurement (default: 3000; "
                                                  "--subnormals: 2000 per copy)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=list(LADDER), default=CLIMB)
    parser.add_argument("--subnormals", type=Path, metavar="RUN_DIR",
                        help="continue this run's checkpoint with subnormals kept and flushed, in place of the ladder")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/pong_cpu_speed.json (--subnormals: "
                                                 "pong_subnormals.json)")
    options = parser.parse_args()
    options.steps = options.steps or (2000 if options.subnormals else 3000)
    name = "pong_subnormals" if options.subnormals else "pong_cpu_speed"
    out = options.out or ROOT / "benchmarks" / "results" / f"{name}.json"
    os.environ.setdefault("WANDB_MODE", "disabled")
    harness.run.evaluate = lambda *args, **kwargs: [[0.0]]  # evaluations' games are not the training's speed
    algo = load_algo("per_dqn")
    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "avx512f"})
    print(f"{os.cpu_count()} cores, flags {' '.join(flags)}, torch {torch.__version__}", flush=True)
    if options.subnormals:
        with tempfile.TemporaryDirectory() as tmp:  # a snapshot: the run may be training and replace its checkpoint
            snapshot = Path(tmp) / options.subnormals.name
            snapshot.mkdir()
            for file in FILES:
                shutil.copy2(options.subnormals / file, snapshot / file)
            result = measure_subnormals(options, algo, snapshot, flags)
    else:
        result = measure_ladder(options, algo, flags)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
