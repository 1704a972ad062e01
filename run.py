"""Launch a config over seeds x envs x swept values, resume a launch, plot learning curves, tabulate results.

    python run.py CONFIG.yaml [--seeds 1 2 3] [--env ID ...] [--set key=value ...] [--sweep key=v1,v2 ...]
                              [--num-seeds N] [--jobs N] [--track] [--ray ADDRESS] [--runs-dir runs]
    python run.py resume runs/LAUNCH_ID [--total-timesteps N] [--jobs N] [--ray ADDRESS]
    python run.py evaluate RUNS... [--eval-episodes N] [--seed S] [--capture-video] [--jobs N]
    python run.py plot RUN_DIR... [--metric TAG] [--smooth N] [--by KEY] [--out curves.png]
    python run.py table RUN_DIR... [--by KEY] [--metric final|final-episodes|last-episodes|best-eval|eval-at|iteration]
                                   [--episodes N] [--at STEP]
    python run.py tune CONFIG.yaml --trials N [--space SPACE.yaml] [--seeds 1 2 3] [--num-seeds N] [--sampler NAME]
                       [--objective mean-std|min|mean] [--jobs N] [--ray ADDRESS]     (--resume runs/TUNE_ID continues)
    python run.py CONFIG.yaml --help        # every launch option (and resume/plot/table --help)

A launch runs algos/<algo>.py (the config's `algo:` key, else its folder name) once per env x swept
values x seed, as separate processes, N at a time, or as Ray tasks with --ray (auto: the cluster this
machine is in; local: a new local one); with --num-seeds N, a process trains up to N consecutive seeds
(the scripts' --num-seeds), and a sweep of settings the script marks Packable inside packs of up to N runs
(the scripts' --pack), split by the other swept settings.
Runs go to runs/<env>__<algo>[__key=value...]__<seed>__<launch id>/,
logs and launch.json (what was launched) to runs/<launch id>/; the launch id is <config stem>__<unix time>
(also the W&B group). `resume` continues the unfinished jobs of a launch, locally or on Ray: those with a
checkpoint.pt with --resume, the others from scratch; finished ones are skipped. `tune` asks Optuna for trials
of the settings in a search space, trains each on every seed (trials x seeds packed as --num-seeds allows), scores
each trial by its seeds' final evaluations and writes the trials' table and figure and the best settings as a config.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from launcher import ROOT, fail, say, tune
from launcher.evaluate import evaluate_runs
from launcher.results import METRICS, TRAINING_RETURN, curves_figure, results_table
from launcher.resume import resume
from launcher.sweeps import launch


def launch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py", description="Run a config once per env x swept values x seed.")
    p.add_argument("config", type=Path, help="configs/<algo>/<env>.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="seeds to run (default: 1)")
    p.add_argument("--num-seeds", type=int, default=1, metavar="N",
                   help="train up to N consecutive seeds in one process, or N runs of a sweep of packable settings "
                        "(docs/packs.md; default: 1)")
    p.add_argument("--env", nargs="+", help="environment ids (default: the config's env)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override a script argument in every job, e.g. --set learning_rate=1e-3 cuda=true")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="run every value (YAML, as --set); several --sweep run their cartesian product")
    add_where_options(p)
    p.add_argument("--track", action="store_true", help="log to W&B, grouped by launch")
    p.add_argument("--runs-dir", default="runs", help="where run directories and logs go (default: runs)")
    return p


def add_where_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, help="jobs running at once (default: 1; with --ray all, queued by resources)")
    p.add_argument("--ray", metavar="ADDRESS", help="run as Ray tasks: auto, local, or a cluster address")


def resume_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py resume", description="Continue the unfinished jobs of a launch: "
                                "from their checkpoint.pt with --resume, else from scratch.")
    p.add_argument("launch_dir", type=Path, help="runs/<launch id>, the folder holding the launch's launch.json")
    p.add_argument("--total-timesteps", type=int, help="train every unfinished run this long instead")
    add_where_options(p)
    return p


def tune_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py tune", description="Tune a config's settings with Optuna: every trial "
                                "on each seed, the trials x seeds trained as packs (docs/launcher.md, Tuning).")
    p.add_argument("config", type=Path, nargs="?", help="configs/<algo>/<env>.yaml")
    p.add_argument("--space", type=Path, help="the search space (default: configs/<algo>/spaces/default.yaml)")
    p.add_argument("--trials", type=int, help="trials in the study in all (--resume: more extends it)")
    p.add_argument("--seeds", type=int, nargs="+", help="each trial's seeds (default: 1 2 3)")
    p.add_argument("--num-seeds", type=int, metavar="N",
                   help="runs (trial x seed) per process: trials that share their unpackable settings are packed")
    p.add_argument("--objective", choices=list(tune.OBJECTIVES),
                   help="a trial's value from its seeds' final evaluation returns: "
                        + "; ".join(f"{name}: the {what}" for name, what in tune.OBJECTIVES.items())
                        + " (default: mean-std)")
    p.add_argument("--sampler", help="an Optuna sampler: tpe (default), random, cmaes, gp, qmc, "
                   "nsgaii or any class name of optuna.samplers")
    p.add_argument("--sampler-seed", type=int, help="the sampler's seed (default: 0)")
    p.add_argument("--round", type=int, metavar="N", help="trials asked and trained together (default: --jobs x the "
                   "trials a pack holds)")
    p.add_argument("--rungs", type=int, metavar="K", help="successive halving: K rungs, the last at the "
                   "full budget, each the previous one's budget times --eta; 1 (default): every trial to the end")
    p.add_argument("--eta", type=int, metavar="E", help="successive halving: the best 1/E of a round's "
                   "trials go on at each rung, the others are pruned (default: 2)")
    p.add_argument("--set", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="override a script argument in every run, e.g. --set total_timesteps=50000")
    p.add_argument("--resume", type=Path, metavar="TUNE_DIR", help="continue the tune in runs/<tune id> (its "
                   "stopped round first; --trials, --jobs and --ray may change, any other option must be as asked)")
    add_where_options(p)
    p.add_argument("--runs-dir", help="where run directories and the tune's go (default: runs)")
    return p


def results_parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"run.py {command}")
    p.add_argument("run_dirs", type=Path, nargs="+", help="run directories, or directories holding them")
    p.add_argument("--by", metavar="KEY", help="split by this key of each run's config.yaml, e.g. --by alpha")
    if command == "table":
        p.add_argument("--metric", choices=list(METRICS), default="final",
                       help="final: each seed's final evaluation mean (default); final-episodes: every final "
                       "evaluation episode pooled (as a single agent's episodes are reported); last-episodes: the mean "
                       "of each seed's last --episodes training episodes (CleanRL's benchmarks); best-eval: each "
                       "seed's best evaluation during training (the TD3 paper's max); eval-at: the evaluation at "
                       "--at; iteration: the mean return of the training episodes that ended in the 250k steps up "
                       "to --at (Dopamine's iteration)")
        p.add_argument("--episodes", type=int, default=100, help="training episodes for --metric last-episodes")
        p.add_argument("--at", type=int, metavar="STEP", help="the step a metric is read at (eval-at and iteration "
                       "need it; last-episodes and best-eval then count up to it); runs that have not reached it "
                       "give none")
    if command == "plot":
        p.add_argument("--metric", help="a tag in metrics.jsonl (default: eval/episodic_return, or "
                       f"{TRAINING_RETURN} smoothed when some run has fewer than 3 evaluations)")
        p.add_argument("--smooth", type=int, metavar="N", help="rolling mean over N points of each run's curve")
        p.add_argument("--out", type=Path, default=Path("curves.png"), help="the image to write")
    return p


def evaluate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py evaluate", description="Evaluate trained runs again with their "
                                "algorithm file's --evaluate (model.pt, else checkpoint.pt) and tabulate.")
    p.add_argument("run_dirs", type=Path, nargs="+", help="run directories, or directories holding them")
    p.add_argument("--eval-episodes", type=int, help="episodes per run (default: each run's own setting)")
    p.add_argument("--eval-epsilon", type=float, help="exploration epsilon (DQN files; default: the run's)")
    p.add_argument("--seed", type=int, help="seed of the evaluation (default: each run's own)")
    p.add_argument("--capture-video", action="store_true", help="record each run's first evaluation episode")
    p.add_argument("--track", action="store_true", help="log each result (and video) to the run's W&B run")
    p.add_argument("--jobs", type=int, default=2, help="evaluations at a time")
    return p


def overview() -> str:
    configs = []
    for path in sorted((ROOT / "configs").glob("*/*.yaml")):
        values = yaml.safe_load(path.read_text()) or {}
        configs.append(f"  {path.relative_to(ROOT)}  ({values.get('algo', path.parent.name)} on {values.get('env')})")
    return __doc__ + "\nconfigs:\n" + ("\n".join(configs) or "  (none)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        say(overview())
        return 0
    if argv[0] == "plot":
        args = results_parser("plot").parse_args(argv[1:])
        if args.smooth is not None and args.smooth < 1:
            fail(f"--smooth must be >= 1, got {args.smooth}")
        curves_figure(args.run_dirs, args.metric, args.smooth, args.by).savefig(args.out, dpi=120)
        say(f"wrote {args.out}")
        return 0
    if argv[0] == "table":
        args = results_parser("table").parse_args(argv[1:])
        if args.episodes < 1:
            fail(f"--episodes must be >= 1, got {args.episodes}")
        if args.at is None and args.metric in ("eval-at", "iteration"):
            fail(f"--metric {args.metric} needs --at STEP (the step it is read at)")
        if args.at is not None and (args.at < 1 or args.metric in ("final", "final-episodes")):
            fail(f"--at must be >= 1 and goes with --metric eval-at, iteration, last-episodes or best-eval; got "
                 f"--at {args.at} --metric {args.metric}")
        say(results_table(args.run_dirs, args.by, args.metric, args.episodes, args.at))
        return 0
    if argv[0] == "resume":
        return resume(resume_parser().parse_args(argv[1:]))
    if argv[0] == "evaluate":
        return evaluate_runs(evaluate_parser().parse_args(argv[1:]))
    if argv[0] == "tune":
        return tune.run_tune(tune_parser().parse_args(argv[1:]))
    return launch(launch_parser().parse_args(argv))


def interrupt_on_sigterm(*_: Any) -> None:
    raise KeyboardInterrupt  # a cancelled CI job stops its jobs the way Ctrl-C does


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    sys.exit(main())
