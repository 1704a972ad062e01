"""Helpers for the algorithm tests: import an algos/ script as a module, tiny budgets, run paths."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_algo(name: str) -> ModuleType:
    """algos/<name>.py as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(f"algos_{name}", ROOT / "algos" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing.get_type_hints look the module up by name
    spec.loader.exec_module(module)
    return module


def parse(module: ModuleType, argv: list[str]):
    """The file's arguments from a command line, as `python algos/<name>.py ARGV` parses them."""
    return module.parse_args(module.Args, module.__doc__, getattr(module, "ATARI_PRESET", None), argv=argv)


def tiny_args(module: ModuleType, **changes):
    """The script's Args with budgets small enough for a smoke test that still reaches gradient steps."""
    tiny = dict(total_timesteps=400, learning_starts=100, buffer_size=1000, batch_size=16, train_frequency=2,
                gradient_steps=1, eval_episodes=2, cuda=False, run_name="smoke")
    fields = {f.name for f in dataclasses.fields(module.Args)}
    return dataclasses.replace(module.Args(), **{k: v for k, v in {**tiny, **changes}.items() if k in fields})


def run_dir_of(root: Path, args) -> Path:
    return Path(root) / "runs" / args.run_name
