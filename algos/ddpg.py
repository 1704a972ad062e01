"""DDPG: a deterministic actor climbs the gradient of a Q(s, a) critic learned off-policy from replay.

Lillicrap et al. 2016, "Continuous control with deep reinforcement learning", ICLR (arXiv:1509.02971).

Usage: python algos/ddpg.py   |   python algos/ddpg.py --config configs/ddpg/halfcheetah.yaml --track
"""

from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict, from_module

from buffers import NStepReturns, ReplayBuffer, lambda_returns
from envs import RunningMeanStd, TransitionRecorder
from harness import Packable, Run, RunArgs, fail, parse_args, per_leaf


@dataclass
class Args(RunArgs):
    env: str = "Pendulum-v1"  # the environment id (continuous actions)
    total_timesteps: int = 20_000  # environment steps of each seed, summed over its parallel environments
    learning_rate: Packable[float] = 1e-3  # Adam's learning rate, for the actor and the critic
    buffer_size: int = 100_000  # replay capacity in transitions
    gamma: Packable[float] = 0.99  # discount factor
    tau: Packable[float] = 0.005  # target update rate: each target moves this fraction of the way to its network
    batch_size: int = 64  # transitions per gradient step
    learning_starts: int = 1_000  # environment steps of uniform random actions before learning starts
    updates_per_step: float = 1.0  # critic gradient steps per environment step (update-to-data ratio; 0.5, 2 work)
    policy_frequency: int = 2  # critic updates per actor and target update (1: the paper; 2: TD3's delay)
    exploration_noise: Packable[float] = 0.2  # noise scale sigma, as a fraction of the half action range
    ou_theta: Packable[float] = 1.0  # the noise's mean reversion per step: 1 is Gaussian noise, 0.15 the paper's OU
    normalize_obs: bool = False  # normalise observations by the running mean and std of the collected ones
    n_step: int = 1  # bootstrap from n-step returns (1: the one-step TD target)
    td_lambda: Packable[float | None] = None  # train the critic on lambda-returns of replayed slices of steps
    td_lambda_steps: int = 8  # length of those slices (batch_size counts their steps)
    save_model: bool = True  # save the actor's, critic's and normaliser's state_dicts to <run dir>/model.pt


def mlp(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, outputs))


