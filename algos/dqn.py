"""DQN: Q-learning from a replay buffer, with a target network that trails the Q-network.

Mnih et al. 2015, "Human-level control through deep reinforcement learning", Nature 518:529.

Usage: python algos/dqn.py   |   python algos/dqn.py --env PongNoFrameskip-v4   |   python algos/dqn.py --help

An Atari id without --config trains with ATARI_PRESET (printed at the start); --config and flags override it.
"""

import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

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

from buffers import ReplayBuffer
from envs import TransitionRecorder, check_video, env_state, evaluate, is_atari, load_env_state, make_vector_env

ALGO = Path(__file__).stem
# Atari ids without --config train with the Nature-DQN recipe (Mnih et al. 2015) as CleanRL's dqn_atari.py
# runs it, with the Huber loss of the paper's error clipping and the paper's evaluation epsilon of 0.05.
ATARI_PRESET = dict(total_timesteps=10_000_000, learning_rate=1e-4, buffer_size=1_000_000, batch_size=32,
                    learning_starts=80_000, train_frequency=4, gradient_steps=1, target_network_frequency=1000,
                    start_e=1.0, end_e=0.01, exploration_fraction=0.1, loss="huber", eval_epsilon=0.05,
                    eval_frequency=250_000, checkpoint_frequency=500_000, anneal_lr=False)


@dataclass
class Args:
    config: str | None = None  # YAML file of argument defaults (keys: the names below); flags override it
    resume: str | None = None  # continue runs/<run_name> from its checkpoint.pt (only --total-timesteps may change)
    exp_name: str = ALGO  # the name of this experiment, part of the run name
    run_name: str | None = None  # the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)
    env: str = "CartPole-v1"  # the environment id (an Atari id without --config gets the Atari preset)
    seed: int = 1  # seed of the run: networks, exploration, replay sampling and environments
    cuda: bool = True  # use CUDA when it is available
    threads: int = 1  # torch CPU threads (one is fastest for small networks; raise it for CNNs on a CPU)
    compile: bool = False  # torch.compile the update
    cudagraphs: bool = False  # replay the update as a CUDA graph (CUDA only)
    track: bool = False  # log to Weights & Biases (WANDB_MODE=offline works without an account)
    wandb_project_name: str = "offpolicy-zoo"  # the W&B project
    wandb_entity: str | None = None  # the W&B entity (team or user)
    wandb_group: str | None = None  # the W&B group (run.py sets one per launch so seeds are grouped)
    capture_video: bool = False  # record the final evaluation episode to runs/<run_name>/videos/
    save_model: bool = False  # save the Q-network's state_dict to runs/<run_name>/model.pt
    checkpoint_frequency: int = 0  # environment steps between checkpoints (0: only on SIGTERM / Ctrl-C)

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
    stop_return: float | None = None  # stop once an evaluation's mean return reaches this (needs eval_frequency)


