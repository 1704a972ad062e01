"""DDPG: a deterministic actor climbs the gradient of a Q(s, a) critic learned off-policy from replay.

Lillicrap et al. 2016, "Continuous control with deep reinforcement learning", ICLR (arXiv:1509.02971).

Usage: python algos/ddpg.py   |   python algos/ddpg.py --config configs/ddpg/halfcheetah.yaml --track
"""

import difflib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import NoReturn

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
import yaml
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from tqdm import tqdm

from buffers import NStepReturns, ReplayBuffer, SeedStack, lambda_returns
from envs import RunningMeanStd, TransitionRecorder, check_video, env_seeds, env_state, evaluate, is_atari

from envs import load_env_state, make_vector_env  # isort: skip (one line each under 120 columns)

ALGO = Path(__file__).stem
ATARI_PRESET = None  # DDPG acts in continuous action spaces: no Atari


@dataclass
class Args:
    env: str = "Pendulum-v1"  # the environment id (continuous actions)
    total_timesteps: int = 15_000  # environment steps in all, summed over the parallel environments
    num_envs: int = 1  # parallel environments
    learning_rate: float = 1e-3  # Adam's learning rate, for the actor and the critic
    buffer_size: int = 100_000  # replay capacity in transitions
    gamma: float = 0.98  # discount factor
    tau: float = 0.005  # target update rate: each target moves this fraction of the way to its network
    batch_size: int = 64  # transitions per gradient step
    learning_starts: int = 1_000  # environment steps of uniform random actions before learning starts
    updates_per_step: float = 1.0  # critic gradient steps per environment step (update-to-data ratio; 0.5, 2 work)
    policy_frequency: int = 2  # critic updates per actor and target update (1: the paper; 2: TD3's delay)
    exploration_noise: float = 0.2  # noise scale sigma, as a fraction of the half action range
    ou_theta: float = 1.0  # the noise's mean reversion per step: 1 is Gaussian noise, 0.15 the paper's OU process
    normalize_obs: bool = False  # normalise observations by the running mean and std of the collected ones
    n_step: int = 1  # bootstrap from n-step returns (1: the one-step TD target)
    td_lambda: float | None = None  # train the critic on lambda-returns over replayed slices of td_lambda_steps steps
    td_lambda_steps: int = 8  # length of those slices (batch_size counts their steps)
    eval_frequency: int = 0  # environment steps between evaluations during training (0: only the final one)
    eval_episodes: int = 10  # episodes per evaluation
    stop_return: float | None = None  # stop once every seed's evaluation mean reaches this (needs eval_frequency)

    seed: int = 1  # seed of the run: networks, exploration, replay sampling and environments
    num_seeds: int = 1  # train seeds seed .. seed+num_seeds-1 in this process, each its own run (README: many seeds)
    exp_name: str = ALGO  # the name of this experiment, part of the run name
    run_name: str | None = None  # the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)
    config: str | None = None  # YAML file of argument defaults (keys: the names above); flags override it
    resume: str | None = None  # continue the run in this directory from its checkpoint (--total-timesteps may change)
    cuda: bool = True  # use CUDA when it is available
    threads: int = 1  # torch CPU threads (one is fastest for small networks)
    compile: bool = False  # torch.compile the updates
    cudagraphs: bool = False  # replay the updates as CUDA graphs (CUDA only)
    track: bool = False  # log to Weights & Biases (WANDB_MODE=offline works without an account)
    wandb_project_name: str = "offpolicy-zoo"  # the W&B project
    wandb_entity: str | None = None  # the W&B entity (team or user)
    wandb_group: str | None = None  # the W&B group (run.py sets one per launch so seeds are grouped)
    capture_video: bool = False  # record the final evaluation's first episode to <run dir>/videos/
    evaluate: str | None = None  # evaluate the networks of this run directory (see README: watch and evaluate)
    save_model: bool = True  # save the actor's, critic's and normaliser's state_dicts to <run dir>/model.pt
    checkpoint_frequency: int = 0  # environment steps between checkpoints (0: only on SIGTERM / Ctrl-C)


# ---- the algorithm ------------------------------------------------------------------------------------------


def mlp(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, outputs))


class Actor(nn.Module):
    """The deterministic policy: tanh squashed, then scaled and shifted to the action bounds."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.net = mlp(int(np.prod(observation_space.shape)), int(np.prod(action_space.shape)))
        high, low = (torch.as_tensor(b, dtype=torch.float32) for b in (action_space.high, action_space.low))
        self.register_buffer("action_scale", (high - low) / 2)  # buffers: they follow .to() and the state_dict
        self.register_buffer("action_bias", (high + low) / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # [seeds, batch, ...] -> [seeds, batch, action]
        return torch.addcmul(self.action_bias, torch.tanh(self.net(obs.float().flatten(2))), self.action_scale)


class QNetwork(nn.Module):
    """Q(s, a): one value per (observation, action) pair."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.net = mlp(int(np.prod(observation_space.shape)) + int(np.prod(action_space.shape)), 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # [seeds, batch]
        return self.net(torch.cat([obs.float().flatten(2), action.flatten(2)], dim=-1)).squeeze(-1)


