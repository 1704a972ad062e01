"""--resume: the checkpoint a run writes, and the run it continues from one.

    state = load_checkpoint(args.resume, algo)                 # args.py: plain data, weights_only
    args, dirs, cut = resumed(args, state, extended)           # the arguments and directories that go on
    obs, counts = restore(parts, state, cut, directory)        # every part as the checkpoint left it
    save_checkpoint(directory / "checkpoint.pt", state, parts, metrics)

A checkpoint holds all the loop needs to go on bit for bit: the parts the file hands the run (networks, optimizers,
replay, env, generators), the loop's counts and observations, an evaluation left due, the global generators, the W&B
ids and the length of each metrics.jsonl. A pack's is in its first member's directory and lists the pack's
directories; `--members` cuts it to some of them (cut.py).
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from envs import env_state, load_env_state  # isort: skip

from .args import fail
from .cut import member_rows, part_rows
from .files import save_atomic
from .members import members, repacked


def resumed(args, state: dict, extended):
    """(args, dirs, cut) of a resumed run: the run goes on in the directory named, wherever it is; a pack's other seeds
    in the directories beside it, which must be the pack's own (a renamed or partial copy would write into another
    run's files). cut: with --members, (the kept members' rows, the pack's size), and `state`'s per-member lists and
    observations cut to those rows (the parts are cut by restore, which knows their layouts); else None."""
    here, names, step = Path(args.resume), state["dirs"], state["counts"][0]
    if len(names) > 1:
        if here.name != names[0]:
            fail(f"{here} holds the checkpoint of a pack of {len(names)} seeds saved in {names[0]}: resume it "
                 f"under that name, in a copy of the pack's whole folder (its directories keep their names)")
        missing = [name for name in names[1:] if not (here.parent / name / "config.yaml").is_file()]
        if missing:
            fail(f"cannot resume the pack in {here}: the directories of its other seeds ({', '.join(missing)}) "
                 f"are not beside it in {here.parent}; copy the pack's directories together")
    saved, total, cut = state["args"]["total_timesteps"], args.total_timesteps, None
    args = replace(args, run_name=here.name)
    if total < step:
        fail(f"--total-timesteps {total} is below the step the run reached, {step}")
    if total != saved:  # train longer: schedules go on from here (see the file's `extended`), member by member
        args = repacked(args, [extended(replace(run, total_timesteps=saved), step, total) for run in members(args)])
    dirs = [here] + [here.parent / name for name in names[1:]]
    rows = kept_rows(here, names, args.members, state) if args.members else list(range(len(names)))
    if len(rows) < len(names):
        args = replace(repacked(args, [members(args)[i] for i in rows]), run_name=names[rows[0]], members=())
        dirs, cut = [dirs[i] for i in rows], (rows, len(names))
        envs = len(state["obs"]) // len(names)
        state["obs"] = state["obs"][member_rows(rows, envs)]
        state["last"] = state["last"] and (state["last"][0], [state["last"][1][i] for i in rows])
        for key in ("wandb_ids", "metrics_bytes", "dirs"):
            state[key] = state[key] and [state[key][i] for i in rows]
    return replace(args, members=()), dirs, cut


def kept_rows(here: Path, names: list[str], kept: tuple[str, ...], state: dict) -> list[int]:
    """The rows of the members --members keeps, in the pack's order; what cannot be cut refused in one line."""
    if len(names) == 1:
        fail(f"--members picks members of a pack, and {here} holds a lone run's checkpoint")
    unknown = [name for name in kept if name not in names]
    if unknown:
        fail(f"--members {' '.join(unknown)}: not a member of the pack in {here} (its members: {', '.join(names)})")
    if len(set(kept)) < len(kept):
        fail(f"--members names a member twice: {' '.join(kept)}")
    if not state["env"].get("exact") or (state.get("rb") or {}).get("frames") is not None:
        fail(f"--members: the pack in {here} cannot be cut exactly (Atari emulators cannot be saved, and a replay "
             "that stores frames once is not cut by member): resume it whole")
    return [i for i, name in enumerate(names) if name in kept]


def restore(parts: dict, state: dict, cut: tuple | None, directory: Path) -> tuple[np.ndarray, tuple]:
    """Every part from the checkpoint; the loop's (obs, counts). Atari starts new games (see envs/state.py) with no
    episode statistics or n-step windows of the old ones."""
    try:
        if cut is not None:  # --members: every part cut to the kept members' rows (cut.py)
            rows, n = cut
            state = {**state, **{name: part_rows(part, state[name], rows, n, env_state(part) if name == "env"
                                                 else None) for name, part in parts.items()}}
        games = load_env_state(parts["env"], state["env"])
        for name, part in parts.items():
            if name == "env" or (games is not None and name in ("recorder", "nstep")):
                continue
            if isinstance(part, list):  # a NumPy generator per seed
                for generator, generator_state in zip(part, state[name], strict=True):
                    generator.bit_generator.state = generator_state
            else:  # the buffer adopts the memory-mapped storage: no second copy
                part.load_state_dict(state[name], **({"copy": False} if name == "rb" else {}))
        generators(state["generators"])
    except (KeyError, ValueError, RuntimeError) as e:
        fail(f"cannot resume from {directory}: {e}")
    return (state["obs"].numpy() if games is None else games), state["counts"]


def save_checkpoint(path: Path, state: dict, parts: dict, metrics: list) -> None:
    """checkpoint.pt: the run's `state` and every part's, after the metrics written so far are on disk (the
    checkpoint records their lengths); written, synced, then renamed into place."""
    for file in metrics:
        file.flush()
        os.fsync(file.fileno())
    state = {**state, "metrics_bytes": [file.tell() for file in metrics], "generators": generators()}
    for name, part in parts.items():
        state[name] = [g.bit_generator.state for g in part] if isinstance(part, list) else \
            env_state(part) if name == "env" else part.state_dict()
    save_atomic(state, path)


def generators(state: tuple | None = None) -> tuple:
    """The global generators' states (Python, legacy NumPy, torch); with `state`, restore them first."""
    if state is not None:
        random.setstate(state[0])
        np.random.set_state((state[1][0], np.array(state[1][1], dtype=np.uint32), *state[1][2:]))
        torch.set_rng_state(state[2])
    legacy = np.random.get_state()
    return random.getstate(), (legacy[0], legacy[1].tolist(), *legacy[2:]), torch.get_rng_state()
