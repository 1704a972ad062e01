"""What every algorithm file needs around its loop: arguments, a run directory, logging.

    args = parse_args(Args)        # tyro CLI; --config file.yaml supplies defaults, flags override
    run = Run(args)                # runs/<run_name>/ with config.yaml; W&B if args.track
    run.log(global_step, {"charts/SPS": 812.0})     # metrics.jsonl (+ W&B)
    run.progress(global_step, episodic_return)      # the progress bar
    run.finish({"eval_return_mean": ...})           # summary.json, closes everything

The run directory layout is DESIGN.md's: config.yaml, metrics.jsonl, summary.json, and
model.pt / videos/ when asked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import torch
import tyro
import yaml
from tqdm import tqdm

T = TypeVar("T")


def fail(message: str) -> typing.NoReturn:
    """Stop with a one-line error for the user instead of a traceback."""
    raise SystemExit(f"error: {message}")


def parse_args(cls: type[T], argv: list[str] | None = None) -> T:
    """Parse the command line into `cls`; a `--config` YAML file gives the defaults."""
    argv = sys.argv[1:] if argv is None else list(argv)
    defaults = cls()
    path = _config_path(argv)
    if path is not None:
        defaults = dataclasses.replace(defaults, **load_config(path, cls), config=path)
    return tyro.cli(cls, args=argv, default=defaults)


def _config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def load_config(path: str | os.PathLike, cls: type) -> dict[str, Any]:
    """Read a flat YAML mapping of `cls` field names to values, checking names and types."""
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except OSError as e:
        fail(f"cannot read config {path}: {e.strerror}")
    except yaml.YAMLError as e:
        fail(f"config {path} is not valid YAML: {e}")
    if not isinstance(values, dict):
        fail(f"config {path} must be a mapping of argument names to values")
    values.pop("algo", None)  # names the script for run.py; not an argument
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "config"]
    checked = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            fail(f"unknown key {key!r} in config {path}; valid keys: {', '.join(fields)}")
        value = _float_if_numeric(value, hints[name])
        if not _matches(value, hints[name]):
            fail(f"config {path}: {key} = {value!r} is not of type {_type_name(hints[name])}")
        checked[name] = value
    return checked


def _float_if_numeric(value: Any, annotation: Any) -> Any:
    """YAML reads 1e-4 as a string and 3 as an int; a float field takes both as floats."""
    if float not in (annotation, *typing.get_args(annotation)) or isinstance(value, bool):
        return value
    try:
        return float(value) if isinstance(value, (int, str)) else value
    except ValueError:
        return value


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (tuple, list):
        return isinstance(value, list) and all(_matches(v, typing.get_args(annotation)[0]) for v in value)
    return isinstance(value, annotation)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def select_device(want_cuda: bool) -> torch.device:
    if want_cuda and not torch.cuda.is_available():
        warnings.warn("--cuda was asked for but no CUDA device is available; running on the CPU", stacklevel=2)
    return torch.device("cuda" if want_cuda and torch.cuda.is_available() else "cpu")


class Run:
    """A run directory, metrics.jsonl, optional W&B, and a progress bar."""

    def __init__(self, args: Any, root: str | os.PathLike = "runs"):
        self.args = args
        self.name = args.run_name or f"{args.env.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.dir = Path(root) / self.name
        if self.dir.exists():
            fail(f"run directory {self.dir} already exists; pick another --run-name or remove it")
        self.dir.mkdir(parents=True)
        self.start = time.time()
        config = {k: v for k, v in dataclasses.asdict(args).items()}
        config["run_name"] = self.name
        (self.dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self._metrics = open(self.dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in finish)
        self.wandb = None
        if args.track:
            import wandb

            self.wandb = wandb.init(
                project=args.wandb_project_name, entity=args.wandb_entity, group=args.wandb_group,
                name=self.name, config=config, dir=str(self.dir), save_code=True,
            )
            self.wandb.define_metric("*", step_metric="global_step")
        self.bar = tqdm(total=args.total_timesteps, unit="step", dynamic_ncols=True, mininterval=1.0,
                        disable=None if sys.stderr.isatty() else True)
        self._last_bar = 0
        print(f"run {self.name}: {self.dir}\n" + "\n".join(f"  {k}: {v}" for k, v in config.items()))

    def log(self, global_step: int, metrics: dict[str, float]) -> None:
        record = {"global_step": int(global_step)}
        record.update({k: _plain(v) for k, v in metrics.items()})
        self._metrics.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log(record)

    def progress(self, global_step: int, recent_return: float | None, sps: float | None = None) -> None:
        self.bar.update(global_step - self._last_bar)
        self._last_bar = global_step
        postfix = {}
        if sps is not None:
            postfix["SPS"] = f"{sps:.0f}"
        if recent_return is not None:
            postfix["return"] = f"{recent_return:.1f}"
        self.bar.set_postfix(postfix, refresh=False)

    def video(self, path: Path, global_step: int) -> None:
        if self.wandb is not None and path.exists():
            import wandb

            self.wandb.log({"global_step": global_step, "media/video": wandb.Video(str(path), format="mp4")})

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        self.bar.close()
        summary = {"run_name": self.name, "env": self.args.env, "algo": self.args.exp_name,
                   "seed": self.args.seed, **summary, "wall_time_s": time.time() - self.start}
        (self.dir / "summary.json").write_text(json.dumps({k: _plain(v) for k, v in summary.items()}, indent=2))
        self._metrics.close()
        if self.wandb is not None:
            self.wandb.summary.update({k: _plain(v) for k, v in summary.items() if not isinstance(v, list)})
            self.wandb.finish()
        return summary


def _plain(value: Any) -> Any:
    """JSON-safe python value from tensors, numpy scalars and lists of them."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        value = value.item()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