class QNetwork(nn.Module):
    """Q-values for every action: the Nature-DQN CNN for image observations, an MLP otherwise."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        shape, actions = observation_space.shape, int(action_space.n)
        self.image = len(shape) == 3  # (frames, height, width) uint8 pixels
        if self.image:
            conv = nn.Sequential(nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                 nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
            features = conv(torch.zeros(1, *shape)).shape[1]
            self.net = nn.Sequential(conv, nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, actions))
        else:
            self.net = nn.Sequential(nn.Linear(int(np.prod(shape)), 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / 255.0 if self.image else obs.float().flatten(1))


def epsilon_at(step: int, args: Args) -> float:
    """Linear decay from start_e to end_e over exploration_fraction of the run, then constant."""
    return args.start_e + min(1.0, step / max(1.0, args.exploration_fraction * args.total_timesteps)) * (
        args.end_e - args.start_e)


def td_target(target_network: nn.Module, batch: TensorDict, gamma: float) -> torch.Tensor:
    """reward + gamma * max_a Q_target(next_obs, a); no bootstrap past a termination."""
    next_q = target_network(batch["next_obs"]).max(dim=1).values
    return batch["reward"] + gamma * (~batch["terminated"]) * next_q


def q_loss(q_network: nn.Module, target_network: nn.Module, batch: TensorDict, args: Args):
    """The TD loss on one batch, with the Q-values of the actions taken."""
    with torch.no_grad():
        target = td_target(target_network, batch, args.gamma)
    q = q_network(batch["obs"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    loss = (F.mse_loss if args.loss == "mse" else F.smooth_l1_loss)(q, target)
    return loss, q.detach()


def crossed(every: int, previous: int, step: int) -> int:
    """How many multiples of `every` lie in (previous, step]: the periodic events due at this step (none if 0)."""
    return step // every - previous // every if every else 0


def fail(message: str) -> None:
    raise SystemExit(f"error: {message}")  # one line for the user, no traceback


def check_args(args: Args) -> None:
    for name in ("total_timesteps", "num_envs", "threads", "buffer_size", "batch_size", "train_frequency",
                 "gradient_steps", "target_network_frequency", "eval_episodes"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and 0 <= args.gamma <= 1 and args.batch_size <= args.buffer_size):
        fail(f"need tau in (0, 1], gamma in [0, 1] and batch_size <= buffer_size; got {args.tau}, {args.gamma}")


def flags(values: dict) -> list[str]:
    """Command-line flags for a mapping of argument names to values (tyro spells booleans --x / --no-x)."""
    named = {str(key).replace("_", "-"): value for key, value in values.items()}
    return [flag for k, v in named.items() for flag in
            (([f"--{k}"] if v else [f"--no-{k}"]) if isinstance(v, bool) else [f"--{k}", str(v)])]


def parse_args(argv: list[str] | None = None) -> Args:
    """The command line after the flags of --config (or the Atari preset, or a resumed run's saved arguments),
    so that later flags win and tyro checks every name and type."""
    argv = [part for arg in (sys.argv[1:] if argv is None else argv)
            for part in (arg.split("=", 1) if arg.startswith("--") and "=" in arg else [arg])]
    if "--resume" in argv:
        if len(argv) % 2 or set(argv[::2]) - {"--resume", "--total-timesteps"}:
            fail(f"--resume continues a run with its saved arguments; only --total-timesteps may change, got {argv}")
        return tyro.cli(Args, args=flags(load_checkpoint(argv[argv.index("--resume") + 1])["args"]) + argv)
    defaults = []
    if "--config" in argv[:-1]:
        config = argv[argv.index("--config") + 1]
        try:
            if not isinstance(values := yaml.safe_load(Path(config).read_text()) or {}, dict):
                raise ValueError("it must be a mapping of argument names to values")
        except (OSError, yaml.YAMLError, ValueError) as e:
            fail(f"cannot read config {config}: {e}")
        if (algo := values.pop("algo", ALGO)) != ALGO:
            fail(f"config {config} is for algos/{algo}.py, not {ALGO}.py (drop its algo key to use it anyway)")
        defaults = flags(values)  # tyro names an unknown key or a wrong type
    args = tyro.cli(Args, args=defaults + argv, description=__doc__)
    if "--config" not in argv and is_atari(args.env):
        print(f"{args.env} is an Atari game: using the Atari preset ({' '.join(flags(ATARI_PRESET))}); "
              "--config or flags override it")
        args = tyro.cli(Args, args=flags(ATARI_PRESET) + argv)
    return args


def load_checkpoint(run_dir: str) -> dict:
    """runs/<run>/checkpoint.pt, memory-mapped, as plain data (weights_only: a checkpoint cannot run code)."""
    try:
        if (state := torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True, mmap=True))["algo"] != ALGO:
            raise ValueError(f"it is a checkpoint of algos/{state['algo']}.py, not of {ALGO}.py")
    except Exception as e:  # missing, truncated, another algorithm's: torch raises several types
        fail(f"cannot resume from {Path(run_dir) / 'checkpoint.pt'}: {e}")
    return state


def generators(explore_rng: np.random.Generator, state: dict | None = None) -> dict:
    """Every random generator's state (the buffer and the envs keep their own); with `state`, restore them."""
    if state is not None:
        random.setstate(state["python"])
        np.random.set_state((state["numpy"][0], np.array(state["numpy"][1], dtype=np.uint32), *state["numpy"][2:]))
        torch.set_rng_state(state["torch"])
        explore_rng.bit_generator.state = state["explore"]
    legacy = np.random.get_state()
    return {"python": random.getstate(), "numpy": (legacy[0], legacy[1].tolist(), *legacy[2:]),
            "torch": torch.get_rng_state(), "explore": explore_rng.bit_generator.state}


class Run:
    """runs/<run_name>/: config.yaml, metrics.jsonl (and W&B), summary.json; a progress bar on a terminal."""

    def __init__(self, args: Args, device: torch.device, resumed: dict | None = None):
        self.args, self.dir, self.start, self.wandb = args, Path("runs") / args.run_name, time.time(), None
        if resumed is None and self.dir.exists():
            fail(f"run directory {self.dir} already exists; pick another --run-name or remove it")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(yaml.safe_dump(asdict(args), sort_keys=False))
        self.metrics = open(self.dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in finish)
        self.metrics.truncate(resumed["metrics_bytes"] if resumed else 0)  # drop what came after the checkpoint
        if args.track:
            import wandb

            self.video = wandb.Video
            self.wandb = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, group=args.wandb_group,
                                    name=args.run_name, config=asdict(args), dir=str(self.dir), save_code=True,
                                    id=resumed and resumed["wandb_id"], resume="must" if resumed else None)
        print(f"{'resuming' if resumed else 'run'} {self.dir} on {device}, settings in {self.dir / 'config.yaml'}")
        self.bar = tqdm(total=args.total_timesteps, initial=resumed["counts"][0] if resumed else 0, unit="step",
                        mininterval=1.0, disable=not sys.stderr.isatty())

    def log(self, step: int, metrics: dict) -> None:
        record = {"global_step": step, **{k: float(v) for k, v in metrics.items()}}
        self.metrics.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def checkpoint(self, state: dict) -> None:
        """checkpoint.pt, written to a temporary file and renamed: a kill at any moment leaves the last one whole."""
        torch.save({**state, "metrics_bytes": self.metrics.tell(), "wandb_id": self.wandb and self.wandb.id},
                   self.dir / "checkpoint.tmp")
        os.replace(self.dir / "checkpoint.tmp", self.dir / "checkpoint.pt")

    def finish(self, returns: list[float], **counts) -> dict:
        """summary.json: the final evaluation (none if interrupted), counts and wall time; the closing line."""
        self.bar.close()
        summary = {"run_name": self.args.run_name, "env": self.args.env, "algo": self.args.exp_name,
                   "seed": self.args.seed, "eval_return_mean": float(np.mean(returns)) if returns else None,
                   "eval_return_std": float(np.std(returns)) if returns else None, "eval_episodes": len(returns),
                   "eval_returns": returns, **counts, "wall_time_s": time.time() - self.start}
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        if self.wandb is not None:
            if (video := self.dir / "videos" / "eval-episode-0.mp4").exists():
                self.wandb.log({"media/video": self.video(str(video))}, step=counts["global_step"])
            self.wandb.summary.update({k: v for k, v in summary.items() if not isinstance(v, list)})
            self.wandb.finish()
        result = f"{np.mean(returns):.1f} ± {np.std(returns):.1f} over {len(returns)} episodes" if returns else "none"
        print(f"final evaluation: {result} | {counts['global_step']} steps | {summary['wall_time_s']:.0f} s | "
              f"{self.dir}")
        return summary


