"""DDPG: a deterministic actor climbs the gradient of a Q(s, a) critic learned off-policy from replay.

Lillicrap et al. 2016, "Continuous control with deep reinforcement learning", ICLR (arXiv:1509.02971).

Usage: python algos/ddpg.py   |   python algos/ddpg.py --config configs/ddpg/halfcheetah.yaml --track
"""

import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

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

from buffers import NStepReturns, ReplayBuffer, lambda_returns
from envs import RunningMeanStd, TransitionRecorder, check_video, env_state, evaluate, load_env_state, make_vector_env

ALGO = Path(__file__).stem


@dataclass
class Args:
    config: str | None = None  # YAML file of argument defaults (keys: the names below); flags override it
    resume: str | None = None  # continue runs/<run_name> from its checkpoint.pt (only --total-timesteps may change)
    exp_name: str = ALGO  # the name of this experiment, part of the run name
    run_name: str | None = None  # the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)
    env: str = "Pendulum-v1"  # the environment id (continuous actions)
    seed: int = 1  # seed of the run: networks, exploration, replay sampling and environments
    cuda: bool = True  # use CUDA when it is available
    threads: int = 1  # torch CPU threads (one is fastest for small networks)
    compile: bool = False  # torch.compile the updates
    cudagraphs: bool = False  # replay the updates as CUDA graphs (CUDA only)
    track: bool = False  # log to Weights & Biases (WANDB_MODE=offline works without an account)
    wandb_project_name: str = "offpolicy-zoo"  # the W&B project
    wandb_entity: str | None = None  # the W&B entity (team or user)
    wandb_group: str | None = None  # the W&B group (run.py sets one per launch so seeds are grouped)
    capture_video: bool = False  # record the final evaluation episode to runs/<run_name>/videos/
    save_model: bool = False  # save the actor's, critic's (and normaliser's) state_dicts to runs/<run_name>/model.pt
    checkpoint_frequency: int = 0  # environment steps between checkpoints (0: only on SIGTERM / Ctrl-C)

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
    stop_return: float | None = None  # stop once an evaluation's mean return reaches this (needs eval_frequency)


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

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.action_bias, torch.tanh(self.net(obs.float().flatten(1))), self.action_scale)


