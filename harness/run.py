"""The run around an algorithm's loop: its directory, metrics, W&B, progress bar, evaluations, checkpoints,
signals, --resume and --evaluate, for one seed or a pack of seeds.

    run = Run(args, extended)                       # checks, run directories, seeds, device
    env = run.make_env()                            # num_envs per seed; seed i's envs in rows i * num_envs ...
    q_network = run.networks(make_q_network)        # the plain network; a pack: each seed's, stacked
    obs, counts = run.start(parts, counts, policy, model=q_network)  # parts: what a checkpoint saves
    while run.training(counts[0]):
        ...                                         # collect, store, learn
        run.episodes(step, finished)                # the episodes that ended, logged per seed
        run.log(step, {"losses/td_loss": loss})     # a value, or one per seed
        run.end_of_step(previous, step, obs, counts)  # the progress line, evaluations and checkpoints that fall due
    return run.finish(obs, counts)                  # final evaluation, model.pt, summary.json

A pack (--num-seeds N) is N runs in one process: each seed has its own directory, metrics.jsonl, summary.json,
model.pt (the plain network's state_dict) and W&B run; the first seed's directory holds the checkpoint of them all.
SIGTERM or Ctrl-C ends the loop after its step (an evaluation cut short stays due) and writes a checkpoint, so
--resume goes on bit for bit (Atari: from new games, see envs/state.py).

This file is the run's facade; its parts, one module each: resume.py (checkpoints and --resume), tracking.py (W&B),
loading.py (--evaluate's loading of a run's networks), progress.py (what it prints while it trains), graphs.py
(--cudagraphs' replay of the learner), with seeds.py and members.py for packs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import yaml

from envs import check_video, env_seeds, evaluate, make_vector_env  # isort: skip

from .args import ONE_OFF, algo_of, fail, load_checkpoint
from .files import save_atomic, write_atomic, write_json_atomic
from .graphs import LearnerGraphs
from .loading import load_model, member_model, plain_shapes
from .members import carried, each, members, packed
from .members import names as member_names
from .optim import adam
from .precision import autocast, chosen_precision
from .progress import Progress, mean_std, say, spread
from .resume import restore, resumed, save_checkpoint
from .seeds import seed_state_dict, stacked
from .tracking import finish_wandb, log_evaluation, start_wandb

EVAL_SEED_OFFSET = 10_000  # evaluation envs and exploration are seeded apart from training's: seed + 10000


def crossed(every: int, previous: int, step: int) -> int:
    """How many multiples of `every` lie in (previous, step]: the periodic events due at this step (none if 0)."""
    return step // every - previous // every if every else 0


class Run:
    """One run, or a pack of runs, of an algorithm file; see the module docstring.

    `extended(args, step, total_timesteps)` (the file's) gives the arguments that train on from `step` to a new
    total when --resume is given a larger --total-timesteps, so that no schedule jumps; `check(args)` (the
    file's) refuses bad settings, called on each member's own. A pack's members may differ in the settings the
    file lists in `Args.packable` (--pack, see members.py): run.args holds those as [members, 1] values.
    """

    def __init__(self, args, extended: Callable | None = None, check: Callable | None = None):
        self.algo = algo_of(type(args))
        self.extended = extended or (lambda a, _, total: replace(a, total_timesteps=total))
        for name in ("total_timesteps", "num_envs", "num_seeds", "threads", "eval_episodes"):
            if getattr(args, name) < 1:
                fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        for name in ("eval_frequency", "checkpoint_frequency", "stop_step"):
            if getattr(args, name) < 0:
                fail(f"--{name.replace('_', '-')} must be >= 0 (0: never), got {getattr(args, name)}")
        args = replace(args, exp_name=args.exp_name or self.algo)
        self.resumed = load_checkpoint(args.resume, self.algo) if args.resume and not args.evaluate else None
        if args.members and self.resumed is None:
            fail("--members picks the members of a pack that go on: give it with --resume PACK_DIR")
        self.cut, self.saved_dirs = None, []  # --members: (the kept members' rows, the pack's size), see cut.py
        if args.evaluate:
            self.dir = Path(args.evaluate)
            args, self.dirs = replace(args, num_seeds=1, pack=()), [self.dir]  # a run directory: one run's networks
            self.members = [args]
        elif self.resumed is not None:
            self.saved_dirs = [Path(args.resume).parent / name for name in self.resumed["dirs"]]  # before a cut
            args, self.dirs, self.cut = resumed(args, self.resumed, self.extended)
            self.members = members(args)
        else:  # <env>__<exp_name>[__key=value...]__<seed>__<time>, or --run-name (see members.names)
            self.members = members(args)
            names = member_names(args, self.members, packed(args), int(time.time()))
            args = replace(args, run_name=args.run_name or names[0], num_seeds=len(self.members))
            self.dirs = [Path("runs") / name for name in names]
            for directory in self.dirs:
                if directory.exists():
                    fail(f"run directory {directory} already exists; pick another --run-name or remove it")
        if args.stop_return is not None and len(self.members) > 1 and not args.evaluate:
            fail("--stop-return stops a run at its own evaluation, so a pack would train its seeds unlike alone: "
                 "train the seeds as separate runs (--num-seeds 1) to use it")
        self.members = [replace(run, run_name=path.name) for run, path in zip(self.members, self.dirs, strict=True)]
        for run in self.members if check else []:  # the file's checks, on each member's own values
            check(run)
        self.dir = self.dirs[0]
        self.device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
        self.plain, self.seeds = args, [run.seed for run in self.members]  # plain: what a checkpoint saves
        self.args = carried(args, self.members, self.device)  # what the file reads: a member's own value per row
        random.seed(self.seeds[0])
        np.random.seed(self.seeds[0])
        torch.manual_seed(self.seeds[0])
        torch.backends.cudnn.deterministic = True
        torch.set_num_threads(args.threads)
        # x86 computes with subnormal floats (below 1.2e-38) many times slower; Adam's moments of weights whose
        # gradient stays 0 decay through them, which made a Pong run 1.87x slower by 225k steps
        # (benchmarks/pong_subnormals.py). Set before the thread pool starts: its threads take it when created.
        torch.set_flush_denormal(True)
        self.signal, self.reached, self.wandb = None, False, None
        self.precision, self.precision_why = "fp32", "fp32"  # make_env chooses (it knows the observations)
        self.precision_asked, self.precision_changes = args.precision, []
        self.due, self.last, self.recent, self.parts = None, None, [], {}

    # ---- what the algorithm builds through the run ------------------------------------------------------------

    def make_env(self) -> gym.vector.VectorEnv:
        """The training envs, num_envs per seed; a bad id, or a video that could not be written, is refused before
        anything starts."""
        try:
            if self.args.capture_video:
                check_video(self.args.env)
            array = "CartPoleArray" in self.resumed["env"].get("vector_layers", ()) if self.resumed else None
            env = make_vector_env(self.args.env, self.args.num_envs * len(self.seeds), self.args.seed,
                                  array=array)  # a resumed run: the layout its env state was saved in
        except (ValueError, RuntimeError, ImportError) as e:
            fail(str(e))
        self._choose_precision(env.single_observation_space)
        return env

    def _choose_precision(self, space: gym.Space) -> None:
        """The update's precision (see precision.py), chosen once: config.yaml keeps the one asked (a rerun of it
        chooses again where it runs), the checkpoint the one chosen, so that a resumed run computes as it did unless
        --resume is given another --precision (said in one line, recorded in summary.json); evaluation runs the fp32
        network whatever it was."""
        asked, state = "fp32" if self.args.evaluate else self.args.precision, self.resumed or {}
        saved = state["args"]["precision"] if state else None  # what the resumed run computed in
        source, advice = "--precision bf16:", None
        if saved == asked == "bf16":  # the run's own bf16, not one given to --resume
            source = f"{self.dir} trained with bf16 autocast, but"
            advice = (f"resume it where bf16 runs (a CPU with amx_bf16 or avx512_bf16), or go on in fp32: --resume "
                      f"{self.dir} --precision fp32 (from then on it computes otherwise than it would have)")
        self.precision, self.precision_why = chosen_precision(asked, self.device, space, source, advice)
        self.precision_asked = state.get("precision_asked", saved or asked)
        self.precision_changes = state.get("precision_changes", [])
        if saved is not None and self.precision != saved:
            step = state["counts"][0]
            self.precision_changes = [*self.precision_changes, {"step": step, "from": saved, "to": self.precision}]
            print(f"{self.dir} trained with {saved} to step {step} and goes on in {self.precision} (--precision): "
                  "from here it computes otherwise than it would have")
        self.plain, self.args = (replace(a, precision=self.precision) for a in (self.plain, self.args))
        self.members = [replace(run, precision=self.precision_asked) for run in self.members]

    def networks(self, make: Callable[[], nn.Module]) -> nn.Module:
        """make() initialised under the run's seed; a pack: each seed's, stacked on a leading seed dimension (a layer
        that cannot be stacked is refused in one line, before anything is written; one that only the pack's first
        call shows computing unlike its seeds alone, in one line at that call)."""
        seeds = len(self.seeds)  # what make() itself raises is the network's error, raised as it is
        return stacked(make, self.seeds, refuse=lambda message: fail(f"--num-seeds {seeds}: {message}"))

    def adam(self, parameters, **kwargs) -> torch.optim.Adam:
        """torch.optim.Adam(parameters, fused=True, **kwargs); a pack's steps each seed as alone (optim.SeedAdam),
        with one lr and eps or, given as [members, 1], each member's (a float32 lr tensor: a schedule writes it in
        place, optimizer.param_groups[0]["lr"][...] = value)."""
        return adam(parameters, len(self.seeds), **kwargs)

    def generators(self) -> list[np.random.Generator]:
        """A NumPy generator per seed, seeded with it (exploration: each seed draws from its own)."""
        return [np.random.default_rng(seed) for seed in self.seeds]

    def each(self, f, *inputs):
        """f(*inputs, member's args) for each member (a string f: that setting): one value when every member has it
        (a lone run: its own), else a float64 tensor [members, 1] on the CPU (see members.each): the values a loop
        computes in Python or NumPy (epsilon, exploration noise) from each member's own numbers."""
        return each(self.members, f, *inputs)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of all seeds' envs [seeds * n, ...] as [seeds, n, ...] for a pack's networks; one seed: x."""
        return x if len(self.seeds) == 1 else x.view(len(self.seeds), -1, *x.shape[1:])

    def compiled(self, update: Callable, buffer=None) -> Callable:
        """The update, wrapped by torch.compile (--compile) and, with --cudagraphs on a GPU, replayed as a CUDA graph,
        unless `buffer` can be captured (it reads only device tensors): then `graphed` captures the whole learner."""
        update = autocast(update, self.precision, self.device)
        if self.args.compile:
            # Static shapes: a batch's shapes never change, and torch 2.11 failed to build the guards of a
            # recompile with symbolic shapes (a pack's DQN update on CUDA: "IndexError: list index out of range").
            update = torch.compile(update, dynamic=False)
        if self.args.cudagraphs and self.device.type == "cuda" and not getattr(buffer, "capturable", False):
            from tensordict.nn import CudaGraphModule

            update = CudaGraphModule(update, in_keys=[], out_keys=[], warmup=5)
        return update

    def graphed(self, learn: Callable, buffer) -> Callable:
        """learn(*counts) -> metrics, the learner's work of one loop iteration (host ints in, device tensors out),
        replayed as CUDA graphs under --cudagraphs on a GPU when `buffer` can be captured (see LearnerGraphs): a
        uniform ReplayBuffer cannot (it draws with its host-side count), so there only the update is graphed."""
        if self.args.cudagraphs and self.device.type == "cuda" and getattr(buffer, "capturable", False):
            return LearnerGraphs(learn, buffer)
        return learn

    # ---- the loop ------------------------------------------------------------------------------------------

    def start(self, parts: dict, counts: tuple, policy: Callable, model: dict[str, nn.Module]):
        """Reset the envs, open the run directories; return the loop's (obs, counts), as given or as the checkpoint
        left them (every part restored; an evaluation it left due run first).

        parts: what a checkpoint saves (state_dict / load_state_dict, the env, lists of NumPy generators);
        counts: the loop's counters, counts[0] the step; policy(obs, rngs) -> actions: the evaluation policy for
        all seeds' rows, rngs[i] seed i's generator for that evaluation; model: the networks model.pt holds, by
        their names in `parts` (one network: model.pt is its state_dict, several: a state_dict per name)."""
        self.parts, self.policy, self.model = parts, policy, model
        env, state = parts["env"], self.resumed
        obs, _ = env.reset(seed=env_seeds(self.seeds, self.args.num_envs))
        if self.args.evaluate:
            self.step, self.source = load_model(self.dir, self.algo, self.model)
            return obs, counts
        if state is None:
            self._check_memory(obs)
        else:
            self._keep_left_out(state)
            obs, counts = restore(self.parts, state, self.cut, self.dir)
            self.due, self.last, self.recent = state["due"], state["last"], state["recent"]
        configs = [{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(run).items() if k not in ONE_OFF}
                   for run in self.members]  # the run's settings: --config of it trains it again, as a new run
        self.metrics, sizes, sent = [], state["metrics_bytes"] if state else [0] * len(self.dirs), []
        self.records = []  # each seed's records so far: the index of its next line of metrics.jsonl
        for config, path, size in zip(configs, self.dirs, sizes, strict=True):
            path.mkdir(parents=True, exist_ok=True)
            write_atomic(path / "config.yaml", lambda f, c=config: f.write(
                yaml.safe_dump({"algo": self.algo, **c}, sort_keys=False).encode()))
            lines = (path / "metrics.jsonl").read_bytes() if (path / "metrics.jsonl").exists() else b""
            sent.append(lines.count(b"\n"))  # what W&B has: every record written before the stop
            self.records.append(lines[:size].count(b"\n"))
            self.metrics.append(open(path / "metrics.jsonl", "a", buffering=1))  # noqa: SIM115 (closed in finish)
            self.metrics[-1].truncate(size)  # drop what came after the checkpoint
        if self.args.track:
            ids = state["wandb_ids"] if state else None
            self.wandb, self.wandb_sent = start_wandb(self.args, configs, self.dirs, ids, sent, self.records)
        pack = f" (and {len(self.dirs) - 1} more seeds beside it)" if len(self.dirs) > 1 else ""
        print(f"{'resuming' if state else 'run'} {self.dir}{pack} on {self.device}, {self.precision_why}, settings in "
              f"{self.dir / 'config.yaml'}", flush=True)  # seen at once in a log file
        self.progress = Progress(self.args.total_timesteps, counts[0])
        self.handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.start_time, self.start_step, self.eval_time = time.time(), counts[0], 0.0
        self.wall_before = state.get("wall_s", 0.0) if state else 0.0  # the run's time up to its checkpoint
        if self.due is not None:
            self.evaluate(self.due)
        return obs, counts

    def _check_memory(self, obs: np.ndarray) -> None:
        """Refuse, in one line before anything is written, a replay buffer of frames that will not fit in memory
        once full (a part with check_memory(obs), which raises a MemoryError whose `fits` is the capacity that does)."""
        for part in self.parts.values():
            if hasattr(part, "check_memory"):
                try:
                    part.check_memory(obs)
                except MemoryError as e:
                    if getattr(e, "fits", None) is None:
                        fail(str(e))
                    fail(f"a replay buffer of {self.args.buffer_size:,} transitions of {self.args.env} needs "
                         f"{e.needed / 2**30:.2f} GiB of memory and {e.available / 2**30:.2f} GiB are available "
                         f"({e.source}): pass --buffer-size {e.fits} ({e.fits_bytes / 2**30:.2f} GiB), or free memory")

    def _keep_left_out(self, state: dict) -> None:
        """--members: each member left out keeps its networks, in its model.pt, before the smaller pack writes its
        checkpoint over the one that held them (with --no-save-model they were only there). Only --members leaves
        members out: a run resumed from a copy of its directory leaves the original as it is."""
        if self.cut is None:
            return
        missing = [path for path in self.saved_dirs if path not in self.dirs and not (path / "model.pt").exists()]
        if not missing:
            return
        shapes = plain_shapes(self.model)
        for path in missing:
            model = member_model(state, self.saved_dirs.index(path), shapes)
            save_atomic(next(iter(model.values())) if len(model) == 1 else model, path / "model.pt")
        print(f"kept the networks of {', '.join(path.name for path in missing)}, left out, in their model.pt")

    def _on_signal(self, signum: int, _frame) -> None:
        self.signal = self.signal or signal.Signals(signum).name

    def training(self, step: int) -> bool:
        paused = 0 < self.args.stop_step <= step  # --stop-step: a rung of successive halving, say
        return step < self.args.total_timesteps and not (self.signal or self.reached or paused or self.args.evaluate)

    def log(self, step: int, metrics: dict, seed: int | None = None) -> None:
        """A record for each seed: a list gives each seed its entry, a tensor each seed the mean of its rows (a
        pack's [seeds, ...]), anything else is every seed's; `seed`: for that seed (its row in the pack) alone."""
        seeds = len(self.dirs)  # a tensor: each seed's mean of its entries (one seed: of them all)
        metrics = {k: (v.detach() if v.is_floating_point() else v.detach().float()).reshape(seeds, -1).mean(1).tolist()
                   if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}  # (float64: a member's setting)
        for i in range(len(self.dirs)) if seed is None else [seed]:
            record = {"global_step": step, **{k: float(v[i] if isinstance(v, list) else v) for k, v in metrics.items()}}
            self.metrics[i].write(json.dumps(record) + "\n")
            if self.wandb is not None and self.records[i] >= self.wandb_sent[i]:
                self.wandb[i].log(record, step=self.records[i])
            self.records[i] += 1

    def episodes(self, step: int, finished: list[dict], extra: dict | None = None) -> None:
        """Log the episodes that ended at this step (envs.TransitionRecorder's), each for its seed."""
        for episode in finished:
            self.recent = (self.recent + [episode["episodic_return"]])[-20:]
            self.log(step, {f"charts/{k}": v for k, v in episode.items() if k != "env"} | (extra or {}),
                     seed=episode["env"] // self.args.num_envs)

    def end_of_step(self, previous: int, step: int, obs: np.ndarray, counts: tuple) -> None:
        """What falls due between the loop's steps `previous` and `step`: the progress line (every 1000 steps),
        an evaluation (every eval_frequency: it ends training at --stop-return) and a checkpoint."""
        if crossed(1000, previous, step):
            sps = (step - self.start_step) / (time.time() - self.start_time - self.eval_time)
            self.log(step, {"charts/SPS": sps, "charts/wall_time_s": round(self.wall_s(), 1)})  # a curve in time
            self.progress.update(step, sps, self.recent)
        if crossed(self.args.eval_frequency, previous, step):
            self.evaluate(step)
        if crossed(self.args.checkpoint_frequency, previous, step):
            self.checkpoint(obs, counts)

    def evaluation(self, video_dirs: list[str] | None = None, abort=None) -> list[list[float]]:
        """Each seed's episodes of its policy, all seeds in one vector env: envs and exploration seeded with
        seed + 10000, afresh for every evaluation (so --evaluate plays the training's final one again)."""
        seeds = [seed + EVAL_SEED_OFFSET for seed in self.seeds]
        rngs = [np.random.default_rng(seed) for seed in seeds]
        self.capped = []  # each seed's episodes that the episode cap ended: a stalled policy (see stalled)
        return evaluate(self.args.env, lambda obs: self.policy(obs, rngs), self.args.eval_episodes, seeds,
                        abort=abort, video_dir=video_dirs, capped=self.capped)

    def stalled(self, step: int) -> None:
        """Says so, in the metrics and in one printed line, when the cap ended some episodes of the evaluation just
        made: their policy kept the game from ending (on Atari: no FIRE after a lost life, or play that never ends a
        game, as some greedy Pong policies did half-way through training), so their returns are not a whole game's."""
        if not any(self.capped):
            return
        if self.args.evaluate is None:
            self.log(step, {"eval/capped_episodes": self.capped})
        counts = ", ".join(f"{n} of {self.args.eval_episodes}" for n in self.capped)
        message = (f"evaluation at step {step}: {counts} episodes ended at the episode cap, not by the game: the "
                   "policy kept it from ending (on Atari: no FIRE after a lost life, or play that never ends a game)")
        say(message)

    def evaluate(self, step: int, video: bool = False, final: bool = False) -> None:
        """The evaluation due at `step`, logged once (a periodic one also printed in a line; the final one has its
        own, see finish); a signal cuts it short and leaves it due (see start)."""
        self.due, tick, logged = step, time.time(), self.last is not None and self.last[0] == step
        try:
            returns = self.evaluation(video_dirs=[str(path / "videos") for path in self.dirs] if video else None,
                                      abort=lambda: self.signal is not None)
        except KeyboardInterrupt:
            return
        finally:
            self.eval_time += time.time() - tick
        self.due, self.last = None, (step, returns, self.capped)
        if not logged:  # a final evaluation at the step of a periodic one is that one (run again for a video)
            self.log(step, {"eval/episodic_return": [np.mean(seed_returns) for seed_returns in returns]})
            if not final:
                self.progress.evaluation(step, returns)
            self.stalled(step)
        self.reached = self.args.stop_return is not None and np.mean(returns[0]) >= self.args.stop_return

    def wall_s(self) -> float:
        """The run's wall time: this process's and, resumed, that of the processes up to its checkpoint."""
        return self.wall_before + time.time() - self.start_time

    def checkpoint(self, obs: np.ndarray, counts: tuple) -> None:
        """checkpoint.pt: all the loop needs to go on bit for bit (resume.py)."""
        state = {"algo": self.algo, "args": asdict(self.plain), "counts": counts, "obs": torch.as_tensor(obs),
                 "due": self.due, "last": self.last, "recent": self.recent,
                 "wandb_ids": [w.id for w in self.wandb] if self.wandb else None,
                 "dirs": [path.name for path in self.dirs], "wall_s": self.wall_s(),
                 "precision_asked": self.precision_asked, "precision_changes": self.precision_changes}
        save_checkpoint(self.dir / "checkpoint.pt", state, self.parts, self.metrics)

    def finish(self, obs: np.ndarray, counts: tuple) -> dict | list[dict]:
        """The final evaluation, a checkpoint (when stopped or checkpointing), each seed's model.pt, summary.json and
        closing line; returns the summary (a list of them for a pack). --evaluate: its record."""
        if self.args.evaluate:
            return self._reevaluate()
        args, step, train_time = self.args, counts[0], time.time() - self.start_time - self.eval_time
        if self.signal is None and (self.last is None or self.last[0] != step or args.capture_video):
            self.evaluate(step, video=args.capture_video, final=True)
        paused = self.signal is None and not self.reached and step < args.total_timesteps  # at --stop-step
        if self.signal is not None or paused or args.checkpoint_frequency:  # after the loop's own at this step, which
            self.checkpoint(obs, counts)  # a kill during the final evaluation falls back to; this one holds its returns
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        self.parts["env"].close()
        if self.signal is not None:
            print(f"stopped by {self.signal} at step {step}; continue: python {sys.argv[0]} --resume {self.dir}")
        elif paused:
            print(f"paused at step {step} (--stop-step), evaluated; continue: python {sys.argv[0]} --resume {self.dir}")
        self.progress.close()
        summaries = []
        for i, (seed, path) in enumerate(zip(self.seeds, self.dirs, strict=True)):
            if args.save_model:
                save_atomic(self._seed_model(i), path / "model.pt")
            returns = self.last[1][i] if self.signal is None else []  # a stopped run has no final evaluation
            capped = self.last[2] if self.last is not None and len(self.last) > 2 else []  # older checkpoints: none
            mean, std = mean_std(returns) if returns else (None, None)
            summary = {"run_name": path.name, "env": args.env, "algo": args.exp_name, "seed": seed,
                       "eval_return_mean": mean, "eval_return_std": std, "eval_episodes": len(returns),
                       "eval_returns": returns, "global_step": step, "updates": counts[1],
                       "eval_capped": capped[i] if self.signal is None and i < len(capped) else None,
                       "interrupted": bool(self.signal) or paused,  # paused: evaluated, to be resumed
                       "train_sps": (step - self.start_step) / max(train_time, 1e-9),
                       "wall_time_s": self.wall_s(), "num_seeds": len(self.seeds),
                       "pack_dirs": [p.name for p in self.dirs], "precision": self.precision}
            if self.precision_changes:  # --resume --precision: the steps before were computed in another
                summary["precision_changes"] = self.precision_changes
            write_json_atomic(summary, path / "summary.json")
            summaries.append(summary)
            self.metrics[i].close()
            if self.wandb is not None:
                finish_wandb(self.wandb[i], path, step, self.records[i], summary)
            result = spread(returns, "episodes") if returns else "none"
            print(f"final evaluation: {result} | {step} steps | {summary['wall_time_s']:.0f} s | {path}")
        return summaries[0] if len(summaries) == 1 else summaries

    # ---- model.pt and --evaluate ---------------------------------------------------------------------------

    def _seed_model(self, i: int) -> dict:
        """Seed i's model.pt: the plain network's state_dict (several networks: a state_dict for each name)."""
        model = {name: seed_state_dict(network, i) for name, network in self.model.items()}
        return next(iter(model.values())) if len(model) == 1 else model

    def _reevaluate(self) -> dict:
        """--evaluate: one record, evaluations/<time>.json (settings and every episode's return), the video beside
        it; the run directory is otherwise left as it was."""
        args, start = self.args, time.time()
        out, stamp = self.dir / "evaluations", f"{start:.3f}"
        out.mkdir(exist_ok=True)
        video = out / f"{stamp}-video" if args.capture_video else None
        returns = self.evaluation(video_dirs=[str(video)] if video else None)[0]
        self.stalled(self.step)
        mean, std = mean_std(returns)
        record = {"run": str(self.dir), "networks": self.source, "global_step": self.step, "seed": args.seed,
                  "eval_episodes": args.eval_episodes, "eval_epsilon": getattr(args, "eval_epsilon", None),
                  "returns": returns, "mean": mean, "std": std, "capped": self.capped[0] if self.capped else None,
                  "video": None, "time": stamp}
        if video is not None:  # env 0's first episode: the first return
            record["video"] = f"{stamp}-episode-0-return-{returns[0]:g}.mp4"
            os.replace(video / "eval-episode-0.mp4", out / record["video"])
            video.rmdir()
        write_json_atomic(record, out / f"{stamp}.json")
        if args.track:  # into the run's own W&B run
            log_evaluation(args, self.dir, mean, std, out / record["video"] if video else None)
        self.parts["env"].close()
        print(f"final evaluation: {spread(returns, 'episodes')} | {self.step} steps | "
              f"{time.time() - start:.0f} s | {out / (stamp + '.json')}")
        return record
