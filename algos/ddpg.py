"""DDPG: a deterministic actor climbs the gradient of a Q(s, a) critic learned off-policy from replay.

Lillicrap et al. 2016, "Continuous control with deep reinforcement learning", ICLR (arXiv:1509.02971).
Usage: python algos/ddpg.py --env Pendulum-v1   |   python algos/ddpg.py --config configs/ddpg/halfcheetah.yaml --track
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict, from_module

from buffers import NStepReturns, PrioritizedReplayBuffer, ReplayBuffer
from envs import TransitionRecorder, evaluate, make_vector_env
from tracking import Run, fail, parse_args, select_device


@dataclass
class Args:
    config: str | None = None
    """YAML file of argument defaults (keys are the names below); command-line flags override it"""
    exp_name: str = "ddpg"
    """the name of this experiment, part of the run name"""
    run_name: str | None = None
    """the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)"""
    env: str = "Pendulum-v1"
    """the gymnasium environment id (continuous actions)"""
    seed: int = 1
    """seed of the run: networks, exploration, replay sampling and environments"""
    torch_deterministic: bool = True
    """make cuDNN deterministic"""
    cuda: bool = True
    """use CUDA when it is available"""
    threads: int = 1
    """torch CPU threads (one is fastest for small networks)"""
    compile: bool = False
    """torch.compile the updates"""
    cudagraphs: bool = False
    """replay the updates as CUDA graphs (CUDA only)"""
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
    """save the actor's and critic's state_dicts (and the observation normaliser's) to runs/<run_name>/model.pt"""

    total_timesteps: int = 15_000
    """environment steps in all, summed over the parallel environments"""
    num_envs: int = 1
    """parallel environments"""
    learning_rate: float = 1e-3
    """Adam's learning rate, for the actor and the critic"""
    buffer_size: int = 100_000
    """replay capacity in transitions"""
    gamma: float = 0.98
    """discount factor"""
    tau: float = 0.005
    """target update rate: each target moves this fraction of the way to its network"""
    batch_size: int = 64
    """transitions per gradient step"""
    learning_starts: int = 1_000
    """environment steps of uniform random actions before learning starts"""
    updates_per_step: float = 1.0
    """critic gradient steps per environment step (update-to-data ratio; 0.5 and 2 work too)"""
    policy_frequency: int = 2
    """critic updates per actor update and target update (1: the paper; 2: delayed, as TD3 and CleanRL)"""
    noise: Literal["gaussian", "ou"] = "gaussian"
    """exploration noise: independent Gaussian, or an Ornstein-Uhlenbeck process per env (the paper's)"""
    exploration_noise: float = 0.2
    """standard deviation (Gaussian) or sigma (OU) of the noise, as a fraction of the half action range"""
    ou_theta: float = 0.15
    """mean reversion rate of the OU noise"""
    noise_final_scale: float = 1.0
    """noise multiplier at the end of the run, reached linearly from 1 at learning_starts (1: no annealing)"""
    reward_scale: float = 1.0
    """multiply rewards by this in the TD target"""
    normalize_obs: bool = False
    """normalise observations by running mean and std of the collected ones"""
    n_step: int = 1
    """bootstrap from n-step returns (1: the one-step TD target)"""
    prioritized: bool = False
    """prioritized replay by |TD error| with importance weights on the critic loss"""
    alpha: float = 0.6
    """prioritized replay: how much priorities count (0: uniform)"""
    beta_start: float = 0.4
    """prioritized replay: importance-sampling exponent at the start, annealed to 1 over the run"""
    prio_eps: float = 1e-6
    """prioritized replay: added to |TD error| so every transition can be sampled"""
    eval_frequency: int = 0
    """environment steps between evaluations during training (0: only the final one)"""
    eval_episodes: int = 10
    """episodes per evaluation"""


def mlp(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, outputs))


class Actor(nn.Module):
    """The deterministic policy: tanh squashed, then scaled and shifted to the action bounds."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.net = mlp(int(np.prod(observation_space.shape)), int(np.prod(action_space.shape)))
        high, low = (torch.as_tensor(b, dtype=torch.float32) for b in (action_space.high, action_space.low))
        # Buffers, so they follow .to(device) and travel in the state_dict with the weights.
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.action_bias, torch.tanh(self.net(obs.float().flatten(1))), self.action_scale)


class QNetwork(nn.Module):
    """Q(s, a): one value per (observation, action) pair."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.net = mlp(int(np.prod(observation_space.shape)) + int(np.prod(action_space.shape)), 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs.float().flatten(1), action.flatten(1)], dim=1)).squeeze(1)


