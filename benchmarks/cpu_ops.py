"""Where per_dqn's Pong learner step spends its time on this CPU, by operation, and its FLOPs against the CPU's peak.

    python benchmarks/cpu_ops.py                               # bf16 autocast (the preset on a bf16 CPU), 1 thread
    python benchmarks/cpu_ops.py --precision fp32 --threads 2 --batch-size 128

The learner step is benchmarks/cpu_learner.py's (`learn(1, 0)` of algos/per_dqn.py on a 100k PER buffer of real
Pong frames). After a warm-up, `--steps` steps run three times:

1. timed alone (the median ms per step);
2. under oneDNN's verbose log (the process is re-run with ONEDNN_VERBOSE=1, which is read when oneDNN loads): every
   primitive oneDNN executes, with its kind (convolution, inner_product, reorder, eltwise...), implementation
   (`brg_conv_fwd:avx512_core_amx_bf16`, `jit:uni` reorders...), propagation and shape, and the time it took;
3. under torch.profiler: every aten operator's own time (casts, Adam, sampling and priorities are not oneDNN's).

FLOPs per step are counted from the Nature CNN's layer shapes: for each convolution and linear layer the forward's
2 * MACs for the target network's forward and the Q-network's, and the backward's for the weights' gradient and the
inputs' (none for the first layer: its input is the observation). The peak is the CPU's bf16 rate per core times
its clock (`cpu MHz` in /proc/cpuinfo) times the threads: AMX 1,024 bf16 FLOP per cycle per core (a TMUL tile
product: 16 x 16 x 32 MACs in 16 cycles), AVX512-BF16 64 (one 512-bit vdpbf16ps per cycle: 16 lanes x 2 pairs x
2 FLOP); fp32 AVX-512 FMA: 64 on two FMA units. Writes benchmarks/results/cpu_ops_<precision>_<threads>t.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.cpu_learner import learner, pong_buffer  # noqa: E402
from harness.precision import cpu_flags  # noqa: E402
from tests.algo_utils import load_algo, parse  # noqa: E402

MARK = "cpu_ops: verbose steps start"


def step_flops(network: torch.nn.Module, obs_shape: tuple[int, ...], batch: int) -> dict[str, float]:
    """FLOPs of one learner step by layer: target forward + Q forward + backward (weights, and inputs past layer 1)."""
    flops, first = {}, True
    x = torch.zeros(1, *obs_shape)
    for i, layer in enumerate(network.modules()):
        if isinstance(layer, torch.nn.Conv2d):
            y = layer(x)
            macs = y.numel() * layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
            x = torch.relu(y)
        elif isinstance(layer, torch.nn.Linear):
            x = x.flatten(1)
            macs = layer.in_features * layer.out_features
            x = layer(x)
        else:
            continue
        forward = 2 * macs * batch
        flops[f"{i}:{type(layer).__name__}"] = 2 * forward + forward + (0 if first else forward)
        first = False
    return flops


def peak_per_core(precision: str) -> tuple[float, str]:
    """bf16 (or fp32) FLOP per cycle per core that this CPU's instructions can reach, and which instructions."""
    flags = cpu_flags()
    if precision == "bf16":
        if "amx_bf16" in flags:
            return 1024.0, "AMX (amx_bf16)"
        if "avx512_bf16" in flags:
            return 64.0, "AVX512-BF16"
    return 64.0, "AVX-512 FMA (fp32)" if "avx512f" in flags else "AVX2 FMA (fp32)"


def clock_hz() -> float:
    mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
           if line.startswith("cpu MHz")]
    return statistics.mean(mhz) * 1e6 if mhz else float("nan")


def parse_verbose(lines: list[str], steps: int) -> list[dict]:
    """oneDNN's exec lines after MARK, summed by (kind, implementation, propagation, shape), per step."""
    rows: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0])
    started = False
    for line in lines:
        if MARK in line:
            started = True
            continue
        if not started or not line.startswith("onednn_verbose") or ",exec," not in line:
            continue
        fields = line.strip().split(",")
        # onednn_verbose,[timestamp,]v1,primitive,exec,cpu,KIND,IMPL,PROP,MEMORY,ATTR,AUX,SHAPE,TIME
        at = fields.index("exec")
        kind, impl, prop = fields[at + 2], fields[at + 3], fields[at + 4]
        memory, shape, ms = fields[at + 5], fields[-2], float(fields[-1])
        dtypes = "/".join(sorted({m.split(":")[1] for m in memory.split() if m.count(":") >= 2}))
        key = (kind, impl, prop, dtypes, shape)
        rows[key][0] += 1
        rows[key][1] += ms
    return sorted(({"kind": k[0], "impl": k[1], "prop": k[2], "dtypes": k[3], "shape": k[4],
                    "calls_per_step": n / steps, "ms_per_step": ms / steps} for k, (n, ms) in rows.items()),
                  key=lambda r: -r["ms_per_step"])


