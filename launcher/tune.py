"""Tuning with Optuna (run.py tune): trials asked in rounds, each trial's seeds as members of packs run as the
launcher runs jobs, each trial told its value over its seeds; the search space file is space.py's, a trial's value
and the tune's report (table, figure, best config) trials.py's, successive halving's rungs halving.py's.

Rounds: the trials of a round are asked together (Optuna's ask), trained together (rung by rung with halving), then
told; the sampler of a round is created afresh, seeded with (the tune's sampler seed, the round's first trial
number), so a tune stopped and continued asks exactly what the same tune never stopped asks.

The record (<tune dir>/rounds.json, written whole or not at all): each round's trials as they were asked (settings
and the sampler's attributes), written before any of them enters the study, and each rung's decision (the trials
alive there, their values, those kept), written when it is taken. A tune killed at any moment continues from it: the
rest of a round's trials enter the study as asked, a decided rung is read back, never decided again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import yaml

from launcher import ROOT, fail, halving, say, seeds_checked, sweeps, write_whole, yaml_value
from launcher.jobs import Job, LocalJobs, RayJobs, run_jobs
from launcher.results import finished, summary_in
from launcher.space import args_class, distributions, optuna_module, space_from
from launcher.sweeps import LAUNCHER_KEYS, config_and_script, flags_from, overrides_from, packable_keys
from launcher.trials import OBJECTIVES, best_config, objective, text, trials_figure, trials_table

TUNE_KEYS = LAUNCHER_KEYS | {  # what run.py tune sets itself, beyond what every launch sets
    "stop_step": "--rungs pauses the runs at each rung", "members": "--rungs cuts the packs at each rung",
    "evaluate": "run.py evaluate evaluates trained runs", "schedule_start": "a resumed run's own",
}
SPACE_REFUSED = {  # settings a trial may not change: why
    "total_timesteps": "every trial trains the same budget (the rungs are its fractions): --set total_timesteps=N",
    "stop_return": "it stops a run early, so its final evaluation would not be the trial's",
}
ASKED = {  # the options a tune is asked with (tune.json), and their defaults; --resume takes them as they were
    "seeds": [1, 2, 3], "num_seeds": 1, "objective": "mean-std", "sampler": "tpe", "sampler_seed": 0, "round": None,
    "rungs": 1, "eta": 2, "space": None, "set": [], "runs_dir": "runs",
}
SHORT_NAMES = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "gp": "GPSampler",
               "qmc": "QMCSampler", "nsgaii": "NSGAIISampler"}


def refused_in_space() -> dict[str, str]:
    """The settings a space may not search: why, as its one-line error says it."""
    return {key: f"run.py tune sets {key} itself ({how})" for key, how in TUNE_KEYS.items()} | SPACE_REFUSED


def sampler_class(name: str) -> str:
    """The class name of the sampler `name` names: a short name's (tpe: TPESampler, ...), else `name` itself."""
    return SHORT_NAMES.get(name.lower(), name)


def sampler_named(name: str, seed: int):
    """An Optuna sampler by its class name (TPESampler, RandomSampler, ...) or short name (tpe, random, cmaes, gp,
    qmc, nsgaii), seeded; one that needs more than a seed (GridSampler, ...) is refused in one line."""
    optuna = optuna_module()
    names = sorted(n for n in dir(optuna.samplers) if n.endswith("Sampler") and not n.startswith("Base"))
    chosen = sampler_class(name)
    if chosen not in names:
        fail(f"--sampler {name}: Optuna has no such sampler (samplers: {', '.join(names)}; or "
             f"{', '.join(SHORT_NAMES)})")
    try:
        return getattr(optuna.samplers, chosen)(seed=seed)
    except TypeError as e:
        fail(f"--sampler {name}: it needs more than a seed to start ({e}); pick another")