class SeedLinear(nn.Module):
    """The nn.Linear of every seed of a pack, stacked: [seeds, batch, in] -> [seeds, batch, out], one baddbmm."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))  # [seeds, out, in]
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]).unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight.mT)


def stacked(network: Callable[[], nn.Module], seeds: list[int]) -> nn.Module:
    """Each seed's network, initialised as a run of that seed alone initialises it, as one module whose layers (and
    buffers, [seeds, 1, ...]) hold the seeds' tensors on a leading dimension: each seed its own network, in one pass."""
    networks = []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            networks.append(network())
    for name, layer in list(networks[0].named_modules()):
        if isinstance(layer, nn.Linear):
            networks[0].set_submodule(name, SeedLinear([network.get_submodule(name) for network in networks]))
    for name, _ in list(networks[0].named_buffers()):
        networks[0].register_buffer(name, torch.stack([network.get_buffer(name) for network in networks]).unsqueeze(1))
    return networks[0]


class ExplorationNoise:
    """Ornstein-Uhlenbeck noise per seed, env and action (dt = 1): x += -theta x + sigma N(0, 1); theta = 1: Gaussian.
    Seed i's rows, and its warm-up's uniform actions, come from its own generator."""

    def __init__(self, shape: tuple[int, ...], theta: float, sigma: np.ndarray | float, seeds: list[int]):
        self.theta, self.sigma, self.state = theta, sigma, np.zeros(shape)
        self.rngs = [np.random.default_rng(seed) for seed in seeds]

    def sample(self) -> np.ndarray:
        normal = np.array([rng.standard_normal(self.state.shape[1:]) for rng in self.rngs])
        self.state += -self.theta * self.state + self.sigma * normal
        return self.state.copy()

    def uniform(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        return np.array([rng.uniform(low, high, self.state.shape[1:]) for rng in self.rngs], np.float32)

    def reset(self, done: np.ndarray) -> None:
        self.state[done] = 0.0  # a new episode starts a new OU path: no correlation across episodes

    def state_dict(self) -> dict:
        return {"state": torch.from_numpy(self.state.copy()), "rngs": [rng.bit_generator.state for rng in self.rngs]}

    def load_state_dict(self, state: dict) -> None:
        self.state = state["state"].numpy().copy()
        for rng, rng_state in zip(self.rngs, state["rngs"], strict=True):
            rng.bit_generator.state = rng_state


def extended(args: Args, step: int, total_timesteps: int) -> Args:
    """Training on to a new total_timesteps: nothing in DDPG is scheduled over the run (noise and learning rate)."""
    return replace(args, total_timesteps=total_timesteps)


def make_updates(actor, qf, actor_target, qf_target, actor_optimizer, qf_optimizer, obs_norm, args: Args):
    """The critic's and the actor's gradient steps, closures of tensors (torch.compile and CUDA graphs wrap them)."""

    def update_critic(batch: TensorDict) -> TensorDict:
        """A step on each seed's squared TD error to r + d Q'(s', mu'(s')), for [seeds, B] transitions, or to
        lambda-returns for [seeds, B, L] slices."""
        flat = batch.flatten(1, 2) if batch.batch_dims == 3 else batch  # the one-step case skips the reshapes
        with torch.no_grad():  # DDPG: the target policy's action, valued by the target critic
            next_obs = obs_norm(flat["next_obs"])
            next_value = qf_target(next_obs, actor_target(next_obs))
            if batch.batch_dims == 2:
                target = flat["reward"] + flat["discount"] * next_value  # discount: 0 after a termination
            else:  # each of the seeds' slices [seeds * B, L] on its own
                s = batch.flatten(0, 1)
                target = lambda_returns(s["reward"], s["discount"], s["terminated"] | s["truncated"],
                                        next_value.view(s.shape), args.td_lambda).view(flat.shape)
        q = qf(obs_norm(flat["obs"]), flat["action"])
        loss = F.mse_loss(q, target, reduction="none").mean(1)  # each seed's
        qf_optimizer.zero_grad()
        loss.sum().backward()  # the sum: each seed's gradient is its own loss's, and Adam is per element
        qf_optimizer.step()
        return TensorDict(qf_loss=loss.detach(), qf_values=q.detach().mean(1))

    def update_actor(batch: TensorDict) -> TensorDict:
        """One step up the deterministic policy gradient -Q(obs, actor(obs)); inputs= keeps the critic's .grad out."""
        obs = obs_norm(batch["obs"].flatten(1, batch.batch_dims - 1))
        loss = -qf(obs, actor(obs)).mean(1)  # DDPG: the actor climbs the critic
        actor_optimizer.zero_grad()
        loss.sum().backward(inputs=list(actor.parameters()))
        actor_optimizer.step()
        return TensorDict(actor_loss=loss.detach())

    return update_critic, update_actor


def check_args(args: Args) -> None:
    for name in ("total_timesteps", "num_envs", "num_seeds", "threads", "buffer_size", "batch_size", "policy_frequency",
                 "n_step", "eval_episodes", "td_lambda_steps"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and 0 <= args.gamma <= 1 and args.batch_size <= args.buffer_size
            and args.updates_per_step > 0 and 0 < args.ou_theta <= 1):
        fail("need tau in (0, 1], gamma in [0, 1], batch_size <= buffer_size, updates_per_step > 0, ou_theta in (0, 1]")
    if args.td_lambda is not None and not (0 <= args.td_lambda <= 1 and args.n_step == 1
                                           and args.td_lambda_steps <= args.batch_size):
        fail(f"--td-lambda must be in [0, 1] with --n-step 1 and slices of --td-lambda-steps <= --batch-size, got "
             f"{args.td_lambda}, {args.n_step}, {args.td_lambda_steps} > {args.batch_size}")


def main(args: Args) -> dict:
    check_args(args)
    run = Run(args)  # the run directory, checkpoints, logging, signals: the plumbing at the end of this file
    args, device, seeds = run.args, run.device, run.seeds  # seeds: the runs of this process, rows of every tensor
    torch.set_flush_denormal(True)  # Adam's moments of dead units decay into subnormals: 2x slower steps on x86
    env = run.make_env()  # num_envs per seed: seed i's in rows i * num_envs ... (i + 1) * num_envs - 1
    if not isinstance(env.single_action_space, gym.spaces.Box):
        fail(f"DDPG needs a continuous (Box) action space; {args.env} has {env.single_action_space} "
             "(use algos/dqn.py for discrete actions)")

    # Networks and their targets: modules on the meta device reading target_params, a copy that one lerp_ moves.
    obs_space, action_space = env.single_observation_space, env.single_action_space
    actor = stacked(partial(Actor, obs_space, action_space), seeds).to(device)
    qf = stacked(partial(QNetwork, obs_space, action_space), seeds).to(device)
    params = TensorDict(actor=from_module(actor).data, qf=from_module(qf).data).lock_()  # locked: faster lerp_
    target_params = params.clone().lock_()
    with torch.device("meta"):
        actor_target = stacked(partial(Actor, obs_space, action_space), seeds)
        qf_target = stacked(partial(QNetwork, obs_space, action_space), seeds)
    target_params["actor"].to_module(actor_target)
    target_params["qf"].to_module(qf_target)
    capturable = args.cudagraphs and device.type == "cuda"
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
    qf_optimizer = torch.optim.Adam(qf.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
    obs_norm = RunningMeanStd((len(seeds), 1, *obs_space.shape), enabled=args.normalize_obs, batch_dim=1).to(device)
    rb = SeedStack([ReplayBuffer(args.buffer_size, device=device, seed=seed) for seed in seeds])  # a replay per seed
    nstep = SeedStack([NStepReturns(args.n_step, args.gamma, args.num_envs) for _ in seeds])
    recorder = TransitionRecorder(env.num_envs)
    noise = ExplorationNoise((len(seeds), args.num_envs, *action_space.shape), args.ou_theta,
                             args.exploration_noise * (action_space.high - action_space.low) / 2, seeds)
    update_critic, update_actor = make_updates(actor, qf, actor_target, qf_target, actor_optimizer, qf_optimizer,
                                               obs_norm, args)
    if args.compile:
        update_critic, update_actor = torch.compile(update_critic), torch.compile(update_actor)
    if args.cudagraphs and device.type == "cuda":
        update_critic = CudaGraphModule(update_critic, in_keys=[], out_keys=[], warmup=5)
        update_actor = CudaGraphModule(update_actor, in_keys=[], out_keys=[], warmup=5)

    @torch.inference_mode()  # a little cheaper than no_grad: these tensors never meet autograd
    def act(obs: np.ndarray) -> np.ndarray:  # [seeds, envs, ...] -> [seeds, envs, action]
        return actor(obs_norm(torch.as_tensor(obs, device=device).float())).cpu().numpy()

    def evaluation(video_dirs: list[str] | None = None, abort=None) -> list[list[float]]:
        """Each seed's episodes of its deterministic policy on envs seeded apart from training (seed + 10000)."""
        policies = [lambda obs, i=i: act(np.stack([obs] * len(seeds)))[i] for i in range(len(seeds))]
        return [evaluate(args.env, policies[i], args.eval_episodes, seed=seed + 10_000, abort=abort,
                         video_dir=video_dirs[i] if video_dirs else None) for i, seed in enumerate(seeds)]

    # Everything a checkpoint holds; with --resume, run.start loads it back and continues where it stopped.
    parts = dict(env=env, rb=rb, actor=actor, qf=qf, target_params=target_params, actor_optimizer=actor_optimizer,
                 qf_optimizer=qf_optimizer, obs_norm=obs_norm, nstep=nstep, recorder=recorder, noise=noise)
    obs, _ = env.reset(seed=env_seeds(seeds, args.num_envs))
    obs, (global_step, updates, credit, recent) = run.start(parts, obs, (0, 0, 0.0, []), evaluation)

    # Collect, store, learn. `credit` carries the part of an update left over (updates_per_step 0.5: every 2 steps).
    losses = {}
    while run.training(global_step):
        pack_obs = obs.reshape(len(seeds), args.num_envs, *obs.shape[1:])  # row i: seed i's envs
        obs_norm.update(torch.as_tensor(pack_obs))
        if global_step < args.learning_starts:
            action = noise.uniform(action_space.low, action_space.high)
        else:  # DDPG: the deterministic action plus exploration noise, kept in the action box
            action = np.clip(act(pack_obs) + noise.sample(), action_space.low, action_space.high).astype(np.float32)
        action = action.reshape(env.num_envs, *action_space.shape)
        next_obs, reward, terminated, truncated, info = env.step(action)
        transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        rb.extend(nstep.push(transitions))  # folded, discount gamma**m or 0
        noise.reset((terminated | truncated).reshape(len(seeds), args.num_envs))
        obs = next_obs
        previous, global_step = global_step, global_step + args.num_envs
        for episode in finished:
            recent = (recent + [episode["episodic_return"]])[-20:]
            run.log(global_step, {f"charts/{k}": v for k, v in episode.items() if k != "env"},
                    seed=episode["env"] // args.num_envs)

        if global_step > args.learning_starts and len(rb) >= args.batch_size:
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
                    target_params.lerp_(params, args.tau)
                if updates % 100 == 0:
                    run.log(global_step, {f"losses/{k}": v for m in (metrics, losses) for k, v in m.items()})
            credit -= int(credit)

        if crossed(1000, previous, global_step):
            run.progress(global_step, recent)
        if crossed(args.eval_frequency, previous, global_step):
            run.evaluate(global_step)  # ends training if the mean return reaches --stop-return
        if crossed(args.checkpoint_frequency, previous, global_step):
            run.checkpoint(obs, (global_step, updates, credit, recent))
    model = {"actor": actor.state_dict(), "qf": qf.state_dict(), "obs_norm": obs_norm.state_dict()}
    return run.finish(obs, (global_step, updates, credit, recent), model=model)


# ---- plumbing: the same in all four algorithm files (tests/test_plumbing.py keeps the copies equal) -----------


def crossed(every: int, previous: int, step: int) -> int:
    """How many multiples of `every` lie in (previous, step]: the periodic events due at this step (none if 0)."""
    return step // every - previous // every if every else 0


def fail(message: str) -> NoReturn:
    raise SystemExit(f"error: {message}")  # one line for the user, no traceback


def flags(values: dict) -> list[str]:
    """Command-line flags for a mapping of argument names to values (tyro spells booleans --x / --no-x)."""
    named = {str(key).replace("_", "-"): value for key, value in values.items()}
    return [flag for k, v in named.items() for flag in ([f"--{k}" if v else f"--no-{k}"] if isinstance(v, bool)
                                                        else [f"--{k}", str(v)])]


def config_flags(path: str) -> list[str]:
    """The flags of a YAML file of this script's arguments; a bad file or key is a one-line error."""
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        fail(f"cannot read config {path}: {e}")
    if not isinstance(values, dict):
        fail(f"cannot read config {path}: it must be a mapping of argument names to values")
    algo = values.pop("algo", ALGO)
    if algo != ALGO:
        fail(f"config {path} is for algos/{algo}.py, not {ALGO}.py (drop its algo key to use it anyway)")
    names = [field.name for field in fields(Args)]
    for key in [key for key in values if key not in names]:
        close = difflib.get_close_matches(str(key), names)
        fail(f"config {path}: unknown key {key!r} (closest: {', '.join(close) or 'none'}; see --help)")
    return flags(values)  # tyro checks each value's type


def parse_args(argv: list[str] | None = None) -> Args:
    """The command line after the flags of --config (or the Atari preset, or a resumed run's saved arguments),
    so that later flags win and tyro checks every name and type."""
    argv = [part for arg in (sys.argv[1:] if argv is None else argv)
            for part in (arg.split("=", 1) if arg.startswith("--") and "=" in arg else [arg])]
    if "--evaluate" in argv[:-1]:  # the run's own arguments, and only what an evaluation may change
        allowed = {"--evaluate", "--eval-episodes", "--eval-epsilon", "--seed", "--capture-video", "--track"}
        given = {arg.replace("--no-", "--") for arg in argv if arg.startswith("--")}
        if given - allowed:
            fail(f"--evaluate takes only {', '.join(sorted(allowed - {'--evaluate'}))}; got {sorted(given - allowed)}")
        return tyro.cli(Args, args=flags(run_config(argv[argv.index("--evaluate") + 1])) + argv)
    if "--resume" in argv:
        if len(argv) % 2 or set(argv[::2]) - {"--resume", "--total-timesteps"}:
            fail(f"--resume continues a run with its saved arguments; only --total-timesteps may change, got {argv}")
        return tyro.cli(Args, args=flags(load_checkpoint(argv[argv.index("--resume") + 1])["args"]) + argv)
    defaults = config_flags(argv[argv.index("--config") + 1]) if "--config" in argv[:-1] else []
    args = tyro.cli(Args, args=defaults + argv, description=__doc__)
    if ATARI_PRESET and "--config" not in argv and is_atari(args.env):
        print(f"{args.env} is an Atari game: using the Atari preset ({' '.join(flags(ATARI_PRESET))}); "
              "--config or flags override it")
        args = tyro.cli(Args, args=flags(ATARI_PRESET) + argv)
    return args


def run_config(run_dir: str) -> dict:
    """<run dir>/config.yaml, the arguments of a run of this algorithm (a run of another is a one-line error)."""
    try:
        values = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
        algo = values.pop("algo", None)
    except (OSError, yaml.YAMLError, AttributeError) as e:
        fail(f"cannot read the run's arguments in {Path(run_dir) / 'config.yaml'}: {e}")
    if algo != ALGO:
        fail(f"{run_dir} is a run of algos/{algo}.py, not {ALGO}.py: evaluate it with algos/{algo}.py")
    return values


def load_checkpoint(run_dir: str) -> dict:
    """<run dir>/checkpoint.pt, memory-mapped, as plain data (weights_only: a checkpoint cannot run code)."""
    try:
        state = torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True, mmap=True)
        if state["algo"] != ALGO:
            raise ValueError(f"it is a checkpoint of algos/{state['algo']}.py, not of {ALGO}.py")
    except Exception as e:  # missing, truncated, another algorithm's: torch raises several types
        fail(f"cannot resume from {Path(run_dir) / 'checkpoint.pt'}: {e}")
    return state


def seed_row(state, i: int):
    """Seed i's part of a pack's state_dict: row i of every tensor, kept as a seed dimension of 1 (a run of one)."""
    if isinstance(state, dict):
        return {key: seed_row(value, i) for key, value in state.items()}
    return state[i : i + 1] if isinstance(state, torch.Tensor) and state.ndim else state


def generators(state: tuple | None = None) -> tuple:
    """The global generators' states (Python, legacy NumPy, torch); with `state`, restore them first."""
    if state is not None:
        random.setstate(state[0])
        np.random.set_state((state[1][0], np.array(state[1][1], dtype=np.uint32), *state[1][2:]))
        torch.set_rng_state(state[2])
    legacy = np.random.get_state()
    return random.getstate(), (legacy[0], legacy[1].tolist(), *legacy[2:]), torch.get_rng_state()


class Run:
    """Around the algorithm: arguments, seeds and device; the run directory (config.yaml, metrics.jsonl, summary.json,
    checkpoint.pt, model.pt, videos/), W&B and the progress bar; evaluations; checkpoints; signals. SIGTERM or Ctrl-C
    ends the loop after its step (an evaluation cut short stays due) and checkpoints: --resume goes on bit for bit.
    A pack (--num-seeds N) is N runs, each with its own directory, metrics and W&B run; the first holds the checkpoint
    of them all."""

    def __init__(self, args: Args):
        for name in ("eval_frequency", "checkpoint_frequency"):
            if getattr(args, name) < 0:
                fail(f"--{name.replace('_', '-')} must be >= 0 (0: never), got {getattr(args, name)}")
        self.resumed = load_checkpoint(args.resume) if args.resume and not args.evaluate else None
        if args.evaluate:
            self.dir = Path(args.evaluate)
            run_config(args.evaluate)  # a run of this algorithm
            args, self.dirs = replace(args, num_seeds=1), [self.dir]  # a run directory holds one seed's networks
        elif self.resumed is not None:  # the run goes on in the directory named, wherever that is (a pack's beside)
            self.dir, step = Path(args.resume), self.resumed["counts"][0]
            self.dirs = [self.dir] + [self.dir.parent / name for name in self.resumed["dirs"][1:]]
            saved = self.resumed["args"]["total_timesteps"]
            args = replace(args, run_name=self.dir.name)
            if args.total_timesteps < step:
                fail(f"--total-timesteps {args.total_timesteps} is below the step the run reached, {step}")
            if args.total_timesteps != saved:  # train longer: schedules go on from here (see `extended`)
                args = extended(replace(args, total_timesteps=saved), step, args.total_timesteps)
        else:  # <env>__<exp_name>__<seed>__<time>, or --run-name ({seed} in it, or __<seed> after it, names each seed)
            stamp, seeds = int(time.time()), range(args.seed, args.seed + args.num_seeds)
            names = [f"{args.env.replace('/', '-')}__{args.exp_name}__{seed}__{stamp}" for seed in seeds]
            if args.run_name:
                name = args.run_name if "{seed}" in args.run_name or args.num_seeds == 1 else args.run_name + "__{seed}"
                names = [name.replace("{seed}", str(seed)) for seed in seeds]
            args = replace(args, run_name=args.run_name or names[0])
            self.dirs = [Path("runs") / name for name in names]
            self.dir = self.dirs[0]
            for directory in self.dirs:
                if directory.exists():
                    fail(f"run directory {directory} already exists; pick another --run-name or remove it")
        self.args, self.seeds = args, list(range(args.seed, args.seed + args.num_seeds))
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = True
        torch.set_num_threads(args.threads)
        self.device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
        self.signal, self.reached, self.wandb, self.due, self.last = None, False, None, None, None

    def make_env(self) -> gym.vector.VectorEnv:
        """The training envs; a bad id, or a video that could not be written, is refused before anything starts."""
        try:
            if self.args.capture_video:
                check_video(self.args.env)
            return make_vector_env(self.args.env, self.args.num_envs * len(self.seeds), self.args.seed)
        except (ValueError, RuntimeError, ImportError) as e:
            fail(str(e))

    def start(self, parts: dict, obs: np.ndarray, counts: tuple, evaluation) -> tuple[np.ndarray, tuple]:
        """Open the run directory; return the loop's (obs, counts), as given or as the checkpoint left them (every
        part restored; an evaluation it left due run first). `parts`: what a checkpoint saves; counts[0]: the step."""
        self.parts, self.evaluation, state = parts, evaluation, self.resumed
        if self.args.evaluate:
            self.load_networks()
            return obs, counts
        if state is not None:
            try:
                games = load_env_state(parts["env"], state["env"])  # None; Atari: new games (README: resume)
                for name, part in parts.items():  # new Atari games start no episode statistics nor n-step windows
                    if name == "env" or (games is not None and name in ("recorder", "nstep")):
                        continue
                    if isinstance(part, list):  # a generator per seed
                        for generator, generator_state in zip(part, state[name], strict=True):
                            generator.bit_generator.state = generator_state
                    else:  # the buffer adopts the memory-mapped storage: no second copy
                        part.load_state_dict(state[name], **({"copy": False} if name == "rb" else {}))
                generators(state["generators"])
            except (KeyError, ValueError, RuntimeError) as e:
                fail(f"cannot resume from {self.dir}: {e}")
            obs, counts = (state["obs"].numpy() if games is None else games), state["counts"]
            self.due, self.last = state["due"], state["last"]
        configs = [asdict(self.args) | {"seed": seed, "run_name": path.name}
                   for seed, path in zip(self.seeds, self.dirs, strict=True)]
        self.metrics, sizes = [], state["metrics_bytes"] if state else [0] * len(self.dirs)
        for config, path, size in zip(configs, self.dirs, sizes, strict=True):
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.yaml").write_text(yaml.safe_dump({"algo": ALGO, **config}, sort_keys=False))
            self.metrics.append(open(path / "metrics.jsonl", "a", buffering=1))  # noqa: SIM115 (closed in finish)
            self.metrics[-1].truncate(size)  # drop what came after the checkpoint
        if self.args.track:  # a resumed W&B run is rewound to the checkpoint (synced later when offline)
            import wandb

            ids, self.wandb, self.video = state["wandb_ids"] if state else [None] * len(self.dirs), [], wandb.Video
            for config, path, run_id in zip(configs, self.dirs, ids or [None] * len(self.dirs), strict=True):
                rewind = {"resume_from": f"{run_id}?_step={counts[0]}"} if run_id else {}
                self.wandb.append(wandb.init(project=self.args.wandb_project_name, entity=self.args.wandb_entity,
                                             **rewind, group=self.args.wandb_group, name=path.name, config=config,
                                             dir=str(path), save_code=True, reinit="create_new"))
        pack = f" (and {len(self.dirs) - 1} more seeds beside it)" if len(self.dirs) > 1 else ""
        print(f"{'resuming' if state else 'run'} {self.dir}{pack} on {self.device}, settings in "
              f"{self.dir / 'config.yaml'}")
        self.bar = tqdm(total=self.args.total_timesteps, initial=counts[0], unit="step", mininterval=1.0,
                        disable=not sys.stderr.isatty())
        self.handlers = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.start_time, self.start_step, self.eval_time = time.time(), counts[0], 0.0
        if self.due is not None:
            self.evaluate(self.due)
        return obs, counts

    def on_signal(self, signum: int, _frame) -> None:
        self.signal = self.signal or signal.Signals(signum).name

    def training(self, step: int) -> bool:
        return step < self.args.total_timesteps and not (self.signal or self.reached or self.args.evaluate)

    def log(self, step: int, metrics: dict, seed: int | None = None) -> None:
        """A record for each seed: a list or tensor value holds one entry per seed, anything else is every seed's;
        `seed`: for that seed (its row in the pack) alone."""
        metrics = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        for i in range(len(self.dirs)) if seed is None else [seed]:
            record = {"global_step": step, **{k: float(v[i] if isinstance(v, list) else v) for k, v in metrics.items()}}
            self.metrics[i].write(json.dumps(record) + "\n")
            if self.wandb is not None:
                self.wandb[i].log(record, step=step)

    def progress(self, step: int, recent: list[float]) -> None:
        sps = (step - self.start_step) / (time.time() - self.start_time - self.eval_time)
        self.log(step, {"charts/SPS": sps})
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(SPS=f"{sps:.0f}", recent_return=f"{np.mean(recent):.1f}" if recent else "-")

    def evaluate(self, step: int, video: bool = False) -> None:
        """The evaluation due at `step`, logged once; a signal cuts it short and leaves it due (see start)."""
        self.due, tick, logged = step, time.time(), self.last is not None and self.last[0] == step
        try:
            returns = self.evaluation(video_dirs=[str(path / "videos") for path in self.dirs] if video else None,
                                      abort=lambda: self.signal is not None)
        except KeyboardInterrupt:
            return
        finally:
            self.eval_time += time.time() - tick
        self.due, self.last = None, (step, returns)
        if not logged:  # a final evaluation at the step of a periodic one is that one (run again for a video)
            self.log(step, {"eval/episodic_return": [np.mean(seed_returns) for seed_returns in returns]})
        self.reached = self.args.stop_return is not None and min(map(np.mean, returns)) >= self.args.stop_return

    def checkpoint(self, obs: np.ndarray, counts: tuple) -> None:
        """checkpoint.pt: all the loop needs to go on bit for bit; written, synced, then renamed into place."""
        for metrics in self.metrics:
            metrics.flush()
            os.fsync(metrics.fileno())
        state = {"algo": ALGO, "args": asdict(self.args), "counts": counts, "obs": torch.as_tensor(obs),
                 "due": self.due, "last": self.last, "wandb_ids": [w.id for w in self.wandb] if self.wandb else None,
                 "metrics_bytes": [metrics.tell() for metrics in self.metrics], "generators": generators(),
                 "dirs": [path.name for path in self.dirs]}
        for name, part in self.parts.items():
            is_generators = isinstance(part, list)
            state[name] = [g.bit_generator.state for g in part] if is_generators else env_state(part) if name == "env" \
                else part.state_dict()
        with open(self.dir / "checkpoint.tmp", "wb") as f:
            torch.save(state, f)
            os.fsync(f.fileno())
        os.replace(self.dir / "checkpoint.tmp", self.dir / "checkpoint.pt")
        directory = os.open(self.dir, os.O_RDONLY)  # a crash after the rename keeps it once the directory is synced
        os.fsync(directory)
        os.close(directory)

    def load_networks(self) -> None:
        """--evaluate: the networks from model.pt, or from checkpoint.pt when the run saved no model."""
        networks = {name: part for name, part in self.parts.items() if isinstance(part, nn.Module)}
        summary = self.dir / "summary.json"
        self.step = json.loads(summary.read_text())["global_step"] if summary.exists() else None
        try:
            if not (self.dir / "model.pt").exists() and not (self.dir / "checkpoint.pt").exists():
                fail(f"{self.dir} has no model.pt nor checkpoint.pt: nothing to evaluate")
            if (self.dir / "model.pt").exists():
                self.source, model = "model.pt", torch.load(self.dir / "model.pt", weights_only=True)
                model = model if set(model) == set(networks) else {name: model for name in networks}  # one network
            else:  # the pack's first seed, row 0
                self.source, model = "checkpoint.pt", load_checkpoint(str(self.dir))
                self.step, model = model["counts"][0], seed_row(model, 0)
            for name, network in networks.items():
                network.load_state_dict(model[name])
        except (OSError, KeyError, RuntimeError) as e:
            fail(f"cannot load the networks of {self.dir} from {self.source}: {e}")

    def reevaluate(self) -> dict:
        """--evaluate: one record, evaluations/<time>.json (settings and every episode's return), the video beside
        it; the run directory is otherwise left as it was."""
        args, start = self.args, time.time()
        out, stamp = self.dir / "evaluations", f"{start:.3f}"
        out.mkdir(exist_ok=True)
        video = out / f"{stamp}-video" if args.capture_video else None
        returns = self.evaluation(video_dirs=[str(video)] if video else None)[0]
        mean, std = float(np.mean(returns)), float(np.std(returns, ddof=1)) if len(returns) > 1 else 0.0
        record = {"run": str(self.dir), "networks": self.source, "global_step": self.step, "seed": args.seed,
                  "eval_episodes": args.eval_episodes, "eval_epsilon": getattr(args, "eval_epsilon", None),
                  "returns": returns, "mean": mean, "std": std, "video": None, "time": stamp}
        if video is not None:  # env 0's first episode: the first return
            record["video"] = f"{stamp}-episode-0-return-{returns[0]:g}.mp4"
            os.replace(video / "eval-episode-0.mp4", out / record["video"])
            video.rmdir()
        (out / f"{stamp}.json").write_text(json.dumps(record, indent=2))
        if args.track:  # into the run's own W&B run
            import wandb

            ids = [path.name.rsplit("-", 1)[-1] for path in sorted((self.dir / "wandb").glob("*run-*-*"))]
            run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, id=ids[-1] if ids else None,
                             resume="allow", dir=str(self.dir))
            run.log({"evaluate/return_mean": mean, "evaluate/return_std": std}
                    | ({"evaluate/video": wandb.Video(str(out / record["video"]))} if video else {}))
            run.finish()
        self.parts["env"].close()
        print(f"final evaluation: {mean:.1f} ± {std:.1f} over {len(returns)} episodes | {self.step} steps | "
              f"{time.time() - start:.0f} s | {out / (stamp + '.json')}")
        return record

    def finish(self, obs: np.ndarray, counts: tuple, model: dict) -> dict | list[dict]:
        """The final evaluation, a checkpoint (when stopped or checkpointing), each seed's model.pt, summary.json and
        line; returns the summary (a list of them for a pack)."""
        if self.args.evaluate:
            return self.reevaluate()
        args, step, train_time = self.args, counts[0], time.time() - self.start_time - self.eval_time
        if self.signal is None and (self.last is None or self.last[0] != step or args.capture_video):
            self.evaluate(step, video=args.capture_video)
        if self.signal is not None or args.checkpoint_frequency:  # after the loop's own at this step, which a kill
            self.checkpoint(obs, counts)  # during the final evaluation falls back to; this one holds its returns
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        self.parts["env"].close()
        if self.signal is not None:
            print(f"stopped by {self.signal} at step {step}; continue: python {sys.argv[0]} --resume {self.dir}")
        self.bar.close()
        summaries = []
        for i, (seed, path) in enumerate(zip(self.seeds, self.dirs, strict=True)):
            if args.save_model:
                torch.save(seed_row(model, i), path / "model.pt")
            returns = self.last[1][i] if self.signal is None else []  # a stopped run has no final evaluation
            std = np.std(returns, ddof=1) if len(returns) > 1 else 0.0
            mean, std = (np.mean(returns), std) if returns else (None, None)
            summary = {"run_name": path.name, "env": args.env, "algo": args.exp_name, "seed": seed,
                       "eval_return_mean": mean, "eval_return_std": std, "eval_episodes": len(returns),
                       "eval_returns": returns, "global_step": step, "updates": counts[1],
                       "interrupted": bool(self.signal), "train_sps": (step - self.start_step) / max(train_time, 1e-9),
                       "wall_time_s": time.time() - self.start_time, "num_seeds": len(self.seeds)}
            (path / "summary.json").write_text(json.dumps(summary, indent=2))
            summaries.append(summary)
            self.metrics[i].close()
            if self.wandb is not None:
                video = path / "videos" / "eval-episode-0.mp4"
                if video.exists():
                    self.wandb[i].log({"media/video": self.video(str(video))}, step=step)
                self.wandb[i].summary.update({k: v for k, v in summary.items() if not isinstance(v, list)})
                self.wandb[i].finish()
            result = f"{mean:.1f} ± {std:.1f} over {len(returns)} episodes" if returns else "none"
            print(f"final evaluation: {result} | {step} steps | {summary['wall_time_s']:.0f} s | {path}")
        return summaries[0] if len(summaries) == 1 else summaries


if __name__ == "__main__":
    main(parse_args())
