"""n-step DQN: DQN whose targets sum n rewards before bootstrapping from the target network.

Sutton 1988 (n-step TD); Hessel et al. 2018, "Rainbow", AAAI (n-step targets for DQN).
Usage: python algos/nstep_dqn.py --n-step 3   |   python algos/nstep_dqn.py --config configs/nstep_dqn/pong.yaml
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict, from_module

from buffers import NStepReturns, ReplayBuffer
from envs import TransitionRecorder, evaluate, is_atari, make_vector_env
from tracking import Run, fail, parse_args, select_device


@dataclass
class Args:
    config: str | None = None
    """YAML file of argument defaults (keys are the names below); command-line flags override it"""
    exp_name: str = "nstep_dqn"
    """the name of this experiment, part of the run name"""
    run_name: str | None = None
    """the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)"""
    env: str = "CartPole-v1"
    """the gymnasium environment id (Atari ids such as PongNoFrameskip-v4 get the DQN preprocessing)"""
    seed: int = 1
    """seed of the run: networks, exploration, replay sampling and environments"""
    torch_deterministic: bool = True
    """make cuDNN deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    threads: int = 1
    """torch CPU threads (one is fastest for small networks; raise it for CNNs on a CPU)"""
    compile: bool = False
    """torch.compile the update"""
    cudagraphs: bool = False
    """replay the update as a CUDA graph (CUDA only)"""
    track: bool = False
    """log to Weights & Biases (WANDB_MODE=offline works without an account)"""
    wandb_project_name: str = "offpolicy-zoo"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team or user)"""
    wandb_group: str | None = None
    """the W&B group (run.py sets one per launch so seeds are grouped)"""
    capture_video: bool = False
    """record the final evaluation episode to runs/<run_name>/videos/"""
    save_model: bool = False
    """save the Q-network's state_dict to runs/<run_name>/model.pt"""

    total_timesteps: int = 100_000
    """environment steps in all, summed over the parallel environments"""
    num_envs: int = 1
    """parallel environments"""
    learning_rate: float = 2.3e-3
    """Adam's learning rate"""
    buffer_size: int = 100_000
    """replay capacity in transitions"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target update rate: 1 copies the Q-network, less moves the target that fraction of the way"""
    target_network_frequency: int = 10
    """environment steps between target updates"""
    batch_size: int = 64
    """transitions per gradient step"""
    start_e: float = 1.0
    """exploration epsilon at the start"""
    end_e: float = 0.04
    """exploration epsilon at the end of the schedule"""
    exploration_fraction: float = 0.16
    """fraction of total_timesteps over which epsilon falls from start_e to end_e"""
    learning_starts: int = 1000
    """environment steps of experience before learning starts"""
    train_frequency: int = 256
    """environment steps between training rounds"""
    gradient_steps: int = 128
    """gradient steps in each training round"""
    n_step: int = 3
    """steps folded into each target: reward = sum_k gamma**k r_k, discount = gamma**n (0 at termination)"""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss: squared error or Huber (smooth L1)"""
    max_grad_norm: float = 10.0
    """clip the gradient to this global norm"""
    eval_frequency: int = 0
    """environment steps between evaluations during training (0: only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    eval_epsilon: float = 0.0
    """exploration epsilon during evaluation"""
    stop_return: float | None = None
    """stop training once an evaluation's mean return reaches this (needs eval_frequency)"""


class QNetwork(nn.Module):
    """Q-values for every action: the Nature-DQN CNN for image observations, an MLP otherwise."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        shape, actions = observation_space.shape, int(action_space.n)
        self.image = len(shape) == 3  # (frames, height, width) uint8 pixels
        if self.image:
            conv = nn.Sequential(
                nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            )
            features = conv(torch.zeros(1, *shape)).shape[1]
            self.net = nn.Sequential(conv, nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, actions))
        else:
            self.net = nn.Sequential(
                nn.Linear(int(np.prod(shape)), 256), nn.ReLU(),
                nn.Linear(256, 256), nn.ReLU(),
                nn.Linear(256, actions),
            )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / 255.0 if self.image else obs.float().flatten(1))


def epsilon_at(step: int, args: Args) -> float:
    """Linear decay from start_e to end_e over exploration_fraction of the run, then constant."""
    progress = min(1.0, step / max(1.0, args.exploration_fraction * args.total_timesteps))
    return args.start_e + progress * (args.end_e - args.start_e)


def td_target(target_network: nn.Module, batch: TensorDict) -> torch.Tensor:
    """reward + discount * max_a Q_target(next_obs, a), with the n-step reward and discount stored."""
    next_q = target_network(batch["next_obs"]).max(dim=1).values
    return batch["reward"] + batch["discount"] * next_q


def q_loss(q_network: nn.Module, target_network: nn.Module, batch: TensorDict, args: Args):
    """The TD loss on one batch, with the Q-values of the actions taken."""
    with torch.no_grad():
        target = td_target(target_network, batch)
    q = q_network(batch["obs"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    loss = F.mse_loss(q, target) if args.loss == "mse" else F.smooth_l1_loss(q, target)
    return loss, q


def check_args(args: Args) -> None:
    for name in ("total_timesteps", "num_envs", "threads", "buffer_size", "batch_size", "train_frequency",
                 "gradient_steps", "target_network_frequency", "eval_episodes", "n_step"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau must be in (0, 1], got {args.tau}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")


def main(args: Args) -> dict:
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.threads)
    device = select_device(args.cuda)
    try:
        env = make_vector_env(args.env, args.num_envs, args.seed)
    except ValueError as e:
        fail(str(e))
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        fail(f"DQN needs a discrete action space; {args.env} has {env.single_action_space} "
             "(use algos/ddpg.py for continuous actions)")
    run = Run(args)

    # Networks: the target is a second module on the meta device whose parameters are
    # target_params, a TensorDict copy that the update moves with one lerp_.
    q_network = QNetwork(env.single_observation_space, env.single_action_space).to(device)
    params = from_module(q_network).data
    target_params = params.clone()
    with torch.device("meta"):
        target_network = QNetwork(env.single_observation_space, env.single_action_space)
    target_params.to_module(target_network)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True,
                                 capturable=args.cudagraphs and device.type == "cuda")
    rb = ReplayBuffer(args.buffer_size, device=device, seed=args.seed)
    nstep = NStepReturns(args.n_step, args.gamma, args.num_envs)
    recorder = TransitionRecorder(args.num_envs, clip_reward=is_atari(args.env))
    explore_rng = np.random.default_rng(args.seed)

    def update(batch: TensorDict) -> TensorDict:
        loss, q = q_loss(q_network, target_network, batch, args)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        return TensorDict(td_loss=loss.detach(), q_values=q.detach().mean(), grad_norm=grad_norm)

    if args.compile:
        update = torch.compile(update)
    if args.cudagraphs and device.type == "cuda":
        from tensordict.nn import CudaGraphModule

        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)

    def act(obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        explore = rng.random(len(obs)) < epsilon
        actions = rng.integers(env.single_action_space.n, size=len(obs))
        if not explore.all():
            with torch.no_grad():
                greedy = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions

    def evaluation(step: int, video: bool = False) -> list[float]:
        eval_rng = np.random.default_rng(args.seed + 10_000)
        returns = evaluate(args.env, lambda o: act(o, args.eval_epsilon, eval_rng), args.eval_episodes,
                           seed=args.seed + 10_000, video_dir=str(run.dir / "videos") if video else None)
        run.log(step, {"eval/episodic_return": float(np.mean(returns))})
        if video:
            run.video(run.dir / "videos" / "eval-episode-0.mp4", step)
        return returns

    # Collect, store, learn. global_step counts environment steps over all envs.
    obs, _ = env.reset(seed=args.seed)
    global_step, updates, recent = 0, 0, []
    start, eval_time = time.time(), 0.0
    interrupted = False
    try:
        while global_step < args.total_timesteps:
            epsilon = epsilon_at(global_step, args)
            action = act(obs, epsilon, explore_rng)
            next_obs, reward, terminated, truncated, info = env.step(action)
            transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
            rb.extend(nstep.push(transitions))
            obs = next_obs
            previous, global_step = global_step, global_step + args.num_envs
            for episode in finished:
                recent = (recent + [episode["episodic_return"]])[-20:]
                run.log(global_step, {f"charts/{k}": v for k, v in episode.items()} | {"charts/epsilon": epsilon})

            if global_step > args.learning_starts:
                rounds = global_step // args.train_frequency - previous // args.train_frequency
                for _ in range(rounds * args.gradient_steps):
                    metrics = update(rb.sample(args.batch_size))
                    updates += 1
                if rounds and global_step // 100 > previous // 100:
                    run.log(global_step, {f"losses/{k}": v.item() for k, v in metrics.items()})
                if global_step // args.target_network_frequency > previous // args.target_network_frequency:
                    target_params.lerp_(params, args.tau)

            if global_step // 1000 > previous // 1000:
                sps = global_step / (time.time() - start - eval_time)
                run.log(global_step, {"charts/SPS": sps})
                run.progress(global_step, np.mean(recent) if recent else None, sps)
            if args.eval_frequency and global_step // args.eval_frequency > previous // args.eval_frequency:
                tick = time.time()
                mean_return = float(np.mean(evaluation(global_step)))
                reached = args.stop_return is not None and mean_return >= args.stop_return
                eval_time += time.time() - tick
                if reached:
                    break
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted at step {global_step}; saving what there is")
    env.close()
    train_time = time.time() - start - eval_time

    if args.save_model:
        torch.save(q_network.state_dict(), run.dir / "model.pt")
    returns = [] if interrupted else evaluation(global_step, video=args.capture_video)
    return run.finish({
        "eval_return_mean": float(np.mean(returns)) if returns else None,
        "eval_return_std": float(np.std(returns)) if returns else None,
        "eval_episodes": len(returns), "eval_returns": returns, "global_step": global_step,
        "updates": updates, "train_sps": global_step / max(train_time, 1e-9), "interrupted": interrupted,
    })


if __name__ == "__main__":
    main(parse_args(Args))
