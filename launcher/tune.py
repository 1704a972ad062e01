"""Tuning with Optuna (run.py tune): a search space file, trials asked in rounds, each trial's seeds as members of
packs run as the launcher runs jobs, the objective over a trial's seeds, and the results (a table, a figure, the best
settings as a config).

A space file maps an algorithm file's settings to what Optuna may propose for them:

    learning_rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}   # log: sampled on a log scale
    exploration_fraction: {type: float, low: 0.05, high: 0.3, step: 0.05}
    target_network_frequency: {type: int, low: 100, high: 1000, step: 100}
    loss: {type: choice, choices: [mse, huber]}

Rounds: the trials of a round are asked together (Optuna's ask), trained together, then told together; the
sampler of a round is created afresh, seeded with (the tune's sampler seed, the round's first trial number), so a
tune stopped and continued asks exactly what the same tune never stopped asks.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import json
import shutil
import signal
import statistics
import sys
import time
import typing
from pathlib import Path
from typing import Any

import yaml

from launcher import ROOT, fail, say, sweeps, yaml_value
from launcher.jobs import Job, LocalJobs, RayJobs, run_jobs
from launcher.results import finished, summary_in
from launcher.sweeps import LAUNCHER_KEYS, config_and_script, flags_from, overrides_from, packable_keys

TYPES = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}, "choice": {"choices"}}
OBJECTIVES = {  # a trial's value from its seeds' final evaluation returns; the first two reward settings that hold
    "mean-std": "mean minus sample std over seeds",  # on every seed, not one lucky seed
    "min": "worst seed",
    "mean": "mean over seeds",
}
SHORT_NAMES = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "gp": "GPSampler",
               "qmc": "QMCSampler", "nsgaii": "NSGAIISampler"}


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
    one line naming the file, the key and what is wrong. `refused`: settings the launcher sets itself."""
    from harness.args import _type_name, _typed

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
            fail(f"{where}: run.py tune sets {key} itself ({refused[key]})")
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
                    _typed(choice, hints[key])
                except ValueError:
                    fail(f"{where}: the choice {choice!r} is not {_type_name(hints[key])}")
            continue
        number = int if spec["type"] == "int" else (int, float)
        for bound in ("low", "high"):
            value = spec.get(bound)
            if not isinstance(value, number) or isinstance(value, bool):
                fail(f"{where}: {bound} must be a{'n int' if spec['type'] == 'int' else ' number'}, got {value!r}")
        try:  # a float's bounds as floats: an int setting cannot take them
            _typed(float(spec["low"]) if spec["type"] == "float" else spec["low"], hints[key])
        except ValueError:
            fail(f"{where}: {key} is {_type_name(hints[key])}, so type: {spec['type']} cannot give it")
        if spec["low"] >= spec["high"]:
            fail(f"{where}: low {spec['low']} must be below high {spec['high']}")
        if spec.get("log") and spec["low"] <= 0:
            fail(f"{where}: log needs low > 0, got {spec['low']}")
        if spec.get("log") and spec.get("step") is not None and spec["type"] == "float":
            fail(f"{where}: a float takes log or step, not both")
        step = spec.get("step")
        if step is not None and (not isinstance(step, number) or isinstance(step, bool) or step <= 0):
            fail(f"{where}: step must be a positive {'int' if spec['type'] == 'int' else 'number'}, got {step!r}")
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


def sampler_named(name: str, seed: int):
    """An Optuna sampler by its class name (TPESampler, RandomSampler, ...) or short name (tpe, random, cmaes, gp,
    qmc, nsgaii), seeded; one that needs more than a seed (GridSampler, ...) is refused in one line."""
    optuna = optuna_module()
    names = sorted(n for n in dir(optuna.samplers) if n.endswith("Sampler") and not n.startswith("Base"))
    chosen = SHORT_NAMES.get(name.lower(), name)
    if chosen not in names:
        fail(f"--sampler {name}: Optuna has no such sampler (samplers: {', '.join(names)}; or "
             f"{', '.join(SHORT_NAMES)})")
    try:
        return getattr(optuna.samplers, chosen)(seed=seed)
    except TypeError as e:
        fail(f"--sampler {name}: it needs more than a seed to start ({e}); pick another")


