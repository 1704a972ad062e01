"""Environment steps per second of our DQN against Stable-Baselines3's, at the same hyper-parameters.

    python benchmarks/sps.py                 # DQN on CartPole-v1, 100k steps each, then the table
    python benchmarks/sps.py --steps 20000   # shorter
    python benchmarks/sps.py --algo ddpg     # DDPG on Pendulum-v1 (benchmarks/sps_ddpg.py)

Both run in this process, one after the other, on one torch thread, with the hyper-parameters of
configs/dqn/cartpole.yaml (SB3's DQN uses the Huber loss, so ours does here too). The table has
steps, wall time, steps/s and the final evaluation return (10 greedy episodes); the numbers go to
benchmarks/results/sps.json. Requires the `bench` extra (stable-baselines3).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.algo_utils import load_algo  # noqa: E402


def ours_dqn(steps: int, seed: int) -> dict:
    dqn = load_algo("dqn")
    config = dqn.parse_args(["--config", str(ROOT / "configs/dqn/cartpole.yaml")])
    args = dataclasses.replace(config, total_timesteps=steps, seed=seed, cuda=False, loss="huber",
                               run_name=f"sps-dqn-{seed}-{int(time.time())}")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            start = time.perf_counter()
            summary = dqn.main(args)
        finally:
            os.chdir(cwd)
    return {"lib": "ours", "steps": summary["global_step"], "train_s": summary["global_step"] / summary["train_sps"],
            "total_s": time.perf_counter() - start, "return": summary["eval_return_mean"]}


def sb3_dqn(steps: int, seed: int) -> dict:
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.evaluation import evaluate_policy

    dqn = load_algo("dqn")
    c = dqn.parse_args(["--config", str(ROOT / "configs/dqn/cartpole.yaml")])
    model = DQN(
        "MlpPolicy", gym.make("CartPole-v1"), learning_rate=c.learning_rate, buffer_size=c.buffer_size,
        learning_starts=c.learning_starts, batch_size=c.batch_size, tau=c.tau, gamma=c.gamma,
        train_freq=c.train_frequency, gradient_steps=c.gradient_steps,
        target_update_interval=c.target_network_frequency, exploration_fraction=c.exploration_fraction,
        exploration_initial_eps=c.start_e, exploration_final_eps=c.end_e, max_grad_norm=c.max_grad_norm,
        policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu", verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    train_s = time.perf_counter() - start
    returns, _ = evaluate_policy(model, gym.make("CartPole-v1"), n_eval_episodes=10, deterministic=True,
                                 return_episode_rewards=True)
    return {"lib": "sb3", "steps": steps, "train_s": train_s, "total_s": time.perf_counter() - start,
            "return": float(np.mean(returns))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["dqn", "ddpg"], default="dqn")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    if options.algo == "ddpg":
        from benchmarks import sps_ddpg

        sys.argv = [sys.argv[0], "--steps", str(options.steps)]
        return sps_ddpg.main()
    torch.set_num_threads(1)
    rows = [ours_dqn(options.steps, options.seed), sb3_dqn(options.steps, options.seed)]
    for row in rows:
        row["sps"] = row["steps"] / row["train_s"]
    ratio = rows[0]["sps"] / rows[1]["sps"]
    print(f"\nDQN on CartPole-v1, {options.steps} steps, seed {options.seed}, 1 torch thread")
    print("| lib | steps | train wall (s) | steps/s | final eval return |\n| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['lib']} | {row['steps']} | {row['train_s']:.1f} | {row['sps']:.0f} | {row['return']:.1f} |")
    print(f"\nsteps/s ratio ours / SB3: {ratio:.2f}x")
    out = ROOT / "benchmarks/results/sps.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "dqn-cartpole", "steps": options.steps, "seed": options.seed, "rows": rows,
        "sps_ratio_ours_over_sb3": ratio, "torch": torch.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "torch_threads": 1,
    }, indent=2))


if __name__ == "__main__":
    main()
