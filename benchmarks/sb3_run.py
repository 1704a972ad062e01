"""One Stable-Baselines3 run at the hyper-parameters of one of our configs, for benchmarks/sps.py.

    python benchmarks/sb3_run.py dqn configs/dqn/cartpole.yaml --steps 100000 --seed 1

Prints one JSON line: steps, the time inside learn(), and the final evaluation (10 episodes through
envs.evaluate with the same seeds as ours, the greedy / deterministic policy). sps.py times the whole
process around it, imports and start-up included, as it times ours.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from envs import evaluate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo", choices=["dqn", "ddpg"])
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=10)
    options = parser.parse_args()
    c = yaml.safe_load(Path(options.config).read_text())
    torch.set_num_threads(1)
    env = gym.make(c["env"])
    if options.algo == "dqn":
        from stable_baselines3 import DQN

        lr = float(c["learning_rate"])  # anneal_lr: linear to 0, as ours (SB3 passes the fraction of steps left)
        schedule = (lambda left: lr * left) if c.get("anneal_lr") else lr
        model = DQN("MlpPolicy", env, learning_rate=schedule, buffer_size=c["buffer_size"],
                    learning_starts=c["learning_starts"], batch_size=c["batch_size"], tau=c.get("tau", 1.0),
                    gamma=c["gamma"], train_freq=c["train_frequency"], gradient_steps=c["gradient_steps"],
                    target_update_interval=c["target_network_frequency"],
                    exploration_fraction=c["exploration_fraction"], exploration_initial_eps=c["start_e"],
                    exploration_final_eps=c["end_e"], max_grad_norm=c.get("max_grad_norm", 10.0),
                    policy_kwargs={"net_arch": [256, 256]}, seed=options.seed, device="cpu", verbose=0)
    else:
        from stable_baselines3 import DDPG
        from stable_baselines3.common.noise import NormalActionNoise

        # SB3 adds the noise to the action rescaled to [-1, 1], i.e. in half action ranges, as ours does.
        dim = env.action_space.shape[0]
        noise = NormalActionNoise(np.zeros(dim), c["exploration_noise"] * np.ones(dim))
        ups = c.get("updates_per_step", 1.0)
        train_freq, gradient_steps = (1, int(ups)) if ups >= 1 else (round(1 / ups), 1)
        model = DDPG("MlpPolicy", env, learning_rate=float(c["learning_rate"]), buffer_size=c["buffer_size"],
                     learning_starts=c["learning_starts"], batch_size=c["batch_size"], tau=c["tau"],
                     gamma=c["gamma"], train_freq=train_freq, gradient_steps=gradient_steps, action_noise=noise,
                     policy_kwargs={"net_arch": [256, 256]}, device="cpu", seed=options.seed)
        model.policy_delay = c.get("policy_frequency", 2)  # SB3's DDPG is its TD3 with delay 1: same update rule
    start = time.perf_counter()
    model.learn(total_timesteps=options.steps)
    learn_s = time.perf_counter() - start
    returns = evaluate(c["env"], lambda obs: model.predict(obs, deterministic=True)[0], options.eval_episodes,
                       seed=options.seed + 10_000)
    print(json.dumps({"steps": options.steps, "learn_s": learn_s, "eval_return": float(np.mean(returns))}))


if __name__ == "__main__":
    main()
