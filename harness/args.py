"""The run's own arguments, and the command line of an algorithm file: --config, the Atari preset, --resume and
--evaluate, all through tyro with defaults from a dataclass instance (flags always win).

    @dataclass
    class Args(RunArgs):        # the algorithm's hyper-parameters; RunArgs adds the run's options
        learning_rate: float = 1e-3  # Adam's learning rate (the comment is the --help text)

    args = parse_args(Args, __doc__, ATARI_PRESET)

A bad YAML key or value, a flag --resume or --evaluate cannot take, or a run of another algorithm is a one-line
error (SystemExit), never a traceback.
"""

from __future__ import annotations

import difflib
import sys
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import torch
import tyro
import yaml

from envs import is_atari  # isort: skip (the sibling package; see README, "Use it in your own code")


class Packable:
    """`gamma: Packable[float] = 0.99`: a setting the members of a pack may differ in (--pack, harness/members.py),
    one that changes no tensor's shape and no step at which the loop does something; to the CLI, a plain float."""

    def __class_getitem__(cls, hint):
        return Annotated[hint, cls]


def packable(args_class: type) -> list[str]:
    """The settings of args_class marked Packable."""
    hints = typing.get_type_hints(args_class, include_extras=True)
    return [name for name, hint in hints.items() if Packable in getattr(hint, "__metadata__", ())]


@dataclass
class RunArgs:
    """Options of the run around an algorithm, shared by every file (an algorithm's Args extends this)."""

    env: str = "CartPole-v1"  # the environment id
    total_timesteps: int = 100_000  # environment steps of each seed, summed over its parallel environments
    num_envs: int = 1  # parallel environments of each seed
    eval_frequency: int = 0  # environment steps between evaluations during training (0: only the final one)
    eval_episodes: int = 10  # episodes per evaluation
    stop_return: float | None = None  # stop once an evaluation's mean return reaches this (needs eval_frequency)
    stop_step: int = 0  # pause at this step: evaluate, save a checkpoint to --resume (schedules keep total_timesteps)

    seed: int = 1  # seed of the run: networks, exploration, replay sampling and environments
    num_seeds: int = 1  # train seeds seed .. seed+num_seeds-1 in this process, each its own run (README: packs)
    pack: tuple[str, ...] = ()  # members' own settings, KEY=V1,V2,... one value per member: alpha=0,0.6 seed=1,1
    exp_name: str | None = None  # the name of this experiment, part of the run name (default: the file's name)
    run_name: str | None = None  # the run directory under runs/ (default: <env>__<exp_name>__<seed>__<unix time>)
    config: str | None = None  # YAML file of argument defaults (keys: the names above); flags override it
    resume: str | None = None  # continue the run in this directory from its checkpoint (--total-timesteps may change)
    members: tuple[str, ...] = ()  # with --resume of a pack: go on with only these members (run dir names) as a pack
    schedule_start: int = 0  # the step the schedules start from (an extending --resume sets it, see README)
    evaluate: str | None = None  # evaluate the networks of this run directory (see README: watch and evaluate)
    cuda: bool = True  # use CUDA when it is available
    threads: int = 1  # torch CPU threads (one is fastest for small networks; raise it for CNNs on a CPU)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # the update: auto = bf16 for a CNN on a CPU with bf16
    compile: bool = False  # torch.compile the update
    cudagraphs: bool = False  # replay the update as a CUDA graph (CUDA only)
    track: bool = False  # log to Weights & Biases (WANDB_MODE=offline works without an account)
    wandb_project_name: str = "offpolicy-zoo"  # the W&B project
    wandb_entity: str | None = None  # the W&B entity (team or user)
    wandb_group: str | None = None  # the W&B group (run.py sets one per launch so seeds are grouped)
    wandb_resume: Literal["allow", "rewind", "fork"] = "allow"  # how --resume --track continues the W&B run (README)
    capture_video: bool = False  # record the final evaluation's first episode to <run dir>/videos/
    save_model: bool = True  # save the trained networks' state_dicts to <run dir>/model.pt (--evaluate reads it)
    checkpoint_frequency: int = 0  # environment steps between checkpoints (0: only on SIGTERM / Ctrl-C)


# Options of one process, not settings of the run: never in a run's config.yaml, nor taken from a --config file.
ONE_OFF = ("resume", "stop_step", "members", "evaluate")

# What --evaluate and --resume may be given besides the run directory.
EVALUATE_FLAGS = ("--eval-episodes", "--eval-epsilon", "--seed", "--capture-video", "--track")
# --threads: a resumed run may use the cores of the machine it continues on (fewer while they are shared).
RESUME_FLAGS = ("--total-timesteps", "--wandb-resume", "--stop-step", "--members", "--precision", "--threads")


def fail(message: str) -> NoReturn:
    raise SystemExit(f"error: {message}")  # one line for the user, no traceback


def algo_of(args_class: type) -> str:
    """The algorithm's name: the stem of the file that defines its Args (algos/dqn.py: dqn)."""
    return Path(sys.modules[args_class.__module__].__file__).stem