def warmed_learner(options):
    """(algo, env, learn): per_dqn's Pong learner step on the options' threads, batch and precision, warmed up."""
    torch.set_num_threads(options.threads)
    algo = load_algo("per_dqn")
    args = parse(algo, ["--env", "PongNoFrameskip-v4", "--batch-size", str(options.batch_size), "--no-cuda"])
    rb, env = pong_buffer(algo, args)
    learn = learner(algo, args, rb, env, options.precision)
    for _ in range(options.warmup):
        learn(1, 0)
    return algo, env, learn


def child(options) -> None:
    """Runs the steps under ONEDNN_VERBOSE (set by the parent) and prints MARK before the measured ones."""
    _, _, learn = warmed_learner(options)
    print(MARK, flush=True)
    for _ in range(options.steps):
        learn(1, 0)
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    if options.child:
        return child(options)

    algo, env, learn = warmed_learner(options)
    times = []
    for _ in range(options.steps):
        start = time.perf_counter()
        learn(1, 0)
        times.append((time.perf_counter() - start) * 1e3)
    ms = statistics.median(times)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(options.steps):
            learn(1, 0)
    ops = sorted(({"op": e.key, "calls_per_step": e.count / options.steps,
                   "self_ms_per_step": e.self_cpu_time_total / 1e3 / options.steps}
                  for e in prof.key_averages()), key=lambda r: -r["self_ms_per_step"])
    env.close()

    verbose = subprocess.run([sys.executable, __file__, "--child", "--precision", options.precision,
                              "--threads", str(options.threads), "--batch-size", str(options.batch_size),
                              "--steps", str(options.steps), "--warmup", str(options.warmup)],
                             env=os.environ | {"ONEDNN_VERBOSE": "1"}, capture_output=True, text=True, check=True)
    primitives = parse_verbose(verbose.stdout.splitlines(), options.steps)

    probe = algo.QNetwork(env.single_observation_space, env.single_action_space)
    flops = step_flops(probe, env.single_observation_space.shape, options.batch_size)
    per_cycle, instructions = peak_per_core(options.precision)
    hz = clock_hz()
    peak = per_cycle * hz * options.threads
    total = sum(flops.values())
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "")
    print(f"CPU: {model}, clock {hz / 1e9:.2f} GHz, peak {per_cycle:.0f} FLOP/cycle/core ({instructions}); "
          f"torch {torch.__version__}; {options.precision}, {options.threads} thread(s), batch {options.batch_size}")
    print(f"learner step: {ms:.2f} ms median; {total / 1e9:.3f} GFLOP per step -> {total / ms / 1e6:.1f} GFLOP/s, "
          f"{100 * total / (ms / 1e3) / peak:.1f}% of the peak {peak / 1e9:.0f} GFLOP/s")
    one_dnn = sum(r["ms_per_step"] for r in primitives)
    print(f"\noneDNN primitives: {one_dnn:.2f} ms per step (the verbose run's own time)")
    by_kind: dict[str, float] = defaultdict(float)
    for r in primitives:
        by_kind[f"{r['kind']} {r['prop']}"] += r["ms_per_step"]
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {t:7.3f} ms  {100 * t / one_dnn:5.1f}%  {kind}")
    print("\n  by primitive (top 25):")
    for r in primitives[:25]:
        print(f"  {r['ms_per_step']:7.3f} ms  x{r['calls_per_step']:<4.1f} {r['kind']:14s} {r['impl']:34s} "
              f"{r['prop']:17s} {r['dtypes']:12s} {r['shape'][:70]}")
    print("\naten operators by own time (top 20):")
    for r in ops[:20]:
        share = 100 * r["self_ms_per_step"] / ms
        print(f"  {r['self_ms_per_step']:7.3f} ms  {share:5.1f}%  x{r['calls_per_step']:<5.1f} {r['op']}")
    print("\nFLOPs per step by layer (target fwd + fwd + bwd):")
    for name, f in flops.items():
        print(f"  {name:12s} {f / 1e6:9.1f} MFLOP")
    out = options.out or ROOT / "benchmarks" / "results" / f"cpu_ops_{options.precision}_{options.threads}t.json"
    out.write_text(json.dumps({
        "cpu": model, "flags": sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "avx512f", "amx_tile"}),
        "clock_ghz": hz / 1e9, "peak_flop_per_cycle_per_core": per_cycle, "peak_instructions": instructions,
        "torch": torch.__version__, "precision": options.precision, "threads": options.threads,
        "batch_size": options.batch_size, "ms_per_step": ms, "flops_per_step": total, "flops_by_layer": flops,
        "fraction_of_peak": total / (ms / 1e3) / peak, "onednn_ms_per_step": one_dnn,
        "onednn_by_kind": dict(by_kind), "primitives": primitives, "aten_ops": ops[:40]}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