def round_seed(name: str, seed: int, first_trial: int) -> int:
    """The seed of the sampler that asks a round's trials. A sequence sampler (QMC) keeps its place in its sequence in
    the study, under its seed: the tune's own seed, so each round goes on along one sequence. Any other gets a seed of
    the round's own, from the tune's seed and the round's first trial (with the same seed in each round, a sampler
    would ask every round the same trials before it learns anything); CMA-ES, GP and TPE keep what they learnt in the
    study's trials, so a sampler created afresh goes on from it, with the round's random draws."""
    import numpy as np

    if sampler_class(name) == "QMCSampler":
        return seed
    return int(np.random.SeedSequence([seed, first_trial]).generate_state(1)[0])


def round_sampler(name: str, seed: int, first_trial: int):
    """The sampler that asks the round of trials from `first_trial` on, seeded from the tune's `seed` (round_seed); a
    seed it cannot take is refused in one line."""
    if seed < 0:
        fail(f"--sampler-seed must be >= 0, got {seed}")
    try:
        return sampler_named(name, round_seed(name, seed, first_trial))
    except ValueError as e:  # NumPy's, for QMC's own seed (its sequence's) above 2**32 - 1
        fail(f"--sampler-seed {seed}: {sampler_class(name)} cannot take it ({e})")


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done (asking a round's trials is all or nothing)."""
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def rounds_of(tune_dir: Path) -> dict[str, Any]:
    """The tune's record of its rounds (rounds.json): by a round's first trial number, its trials as asked and its
    rungs' decisions."""
    path = tune_dir / "rounds.json"
    return json.loads(path.read_text()) if path.exists() else {}


def record_round(tune_dir: Path, first: int, **entries: Any) -> None:
    rounds = rounds_of(tune_dir)
    rounds.setdefault(str(first), {}).update(entries)
    write_whole(tune_dir / "rounds.json", json.dumps(rounds, indent=1))


def asked_round(study, sampler, dists: dict[str, Any], count: int) -> dict[str, Any]:
    """The next `count` trials as `sampler` asks them of `study`, asked of a copy held in memory, so that nothing
    enters the study until the round is recorded: {"trials": each one's params and sampler attributes, "study_attrs":
    the sampler's attributes of the study (QMC's place in its sequence, ...)}."""
    optuna = optuna_module()
    scratch = optuna.create_study(direction="maximize", sampler=sampler)
    scratch.add_trials(study.get_trials(deepcopy=False))
    for key, value in study._storage.get_study_system_attrs(study._study_id).items():
        scratch._storage.set_study_system_attr(scratch._study_id, key, value)
    for _ in range(count):
        scratch.ask(dists)
    trials = scratch.get_trials(deepcopy=False)[-count:]  # as stored: with what the sampler wrote beside them
    return {"trials": [{"params": t.params, "system_attrs": t.system_attrs} for t in trials],
            "study_attrs": scratch._storage.get_study_system_attrs(scratch._study_id)}


def enter_round(study, first: int, asked: dict[str, Any], dists: dict[str, Any]) -> None:
    """The recorded trials of a round that are not yet in the study enter it, each in one write, as asked."""
    optuna = optuna_module()
    for key, value in asked["study_attrs"].items():
        study._storage.set_study_system_attr(study._study_id, key, value)
    for trial in asked["trials"][len(study.get_trials(deepcopy=False)) - first:]:
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, params=trial["params"], system_attrs=trial["system_attrs"],
            distributions={key: dists[key] for key in trial["params"]}, user_attrs={"round": first}))


