"""DQN: Q-learning from a replay buffer, with a target network that trails the Q-network.

Mnih et al. 2015, "Human-level control through deep reinforcement learning", Nature 518:529.

Usage: python algos/dqn.py   |   python algos/dqn.py --env PongNoFrameskip-v4   |   python algos/dqn.py --help

An Atari id without --config trains with ATARI_PRESET (printed at the start); --config and flags override it.
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
from typing import Literal, NoReturn

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

from buffers import ReplayBuffer, SeedStack
from envs import (
    TransitionRecorder,
    check_video,
    env_seeds,
    env_state,
    evaluate,
    is_atari,
    load_env_state,
    make_vector_env,
)

ALGO = Path(__file__).stem
# Atari ids without --config: the Nature-DQN recipe (Mnih et al. 2015) as CleanRL's dqn_atari.py runs it, with the
# Huber loss of the paper's error clipping and the paper's evaluation epsilon of 0.05.
ATARI_PRESET = dict(learning_rate=1e-4, batch_size=32, gradient_steps=1, target_network_frequency=1000, start_e=1.0,
                    exploration_fraction=0.1, anneal_lr=False,
                    total_timesteps=10_000_000, buffer_size=1_000_000, learning_starts=80_000, train_frequency=4,
                    end_e=0.01, loss="huber", eval_epsilon=0.05, eval_frequency=250_000, checkpoint_frequency=500_000)


@dataclass
class Args:
    env: str = "CartPole-v1"  # the environment id (an Atari id without --config gets the Atari preset)
    total_timesteps: int = 100_000  # environment steps in all, summed over the parallel environments
    num_envs: int = 1  # parallel environments
    learning_rate: float = 1e-3  # Adam's learning rate
    anneal_lr: bool = True  # decay the learning rate linearly to 0 at the end of training, so the final policy settles
    buffer_size: int = 100_000  # replay capacity in transitions
    gamma: float = 0.99  # discount factor
    tau: float = 1.0  # target update rate: 1 copies the Q-network, less moves the target that fraction of the way
    target_network_frequency: int = 250  # environment steps between target updates
    batch_size: int = 64  # transitions per gradient step
    start_e: float = 1.0  # exploration epsilon at the start
    end_e: float = 0.02  # exploration epsilon at the end of the schedule
    exploration_fraction: float = 0.1  # fraction of total_timesteps over which epsilon falls from start_e to end_e
    learning_starts: int = 1000  # environment steps of experience before learning starts
    train_frequency: int = 4  # environment steps between training rounds
    gradient_steps: int = 1  # gradient steps in each training round
    loss: Literal["mse", "huber"] = "huber"  # TD loss: squared error or Huber (smooth L1)
    max_grad_norm: float = 10.0  # clip the gradient to this global norm
    eval_frequency: int = 10_000  # environment steps between evaluations during training (0: only the final one)
    eval_episodes: int = 10  # episodes per evaluation
    eval_epsilon: float = 0.0  # exploration epsilon during evaluation
    stop_return: float | None = None  # stop once every seed's evaluation mean reaches this (needs eval_frequency)

    seed: int = 1  # seed of the run: networks, exploration, replay sampling and environments
    num_seeds: int = 1  # train seeds seed .. seed+num_seeds-1 in this process, each its own run (README: many seeds)
    exp_name: str = ALGO  # the name of this experiment, part of the run name
    run_name: str | None = None  # the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)
    config: str | None = None  # YAML file of argument defaults (keys: the names above); flags override it
    resume: str | None = None  # continue the run in this directory from its checkpoint (--total-timesteps may change)
    schedule_start: int = 0  # the step the schedules start from (an extending --resume sets it, see README)
    cuda: bool = True  # use CUDA when it is available
    threads: int = 1  # torch CPU threads (one is fastest for small networks; raise it for CNNs on a CPU)
    compile: bool = False  # torch.compile the update
    cudagraphs: bool = False  # replay the update as a CUDA graph (CUDA only)
    track: bool = False  # log to Weights & Biases (WANDB_MODE=offline works without an account)
    wandb_project_name: str = "offpolicy-zoo"  # the W&B project
    wandb_entity: str | None = None  # the W&B entity (team or user)
    wandb_group: str | None = None  # the W&B group (run.py sets one per launch so seeds are grouped)
    capture_video: bool = False  # record the final evaluation's first episode to <run dir>/videos/
    evaluate: str | None = None  # evaluate the networks of this run directory (see README: watch and evaluate)
    save_model: bool = True  # save the Q-network's state_dict to <run dir>/model.pt (--evaluate reads it)
    checkpoint_frequency: int = 0  # environment steps between checkpoints (0: only on SIGTERM / Ctrl-C)


# ---- the algorithm ------------------------------------------------------------------------------------------


class QNetwork(nn.Module):
    """Q-values for every action: the Nature-DQN CNN for uint8 image stacks, an MLP otherwise."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        shape, actions = observation_space.shape, int(action_space.n)
        self.image = len(shape) == 3 and observation_space.dtype == np.uint8  # (frames, height, width) pixels
        if self.image:
            conv = nn.Sequential(nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                 nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(2))
            features = conv[:-1](torch.zeros(1, *shape)).numel()
            self.net = nn.Sequential(conv, nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, actions))
        else:
            self.net = nn.Sequential(nn.Linear(int(np.prod(shape)), 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # [seeds, batch, ...] -> [seeds, batch, actions]
        return self.net(obs.float() / 255.0 if self.image else obs.float().flatten(2))


class SeedLinear(nn.Module):
    """The nn.Linear of every seed of a pack, stacked: [seeds, batch, in] -> [seeds, batch, out], one baddbmm."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))  # [seeds, out, in]
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]).unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight.mT)


class SeedConv2d(nn.Module):
    """The nn.Conv2d of every seed, stacked: [seeds, batch, C, H, W] in and out, the seeds as groups of channels."""

    def __init__(self, layers: list[nn.Conv2d]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))  # [seeds, out, in, k, k]
        self.bias, self.stride = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers])), layers[0].stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seeds = x.shape[0]
        x = F.conv2d(x.transpose(0, 1).flatten(1, 2), self.weight.flatten(0, 1), self.bias.flatten(), self.stride,
                     groups=seeds)
        return x.unflatten(1, (seeds, -1)).transpose(0, 1)


def stacked(network: Callable[[], nn.Module], seeds: list[int]) -> nn.Module:
    """Each seed's network, initialised as a run of that seed alone initialises it, as one module whose layers hold
    the seeds' parameters on a leading dimension: every seed is its own network, computed in one pass."""
    networks = []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            networks.append(network())
    for name, layer in list(networks[0].named_modules()):
        if isinstance(layer, nn.Linear | nn.Conv2d):
            seed_layer = SeedLinear if isinstance(layer, nn.Linear) else SeedConv2d
            networks[0].set_submodule(name, seed_layer([network.get_submodule(name) for network in networks]))
    return networks[0]


def clip_grad_norm_per_seed(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """nn.utils.clip_grad_norm_ for each seed (row i of every stacked .grad) on its own, since a norm over the stack
    would couple the seeds; returns the seeds' norms before clipping [seeds]."""
    grads = [p.grad for p in parameters]
    norms = torch.stack([grad.flatten(1).norm(dim=1) for grad in grads]).norm(dim=0)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(scale.view(-1, *[1] * (grad.dim() - 1)))
    return norms


def epsilon_at(step: int, args: Args) -> float:
    """Linear from start_e (at schedule_start) to end_e at exploration_fraction * total_timesteps, then constant."""
    span = max(1.0, args.exploration_fraction * args.total_timesteps - args.schedule_start)
    return args.start_e + min(1.0, (step - args.schedule_start) / span) * (args.end_e - args.start_e)


def annealed(step: int, args: Args) -> float:
    """How far the annealing is at `step`: 0 at schedule_start, 1 at total_timesteps (the learning rate, PER's beta)."""
    return min(1.0, (step - args.schedule_start) / (args.total_timesteps - args.schedule_start))


def learning_rate_at(step: int, args: Args) -> float:
    """learning_rate, or with anneal_lr linear from learning_rate (at schedule_start) to 0 at total_timesteps."""
    return args.learning_rate * (1 - annealed(step, args)) if args.anneal_lr else args.learning_rate


def extended(args: Args, step: int, total_timesteps: int) -> Args:
    """The arguments that train on from `step` to a new total_timesteps with no schedule jumping: epsilon reaches
    end_e at the same step as before; every other schedule goes from its value at `step` to its end at the new end."""
    end_of_decay = args.exploration_fraction * args.total_timesteps
    return replace(args, total_timesteps=total_timesteps, schedule_start=step, start_e=epsilon_at(step, args),
                   exploration_fraction=end_of_decay / total_timesteps, learning_rate=learning_rate_at(step, args))


def td_target(target_network: nn.Module, batch: TensorDict, gamma: float) -> torch.Tensor:
    """reward + gamma * max_a Q_target(next_obs, a); no bootstrap past a termination."""
    next_q = target_network(batch["next_obs"]).max(dim=-1).values
    return batch["reward"] + gamma * (~batch["terminated"]) * next_q


def q_loss(q_network: nn.Module, target_network: nn.Module, batch: TensorDict, args: Args):
    """DQN: each seed's TD loss on its batch [seeds, batch], with the Q-values of the actions taken."""
    with torch.no_grad():
        target = td_target(target_network, batch, args.gamma)
    q = q_network(batch["obs"]).gather(-1, batch["action"].long().unsqueeze(-1)).squeeze(-1)
    loss = (F.mse_loss if args.loss == "mse" else F.smooth_l1_loss)(q, target, reduction="none")
    return loss.mean(1), q.detach()


def make_update(q_network: nn.Module, target_network: nn.Module, optimizer: torch.optim.Optimizer, args: Args):
    """The gradient step, a closure of tensors (so torch.compile and CUDA graphs can wrap it): batch -> metrics."""

    def update(batch: TensorDict) -> TensorDict:
        loss, q = q_loss(q_network, target_network, batch, args)
        optimizer.zero_grad()
        loss.sum().backward()  # the sum: each seed's gradient is its own loss's, and Adam is per element
        grad_norm = clip_grad_norm_per_seed(list(q_network.parameters()), args.max_grad_norm)
        optimizer.step()
        return TensorDict(td_loss=loss.detach(), q_values=q.mean(1), grad_norm=grad_norm)

    return update


def check_args(args: Args) -> None:
    for name in ("total_timesteps", "num_envs", "num_seeds", "threads", "buffer_size", "batch_size", "train_frequency",
                 "gradient_steps", "target_network_frequency", "eval_episodes"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and 0 <= args.gamma <= 1 and args.batch_size <= args.buffer_size):
        fail(f"need tau in (0, 1], gamma in [0, 1] and batch_size <= buffer_size; got {args.tau}, {args.gamma}")


def main(args: Args) -> dict:
    check_args(args)
    run = Run(args)  # the run directory, checkpoints, logging, signals: the plumbing at the end of this file
    args, device, seeds = run.args, run.device, run.seeds  # seeds: the runs of this process, rows of every tensor
    env = run.make_env()  # num_envs per seed: seed i's in rows i * num_envs ... (i + 1) * num_envs - 1
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        fail(f"DQN needs a discrete action space; {args.env} has {env.single_action_space} "
             "(use algos/ddpg.py for continuous actions)")

    # The target network lives on the meta device and reads target_params, a copy that one lerp_ moves.
    network = partial(QNetwork, env.single_observation_space, env.single_action_space)
    q_network = stacked(network, seeds).to(device)
    params = from_module(q_network).data
    target_params = params.clone()
    with torch.device("meta"):
        target_network = stacked(network, seeds)
    target_params.to_module(target_network)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=torch.tensor(args.learning_rate, device=device), fused=True,
                                 capturable=args.cudagraphs and device.type == "cuda")  # tensor lr: graphs see it
    frame_stack = 4 if is_atari(args.env) else 0  # Atari: replay stores each frame of the stacks once
    rb = SeedStack([ReplayBuffer(args.buffer_size, device, seed, frame_stack) for seed in seeds])  # a replay per seed
    recorder = TransitionRecorder(env.num_envs, clip_reward=is_atari(args.env))
    explore_rngs = [np.random.default_rng(seed) for seed in seeds]
    update = make_update(q_network, target_network, optimizer, args)
    if args.compile:
        update = torch.compile(update)
    if args.cudagraphs and device.type == "cuda":
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)

    @torch.inference_mode()  # a little cheaper than no_grad: these tensors never meet autograd
    def act(obs: np.ndarray, epsilon: float, rngs: list[np.random.Generator]) -> np.ndarray:
        """Actions [seeds, envs] for obs [seeds, envs, ...], seed i's drawn from rngs[i] alone."""
        explore = np.array([rng.random(obs.shape[1]) < epsilon for rng in rngs])  # DQN: epsilon-greedy
        actions = np.array([rng.integers(env.single_action_space.n, size=obs.shape[1]) for rng in rngs])
        if not explore.all():  # the greedy actions, where not exploring
            greedy = q_network(torch.as_tensor(obs, device=device)).argmax(-1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions

    def evaluation(video_dirs: list[str] | None = None, abort=None) -> list[list[float]]:
        """Each seed's episodes of its epsilon-greedy policy on envs seeded apart from training (seed + 10000)."""
        returns = []
        for i, seed in enumerate(seeds):  # the other rows draw from a spare generator: seed i's draws are its own
            rngs = [np.random.default_rng(seed + 10_000) if j == i else np.random.default_rng() for j in seeds]

            def policy(obs: np.ndarray, i: int = i, rngs: list = rngs) -> np.ndarray:
                return act(np.stack([obs] * len(seeds)), args.eval_epsilon, rngs)[i]

            returns.append(evaluate(args.env, policy, args.eval_episodes, seed=seed + 10_000, abort=abort,
                                    video_dir=video_dirs[i] if video_dirs else None))
        return returns

    # Everything a checkpoint holds; with --resume, run.start loads it back and continues where it stopped.
    parts = dict(env=env, rb=rb, q_network=q_network, target_params=target_params, optimizer=optimizer,
                 recorder=recorder, explore=explore_rngs)
    obs, _ = env.reset(seed=env_seeds(seeds, args.num_envs))
    obs, (global_step, updates, recent) = run.start(parts, obs, (0, 0, []), evaluation)

    # Collect, store, learn. global_step counts environment steps over all envs.
    while run.training(global_step):
        epsilon = epsilon_at(global_step, args)
        action = act(obs.reshape(len(seeds), args.num_envs, *obs.shape[1:]), epsilon, explore_rngs).reshape(-1)
        next_obs, reward, terminated, truncated, info = env.step(action)
        transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        rb.extend(rb.add_frames(transitions))
        obs = next_obs
        previous, global_step = global_step, global_step + args.num_envs
        for episode in finished:
            recent = (recent + [episode["episodic_return"]])[-20:]
            run.log(global_step, {f"charts/{k}": v for k, v in episode.items() if k != "env"}
                    | {"charts/epsilon": epsilon}, seed=episode["env"] // args.num_envs)

        if global_step > args.learning_starts and len(rb) >= args.batch_size:
            optimizer.param_groups[0]["lr"].fill_(learning_rate_at(global_step, args))
            for _ in range(crossed(args.train_frequency, previous, global_step) * args.gradient_steps):
                batch = rb.sample(args.batch_size)  # [seeds, batch_size], each seed's from its own replay
                metrics = update(batch)
                updates += 1
                if updates % 100 == 0:
                    run.log(global_step, {f"losses/{k}": v.view(len(seeds), -1).mean(1) for k, v in metrics.items()})
            # DQN: the target trails the Q-network, once per interval crossed (several envs per step skip none).
            for _ in range(crossed(args.target_network_frequency, previous, global_step)):
                target_params.lerp_(params, args.tau)

        if crossed(1000, previous, global_step):
            run.progress(global_step, recent)
        if crossed(args.eval_frequency, previous, global_step):
            run.evaluate(global_step)  # ends training if the mean return reaches --stop-return
        if crossed(args.checkpoint_frequency, previous, global_step):
            run.checkpoint(obs, (global_step, updates, recent))
    return run.finish(obs, (global_step, updates, recent), model=q_network.state_dict())


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
