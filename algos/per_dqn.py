"""PER-DQN: DQN that replays transitions in proportion to their last |TD error| (proportional variant).

Schaul et al. 2016, "Prioritized Experience Replay", ICLR; with --n-step N, Rainbow-style n-step targets.

Usage: python algos/per_dqn.py   |   python algos/per_dqn.py --env PongNoFrameskip-v4 --n-step 3

An Atari id without --config trains with ATARI_PRESET (printed at the start); --config and flags override it.
"""

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict, from_module

from buffers import NStepReturns, PrioritizedReplayBuffer
from envs import TransitionRecorder, is_atari
from harness import Packable, Run, RunArgs, chosen, clip_grad_norm, crossed, fail, parse_args, per_leaf, pixels

# Atari ids without --config: Lapan's Pong settings at half its replay ratio, n = 3 and a 1M replay (docs/atari.md).
ATARI_PRESET = dict(learning_rate=1e-4, batch_size=32, gradient_steps=1, target_network_frequency=1000, start_e=1.0,
                    exploration_fraction=0.1, anneal_lr=False, num_envs=8, threads=2,
                    total_timesteps=1_000_000, buffer_size=1_000_000, train_frequency=2, end_e=0.02, eval_epsilon=0.001,
                    learning_starts=10_000, n_step=3, loss="mse", eval_frequency=100_000, checkpoint_frequency=250_000)


@dataclass
class Args(RunArgs):
    env: str = "CartPole-v1"  # the environment id (an Atari id without --config gets the Atari preset)
    total_timesteps: int = 100_000  # environment steps of each seed, summed over its parallel environments
    learning_rate: Packable[float] = 1e-3  # Adam's learning rate
    anneal_lr: bool = True  # decay the learning rate to 0 at the end of training, so the final policy settles
    lr_decay: Literal["linear", "cosine"] = "linear"  # the shape of anneal_lr's decay: a line or a half cosine
    buffer_size: int = 100_000  # replay capacity in transitions
    gamma: Packable[float] = 0.99  # discount factor
    tau: Packable[float] = 1.0  # target update rate: 1 copies the Q-network, less moves the target that fraction closer
    target_network_frequency: int = 250  # environment steps between target updates
    batch_size: int = 64  # transitions per gradient step
    start_e: Packable[float] = 1.0  # exploration epsilon at the start
    end_e: Packable[float] = 0.02  # exploration epsilon at the end of the schedule
    exploration_fraction: Packable[float] = 0.1  # fraction of total_timesteps in which epsilon falls start_e -> end_e
    learning_starts: int = 1000  # environment steps of experience before learning starts
    train_frequency: int = 4  # environment steps between training rounds
    gradient_steps: int = 1  # gradient steps in each training round
    loss: Packable[Literal["mse", "huber"]] = "huber"  # TD loss: squared error or Huber (smooth L1)
    max_grad_norm: Packable[float] = 10.0  # clip the gradient to this global norm
    adam_eps: Packable[float] = 1e-8  # Adam's epsilon: above the gradients of a converged network, it stops their drift
    eval_frequency: int = 10_000  # environment steps between evaluations during training (0: only the final one)
    eval_epsilon: float = 0.0  # exploration epsilon during evaluation
    alpha: Packable[float] = 0.6  # prioritization exponent: P(i) is proportional to (|TD error| + prio_eps) ** alpha
    beta_start: Packable[float] = 0.4  # importance-sampling exponent at the start, annealed linearly to 1 by the end
    prio_eps: Packable[float] = 1e-6  # added to |TD error| so that every transition keeps a chance to be replayed
    n_step: int = 1  # steps folded into each target (3 is Rainbow's choice)