def trial_packs(trials: list[tuple[int, dict[str, Any]]], seeds: list[int], size: int,
                packable: set[str]) -> list[list[dict[str, Any]]]:
    """Every (trial, seed) run as a member {"trial", "seed", **its settings}, in packs of at most `size` members
    whose members share every setting outside `packable`, and for those in it whether it is null (a script refuses a
    pack whose members have a setting some with a value and some without); trials in order, a trial's seeds one
    after another."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for number, params in trials:
        shared = repr(sorted((key, value is None if key in packable else value) for key, value in params.items()))
        groups.setdefault(shared, []).extend({"trial": number, "seed": seed, **params} for seed in seeds)
    return [runs[start:start + size] for runs in groups.values() for start in range(0, len(runs), size)]


def pack_settings(members: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(the settings a pack's members share, those they differ in: one value per member), as text."""
    keys = [key for key in members[0] if key not in ("trial", "seed")]
    values = {key: [text(member[key]) for member in members] for key in keys}
    shared = {key: texts[0] for key, texts in values.items() if len(set(texts)) == 1}
    return shared, {key: texts for key, texts in values.items() if key not in shared}


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


def budget(script: Path, settings: dict[str, Any]) -> int:
    """The runs' total_timesteps: the config's (or --set's), else the script's default."""
    if settings.get("total_timesteps") is not None:
        return int(settings["total_timesteps"])
    return next(f.default for f in dataclasses.fields(args_class(script)) if f.name == "total_timesteps")