class QNetwork(nn.Module):
    """Q(s, a): one value per (observation, action) pair."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box):
        super().__init__()
        self.net = mlp(int(np.prod(observation_space.shape)) + int(np.prod(action_space.shape)), 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs.float().flatten(1), action.flatten(1)], dim=1)).squeeze(1)


class ExplorationNoise:
    """Ornstein-Uhlenbeck noise per env and action (dt = 1): x += -theta x + sigma N(0, 1); theta = 1: Gaussian."""

    def __init__(self, shape: tuple[int, ...], theta: float, sigma: np.ndarray | float, seed: int):
        self.theta, self.sigma, self.state, self.rng = theta, sigma, np.zeros(shape), np.random.default_rng(seed)

    def sample(self) -> np.ndarray:
        self.state += -self.theta * self.state + self.sigma * self.rng.standard_normal(self.state.shape)
        return self.state.copy()

    def reset(self, done: np.ndarray) -> None:
        self.state[done] = 0.0  # a new episode starts a new OU path: no correlation across episodes

    def state_dict(self) -> dict:
        return {"state": torch.from_numpy(self.state.copy()), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.state, self.rng.bit_generator.state = state["state"].numpy().copy(), state["rng"]


def crossed(every: int, previous: int, step: int) -> int:
    """How many multiples of `every` lie in (previous, step]: the periodic events due at this step (none if 0)."""
    return step // every - previous // every if every else 0


def fail(message: str) -> None:
    raise SystemExit(f"error: {message}")  # one line for the user, no traceback


def check_args(args: Args) -> None:
    for name in ("total_timesteps", "num_envs", "threads", "buffer_size", "batch_size", "policy_frequency", "n_step",
                 "eval_episodes", "td_lambda_steps"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (0 < args.tau <= 1 and 0 <= args.gamma <= 1 and args.batch_size <= args.buffer_size
            and args.updates_per_step > 0 and 0 < args.ou_theta <= 1):
        fail("need tau in (0, 1], gamma in [0, 1], batch_size <= buffer_size, updates_per_step > 0, ou_theta in (0, 1]")
    if args.td_lambda is not None and not (0 <= args.td_lambda <= 1 and args.n_step == 1):
        fail(f"--td-lambda must be in [0, 1] and needs --n-step 1, got {args.td_lambda} and {args.n_step}")


def flags(values: dict) -> list[str]:
    """Command-line flags for a mapping of argument names to values (tyro spells booleans --x / --no-x)."""
    named = {str(key).replace("_", "-"): value for key, value in values.items()}
    return [flag for k, v in named.items() for flag in
            (([f"--{k}"] if v else [f"--no-{k}"]) if isinstance(v, bool) else [f"--{k}", str(v)])]


def parse_args(argv: list[str] | None = None) -> Args:
    """The command line after the flags of --config (or of a resumed run's saved arguments), so that later flags
    win and tyro checks every name and type."""
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
    return tyro.cli(Args, args=defaults + argv, description=__doc__)


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
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # Adam's moments of dead units decay into subnormals: 2x slower steps on x86
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    try:
        env = make_vector_env(args.env, args.num_envs, args.seed)
        if args.capture_video:
            check_video(args.env)
    except (ValueError, RuntimeError, ImportError) as e:
        fail(str(e))
    if not isinstance(env.single_action_space, gym.spaces.Box):
        fail(f"DDPG needs a continuous (Box) action space; {args.env} has {env.single_action_space} "
             "(use algos/dqn.py for discrete actions)")

    # Networks and their targets: modules on the meta device reading target_params, a copy that one lerp_ moves.
    obs_space, action_space = env.single_observation_space, env.single_action_space
    actor, qf = Actor(obs_space, action_space).to(device), QNetwork(obs_space, action_space).to(device)
    params = TensorDict(actor=from_module(actor).data, qf=from_module(qf).data).lock_()  # locked: faster lerp_
    target_params = params.clone().lock_()
    with torch.device("meta"):
        actor_target, qf_target = Actor(obs_space, action_space), QNetwork(obs_space, action_space)
    target_params["actor"].to_module(actor_target)
    target_params["qf"].to_module(qf_target)
    capturable = args.cudagraphs and device.type == "cuda"
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
    qf_optimizer = torch.optim.Adam(qf.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
    obs_norm = RunningMeanStd(obs_space.shape, enabled=args.normalize_obs).to(device)
    rb = ReplayBuffer(args.buffer_size, device=device, seed=args.seed)
    nstep = NStepReturns(args.n_step, args.gamma, args.num_envs)
    recorder = TransitionRecorder(args.num_envs)
    noise = ExplorationNoise((args.num_envs, *action_space.shape), args.ou_theta,
                             args.exploration_noise * (action_space.high - action_space.low) / 2, args.seed)
    parts = dict(actor=actor, qf=qf, target_params=target_params, actor_optimizer=actor_optimizer,
                 qf_optimizer=qf_optimizer, obs_norm=obs_norm, nstep=nstep, recorder=recorder, noise=noise)

    # Collect, store, learn. global_step counts environment steps over all envs; `credit` carries the
    # fraction of an update that updates_per_step left over, so 0.5 means one update every 2 steps.
    obs, _ = env.reset(seed=args.seed)
    global_step, updates, credit, recent = 0, 0, 0.0, []
    if resumed is not None:
        try:
            for name, part in parts.items():
                part.load_state_dict(resumed[name])
            load_env_state(env, resumed["env"])  # exact for gymnasium's envs (continuous actions: no Atari)
            rb.load_state_dict(resumed["rb"], copy=False)  # adopts the memory-mapped storage: no second copy
            generators(noise.rng, resumed["generators"])
        except (KeyError, ValueError, RuntimeError) as e:
            fail(f"cannot resume from {args.resume}: {e}")
        obs, (global_step, updates, credit, recent) = resumed["obs"].numpy(), resumed["counts"]
    run = Run(args, device, resumed)

    def update_critic(batch: TensorDict) -> TensorDict:
        """A step on the squared TD error to r + d Q'(s', mu'(s')) for [B] transitions, lambda-returns for [B, L]"""
        flat = batch.flatten(0, 1) if batch.batch_dims == 2 else batch  # the one-step case skips the reshapes
        with torch.no_grad():
            next_value = qf_target(next_obs := obs_norm(flat["next_obs"]), actor_target(next_obs))
            target = flat["reward"] + flat["discount"] * next_value if batch.batch_dims == 1 else lambda_returns(
                batch["reward"], batch["discount"], batch["terminated"] | batch["truncated"],
                next_value.view(batch.shape), args.td_lambda).flatten()
        q = qf(obs_norm(flat["obs"]), flat["action"])
        loss = F.mse_loss(q, target)  # one fused op forward and backward: small batches are bound by op counts
        qf_optimizer.zero_grad()
        loss.backward()
        qf_optimizer.step()
        return TensorDict(qf_loss=loss.detach(), qf_values=q.detach().mean())

    def update_actor(batch: TensorDict) -> TensorDict:
        """One step up the deterministic policy gradient -Q(obs, actor(obs)); inputs= keeps the critic's .grad out."""
        obs = obs_norm(batch["obs"].flatten(0, batch.batch_dims - 1))
        loss = -qf(obs, actor(obs)).mean()
        actor_optimizer.zero_grad()
        loss.backward(inputs=list(actor.parameters()))
        actor_optimizer.step()
        return TensorDict(actor_loss=loss.detach())

    if args.compile:
        update_critic, update_actor = torch.compile(update_critic), torch.compile(update_actor)
    if args.cudagraphs and device.type == "cuda":
        update_critic = CudaGraphModule(update_critic, in_keys=[], out_keys=[], warmup=5)
        update_actor = CudaGraphModule(update_actor, in_keys=[], out_keys=[], warmup=5)

    @torch.inference_mode()  # a little cheaper than no_grad: these tensors never meet autograd
    def act(obs: np.ndarray) -> np.ndarray:
        return actor(obs_norm(torch.as_tensor(obs, device=device).float())).cpu().numpy()

    def evaluation(step: int, video: bool = False) -> list[float]:
        """Episodes of the deterministic policy on envs seeded apart from training (seed + 10000)."""
        returns = evaluate(args.env, act, args.eval_episodes, seed=args.seed + 10_000, abort=lambda: bool(stop),
                           video_dir=str(run.dir / "videos") if video else None)  # a signal cuts it short
        run.log(step, {"eval/episodic_return": np.mean(returns)})
        return returns

    def checkpoint() -> None:  # everything the loop needs to continue bit for bit
        run.checkpoint({"algo": ALGO, "args": asdict(args), "counts": (global_step, updates, credit, recent),
                        "obs": torch.as_tensor(obs), "env": env_state(env), "generators": generators(noise.rng),
                        "rb": rb.state_dict(), **{name: part.state_dict() for name, part in parts.items()}})

    # SIGTERM (preemption) and Ctrl-C stop the run after the current step: the state saved is consistent.
    stop = {}
    handlers = {sig: signal.signal(sig, lambda signum, _: stop.setdefault("signal", signal.Signals(signum).name))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    start, start_step, eval_time, returns, losses = time.time(), global_step, 0.0, [], {}
    try:
        while global_step < args.total_timesteps and not stop:
            obs_norm.update(torch.as_tensor(obs))
            action = env.action_space.sample() if global_step < args.learning_starts else np.clip(
                act(obs) + noise.sample(), action_space.low, action_space.high)
            next_obs, reward, terminated, truncated, info = env.step(action := action.astype(np.float32))
            transitions, finished = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
            rb.extend(nstep.push(transitions))  # folded reward, discount = gamma**m, or 0 after a termination
            noise.reset(terminated | truncated)
            obs = next_obs
            previous, global_step = global_step, global_step + args.num_envs
            for episode in finished:
                recent = (recent + [episode["episodic_return"]])[-20:]
                run.log(global_step, {f"charts/{k}": v for k, v in episode.items()})

            if global_step > args.learning_starts and len(rb) >= args.batch_size:
                credit += args.num_envs * args.updates_per_step
                for _ in range(int(credit)):
                    batch = rb.sample(args.batch_size) if args.td_lambda is None else rb.sample_slices(
                        args.batch_size // args.td_lambda_steps, args.td_lambda_steps, args.num_envs)
                    metrics = update_critic(batch)
                    updates += 1
                    if updates % args.policy_frequency == 0:  # the actor and the targets trail the critic
                        losses = update_actor(batch)
                        target_params.lerp_(params, args.tau)
                    if updates % 100 == 0:
                        run.log(global_step, {f"losses/{k}": v.item() for m in (metrics, losses) for k, v in m.items()})
                credit -= int(credit)

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
        torch.save({"actor": actor.state_dict(), "qf": qf.state_dict(), "obs_norm": obs_norm.state_dict()},
                   run.dir / "model.pt")
    return run.finish(returns, global_step=global_step, updates=updates, interrupted=bool(stop),
                      train_sps=(global_step - start_step) / max(time.time() - start - eval_time, 1e-9))


if __name__ == "__main__":
    main(parse_args())