class RunningMeanStd(nn.Module):
    """Observations scaled by the running mean and variance of all those collected so far (Chan et al.'s
    parallel update). The buffer keeps raw observations and batches pass through this when used, so
    every update sees the latest statistics (as SB3's VecNormalize does)."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))  # no 0/0 before the first batch

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:  # in place, so that CUDA graphs read the new statistics
        obs = obs.to(self.mean.device, torch.float64)
        n, total, delta = obs.shape[0], self.count + obs.shape[0], obs.mean(0) - self.mean
        moments = self.var * self.count + obs.var(0, unbiased=False) * n + delta.square() * self.count * n / total
        self.var.copy_(moments / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.mean.float()) / (self.var.float() + 1e-8).sqrt()).clamp(-self.clip, self.clip)


class ExplorationNoise:
    """Gaussian, or Ornstein-Uhlenbeck (dt = 1, mean 0) per environment, in half action ranges."""

    def __init__(self, kind: str, shape: tuple[int, ...], sigma: float, theta: float, rng: np.random.Generator):
        self.kind, self.sigma, self.theta, self.rng, self.state = kind, sigma, theta, rng, np.zeros(shape)

    def sample(self) -> np.ndarray:
        white = self.sigma * self.rng.standard_normal(self.state.shape)
        if self.kind == "gaussian":
            return white
        self.state += -self.theta * self.state + white
        return self.state.copy()

    def reset(self, done: np.ndarray) -> None:
        self.state[done] = 0.0  # a new episode starts a new OU path: no correlation across episodes


def make_networks(observation_space: gym.spaces.Box, action_space: gym.spaces.Box, device: torch.device):
    """Actor, critic, their targets, and the parameters of both as TensorDicts {"actor", "qf"}. The targets
    are modules on the meta device reading target_params, a copy, so one lerp_ moves both in place."""
    actor = Actor(observation_space, action_space).to(device)
    qf = QNetwork(observation_space, action_space).to(device)
    # Locked: the key set cannot change, which lets TensorDict cache it (lerp_ runs ~2x faster).
    params = TensorDict(actor=from_module(actor).data, qf=from_module(qf).data).lock_()
    target_params = params.clone().lock_()
    with torch.device("meta"):
        actor_target, qf_target = Actor(observation_space, action_space), QNetwork(observation_space, action_space)
    target_params["actor"].to_module(actor_target)
    target_params["qf"].to_module(qf_target)
    return actor, qf, actor_target, qf_target, params, target_params


@torch.no_grad()
def td_target(actor_target: nn.Module, qf_target: nn.Module, reward: torch.Tensor, next_obs: torch.Tensor,
              discount: torch.Tensor) -> torch.Tensor:
    """reward + discount * Q_target(next_obs, actor_target(next_obs)); discount is 0 past a termination."""
    return reward + discount * qf_target(next_obs, actor_target(next_obs))


def critic_update(batch: TensorDict, qf: nn.Module, optimizer: torch.optim.Optimizer, actor_target: nn.Module,
                  qf_target: nn.Module, obs_norm: nn.Module, args: Args) -> dict[str, torch.Tensor]:
    """One step on the squared TD error; returns the loss, Q-values and, for prioritized replay, |TD error|."""
    obs, next_obs = obs_norm(batch["obs"]), obs_norm(batch["next_obs"])
    target = td_target(actor_target, qf_target, args.reward_scale * batch["reward"], next_obs, batch["discount"])
    q = qf(obs, batch["action"])
    metrics = {"qf_values": q.detach()}
    if args.prioritized:  # importance weights undo the bias of prioritized sampling (Schaul et al. 2016)
        td_error = q - target
        loss, metrics["priority"] = (batch["weight"] * td_error.square()).mean(), td_error.detach().abs()
    else:  # one fused op forward and backward: small batches are bound by the count of ops, not FLOPs
        loss = F.mse_loss(q, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return metrics | {"qf_loss": loss.detach()}


def actor_update(batch: TensorDict, actor: nn.Module, optimizer: torch.optim.Optimizer, qf: nn.Module,
                 obs_norm: nn.Module) -> dict[str, torch.Tensor]:
    """One step up the deterministic policy gradient: minimise -Q(obs, actor(obs)).

    backward(inputs=actor parameters) holds the critic out: the gradient flows through the critic to
    the action but lands only in the actor's .grad, and autograd skips the critic's weight gradients
    (swapping detached critic weights in with to_module instead made this step ~30% slower on a CPU).
    """
    obs = obs_norm(batch["obs"])
    loss = -qf(obs, actor(obs)).mean()
    optimizer.zero_grad()
    loss.backward(inputs=list(actor.parameters()))
    optimizer.step()
    return {"actor_loss": loss.detach()}


def noise_scale_at(step: int, args: Args) -> float:
    """Linear from 1 at learning_starts to noise_final_scale at total_timesteps."""
    progress = min(1.0, max(0, step - args.learning_starts) / max(1, args.total_timesteps - args.learning_starts))
    return 1.0 + progress * (args.noise_final_scale - 1.0)


def check_args(args: Args) -> None:
    for name in ("total_timesteps", "num_envs", "threads", "buffer_size", "batch_size", "policy_frequency",
                 "n_step", "eval_episodes"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and args.updates_per_step > 0 and 0 <= args.beta_start <= 1
            and args.exploration_noise >= 0 and args.noise_final_scale >= 0):
        fail("need 0 < --tau <= 1, --updates-per-step > 0, 0 <= --beta-start <= 1, --exploration-noise >= 0 and "
             f"--noise-final-scale >= 0; got {args.tau}, {args.updates_per_step}, {args.beta_start}, "
             f"{args.exploration_noise}, {args.noise_final_scale}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")


def main(args: Args) -> dict:
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.threads)
    # Adam's moments of dead ReLU units decay into subnormal floats, which x86 CPUs compute on
    # slowly (Adam steps took 2x longer on Pendulum); flushing them to zero changes nothing that matters.
    torch.set_flush_denormal(True)
    device = select_device(args.cuda)
    try:
        env = make_vector_env(args.env, args.num_envs, args.seed)
    except ValueError as e:
        fail(str(e))
    if not isinstance(env.single_action_space, gym.spaces.Box):
        fail(f"DDPG needs a continuous (Box) action space; {args.env} has {env.single_action_space} "
             "(use algos/dqn.py for discrete actions)")
    run = Run(args)

    obs_space, action_space = env.single_observation_space, env.single_action_space
    actor, qf, actor_target, qf_target, params, target_params = make_networks(obs_space, action_space, device)
    capturable = args.cudagraphs and device.type == "cuda"
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
    qf_optimizer = torch.optim.Adam(qf.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
    obs_norm = RunningMeanStd(obs_space.shape).to(device) if args.normalize_obs else nn.Identity()
    rb = (PrioritizedReplayBuffer(args.buffer_size, args.alpha, args.beta_start, args.prio_eps, device, args.seed)
          if args.prioritized else ReplayBuffer(args.buffer_size, device=device, seed=args.seed))
    nstep = NStepReturns(args.n_step, args.gamma, args.num_envs) if args.n_step > 1 else None
    recorder = TransitionRecorder(args.num_envs)
    noise = ExplorationNoise(args.noise, (args.num_envs, *action_space.shape), args.exploration_noise,
                             args.ou_theta, np.random.default_rng(args.seed))
    half_range = (action_space.high - action_space.low) / 2

    update_critic = partial(critic_update, qf=qf, optimizer=qf_optimizer, actor_target=actor_target,
                            qf_target=qf_target, obs_norm=obs_norm, args=args)
    update_actor = partial(actor_update, actor=actor, optimizer=actor_optimizer, qf=qf, obs_norm=obs_norm)
    if args.compile:
        update_critic, update_actor = torch.compile(update_critic), torch.compile(update_actor)
    if capturable:
        from tensordict.nn import CudaGraphModule

        update_critic = CudaGraphModule(update_critic, in_keys=[], out_keys=[], warmup=5)
        update_actor = CudaGraphModule(update_actor, in_keys=[], out_keys=[], warmup=5)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor(obs_norm(torch.as_tensor(obs, device=device).float())).cpu().numpy()

    def evaluation(step: int, video: bool = False) -> list[float]:
        returns = evaluate(args.env, act, args.eval_episodes, seed=args.seed + 10_000,
                           video_dir=str(run.dir / "videos") if video else None)
        run.log(step, {"eval/episodic_return": float(np.mean(returns))})
        if video:
            run.video(run.dir / "videos" / "eval-episode-0.mp4", step)
        return returns

    # Collect, store, learn. global_step counts environment steps over all envs; `credit` carries
    # the fraction of an update that updates_per_step left over, so 0.5 means one update every 2 steps.
    obs, _ = env.reset(seed=args.seed)
    global_step, updates, credit, recent, losses = 0, 0, 0.0, [], {}
    start, eval_time, interrupted = time.time(), 0.0, False
    try:
        while global_step < args.total_timesteps:
            if args.normalize_obs:
                obs_norm.update(torch.as_tensor(obs))
            if global_step < args.learning_starts:
                action = env.action_space.sample()
            else:
                scale = noise_scale_at(global_step, args)
                action = np.clip(act(obs) + scale * half_range * noise.sample(), action_space.low, action_space.high)
            action = action.astype(np.float32)
            next_obs, reward, terminated, truncated, info = env.step(action)
            transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
            if nstep is None:  # one-step transitions: discount = gamma, or 0 after a termination
                transitions["discount"] = args.gamma * (~transitions["terminated"]).float()
            else:  # n-step: folded reward, discount = gamma**m or 0
                transitions = nstep.push(transitions)
            rb.extend(transitions)
            noise.reset(terminated | truncated)
            obs = next_obs
            previous, global_step = global_step, global_step + args.num_envs
            for episode in finished:
                recent = (recent + [episode["episodic_return"]])[-20:]
                run.log(global_step, {f"charts/{k}": v for k, v in episode.items()})

            if global_step > args.learning_starts and len(rb):  # n-step may not have emitted anything yet
                if args.prioritized:  # anneal the importance-sampling correction to full at the end
                    rb.beta = args.beta_start + min(1.0, global_step / args.total_timesteps) * (1 - args.beta_start)
                credit += args.num_envs * args.updates_per_step
                for _ in range(int(credit)):
                    batch = rb.sample(args.batch_size)
                    critic_metrics = update_critic(batch)
                    if args.prioritized:
                        rb.update_priority(batch["index"], critic_metrics["priority"])
                    updates += 1
                    if updates % args.policy_frequency == 0:  # the actor and the targets trail the critic
                        losses["actor_loss"] = update_actor(batch)["actor_loss"]
                        target_params.lerp_(params, args.tau)
                    if updates % 100 == 0:
                        losses.update(qf_loss=critic_metrics["qf_loss"], qf_values=critic_metrics["qf_values"].mean())
                        run.log(global_step, {f"losses/{k}": v.item() for k, v in losses.items()})
                credit -= int(credit)

            if global_step // 1000 > previous // 1000:
                sps = global_step / (time.time() - start - eval_time)
                run.log(global_step, {"charts/SPS": sps})
                run.progress(global_step, np.mean(recent) if recent else None, sps)
            if args.eval_frequency and global_step // args.eval_frequency > previous // args.eval_frequency:
                tick = time.time()
                evaluation(global_step)
                eval_time += time.time() - tick
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted at step {global_step}; saving what there is")
    env.close()
    train_time = time.time() - start - eval_time

    if args.save_model:
        model = {"actor": actor.state_dict(), "qf": qf.state_dict()}
        if args.normalize_obs:
            model["obs_rms"] = obs_norm.state_dict()
        torch.save(model, run.dir / "model.pt")
    returns = [] if interrupted else evaluation(global_step, video=args.capture_video)
    return run.finish({
        "eval_return_mean": float(np.mean(returns)) if returns else None,
        "eval_return_std": float(np.std(returns)) if returns else None,
        "eval_episodes": len(returns), "eval_returns": returns, "global_step": global_step,
        "updates": updates, "train_sps": global_step / max(train_time, 1e-9), "interrupted": interrupted,
    })


if __name__ == "__main__":
    main(parse_args(Args))