def new_tune(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """A new tune's record (tune.json) and directory runs/<config stem>__tune__<unix time>, after every check."""
    if args.config is None:
        fail("run.py tune needs a config (or --resume runs/<tune id> to continue a tune)")
    for name, default in ASKED.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    config, script = config_and_script(args.config)
    overrides = overrides_from(args.set)
    for key in overrides:
        if key in TUNE_KEYS:
            fail(f"--set {key}=...: run.py tune sets {key} itself ({TUNE_KEYS[key]})")
    space = args.space or ROOT / "configs" / script.stem / "spaces" / "default.yaml"
    space_from(space, args_class(script), refused_in_space())
    round_sampler(args.sampler, args.sampler_seed, 0)  # the first round's, as it will be created
    if args.trials is None:
        fail("--trials must be >= 1, got None")
    at_least_one(args, ("trials", "num_seeds", "jobs", "round"))
    for key in config:  # a run's own (seed, run_name) are overridden; these would change what the runs do
        if key in ("num_seeds", "pack", "resume", "stop_step", "members", "evaluate", "schedule_start"):
            fail(f"config {args.config} sets {key}, which run.py tune sets itself; drop it")
    settings = config | {k: yaml_value(v) for k, v in overrides.items()}
    if settings.get("stop_return") is not None:
        fail("stop_return stops a run early, so its final evaluation would not be the trial's: drop it")
    halving.rung_steps(budget(script, settings), args.rungs, args.eta)
    seeds = list(dict.fromkeys(args.seeds))
    seeds_checked("--seeds", seeds)
    round_size = args.round or (args.jobs or 1) * max(1, args.num_seeds // len(seeds))
    if args.rungs > 1:
        round_size = halving.round_checked(args.round, round_size, args.trials, args.rungs, args.eta)
        from envs.make import is_atari  # gymnasium and the games: only for a tune

        if args.num_seeds > 1 and is_atari(str(settings.get("env") or "")):
            fail(f"successive halving cuts packs, and a pack of Atari games cannot be cut (its emulators' state "
                 f"cannot be saved): tune {settings['env']} with --num-seeds 1, or without --rungs")
    runs_dir = Path(args.runs_dir).resolve()
    stamp = int(time.time())
    while (runs_dir / f"{args.config.stem}__tune__{stamp}").exists():
        stamp += 1
    tune_id = f"{args.config.stem}__tune__{stamp}"
    (runs_dir / tune_id / "logs").mkdir(parents=True)
    record = {"tune_id": tune_id, "algo": script.stem, "env": str(config.get("env") or "default"),
              "config": str(args.config.resolve()), "config_text": args.config.read_text(),
              "space": str(Path(space).resolve()), "space_text": Path(space).read_text(), "set": overrides,
              "seeds": seeds, "num_seeds": args.num_seeds, "objective": args.objective, "sampler": args.sampler,
              "sampler_seed": args.sampler_seed, "trials": args.trials,
              "round": round_size,
              "rungs": args.rungs, "eta": args.eta}
    (runs_dir / tune_id / Path(record["config"]).name).write_text(record["config_text"])
    (runs_dir / tune_id / "space.yaml").write_text(record["space_text"])
    write_whole(runs_dir / tune_id / "tune.json", json.dumps(record, indent=1))  # last: a tune is whole once it is
    return record, runs_dir / tune_id


def at_least_one(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Each of these options, when given, is 1 or more; another value is refused in one line."""
    for name in names:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def trials_asked(tune_dir: Path) -> int:
    """The trials of the rounds asked so far (rounds.json): the next round is asked from this trial on."""
    return max((int(first) + len(entry["asked"]["trials"]) for first, entry in rounds_of(tune_dir).items()
                if "asked" in entry), default=0)


def as_read(overrides: dict[str, str]) -> dict[str, str]:
    """--set's values as run.py reads them (YAML), each as the text of the value with its type."""
    return {key: repr(yaml_value(value)) for key, value in overrides.items()}


def same_as_asked(args: argparse.Namespace, record: dict[str, Any], tune_dir: Path) -> None:
    """--resume continues a tune as it was asked: an option given again with another value is refused in one line."""
    for name in ASKED:
        given = getattr(args, name)
        if given is None:
            continue
        if name == "space":  # the same space, however it is written (comments, order, flow style)
            same = Path(given).is_file() and yaml_value(Path(given).read_text()) == yaml_value(record["space_text"])
            asked = record["space"]
        elif name == "set":  # values as run.py reads them: false and False are one, 1 and 1.0 are not
            same = as_read(overrides_from(given)) == as_read(record["set"])
            asked = " ".join(f"{k}={v}" for k, v in record["set"].items())
        elif name == "runs_dir":
            same, asked = Path(given).resolve() == tune_dir.parent, str(tune_dir.parent)
        elif name == "sampler":  # tpe and TPESampler name one sampler
            same, asked = sampler_class(given) == sampler_class(record["sampler"]), record["sampler"]
        elif name == "seeds":
            same, asked = list(dict.fromkeys(given)) == record["seeds"], " ".join(map(str, record["seeds"]))
        else:
            same, asked = given == record.get(name, ASKED[name]), record.get(name, ASKED[name])
        if not same:
            shown = " ".join(map(str, given)) if isinstance(given, list) else given
            fail(f"--{name.replace('_', '-')} {shown}: the tune in {tune_dir} was asked with {asked or 'none'}, and "
                 "--resume continues it as asked (only --trials, --jobs and --ray may change)")


def run_round(study, first: int, record: dict[str, Any], steps: list[int], backend: LocalJobs | RayJobs,
              parallel: int, tune_dir: Path, common: list[str]) -> str:
    """The round of trials asked first at trial `first`: its trials x seeds as packs of jobs, rung by rung (one rung:
    to the end; see halving.py), each trial told its value, pruned at a rung or failed; a rung decided before a stop
    is read back from the record (rounds.json), never decided again. Returns "ok", "stopped" (a signal: --resume goes
    on from the checkpoints) or "failed" (every process of a rung failed, a setting the script refuses, say: the
    trials stay asked and --resume tries them again)."""
    optuna = optuna_module()
    states, how, seeds, tune_id = optuna.trial.TrialState, record["objective"], record["seeds"], record["tune_id"]
    runs_dir, script = tune_dir.parent, sweeps.ALGOS / f"{record['algo']}.py"

    def trials_now() -> dict[int, Any]:
        return {t.number: t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("round") == first}

    def prune(numbers: set[int]) -> None:
        with signals_held():
            for n in sorted(numbers):
                if trials[n].state == states.RUNNING:
                    study.tell(n, state=states.PRUNED)

    trials = trials_now()
    first_packs = trial_packs([(n, t.params) for n, t in trials.items()], seeds, record["num_seeds"],
                              packable_keys(script))
    decided = rounds_of(tune_dir).get(str(first), {}).get("rungs", [])
    alive = set(trials)
    for r, step in enumerate(steps):
        final, trials = r == len(steps) - 1, trials_now()
        if r < len(decided):  # decided before a stop: read back, never decided again from what is left now
            keep = decided[r]["kept"]
            prune(set(decided[r]["alive"]) - set(keep))  # those a kill kept from being told
            say(f"rung {r + 1}/{len(steps)} at step {step}: {len(keep)} of {len(decided[r]['alive'])} trials went on "
                f"({' '.join(map(str, keep))}), as recorded")
            alive = set(keep)
            continue
        alive = {n for n in alive if trials[n].state != states.FAIL}  # FAIL: told here before a stop
        entered = set(alive)  # the record's: a trial that fails in this rung entered it
        packs = halving.rung_packs(first_packs, alive)
        missing = sorted(n for n in alive if (trials[n].value if final else trials[n].intermediate_values.get(step))
                         is None)
        if missing:
            stop, jobs = [] if final else ["--stop-step", str(step)], []
            for members, whole in zip(packs, first_packs, strict=True):
                if members is None:
                    continue
                [job] = trial_jobs([members], record["env"], record["algo"], tune_id, tune_dir / "logs", common)
                if all(halving.reached(runs_dir / name, step, final) for name in job.names):
                    continue
                holders = [trial_run_name(record["env"], record["algo"], m["trial"], m["seed"], tune_id)
                           for m in whole]
                argv = halving.resume_argv(job.names, holders, runs_dir, stop, steps[r - 1] if r else 0, step)
                for name in job.names if argv is None else []:  # the scripts refuse an existing run directory
                    shutil.rmtree(runs_dir / name, ignore_errors=True)
                job.argv = job.argv + stop if argv is None else argv
                job.reads = [] if argv is None else [name for name in holders if (runs_dir / name).is_dir()]
                jobs.append(job)
            rung = "" if len(steps) == 1 else f", rung {r + 1}/{len(steps)} (to step {step})"
            say(f"round of trials {min(trials)}-{max(trials)}{rung}: {sum(len(j.names) for j in jobs)} run(s) in "
                f"{len(jobs)} process(es)")
            run_jobs(jobs, backend, parallel, runs_dir)
            if any(job.status in ("stopped", "not started") for job in jobs):
                return "stopped"
            if jobs and all(job.status == "failed" for job in jobs):
                say(f"every process of the round failed (see the logs above): the tune stops; fix the cause and "
                    f"continue: python run.py tune --resume {tune_dir}")
                return "failed"
            for n in missing:
                returns = halving.rung_returns([runs_dir / trial_run_name(record["env"], record["algo"], n, seed,
                                                                          tune_id) for seed in seeds], step, final)
                with signals_held():
                    if returns is None:
                        study.tell(n, state=states.FAIL)
                        alive.discard(n)
                    elif final:
                        study.tell(n, objective(returns, how))
                    else:
                        optuna.trial.Trial(study, trials[n]._trial_id).report(objective(returns, how), step)
                settings = " ".join(f"{key}={text(value)}" for key, value in trials[n].params.items())
                result = "failed" if returns is None else \
                    f"{objective(returns, how):.1f} ({' '.join(f'{r:.1f}' for r in returns)})"
                say(f"trial {n}{'' if final else f' at step {step}'}: {result} | {settings}")
        if not final:
            trials = trials_now()
            values = {n: trials[n].intermediate_values[step] for n in alive if trials[n].state != states.FAIL}
            keep = halving.kept(values, record.get("eta", 2))
            with signals_held():  # the decision is recorded before any trial is told it
                record_round(tune_dir, first, rungs=[*decided[:r], {"step": step, "alive": sorted(entered),
                                                                    "values": values, "kept": keep}])
            decided = rounds_of(tune_dir)[str(first)]["rungs"]
            prune(alive - set(keep))
            say(f"rung {r + 1}/{len(steps)} at step {step}: {len(keep)} of {len(alive)} trials go on "
                f"({' '.join(map(str, keep))}), the others are pruned")
            alive = set(keep)
    return "ok"


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
        same_as_asked(args, record, tune_dir)
        at_least_one(args, ("trials", "jobs"))
        record["trials"] = args.trials or record["trials"]
        halving.more_trials_checked(record["trials"], trials_asked(tune_dir), record.get("rungs", 1),
                                    record.get("eta", 2))
        write_whole(tune_dir / "tune.json", json.dumps(record, indent=1))
    else:
        record, tune_dir = new_tune(args)
    script, runs_dir, tune_id = sweeps.ALGOS / f"{record['algo']}.py", tune_dir.parent, record["tune_id"]
    space = space_from(tune_dir / "space.yaml", args_class(script), refused_in_space())
    config = tune_dir / Path(record["config"]).name
    settings = (yaml.safe_load(record["config_text"]) or {}) | {k: yaml_value(v) for k, v in record["set"].items()}
    steps = halving.rung_steps(budget(script, settings), record.get("rungs", 1), record.get("eta", 2))
    backend = RayJobs(args.ray, script, config, settings, runs_dir) if args.ray else LocalJobs(script, config, runs_dir)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tune_dir / 'study.db'}")  # one object: one view of the trials
    how, seeds = record["objective"], record["seeds"]
    study = optuna.create_study(study_name=tune_id, storage=storage, direction="maximize", load_if_exists=True)
    common = [*(["--env", record["env"]] if record["env"] != "default" else []), *flags_from(record["set"])]
    say(f"tune {tune_id}: {record['trials']} trials of {script.name} x seeds {' '.join(map(str, seeds))}, "
        f"{record['round']} trials a round, objective: {OBJECTIVES[how]}; record in {tune_dir / 'tune.json'}")
    if len(steps) > 1:
        say(f"successive halving: rungs at steps {' '.join(map(str, steps))}, the best 1/{record['eta']} of a round's "
            "trials going on at each")

    def returns_of(trial) -> list[float] | None:
        names = [trial_run_name(record["env"], record["algo"], trial.number, seed, tune_id) for seed in seeds]
        if not all(finished(runs_dir / name) for name in names):
            return None
        return [summary_in(runs_dir / name)["eval_return_mean"] for name in names]

    try:
        while True:
            trials, rounds = study.get_trials(deepcopy=False), rounds_of(tune_dir)
            running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
            entering = [int(f) for f, r in rounds.items() if "asked" in r and
                        int(f) + len(r["asked"]["trials"]) > len(trials)]
            if entering:  # a round recorded as asked, not all in the study yet (a kill came in between)
                first = entering[0]
            elif running:  # a round that was stopped: its trials as they were asked, its runs where they stopped
                first = running[0].user_attrs["round"]
            elif len(trials) >= record["trials"]:
                break
            else:
                first = len(trials)
                sampler = round_sampler(record["sampler"], record["sampler_seed"], first)
                count = halving.round_size(first, record["trials"], record["round"], record.get("rungs", 1),
                                           record.get("eta", 2))
                if count > record["round"]:
                    say(f"trials {first}-{first + count - 1} are one round: after a round of {record['round']}, the "
                        f"{count - record['round']} left would be too few to halve")
                with signals_held():
                    record_round(tune_dir, first, asked=asked_round(study, sampler, distributions(space), count))
            if "asked" in rounds_of(tune_dir).get(str(first), {}):
                with signals_held():
                    enter_round(study, first, rounds_of(tune_dir)[str(first)]["asked"], distributions(space))
            outcome = run_round(study, first, record, steps, backend, args.jobs or (1 if not args.ray else 10**6),
                                tune_dir, common)
            if outcome == "failed":
                return 1
            if outcome == "stopped":
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