def round_seed(seed: int, first_trial: int) -> int:
    """The seed of the sampler that asks a round's trials, from the tune's seed and the round's first trial."""
    import numpy as np

    return int(np.random.SeedSequence([seed, first_trial]).generate_state(1)[0])


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done (asking a round's trials is all or nothing)."""
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def objective(returns: list[float], how: str) -> float:
    """A trial's value from its seeds' final evaluation returns (see OBJECTIVES)."""
    if how == "min":
        return min(returns)
    mean = statistics.fmean(returns)
    if how == "mean":
        return mean
    return mean - (statistics.stdev(returns) if len(returns) > 1 else 0.0)


def trial_packs(trials: list[tuple[int, dict[str, Any]]], seeds: list[int], size: int,
                packable: set[str]) -> list[list[dict[str, Any]]]:
    """Every (trial, seed) run as a member {"trial", "seed", **its settings}, in packs of at most `size` members
    whose members share every setting outside `packable` (trials in order, a trial's seeds one after another)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for number, params in trials:
        shared = repr(sorted((key, value) for key, value in params.items() if key not in packable))
        groups.setdefault(shared, []).extend({"trial": number, "seed": seed, **params} for seed in seeds)
    return [runs[start:start + size] for runs in groups.values() for start in range(0, len(runs), size)]


def text(value: Any) -> str:
    """A setting's value as the command line and --pack read it back exactly (a float: its repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def pack_settings(members: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(the settings a pack's members share, those they differ in: one value per member), as text."""
    keys = [key for key in members[0] if key not in ("trial", "seed")]
    values = {key: [text(member[key]) for member in members] for key in keys}
    shared = {key: texts[0] for key, texts in values.items() if len(set(texts)) == 1}
    return shared, {key: texts for key, texts in values.items() if key not in shared}


def trials_table(trials: list, returns: dict[int, list[float]], how: str) -> str:
    """Markdown, a row per trial (best first, then unfinished ones): its number, value, seeds' final evaluation
    returns (`returns`, by trial number) and settings."""
    keys = list(dict.fromkeys(key for trial in trials for key in trial.params))
    done = sorted((t for t in trials if t.value is not None), key=lambda t: -t.value)
    rows = [[t.number, f"{t.value:.1f}" if t.value is not None else t.state.name.lower(),
             " ".join(f"{r:.1f}" for r in returns.get(t.number, [])) or "-",
             *(f"{t.params[key]:.4g}" if isinstance(t.params.get(key), float) else text(t.params.get(key, "-"))
               for key in keys)]
            for t in done + [t for t in trials if t.value is None]]
    header = ["trial", OBJECTIVES[how], "final eval return per seed", *keys]
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def trials_figure(trials: list, returns: dict[int, list[float]], how: str, space: dict[str, dict[str, Any]]) -> Any:
    """The trials: each one's value and seeds' returns by trial number with the best so far, and its value against
    each setting tried (a log axis for a log-scaled one)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    done = [t for t in trials if t.value is not None]
    fig = Figure(figsize=(4.5 * (1 + len(space)), 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 1 + len(space), squeeze=False)[0]
    for t in done:
        axes[0].scatter([t.number] * len(returns[t.number]), returns[t.number], color="0.7", s=8)
    numbers, values = [t.number for t in done], [t.value for t in done]
    axes[0].scatter(numbers, values, label=OBJECTIVES[how])
    best = [max(values[:i + 1]) for i in range(len(values))]
    axes[0].step(numbers, best, where="post", color="C1", label="best so far")
    axes[0].set(xlabel="trial", ylabel="final eval return")
    axes[0].legend()
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    for ax, (key, spec) in zip(axes[1:], space.items(), strict=True):
        if spec["type"] == "choice":  # a choice's values by their place in the list, named
            names = [text(choice) for choice in spec["choices"]]
            ax.scatter([names.index(text(t.params[key])) for t in done], values)
            ax.set_xticks(range(len(names)), names)
        else:
            ax.scatter([t.params[key] for t in done], values)
        ax.set(xlabel=key, ylabel=OBJECTIVES[how], xscale="log" if spec.get("log") else "linear")
    return fig


def best_config(config_text: str, overrides: dict[str, Any], best, how: str, seeds: list[int], tune_id: str) -> str:
    """The tuned config: the tune's config with its --set values and the best trial's settings, headed by what chose
    them (so `python algos/<file>.py --config` runs it)."""
    values = (yaml.safe_load(config_text) or {}) | overrides | best.params
    header = (f"# The best trial of run.py tune {tune_id}: trial {best.number}, {OBJECTIVES[how]} {best.value:.1f}\n"
              f"# over seeds {' '.join(map(str, seeds))}, the seeds that chose these settings: try them on others\n")
    return header + yaml.safe_dump(values, sort_keys=False)


# ---------------------------------------------------------------- the tune: rounds of trials as jobs

def trial_jobs(packs: list[list[dict[str, Any]]], env: str, algo: str, tune_id: str, log_dir: Path,
               common: list[str]) -> list[Job]:
    """A job per pack of (trial, seed) runs (trial_packs): the settings its members differ in through the
    script's --pack, those they share as flags; each run's directory <env>__<algo>__trial=<n>__<seed>__<tune id>."""
    jobs = []
    for members in packs:
        names = [trial_run_name(env, algo, member["trial"], member["seed"], tune_id) for member in members]
        shared, differ = pack_settings(members)
        if len(members) == 1:
            argv = ["--seed", str(members[0]["seed"]), *common, *flags_from(shared), "--run-name", names[0]]
        else:
            pack = [f"seed={','.join(str(member['seed']) for member in members)}",
                    *(f"{key}={','.join(values)}" for key, values in differ.items())]
            argv = ["--pack", *pack, f"run_name={','.join(names)}", *common, *flags_from(shared)]
        jobs.append(Job(names[0], env, members[0]["seed"], argv, log_dir / f"{names[0]}.log",
                        pack=names if len(names) > 1 else [],
                        members=[{"seed": member["seed"], "trial": member["trial"]} for member in members]))
    return jobs


def trial_run_name(env: str, algo: str, trial: int, seed: int, tune_id: str) -> str:
    return f"{env.replace('/', '-')}__{algo}__trial={trial}__{seed}__{tune_id}"


def new_tune(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """A new tune's record (tune.json) and directory runs/<config stem>__tune__<unix time>, after every check."""
    if args.config is None:
        fail("run.py tune needs a config (or --resume runs/<tune id> to continue a tune)")
    config, script = config_and_script(args.config)
    overrides = overrides_from(args.set)
    space = args.space or ROOT / "configs" / script.stem / "spaces" / "default.yaml"
    space_from(space, args_class(script), LAUNCHER_KEYS)
    sampler_named(args.sampler, 0)
    if args.trials is None or args.trials < 1:
        fail(f"--trials must be >= 1, got {args.trials}")
    for name in ("num_seeds", "jobs", "round"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if "num_seeds" in config:
        fail(f"config {args.config} sets num_seeds, which run.py sets itself; use --num-seeds")
    if {**config, **overrides}.get("stop_return") is not None:
        fail("stop_return stops a run early, so its final evaluation would not be the trial's: drop it")
    runs_dir = Path(args.runs_dir).resolve()
    stamp = int(time.time())
    while (runs_dir / f"{args.config.stem}__tune__{stamp}").exists():
        stamp += 1
    tune_id = f"{args.config.stem}__tune__{stamp}"
    (runs_dir / tune_id / "logs").mkdir(parents=True)
    seeds = list(dict.fromkeys(args.seeds))
    record = {"tune_id": tune_id, "algo": script.stem, "env": str(config.get("env") or "default"),
              "config": str(args.config.resolve()), "config_text": args.config.read_text(),
              "space": str(Path(space).resolve()), "space_text": Path(space).read_text(), "set": overrides,
              "seeds": seeds, "num_seeds": args.num_seeds, "objective": args.objective, "sampler": args.sampler,
              "sampler_seed": args.sampler_seed, "trials": args.trials,
              "round": args.round or (args.jobs or 1) * max(1, args.num_seeds // len(seeds))}
    (runs_dir / tune_id / "tune.json").write_text(json.dumps(record, indent=1))
    (runs_dir / tune_id / Path(record["config"]).name).write_text(record["config_text"])
    (runs_dir / tune_id / "space.yaml").write_text(record["space_text"])
    return record, runs_dir / tune_id


def run_tune(args: argparse.Namespace) -> int:
    """`run.py tune`: trials asked in rounds (Optuna's ask and tell, the study in <tune dir>/study.db), each round's
    trials x seeds trained as packs of jobs, each trial told its objective; then the table, the figure and the best
    settings as a config. The exit code: 130 if stopped (`--resume` continues), else 0."""
    optuna = optuna_module()
    if args.resume is not None:
        if args.config is not None:
            fail("--resume continues a tune with its own config; give one or the other")
        tune_dir = args.resume.resolve()
        try:
            record = json.loads((tune_dir / "tune.json").read_text())
        except (OSError, ValueError) as e:
            fail(f"{tune_dir} has no readable tune.json ({e}); give runs/<tune id> as a tune wrote it")
        record["trials"] = args.trials or record["trials"]
        (tune_dir / "tune.json").write_text(json.dumps(record, indent=1))
    else:
        record, tune_dir = new_tune(args)
    script, runs_dir, tune_id = sweeps.ALGOS / f"{record['algo']}.py", tune_dir.parent, record["tune_id"]
    space = space_from(tune_dir / "space.yaml", args_class(script), LAUNCHER_KEYS)
    config = tune_dir / Path(record["config"]).name
    settings = (yaml.safe_load(record["config_text"]) or {}) | {k: yaml_value(v) for k, v in record["set"].items()}
    backend = RayJobs(args.ray, script, config, settings, runs_dir) if args.ray else LocalJobs(script, config, runs_dir)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tune_dir / 'study.db'}")  # one object: one view of the trials
    how, seeds = record["objective"], record["seeds"]
    study = optuna.create_study(study_name=tune_id, storage=storage, direction="maximize", load_if_exists=True)
    common = [*(["--env", record["env"]] if record["env"] != "default" else []), *flags_from(record["set"])]
    say(f"tune {tune_id}: {record['trials']} trials of {script.name} x seeds {' '.join(map(str, seeds))}, "
        f"{record['round']} trials a round, objective: {OBJECTIVES[how]}; record in {tune_dir / 'tune.json'}")

    def returns_of(trial) -> list[float] | None:
        names = [trial_run_name(record["env"], record["algo"], trial.number, seed, tune_id) for seed in seeds]
        if not all(finished(runs_dir / name) for name in names):
            return None
        return [summary_in(runs_dir / name)["eval_return_mean"] for name in names]

    try:
        while True:
            trials = study.get_trials(deepcopy=False)
            running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
            if running:  # a round that was stopped: its trials as they were asked, its runs where they stopped
                first = running[0].user_attrs["round"]
            elif len(trials) >= record["trials"]:
                break
            else:
                first = len(trials)
                sampler = sampler_named(record["sampler"], round_seed(record["sampler_seed"], first))
                asking = optuna.load_study(study_name=tune_id, storage=storage, sampler=sampler)
                with signals_held():
                    for _ in range(min(record["round"], record["trials"] - first)):
                        asking.ask(distributions(space)).set_user_attr("round", first)
            trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("round") == first]
            packs = trial_packs([(t.number, t.params) for t in trials], seeds, record["num_seeds"],
                                     packable_keys(script))
            jobs = []
            for job in trial_jobs(packs, record["env"], record["algo"], tune_id, tune_dir / "logs", common):
                if all(finished(runs_dir / name) for name in job.names):
                    continue
                if (runs_dir / job.run_name / "checkpoint.pt").is_file():
                    job.argv = ["--resume", f"runs/{job.run_name}"]
                for name in job.names if not job.resumes else []:  # the scripts refuse an existing run directory
                    shutil.rmtree(runs_dir / name, ignore_errors=True)
                jobs.append(job)
            say(f"round of trials {trials[0].number}-{trials[-1].number}: {sum(len(j.names) for j in jobs)} run(s) "
                f"in {len(jobs)} process(es)")
            run_jobs(jobs, backend, args.jobs or (len(jobs) if args.ray else 1), runs_dir)
            stopped = any(job.status in ("stopped", "not started") for job in jobs)
            for trial in trials:
                returns = returns_of(trial)
                if trial.state != optuna.trial.TrialState.RUNNING or returns is None and stopped:
                    continue
                with signals_held():
                    if returns is None:
                        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                    else:
                        study.tell(trial.number, objective(returns, how))
                values = " ".join(f"{key}={text(value)}" for key, value in trial.params.items())
                result = "failed" if returns is None else \
                    f"{objective(returns, how):.1f} ({' '.join(f'{r:.1f}' for r in returns)})"
                say(f"trial {trial.number}: {result} | {values}")
            if stopped:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        say(f"stopped; continue: python run.py tune --resume {tune_dir}")
        return 130
    finally:
        backend.close()
    trials = study.get_trials(deepcopy=False)
    returns = {t.number: r for t in trials if (r := returns_of(t)) is not None}
    table = trials_table(trials, returns, how)
    (tune_dir / "trials.md").write_text(table + "\n")
    trials_figure(trials, returns, how, space).savefig(tune_dir / "trials.png", dpi=120)
    say("\n" + table)
    if not returns:
        say("no trial finished")
        return 1
    best = study.best_trial
    overrides = {k: yaml_value(v) for k, v in record["set"].items()}
    (tune_dir / "best.yaml").write_text(best_config(record["config_text"], overrides, best, how, seeds, tune_id))
    say(f"\nbest: trial {best.number}, {best.value:.1f}; table {tune_dir / 'trials.md'}, figure "
        f"{tune_dir / 'trials.png'}\nits settings: python algos/{record['algo']}.py --config {tune_dir / 'best.yaml'}")
    return 0
