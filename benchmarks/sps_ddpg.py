"""DDPG training speed on Pendulum-v1: algos/ddpg.py against Stable-Baselines3's DDPG, in the same process.

Both run the hyper-parameters of configs/ddpg/pendulum.yaml (learning rate, batch, buffer, tau, gamma,
learning_starts, Gaussian noise, updates per environment step as SB3's train_freq/gradient_steps,
actor and target updates every policy_frequency critic updates as SB3's policy_delay, 256x256 MLPs)
on the CPU with one torch thread, one after the other, for --steps environment steps.
Reported per run: wall time of training (ours: the training loop of main(), without the final
evaluation; SB3: learn()), environment steps per second, CPU seconds of training plus evaluation
(steadier than wall time when other processes compete for the cores), and the mean return of 10
deterministic evaluation episodes, played by both through envs.evaluate with the same seeds.

    python benchmarks/sps_ddpg.py                 # 20k steps, seed 1; writes benchmarks/results/sps_ddpg.json
    python benchmarks/sps_ddpg.py --steps 5000 --seeds 1 2 --out /tmp/sps.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from envs import evaluate  # noqa: E402
from tests.algo_utils import load_algo  # noqa: E402

ENV = "Pendulum-v1"


def run_ours(ddpg, config: dict, steps: int, seed: int, eval_episodes: int) -> dict:
    args = ddpg.Args(**{**config, "total_timesteps": steps, "seed": seed, "eval_episodes": eval_episodes,
                        "run_name": f"sps-ddpg-{seed}", "cuda": False, "threads": 1})
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the run directory lands in tmp and goes with it
        try:
            cpu = time.process_time()
            summary = ddpg.main(args)
            cpu = time.process_time() - cpu
        finally:
            os.chdir(cwd)
    wall = summary["global_step"] / summary["train_sps"]
    return {"lib": "ours", "seed": seed, "steps": summary["global_step"], "wall_s": wall,
            "sps": summary["train_sps"], "cpu_s": cpu, "eval_return": summary["eval_return_mean"]}


def run_sb3(config: dict, steps: int, seed: int, eval_episodes: int) -> dict:
    from stable_baselines3 import DDPG
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    env = gym.make(ENV)
    action_dim = env.action_space.shape[0]
    # SB3 adds the noise to the action rescaled to [-1, 1], i.e. in half action ranges, as ours does.
    noise = NormalActionNoise(np.zeros(action_dim), config["exploration_noise"] * np.ones(action_dim))
    ups = config["updates_per_step"]
    train_freq, gradient_steps = (1, int(ups)) if ups >= 1 else (round(1 / ups), 1)
    model = DDPG("MlpPolicy", env, learning_rate=config["learning_rate"], buffer_size=config["buffer_size"],
                 learning_starts=config["learning_starts"], batch_size=config["batch_size"], tau=config["tau"],
                 gamma=config["gamma"], train_freq=train_freq, gradient_steps=gradient_steps, action_noise=noise,
                 policy_kwargs={"net_arch": [256, 256]}, device="cpu", seed=seed)
    model.policy_delay = config["policy_frequency"]  # SB3's DDPG is its TD3 with this set to 1; same update rule
    # algos/ddpg.py turns on flush-to-zero for subnormal floats (process-wide); SB3 runs as shipped, without it.
    torch.set_flush_denormal(False)
    cpu = time.process_time()
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - start
    returns = evaluate(ENV, lambda obs: model.predict(obs, deterministic=True)[0], eval_episodes, seed=seed + 10_000)
    cpu = time.process_time() - cpu
    return {"lib": "sb3", "seed": seed, "steps": steps, "wall_s": wall, "sps": steps / wall, "cpu_s": cpu,
            "eval_return": float(np.mean(returns))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="environment steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="one run per library per seed")
    parser.add_argument("--config", default=str(ROOT / "configs" / "ddpg" / "pendulum.yaml"))
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--no-sb3", action="store_true", help="time ours alone")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sps_ddpg.json"))
    opts = parser.parse_args()

    ddpg = load_algo("ddpg")
    config = dataclasses.asdict(ddpg.parse_args(["--config", str(opts.config)]))
    config.pop("config")
    if config["env"] != ENV:
        raise SystemExit(f"{opts.config} is for {config['env']}; this benchmark runs {ENV}")
    load_before = os.getloadavg()
    rows = []
    for seed in opts.seeds:
        rows.append(run_ours(ddpg, config, opts.steps, seed, opts.eval_episodes))
        if not opts.no_sb3:
            rows.append(run_sb3(config, opts.steps, seed, opts.eval_episodes))

    print(f"\nDDPG on {ENV}, {opts.steps} steps, 1 torch thread (load average before: {load_before[0]:.1f})")
    print(f"{'lib':6} {'seed':>4} {'steps':>7} {'wall s':>8} {'SPS':>7} {'cpu s':>7} {'eval return':>12}")
    for r in rows:
        print(f"{r['lib']:6} {r['seed']:>4} {r['steps']:>7} {r['wall_s']:>8.1f} {r['sps']:>7.0f} {r['cpu_s']:>7.1f} "
              f"{r['eval_return']:>12.1f}")
    summary = {}
    for lib in ("ours", "sb3"):
        mine = [r for r in rows if r["lib"] == lib]
        if mine:
            summary[lib] = {k: statistics.mean(r[k] for r in mine) for k in ("wall_s", "sps", "cpu_s", "eval_return")}
    if "sb3" in summary:
        summary["speedup_sps"] = summary["ours"]["sps"] / summary["sb3"]["sps"]
        summary["speedup_cpu"] = summary["sb3"]["cpu_s"] / summary["ours"]["cpu_s"]
        print(f"ours / sb3: {summary['speedup_sps']:.2f}x steps per second (wall), "
              f"{summary['speedup_cpu']:.2f}x less CPU time; goal >= 2x with equal or better return")
    import stable_baselines3

    result = {
        "benchmark": "sps_ddpg", "env": ENV, "steps": opts.steps, "seeds": opts.seeds, "config": opts.config,
        "hyperparameters": {k: config[k] for k in ("learning_rate", "buffer_size", "batch_size", "tau", "gamma",
                                                   "learning_starts", "exploration_noise", "updates_per_step",
                                                   "policy_frequency")},
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "gymnasium": gym.__version__, "stable_baselines3": stable_baselines3.__version__},
        "runs": rows, "summary": summary,
    }
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