def parse_args(args_class: type, description: str | None = None, preset: dict | None = None,
               argv: list[str] | None = None):
    """The command line on top of its defaults: the --config file's, else the Atari `preset` for an Atari id
    (announced in one line), else the dataclass's; with --resume, the run's saved arguments (only
    RESUME_FLAGS may be given); with --evaluate, the run's config.yaml (and only EVALUATE_FLAGS)."""
    argv = [part for arg in (sys.argv[1:] if argv is None else argv)
            for part in (arg.split("=", 1) if arg.startswith("--") and "=" in arg else [arg])]
    algo = algo_of(args_class)
    for flag, allowed, what in (("--evaluate", EVALUATE_FLAGS, "evaluates a run with its own settings"),
                                ("--resume", RESUME_FLAGS, "continues a run with its saved arguments")):
        if flag in argv[:-1]:
            run_dir = argv[argv.index(flag) + 1]
            given = {arg.replace("--no-", "--") for arg in argv if arg.startswith("--")} - {flag}
            if given - set(allowed):
                fail(f"{flag} {what}; it takes only {', '.join(allowed)}, "
                     f"got {', '.join(sorted(given - set(allowed)))}")
            if flag == "--evaluate":
                saved, source = run_config(run_dir, algo), Path(run_dir) / "config.yaml"
            else:
                saved, source = load_checkpoint(run_dir, algo)["args"], Path(run_dir) / "checkpoint.pt"
            # a resumed run goes on to the end, or to the --stop-step given again
            saved = {key: value for key, value in saved.items() if key not in ONE_OFF}
            return tyro.cli(args_class, default=instance(args_class, saved, str(source)), args=argv,
                            description=description)
    config = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    default = instance(args_class, config_values(config, algo), f"config {config}") if config else None
    args = tyro.cli(args_class, default=default, args=argv, description=description)
    if preset and config is None and is_atari(args.env):
        args = tyro.cli(args_class, default=instance(args_class, preset, "the Atari preset"), args=argv,
                        description=description)
        print(preset_line(args, preset), flush=True)
    return args


def preset_line(args, preset: dict) -> str:
    """The one line that announces the Atari preset: its values in effect, then those the flags changed (each
    with the preset's value), so that a flag given is seen to be taken."""
    kept = [f"{key}={value}" for key, value in preset.items() if getattr(args, key) == value]
    changed = [f"{key}={getattr(args, key)} (preset {value})" for key, value in preset.items()
               if getattr(args, key) != value]
    line = f"{args.env} is an Atari game: using the Atari preset ({', '.join(kept)})"
    return line + (f"; set by flags: {', '.join(changed)}" if changed else "; --config or flags override it")


def config_values(path: str, algo: str) -> dict:
    """A YAML file of this algorithm's arguments as a mapping (its `algo:` key, if any, must name `algo`); the options
    of one process (ONE_OFF) that a run directory's config.yaml held before it kept only the run's settings are
    dropped, said in one line: `--config runs/<run>/config.yaml` trains a new run."""
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        fail(f"cannot read config {path}: {e}")
    if not isinstance(values, dict):
        fail(f"cannot read config {path}: it must be a mapping of argument names to values")
    named = values.pop("algo", algo)
    if named != algo:
        fail(f"config {path} is for algos/{named}.py, not {algo}.py (drop its algo key to use it anyway)")
    dropped = [key for key in ONE_OFF if values.pop(key, None) not in (None, 0, [], ())]
    if dropped:
        print(f"config {path}: ignoring {', '.join(dropped)} (options of one process, not settings of a run: give "
              "them as flags)")
    return values


def instance(args_class: type, values: dict, source: str):
    """args_class(**values), each key an argument and each value of its type (an int where a float is expected,
    or a YAML string such as 1e-3 that reads as one, is taken as that float), or a one-line error naming
    `source`."""
    hints, names = typing.get_type_hints(args_class), [field.name for field in fields(args_class)]
    checked = {}
    for key, value in values.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names)
            fail(f"{source}: unknown key {key!r} (closest: {', '.join(close) or 'none'}; see --help)")
        try:
            checked[key] = typed(value, hints[key])
        except ValueError:
            fail(f"{source}: {key} must be {type_name(hints[key])}, got {value!r} (--{key.replace('_', '-')})")
    return args_class(**checked)


def typed(value: Any, hint: Any) -> Any:
    """`value` as a `hint` (bool, int, float, str, None, Literal and unions of them), or ValueError."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return typed(value, option)
            except ValueError:
                pass
        raise ValueError(value)
    if typing.get_origin(hint) is tuple and isinstance(value, list | tuple):
        return tuple(typed(item, typing.get_args(hint)[0]) for item in value)
    if typing.get_origin(hint) is Literal:
        if value in typing.get_args(hint):
            return value
        raise ValueError(value)
    if hint is type(None) and value is None or hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool) or hint is str and isinstance(value, str):
        return value
    if hint is float and not isinstance(value, bool):
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            return float(value)  # PyYAML reads 1e-3 (no dot) as a string
    raise ValueError(value)


def type_name(hint: Any) -> str:
    """`hint` as an error names it: "an int", "a float or null", "one of 'mse', 'huber'"."""
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(type_name(option) for option in typing.get_args(hint))
    return "null" if hint is type(None) else f"a{'n' if hint is int else ''} {hint.__name__}"


def run_config(run_dir: str, algo: str) -> dict:
    """<run dir>/config.yaml, the arguments of a run of `algo` (a run of another is a one-line error)."""
    try:
        values = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
        named = values.pop("algo", None)
    except (OSError, yaml.YAMLError, AttributeError) as e:
        fail(f"cannot read the run's arguments in {Path(run_dir) / 'config.yaml'}: {e}")
    if named != algo:
        fail(f"{run_dir} is a run of algos/{named}.py, not {algo}.py: evaluate it with algos/{named}.py")
    return values


def load_checkpoint(run_dir: str | Path, algo: str) -> dict:
    """<run dir>/checkpoint.pt, memory-mapped, as plain data (weights_only: a checkpoint cannot run code)."""
    try:
        state = torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True, mmap=True)
        if state["algo"] != algo:
            raise ValueError(f"it is a checkpoint of algos/{state['algo']}.py, not of {algo}.py")
    except Exception as e:  # missing, truncated, another algorithm's: torch raises several types
        fail(f"cannot resume from {Path(run_dir) / 'checkpoint.pt'}: {e}")
    return state