class Actor(nn.Module):
    """The deterministic policy: tanh squashed, then scaled and shifted to the action bounds."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.obs_dims = len(observation_space.shape)
        self.net = mlp(int(np.prod(observation_space.shape)), int(np.prod(action_space.shape)))
        high, low = (torch.as_tensor(b, dtype=torch.float32) for b in (action_space.high, action_space.low))
        self.register_buffer("action_scale", (high - low) / 2)  # buffers: they follow .to() and the state_dict
        self.register_buffer("action_bias", (high + low) / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # [batch, *obs_shape] -> [batch, action]
        return torch.addcmul(self.action_bias, torch.tanh(self.net(obs.float().flatten(-self.obs_dims))),
                             self.action_scale)


class QNetwork(nn.Module):
    """Q(s, a): one value per (observation, action) pair."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.obs_dims = len(observation_space.shape)
        self.net = mlp(int(np.prod(observation_space.shape)) + int(np.prod(action_space.shape)), 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # -> [batch]
        return self.net(torch.cat([obs.float().flatten(-self.obs_dims), action], dim=-1)).squeeze(-1)


class ExplorationNoise:
    """Ornstein-Uhlenbeck noise per env and action (dt = 1): x += -theta x + sigma N(0, 1); theta = 1 is Gaussian
    noise. A pack's rows are seed by seed (num_envs each), and seed i's draws, its warm-up's uniform actions
    included, come from its own generator; theta and sigma are one, or one per seed ([seeds, 1 or action])."""

    def __init__(self, shape: tuple[int, ...], theta: np.ndarray, sigma: np.ndarray, rngs: list):
        self.rows = (shape[0] // len(rngs), *shape[1:])  # each seed's
        self.theta, self.sigma = (np.repeat(x, self.rows[0], axis=0) if np.ndim(x) == 2 else x for x in (theta, sigma))
        self.state, self.rngs = np.zeros(shape), rngs

    def sample(self) -> np.ndarray:
        self.state += -self.theta * self.state + self.sigma * np.concatenate(
            [rng.standard_normal(self.rows) for rng in self.rngs])
        return self.state.copy()

    def uniform(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        return np.concatenate([rng.uniform(low, high, self.rows) for rng in self.rngs]).astype(np.float32)

    def reset(self, done: np.ndarray) -> None:
        self.state[done] = 0.0  # a new episode starts a new OU path: no correlation across episodes

    def state_dict(self) -> dict:
        return {"state": torch.from_numpy(self.state.copy()), "rngs": [rng.bit_generator.state for rng in self.rngs]}

    def load_state_dict(self, state: dict) -> None:
        self.state = state["state"].numpy().copy()
        for rng, rng_state in zip(self.rngs, state["rngs"], strict=True):
            rng.bit_generator.state = rng_state


def make_updates(actor, qf, actor_target, qf_target, actor_optimizer, qf_optimizer, obs_norm, args: Args):
    """The critic's and the actor's gradient steps, closures of tensors (torch.compile and CUDA graphs wrap them)."""

    def steps(batch: TensorDict) -> TensorDict:
        """The transitions of a batch, lambda slices [..., B, L] as [..., B * L] (the one-step case as it is)."""
        return batch if args.td_lambda is None else batch.reshape(*batch.shape[:-2], -1)

    def update_critic(batch: TensorDict) -> TensorDict:
        """A step on the squared TD error to r + d Q'(s', mu'(s')) (a pack: each seed's), or to lambda-returns for
        slices of consecutive steps."""
        flat = steps(batch)
        with torch.no_grad():  # DDPG: the target policy's action, valued by the target critic
            next_obs = obs_norm(flat["next_obs"])
            next_value = qf_target(next_obs, actor_target(next_obs))
            if args.td_lambda is None:
                target = flat["reward"] + flat["discount"] * next_value  # discount: 0 after a termination
            else:  # each slice [..., B, L] on its own
                target = lambda_returns(batch["reward"], batch["discount"], batch["terminated"] | batch["truncated"],
                                        next_value.view(batch.shape), args.td_lambda).view(flat.shape)
        q = qf(obs_norm(flat["obs"]), flat["action"])
        loss = F.mse_loss(q, target, reduction="none").mean(-1)
        qf_optimizer.zero_grad()
        loss.sum().backward()  # a pack: the sum, so each seed's gradient is its own loss's (Adam is per element)
        qf_optimizer.step()
        return TensorDict(qf_loss=loss.detach(), qf_values=q.detach().mean(-1))

    def update_actor(batch: TensorDict) -> TensorDict:
        """One step up the deterministic policy gradient -Q(obs, actor(obs)); inputs= keeps the critic's .grad out."""
        obs = obs_norm(steps(batch)["obs"])
        loss = -qf(obs, actor(obs)).mean(-1)  # DDPG: the actor climbs the critic
        actor_optimizer.zero_grad()
        loss.sum().backward(inputs=list(actor.parameters()))
        actor_optimizer.step()
        return TensorDict(actor_loss=loss.detach())

    return update_critic, update_actor


def check_args(args: Args) -> None:
    for name in ("buffer_size", "batch_size", "policy_frequency", "n_step", "td_lambda_steps"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and 0 <= args.gamma <= 1 and args.batch_size <= args.buffer_size
            and args.updates_per_step > 0 and 0 < args.ou_theta <= 1):
        fail("need tau in (0, 1], gamma in [0, 1], batch_size <= buffer_size, updates_per_step > 0, ou_theta in (0, 1]")
    if args.td_lambda is not None and not (0 <= args.td_lambda <= 1 and args.n_step == 1
                                           and args.td_lambda_steps <= args.batch_size):
        fail(f"--td-lambda must be in [0, 1] with --n-step 1 and slices of --td-lambda-steps <= --batch-size, got "
             f"{args.td_lambda}, {args.n_step}, {args.td_lambda_steps} > {args.batch_size}")


def main(args: Args) -> dict | list[dict]:
    run = Run(args, check=check_args)  # the run directory, W&B, evaluations, checkpoints, signals: harness/
    args, device, seeds = run.args, run.device, run.seeds  # a pack (--num-seeds): tensors get a leading seed dim
    env = run.make_env()  # num_envs per seed: seed i's in rows i * num_envs ... (i + 1) * num_envs - 1
    if not isinstance(env.single_action_space, gym.spaces.Box):
        fail(f"DDPG needs a continuous (Box) action space; {args.env} has {env.single_action_space} "
             "(use algos/dqn.py for discrete actions)")

    # Networks and their targets: modules on the meta device reading target_params, a copy that one lerp_ moves.
    obs_space, action_space = env.single_observation_space, env.single_action_space
    actor = run.networks(partial(Actor, obs_space, action_space)).to(device)
    qf = run.networks(partial(QNetwork, obs_space, action_space)).to(device)
    params = TensorDict(actor=from_module(actor).data, qf=from_module(qf).data).lock_()  # locked: faster lerp_
    target_params, tau = params.clone().lock_(), per_leaf(args.tau, params)  # a pack's tau: each member's
    with torch.device("meta"):
        actor_target = run.networks(partial(Actor, obs_space, action_space))
        qf_target = run.networks(partial(QNetwork, obs_space, action_space))
    target_params["actor"].to_module(actor_target)
    target_params["qf"].to_module(qf_target)
    capturable = args.cudagraphs and device.type == "cuda"
    actor_optimizer = run.adam(actor.parameters(), lr=args.learning_rate, capturable=capturable)  # fused Adam
    qf_optimizer = run.adam(qf.parameters(), lr=args.learning_rate, capturable=capturable)
    obs_norm = run.networks(partial(RunningMeanStd, obs_space.shape, enabled=args.normalize_obs)).to(device)
    rb = ReplayBuffer(args.buffer_size, device=device, seed=seeds, num_seeds=len(seeds))  # each seed its own
    nstep = NStepReturns(args.n_step, args.gamma, args.num_envs, num_seeds=len(seeds))
    recorder = TransitionRecorder(env.num_envs)
    sigma = np.asarray(run.each("exploration_noise"), np.float32) * (action_space.high - action_space.low) / 2
    noise = ExplorationNoise((env.num_envs, *action_space.shape), np.asarray(run.each("ou_theta")), sigma,
                             run.generators())  # a pack's members: each its own sigma and theta, [seeds, 1]
    update_critic, update_actor = map(run.compiled, make_updates(actor, qf, actor_target, qf_target, actor_optimizer,
                                                                 qf_optimizer, obs_norm, args))

    @torch.inference_mode()  # a little cheaper than no_grad: these tensors never meet autograd
    def act(obs: np.ndarray) -> np.ndarray:  # all seeds' envs [seeds * envs, ...] -> [seeds * envs, *action_shape]
        action = actor(obs_norm(run.rows(torch.as_tensor(obs, device=device).float())))
        return action.reshape(len(obs), *action_space.shape).cpu().numpy()

    # Everything a checkpoint holds; with --resume, run.start loads it back and continues where it stopped.
    parts = dict(env=env, rb=rb, actor=actor, qf=qf, target_params=target_params, actor_optimizer=actor_optimizer,
                 qf_optimizer=qf_optimizer, obs_norm=obs_norm, nstep=nstep, recorder=recorder, noise=noise)
    obs, (global_step, updates, credit) = run.start(parts, (0, 0, 0.0), policy=lambda obs, rngs: act(obs),
                                                    model={"actor": actor, "qf": qf, "obs_norm": obs_norm})

    # Collect, store, learn. `credit` carries the part of an update left over (updates_per_step 0.5: every 2 steps).
    losses = {}
    while run.training(global_step):
        obs_norm.update(run.rows(torch.as_tensor(obs)))
        if global_step < args.learning_starts:
            action = noise.uniform(action_space.low, action_space.high)
        else:  # DDPG: the deterministic action plus exploration noise, kept in the action box
            action = np.clip(act(obs) + noise.sample(), action_space.low, action_space.high).astype(np.float32)
        next_obs, reward, terminated, truncated, info = env.step(action)
        transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        rb.extend(nstep.push(transitions))  # folded, discount gamma**m or 0
        noise.reset(terminated | truncated)
        obs = next_obs
        previous, global_step = global_step, global_step + args.num_envs
        run.episodes(global_step, finished)

        closed = global_step - (args.n_step - 1) * args.num_envs  # n-step windows closed whatever the episodes did
        if global_step > args.learning_starts and closed >= args.batch_size:  # (so each seed of a pack as alone)
            credit += args.num_envs * args.updates_per_step
            for _ in range(int(credit)):
                if args.td_lambda is None:
                    batch = rb.sample(args.batch_size)
                else:  # slices of one env's consecutive steps, for the lambda-returns
                    slices = args.batch_size // args.td_lambda_steps
                    batch = rb.sample_slices(slices, args.td_lambda_steps, args.num_envs)
                metrics = update_critic(batch)
                updates += 1
                if updates % args.policy_frequency == 0:  # DDPG (TD3's delay): the actor and the targets trail
                    losses = update_actor(batch)
                    target_params.lerp_(params, tau)
                if updates % 100 == 0:
                    run.log(global_step, {f"losses/{k}": v for m in (metrics, losses) for k, v in m.items()})
            credit -= int(credit)
        run.end_of_step(previous, global_step, obs, (global_step, updates, credit))  # progress, evaluations, ...
    return run.finish(obs, (global_step, updates, credit))


if __name__ == "__main__":
    main(parse_args(Args, __doc__))