class QNetwork(nn.Module):
    """Q-values for every action: the Nature-DQN CNN for uint8 image stacks, an MLP otherwise."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        shape, actions = observation_space.shape, int(action_space.n)
        self.image = len(shape) == 3 and observation_space.dtype == np.uint8  # (frames, height, width) pixels
        self.obs_dims = len(shape)
        if self.image:
            conv = nn.Sequential(nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                 nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(-3))
            features = conv(torch.zeros(1, *shape)).shape[-1]
            self.net = nn.Sequential(conv, nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, actions))
        else:
            self.net = nn.Sequential(nn.Linear(int(np.prod(shape)), 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # [batch, *obs_shape] -> [batch, actions]
        q = self.net(pixels(obs) if self.image else obs.float().flatten(-self.obs_dims))
        return q.float()  # fp32 Q-values under bf16 autocast (--precision): targets and TD errors stay fp32


def epsilon_at(step: int, args: Args) -> float:
    """Linear from start_e (at schedule_start) to end_e at exploration_fraction * total_timesteps, then constant."""
    span = max(1.0, args.exploration_fraction * args.total_timesteps - args.schedule_start)
    return args.start_e + min(1.0, (step - args.schedule_start) / span) * (args.end_e - args.start_e)


def annealed(step: int, args: Args) -> float:
    """How far the annealing is at `step`: 0 at schedule_start, 1 at total_timesteps (the learning rate, PER's beta)."""
    return min(1.0, (step - args.schedule_start) / (args.total_timesteps - args.schedule_start))


def learning_rate_at(step: int, args: Args) -> float:
    """learning_rate, or with anneal_lr from learning_rate (at schedule_start) to 0 at total_timesteps: along a line,
    or a half cosine, whose steps in the last tenth of the run add up to a sixth of the line's (a policy stays put)."""
    if not args.anneal_lr:
        return args.learning_rate
    done = annealed(step, args)
    return args.learning_rate * ((1 - done) if args.lr_decay == "linear" else (1 + math.cos(math.pi * done)) / 2)


def extended(args: Args, step: int, total_timesteps: int) -> Args:
    """The arguments that train on from `step` to a new total_timesteps with no schedule jumping: epsilon reaches
    end_e at the same step as before; every other schedule goes from its value at `step` to its end at the new end."""
    if args.anneal_lr and step >= args.total_timesteps:
        fail(f"the run annealed its learning rate to 0 at step {step}, so training on would not learn: start a new "
             f"run with --total-timesteps {total_timesteps} (or train with --no-anneal-lr)")
    end_of_decay = args.exploration_fraction * args.total_timesteps
    return replace(args, total_timesteps=total_timesteps, schedule_start=step, start_e=epsilon_at(step, args),
                   exploration_fraction=end_of_decay / total_timesteps, learning_rate=learning_rate_at(step, args),
                   beta_start=args.beta_start + annealed(step, args) * (1.0 - args.beta_start))


def td_target(target_network: nn.Module, batch: TensorDict) -> torch.Tensor:
    """reward + discount * max_a Q_target(next_obs, a), with the n-step reward and discount stored."""
    next_q = target_network(batch["next_obs"]).max(dim=-1).values
    return batch["reward"] + batch["discount"] * next_q


def q_loss(q_network: nn.Module, target_network: nn.Module, batch: TensorDict, args: Args):
    """DQN: the TD loss of a batch (a pack: each seed's, [seeds]) weighted by importance, its Q-values and TD errors."""
    with torch.no_grad():
        target = td_target(target_network, batch)
    q = q_network(batch["obs"]).gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
    loss = chosen(args.loss, mse=F.mse_loss, huber=F.smooth_l1_loss)(q, target, reduction="none")
    return (batch["weight"] * loss).mean(-1), q.detach(), (q - target).detach()  # PER: weighted loss, TD errors


def make_update(q_network: nn.Module, target_network: nn.Module, optimizer: torch.optim.Optimizer, args: Args):
    """The gradient step, a closure of tensors (so torch.compile and CUDA graphs can wrap it): batch -> metrics."""
    seeds, parameters = args.num_seeds, list(q_network.parameters())

    def update(batch: TensorDict) -> TensorDict:
        loss, q, td_error = q_loss(q_network, target_network, batch, args)
        optimizer.zero_grad()
        loss.sum().backward()  # a pack: the sum, so each seed's gradient is its own loss's (Adam is per element)
        grad_norm = clip_grad_norm(parameters, args.max_grad_norm, seeds)  # a pack: each seed its own norm
        optimizer.step()
        return TensorDict(td_loss=loss.detach(), q_values=q.mean(-1), grad_norm=grad_norm, abs_td_error=td_error.abs())

    return update


def make_learner(update, rb, params: TensorDict, target_params: TensorDict, args: Args):
    """The learner's work of one loop iteration as one call, host ints in and tensors out (so a CUDA graph can take it
    whole): `steps` gradient steps on sampled batches, then `moves` target moves -> the last step's metrics."""

    tau = per_leaf(args.tau, params)  # a pack's members: each its own

    def learn(steps: int, moves: int) -> TensorDict | None:
        metrics = None
        for _ in range(steps):
            metrics = update(batch := rb.sample(args.batch_size))  # PER: drawn by priority, with weights
            rb.update_priority(batch["index"], metrics["abs_td_error"])  # PER: the new |TD errors|
        for _ in range(moves):  # DQN: the target trails the Q-network, once per interval crossed
            target_params.lerp_(params, tau)
        return metrics

    return learn

def check_args(args: Args) -> None:
    for name in ("buffer_size", "batch_size", "train_frequency", "gradient_steps",
                 "target_network_frequency", "n_step"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and 0 <= args.gamma <= 1 and args.batch_size <= args.buffer_size):
        fail(f"need tau in (0, 1], gamma in [0, 1] and batch_size <= buffer_size; got {args.tau}, {args.gamma}")
    if not (args.alpha >= 0 and 0 <= args.beta_start <= 1 and args.prio_eps > 0):
        fail(f"need alpha >= 0, 0 <= beta_start <= 1, prio_eps > 0: {args.alpha}, {args.beta_start}, {args.prio_eps}")


def main(args: Args) -> dict | list[dict]:
    run = Run(args, extended, check_args)  # the run directory, W&B, evaluations, checkpoints, signals: harness/
    args, device, seeds = run.args, run.device, run.seeds  # a pack (--num-seeds): tensors get a leading seed dim
    env = run.make_env()  # num_envs per seed: seed i's in rows i * num_envs ... (i + 1) * num_envs - 1
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        fail(f"DQN needs a discrete action space; {args.env} has {env.single_action_space} "
             "(use algos/ddpg.py for continuous actions)")

    # The target network lives on the meta device and reads target_params, a copy that one lerp_ moves.
    network = partial(QNetwork, env.single_observation_space, env.single_action_space)
    q_network = run.networks(network).to(device)
    params = from_module(q_network).data
    target_params = params.clone()
    with torch.device("meta"):
        target_network = run.networks(network)
    target_params.to_module(target_network)
    lr = torch.as_tensor(args.learning_rate, dtype=torch.float32, device=device)  # a tensor: CUDA graphs read it
    optimizer = run.adam(q_network.parameters(), lr=lr, eps=args.adam_eps,  # fused Adam; a pack's: lr, eps per member
                         capturable=args.cudagraphs and device.type == "cuda")
    frame_stack = 4 if is_atari(args.env) else 0  # Atari: replay stores each frame of the stacks once
    rb = PrioritizedReplayBuffer(args.buffer_size, args.alpha, args.beta_start, args.prio_eps, device, seeds,
                                 frame_stack, num_seeds=len(seeds))  # PER: a sum tree of priorities per seed
    nstep = NStepReturns(args.n_step, args.gamma, args.num_envs, num_seeds=len(seeds))
    recorder = TransitionRecorder(env.num_envs, clip_reward=is_atari(args.env))
    explore_rngs = run.generators()  # a NumPy generator per seed
    update = run.compiled(make_update(q_network, target_network, optimizer, args), rb)
    learn = run.graphed(make_learner(update, rb, params, target_params, args), rb)

    @torch.inference_mode()  # a little cheaper than no_grad: these tensors never meet autograd
    def act(obs: np.ndarray, epsilon: float, rngs: list[np.random.Generator]) -> np.ndarray:
        """Actions for all seeds' envs [seeds * envs], seed i's exploration drawn from rngs[i] alone."""
        envs = len(obs) // len(rngs)
        eps = np.broadcast_to(epsilon, (len(rngs), 1))  # DQN: epsilon-greedy (a pack: each member its own epsilon)
        explore = np.concatenate([rng.random(envs) < e for rng, e in zip(rngs, eps, strict=True)])
        actions = np.concatenate([rng.integers(env.single_action_space.n, size=envs) for rng in rngs])
        if not explore.all():  # the greedy actions, where not exploring
            greedy = q_network(run.rows(torch.as_tensor(obs, device=device))).argmax(-1).flatten().cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions

    # Everything a checkpoint holds; with --resume, run.start loads it back and continues where it stopped.
    parts = dict(env=env, rb=rb, q_network=q_network, target_params=target_params, optimizer=optimizer,
                 recorder=recorder, nstep=nstep, explore=explore_rngs)
    obs, (global_step, updates) = run.start(parts, (0, 0), policy=lambda obs, rngs: act(obs, args.eval_epsilon, rngs),
                                            model={"q_network": q_network})

    # Collect, store, learn. global_step counts environment steps over each seed's envs.
    while run.training(global_step):
        epsilon = run.each(epsilon_at, global_step)  # a pack's members: each its own schedule
        action = act(obs, epsilon, explore_rngs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        rb.extend(nstep.push(rb.add_frames(transitions)))
        obs = next_obs
        previous, global_step = global_step, global_step + args.num_envs
        run.episodes(global_step, finished, {"charts/epsilon": epsilon})

        if global_step > args.learning_starts and global_step - (args.n_step - 1) * args.num_envs >= args.batch_size:
            optimizer.param_groups[0]["lr"][...] = run.each(learning_rate_at, global_step)
            rb.beta = args.beta_start + annealed(global_step, args) * (1.0 - args.beta_start)  # PER: beta to 1
            steps = crossed(args.train_frequency, previous, global_step) * args.gradient_steps  # N envs: N x
            metrics = learn(steps, crossed(args.target_network_frequency, previous, global_step))
            for _ in range(crossed(100, updates, updates := updates + steps)):  # per 100 updates: the last's metrics
                run.log(global_step, {f"losses/{k}": v for k, v in metrics.items()}
                        | {"charts/beta": rb.beta})
        run.end_of_step(previous, global_step, obs, (global_step, updates))  # progress, evaluations, checkpoints
    return run.finish(obs, (global_step, updates))


if __name__ == "__main__":
    main(parse_args(Args, __doc__, ATARI_PRESET))
