"""--evaluate's loading: a run directory's networks, from its model.pt or from the checkpoint that holds them.

A run that saved no model.pt (--no-save-model) keeps its networks only in a checkpoint: its own, or, a pack's member,
its row of the pack's checkpoint in the pack's first directory, found from summary.json's pack_dirs or, a pack killed
before it wrote one, from the checkpoints beside it that list the member.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import yaml

from .args import fail, load_checkpoint
from .files import read_json
from .progress import say


def load_model(directory: Path, algo: str, model: dict[str, nn.Module]) -> tuple[int | None, str]:
    """Load the networks of the run in `directory` into `model` (by their names); (the step they are of, their
    source: "model.pt" or "checkpoint.pt"). Nothing to load, or what cannot be loaded, is refused in one line."""
    summary = read_json(directory / "summary.json") or {}
    step, model_file = summary.get("global_step"), directory / "model.pt"
    source = "model.pt" if model_file.exists() else "checkpoint.pt"
    holder = None if model_file.exists() else checkpoint_holder(directory, algo, summary.get("pack_dirs"))
    if not model_file.exists() and holder is None:
        fail(f"{directory} has no model.pt, and no checkpoint.pt holds its networks: nothing to evaluate")
    try:
        if model_file.exists():
            saved = torch.load(model_file, weights_only=True)
            saved = {next(iter(model)): saved} if len(model) == 1 else saved
        else:
            state = load_checkpoint(holder, algo)  # a lone run's (renamed or not), or the pack's
            if len(state["dirs"]) > 1 and directory.name not in state["dirs"]:
                fail(f"{directory} has no model.pt, and the checkpoint in {holder} no longer holds it: its pack went "
                     f"on without it, and no model.pt of it was kept (its members now: {', '.join(state['dirs'])})")
            step = state["counts"][0]
            if summary.get("global_step") is not None and step < summary["global_step"]:
                # a pack's member cut at a rung before it was left out: its checkpoint is of that step, not the end
                say(f"note: {directory} kept no model.pt; its networks come from the checkpoint in {holder}, of step "
                    f"{step:,}, not of the step {summary['global_step']:,} it trained to")
            saved = {name: state[name] for name in model} if len(state["dirs"]) == 1 else \
                member_model(state, state["dirs"].index(directory.name), plain_shapes(model))
        for name, network in model.items():
            network.load_state_dict(saved[name])
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        fail(f"cannot load the networks of {directory} from {source}: {e}")
    return step, source


def plain_shapes(model: dict[str, nn.Module]) -> dict[str, dict[str, torch.Size]]:
    """Each network's tensors' shapes in the plain network (a pack's stacked network knows them: seeds.stacked)."""
    return {name: getattr(network, "seed_shapes", None) or {key: value.shape for key, value in
                                                              network.state_dict().items()}
            for name, network in model.items()}


def member_model(state: dict, row: int, shapes: dict[str, dict[str, torch.Size]]) -> dict[str, dict]:
    """The networks of the pack's member in `row`, from the pack's checkpoint `state`: each a plain state_dict (its
    tensors cloned: a view of a stacked tensor would save the whole stack)."""
    return {name: {key: state[name][key][row].reshape(shape).clone() for key, shape in network.items()}
            for name, network in shapes.items()}


def checkpoint_holder(directory: Path, algo: str, pack_dirs: list[str] | None) -> Path | None:
    """The directory whose checkpoint.pt holds this run's networks: its own (a lone run, or a pack's first member),
    or its pack's first member's, named by summary.json, else (a pack stopped before it wrote one) found beside it
    from the pack's own record of its members: a checkpoint whose list of run directories holds this one (the
    members' seeds and values say nothing of their pack: seeds 1 and 3, or 1 and 1)."""
    if (directory / "checkpoint.pt").exists():
        return directory
    if pack_dirs:
        holder = directory.parent / pack_dirs[0]
        return holder if (holder / "checkpoint.pt").exists() else None
    for candidate in sorted(p.parent for p in directory.parent.glob("*/checkpoint.pt")):
        if read_yaml(candidate / "config.yaml").get("algo") == algo and \
                directory.name in load_checkpoint(candidate, algo)["dirs"]:
            return candidate
    return None


def read_yaml(path: Path) -> dict:
    """A YAML mapping from `path`, or {} when it is missing or unreadable."""
    try:
        value = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}
