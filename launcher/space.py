"""A tune's search space file: which settings of an algorithm file Optuna may propose, and how.

    learning_rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}   # log: sampled on a log scale
    exploration_fraction: {type: float, low: 0.05, high: 0.3, step: 0.05}
    target_network_frequency: {type: int, low: 100, high: 1000, step: 100}
    loss: {type: choice, choices: [mse, huber]}

Every error in the file is one line naming the file, the key and what is wrong.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from launcher import fail

TYPES = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}, "choice": {"choices"}}


def optuna_module():
    """Optuna, or a one-line error saying how to install it (it is an optional extra)."""
    try:
        import optuna
    except ImportError:
        fail('run.py tune needs Optuna: pip install -e ".[tune]" (or pip install optuna)')
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tune prints its own line per trial
    return optuna


def args_class(script: Path) -> type:
    """The Args dataclass of an algorithm file (imported as a module: its settings, their types, Packable)."""
    name = f"tuned_{script.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name].Args


def space_from(path: Path, args: type, refused: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The search space in a YAML file, checked against the settings of `args` (an algorithm's Args); any error is
    one line naming the file, the key and what is wrong. `refused`: settings it may not search, and why."""
    from harness import type_name, typed

    try:
        space = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        fail(f"space {path}: cannot read it: {' '.join(str(e).split())}")
    if not isinstance(space, dict) or not space:
        fail(f"space {path}: must map settings to what to try, e.g. learning_rate: {{type: float, low: 1.0e-4, "
             "high: 1.0e-2, log: true}")
    hints = typing.get_type_hints(args)
    for key, spec in space.items():
        where = f"space {path}: {key}"
        if key in refused:
            fail(f"{where}: {refused[key]}")
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints))
            fail(f"{where}: {args.__module__.removeprefix('tuned_')}.py has no such setting "
                 f"(closest: {', '.join(close) or 'none'})")
        if not isinstance(spec, dict) or spec.get("type") not in TYPES:
            fail(f"{where}: give a mapping with type: float, int or choice, got {spec!r}")
        unknown = set(spec) - TYPES[spec["type"]] - {"type"}
        if unknown:
            fail(f"{where}: a {spec['type']} takes {', '.join(sorted(TYPES[spec['type']]))}, not "
                 f"{', '.join(sorted(map(str, unknown)))}")
        if spec["type"] == "choice":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                fail(f"{where}: choices must be a list of values, got {choices!r}")
            for choice in choices:
                try:
                    typed(choice, hints[key])
                except ValueError:
                    fail(f"{where}: the choice {choice!r} is not {type_name(hints[key])}")
            continue
        number = int if spec["type"] == "int" else (int, float)
        for bound in ("low", "high"):
            value = spec.get(bound)
            if not isinstance(value, number) or isinstance(value, bool):
                fail(f"{where}: {bound} must be a{'n int' if spec['type'] == 'int' else ' number'}, got {value!r}")
        try:  # a float's bounds as floats: an int setting cannot take them
            typed(float(spec["low"]) if spec["type"] == "float" else spec["low"], hints[key])
        except ValueError:
            fail(f"{where}: {key} is {type_name(hints[key])}, so type: {spec['type']} cannot give it")
        if spec["low"] >= spec["high"]:
            fail(f"{where}: low {spec['low']} must be below high {spec['high']}")
        if spec.get("log") and spec["low"] <= 0:
            fail(f"{where}: log needs low > 0, got {spec['low']}")
        if spec.get("log") and spec.get("step") not in (None, 1 if spec["type"] == "int" else None):
            fail(f"{where}: a{'n' if spec['type'] == 'int' else ''} {spec['type']} takes log or step, not both")
        step = spec.get("step")
        if step is not None and (not isinstance(step, number) or isinstance(step, bool) or step <= 0):
            fail(f"{where}: step must be a positive {'int' if spec['type'] == 'int' else 'number'}, got {step!r}")
        try:  # what Optuna refuses besides, in its words
            distributions({key: spec})
        except (ValueError, TypeError) as e:
            fail(f"{where}: {' '.join(str(e).split())}")
    return space


def distributions(space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Optuna's distributions for a checked space."""
    optuna = optuna_module()
    result = {}
    for key, spec in space.items():
        if spec["type"] == "choice":
            result[key] = optuna.distributions.CategoricalDistribution(spec["choices"])
        elif spec["type"] == "int":
            result[key] = optuna.distributions.IntDistribution(spec["low"], spec["high"], log=bool(spec.get("log")),
                                                               step=spec.get("step") or 1)
        else:
            result[key] = optuna.distributions.FloatDistribution(float(spec["low"]), float(spec["high"]),
                                                                 log=bool(spec.get("log")), step=spec.get("step"))
    return result