def main(args: Args) -> dict:
    check_args(args)
    resumed = load_checkpoint(args.resume) if args.resume else None
    args = replace(args, run_name=args.run_name or f"{args.env.replace('/', '-')}__{args.exp_name}__{args.seed}__"
                   f"{int(time.time())}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    try:
        env = make_vector_env(args.env, args.num_envs, args.seed)
        if args.capture_video:
            check_video(args.env)
    except (ValueError, RuntimeError, ImportError) as e:
        fail(str(e))
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        fail(f"DQN needs a discrete action space; {args.env} has {env.single_action_space} "
             "(use algos/ddpg.py for continuous actions)")

    # The target network lives on the meta device and reads target_params, a copy that one lerp_ moves.
    q_network = QNetwork(env.single_observation_space, env.single_action_space).to(device)
    params = from_module(q_network).data
    target_params = params.clone()
    with torch.device("meta"):
        target_network = QNetwork(env.single_observation_space, env.single_action_space)
    target_params.to_module(target_network)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=torch.tensor(args.learning_rate, device=device), fused=True,
                                 capturable=args.cudagraphs and device.type == "cuda")  # tensor lr: graphs see it
    rb = ReplayBuffer(args.buffer_size, device=device, seed=args.seed, frame_stack=4 if is_atari(args.env) else 0)
    recorder = TransitionRecorder(args.num_envs, clip_reward=is_atari(args.env))
    explore_rng = np.random.default_rng(args.seed)
    parts = dict(q_network=q_network, target_params=target_params, optimizer=optimizer, recorder=recorder)

    # Collect, store, learn. global_step counts environment steps over all envs.
    obs, _ = env.reset(seed=args.seed)
    global_step, updates, recent = 0, 0, []
    if resumed is not None:
        try:
            games = load_env_state(env, resumed["env"])  # None; Atari: new games (README: what differs on resume)
            for name, part in parts.items():  # new Atari games start no episode statistics nor n-step windows
                if games is None or name not in ("recorder", "nstep"):
                    part.load_state_dict(resumed[name])
            rb.load_state_dict(resumed["rb"], copy=False)  # adopts the memory-mapped storage: no second copy
            generators(explore_rng, resumed["generators"])
        except (KeyError, ValueError, RuntimeError) as e:
            fail(f"cannot resume from {args.resume}: {e}")
        obs, (global_step, updates, recent) = resumed["obs"].numpy() if games is None else games, resumed["counts"]
    run = Run(args, device, resumed)

    def update(batch: TensorDict) -> TensorDict:
        loss, q = q_loss(q_network, target_network, batch, args)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        return TensorDict(td_loss=loss.detach(), q_values=q.mean(), grad_norm=grad_norm)

    if args.compile:
        update = torch.compile(update)
    if args.cudagraphs and device.type == "cuda":
        update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)

    @torch.inference_mode()  # a little cheaper than no_grad: these tensors never meet autograd
    def act(obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        explore = rng.random(len(obs)) < epsilon
        actions = rng.integers(env.single_action_space.n, size=len(obs))
        if not explore.all():  # the greedy actions, where not exploring
            actions = np.where(explore, actions, q_network(torch.as_tensor(obs, device=device)).argmax(1).cpu().numpy())
        return actions

    def evaluation(step: int, video: bool = False) -> list[float]:
        """Episodes of the epsilon-greedy policy on envs seeded apart from training (seed + 10000)."""
        eval_rng = np.random.default_rng(args.seed + 10_000)
        returns = evaluate(args.env, lambda obs: act(obs, args.eval_epsilon, eval_rng), args.eval_episodes,
                           seed=args.seed + 10_000, video_dir=str(run.dir / "videos") if video else None,
                           abort=lambda: bool(stop))  # SIGTERM or Ctrl-C cuts an evaluation short
        run.log(step, {"eval/episodic_return": np.mean(returns)})
        return returns

    def checkpoint() -> None:  # everything the loop needs to continue bit for bit
        run.checkpoint({"algo": ALGO, "args": asdict(args), "counts": (global_step, updates, recent),
                        "obs": torch.as_tensor(obs), "env": env_state(env), "generators": generators(explore_rng),
                        "rb": rb.state_dict(),
                        **{name: part.state_dict() for name, part in parts.items()}})

    # SIGTERM (preemption) and Ctrl-C stop the run after the current step: the state saved is consistent.
    stop = {}
    handlers = {sig: signal.signal(sig, lambda signum, _: stop.setdefault("signal", signal.Signals(signum).name))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    start, start_step, eval_time, returns = time.time(), global_step, 0.0, []
    try:
        while global_step < args.total_timesteps and not stop:
            epsilon = epsilon_at(global_step, args)
            action = act(obs, epsilon, explore_rng)
            next_obs, reward, terminated, truncated, info = env.step(action)
            transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
            rb.extend(rb.add_frames(transitions))
            obs = next_obs
            previous, global_step = global_step, global_step + args.num_envs
            for episode in finished:
                recent = (recent + [episode["episodic_return"]])[-20:]
                run.log(global_step, {f"charts/{k}": v for k, v in episode.items()} | {"charts/epsilon": epsilon})

            if global_step > args.learning_starts and len(rb) >= args.batch_size:
                if args.anneal_lr:
                    optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1 - global_step / args.total_timesteps))
                for _ in range(crossed(args.train_frequency, previous, global_step) * args.gradient_steps):
                    metrics = update(rb.sample(args.batch_size))
                    updates += 1
                    if updates % 100 == 0:
                        run.log(global_step, {f"losses/{k}": v.mean().item() for k, v in metrics.items()})
                # One target update per interval crossed, so that several envs per step skip none.
                for _ in range(crossed(args.target_network_frequency, previous, global_step)):
                    target_params.lerp_(params, args.tau)

            if crossed(1000, previous, global_step):
                sps = (global_step - start_step) / (time.time() - start - eval_time)
                run.log(global_step, {"charts/SPS": sps})
                run.bar.update(global_step - run.bar.n)
                run.bar.set_postfix(SPS=f"{sps:.0f}", recent_return=f"{np.mean(recent):.1f}" if recent else "-")
            if crossed(args.eval_frequency, previous, global_step):
                tick = time.time()
                mean_return = float(np.mean(evaluation(global_step)))
                eval_time += time.time() - tick
                if args.stop_return is not None and mean_return >= args.stop_return:
                    break
            if crossed(args.checkpoint_frequency, previous, global_step):
                checkpoint()
        if not stop:
            returns = evaluation(global_step, video=args.capture_video)
    except KeyboardInterrupt:  # an evaluation cut short by a signal
        pass
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if stop or args.checkpoint_frequency:
        checkpoint()
    env.close()
    if stop:
        print(f"stopped by {stop['signal']} at step {global_step}; continue: python {sys.argv[0]} --resume {run.dir}")
    if args.save_model:
        torch.save(q_network.state_dict(), run.dir / "model.pt")
    return run.finish(returns, global_step=global_step, updates=updates, interrupted=bool(stop),
                      train_sps=(global_step - start_step) / max(time.time() - start - eval_time, 1e-9))


if __name__ == "__main__":
    main(parse_args())
