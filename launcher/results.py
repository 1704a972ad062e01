"""Results: a run's summary.json and metrics.jsonl, learning curves (run.py plot), the results table and its
metrics, the peers' among them (run.py table), and the markdown they are printed as."""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from launcher import fail, say

TRAINING_RETURN = "charts/episodic_return"  # what plot falls back to when evaluations are too few
TRAINING_SMOOTH = 20  # its default rolling window, in episodes


def summary_in(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def finished(run_dir: Path) -> bool:
    """A run is finished when its summary.json is readable and does not say it was interrupted (an unreadable one,
    cut short by a kill while it was written, counts as unfinished)."""
    summary = summary_in(run_dir)
    return bool(summary) and summary.get("interrupted") is False


def format_return(summary: dict[str, Any]) -> str:
    if summary.get("eval_return_mean") is None:
        return "-"
    return f"{summary['eval_return_mean']:.1f} ± {summary.get('eval_return_std') or 0.0:.1f}"


def markdown(header: list[str], rows: list[list[Any]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def run_dirs_under(paths: list[Path], marker: str) -> list[Path]:
    """Run directories (those holding `marker`) given as themselves or anywhere under the paths."""
    found = set()
    for path in paths:
        if not path.is_dir():
            fail(f"{path} is not a directory")
        found |= {path} if (path / marker).is_file() else {m.parent for m in path.rglob(marker)}
    if not found:
        fail(f"no {marker} under {' '.join(map(str, paths))}")
    return sorted(found)


def run_key(run_dir: Path, by: str | None) -> tuple[str, str, Any]:
    """(algo, env, the value of config key `by` or None) of a run, from its summary.json or config.yaml."""
    config = {}
    with contextlib.suppress(OSError, yaml.YAMLError):
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    summary = summary_in(run_dir)
    algo, env = summary.get("algo", config.get("exp_name", "?")), summary.get("env", config.get("env", run_dir.name))
    return str(algo), str(env), (config.get(by, "-") if by else None)


def key_order(key: tuple[str, str, Any]) -> tuple:
    """Sorts numbers by value (0.2 before 1.0 before 10), other values by text."""
    value = key[2]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return key[0], key[1], (0, value, "") if number else (1, 0, str(value))


def metric_series(run_dir: Path, metric: str) -> tuple[Any, Any]:
    """(steps, values) of one metric in a run's metrics.jsonl, by step."""
    import numpy as np

    points = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a run still writing its last line
        if record.get(metric) is not None:
            points.append((record["global_step"], record[metric]))
    points.sort(key=lambda p: p[0])
    return np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float)


def rolling_mean(values: Any, window: int) -> Any:
    """Each point's mean with up to window - 1 points before it (shorter windows at the start)."""
    import numpy as np

    sums = np.concatenate([[0.0], np.cumsum(values)])
    end = np.arange(1, len(values) + 1)
    begin = np.maximum(0, end - window)
    return (sums[end] - sums[begin]) / (end - begin)


def seed_band(series: list[tuple[Any, Any]]) -> tuple[Any, Any, Any, Any]:
    """(grid, mean, min, max) over seeds, each seed interpolated onto the steps all of them cover."""
    import numpy as np

    lo, hi = max(s[0] for s, _ in series), min(s[-1] for s, _ in series)
    steps = np.unique(np.concatenate([s for s, _ in series]))
    grid = steps[(steps >= lo) & (steps <= hi)]
    if len(grid) == 0:
        grid = np.array([hi])  # the seeds' step ranges do not overlap
    elif len(grid) > 500:
        grid = np.linspace(lo, hi, 500)
    values = np.stack([np.interp(grid, s, v) for s, v in series])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def curve_metric(runs: list[Path], metric: str | None, smooth: int | None) -> tuple[str, int]:
    """The metric to plot and its rolling window: the one asked for; by default the evaluation return,
    or the training return smoothed when some run has fewer than 3 evaluations (a config that
    evaluates only at the end draws no curve)."""
    if metric is not None:
        return metric, smooth or 1
    if all(len(metric_series(run_dir, "eval/episodic_return")[0]) >= 3 for run_dir in runs) or not all(
            len(metric_series(run_dir, TRAINING_RETURN)[0]) >= 3 for run_dir in runs):
        return "eval/episodic_return", smooth or 1
    window = smooth or TRAINING_SMOOTH
    say(f"fewer than 3 evaluations in some runs: plotting {TRAINING_RETURN} smoothed over {window} episodes "
        "(--metric eval/episodic_return plots the evaluations)")
    return TRAINING_RETURN, window


def curves_figure(paths: list[Path], metric: str | None = None, smooth: int | None = None,
                  by: str | None = None) -> Any:
    """One panel per env, one line per algorithm (and value of config key `by`): the mean over seeds
    of each seed's curve (smoothed, then interpolated onto common steps), shaded from min to max."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = run_dirs_under(paths, "metrics.jsonl")
    metric, window = curve_metric(runs, metric, smooth)
    groups: dict[tuple[str, str, Any], list] = {}
    for run_dir in runs:
        steps, values = metric_series(run_dir, metric)
        if len(steps):
            groups.setdefault(run_key(run_dir, by), []).append((steps, rolling_mean(values, window)))
        else:
            say(f"skipped {run_dir}: no {metric} in its metrics.jsonl")
    if not groups:
        fail(f"no run has {metric}; try --metric {TRAINING_RETURN}")
    envs = sorted({env for _, env, _ in groups})
    cols = min(3, len(envs))
    rows = -(-len(envs) // cols)
    fig = Figure(figsize=(5 * cols, 3.5 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, env in zip(axes, envs, strict=False):
        for key in sorted((k for k in groups if k[1] == env), key=key_order):
            series, (algo, _, value) = groups[key], key
            grid, mean, low, high = seed_band(series)
            label = f"{algo}{f' {by}={value}' if by else ''} ({len(series)} seed{'s' if len(series) > 1 else ''})"
            line, = ax.plot(grid, mean, marker="o" if len(grid) == 1 else None, label=label)
            if len(grid) > 1:
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            else:  # a single evaluation: a bar shows the spread where a band would be invisible
                ax.vlines(grid, low, high, color=line.get_color(), alpha=0.4, linewidth=6)
        ylabel = metric + (f" (rolling mean of {window})" if window > 1 else "")
        ax.set(title=env, xlabel="global_step", ylabel=ylabel)
        ax.legend()
    for ax in axes[len(envs):]:
        ax.set_visible(False)  # the grid's unused panels
    return fig


def mean_eval_return(run_dir: Path) -> float | None:
    """The area under the evaluation curve over its step span: the mean return over the run
    (trapezoids between evaluations); None with fewer than two evaluations."""
    if not (run_dir / "metrics.jsonl").is_file():
        return None
    steps, values = metric_series(run_dir, "eval/episodic_return")
    if len(steps) < 2 or steps[-1] == steps[0]:
        return None
    return float(((values[1:] + values[:-1]) / 2 * (steps[1:] - steps[:-1])).sum() / (steps[-1] - steps[0]))


def mean_and_std(values: list[float]) -> str:
    """mean ± sample standard deviation (n - 1 in the denominator; 0 for a single value)."""
    if not values:
        return "-"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1f}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}min" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def latest_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The newest record that `--evaluate` left in <run dir>/evaluations/ (named by its unix time), or None."""
    records = sorted((run_dir / "evaluations").glob("*.json"), key=lambda path: float(path.stem))
    return json.loads(records[-1].read_text()) if records else None


METRICS = {  # run.py table --metric: what each row's value is, per run (then mean ± sample std over the runs)
    "final": "final eval return (mean ± sample std over seeds)",
    "final-episodes": "final eval return (mean ± std over all seeds' episodes)",
    "last-episodes": "mean of the last {episodes} training episodes{at} (mean ± sample std over seeds)",
    "best-eval": "best evaluation during training{at} (mean ± sample std over seeds)",
    "eval-at": "the evaluation at step {step} (mean ± sample std over seeds)",
    "iteration": "mean training return of the episodes ended in steps {start}-{step}, Dopamine's iteration "
                 "(mean ± sample std over seeds)",
}
ITERATION = 250_000  # Dopamine's iteration: 1M frames, 250k agent steps


def metric_values(run_dir: Path, summary: dict[str, Any], metric: str, episodes: int,
                  at: int | None = None) -> list[float]:
    """A run's values of a table metric: its final evaluation's mean (final), every episode of it
    (final-episodes), the mean of its last `episodes` training episodes by step (last-episodes: CleanRL's
    benchmarks and curves), the largest of its evaluations' means (best-eval: the TD3 paper's max over training),
    its evaluation at step `at` (eval-at), or the mean return of the training episodes that ended in the 250k
    steps up to `at` (iteration: Dopamine's). With `at`, last-episodes and best-eval count only what happened up
    to that step. None where the run has nothing to give, or has not reached `at`."""
    if metric == "final":
        return [summary["eval_return_mean"]] if summary.get("eval_return_mean") is not None else []
    if metric == "final-episodes":
        return list(summary.get("eval_returns") or [])
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    training = metric in ("last-episodes", "iteration")
    steps, values = metric_series(run_dir, TRAINING_RETURN if training else "eval/episodic_return")
    if at is not None:
        if max(metric_series(run_dir, "global_step")[1], default=summary.get("global_step", 0)) < at:
            return []  # the run has not reached the step
        values = values[steps <= at]
        if metric == "iteration":
            values = values[steps[steps <= at] > at - ITERATION]
        elif metric == "eval-at":
            values = values[steps[steps <= at] == at]
    if not len(values):
        return []
    return [float(values[-episodes:].mean() if metric == "last-episodes" else
                  values.mean() if metric == "iteration" else values[-1] if metric == "eval-at" else values.max())]


def results_table(paths: list[Path], by: str | None = None, metric: str = "final", episodes: int = 100,
                  at: int | None = None) -> str:
    """Markdown, one row per (algo, env[, value of config key `by`]): the metric (see METRICS; the final
    evaluation return by default) and the mean evaluation return over the run (the area under its curve), each as
    mean ± std over seeds; and the latest re-evaluation (`--evaluate`) of each run, where some run has one."""
    groups: dict[tuple[str, str, Any], list[Path]] = {}
    for run_dir in run_dirs_under(paths, "summary.json"):
        groups.setdefault(run_key(run_dir, by), []).append(run_dir)
    rows = []
    for key in sorted(groups, key=key_order):
        summaries = [summary_in(run_dir) for run_dir in groups[key]]
        per_run = [metric_values(run_dir, summary, metric, episodes, at)
                   for run_dir, summary in zip(groups[key], summaries, strict=True)]
        returns = [value for values in per_run for value in values]
        areas = [a for a in map(mean_eval_return, groups[key]) if a is not None]
        steps = sorted({s.get("global_step", 0) for s in summaries})
        walls = [s["wall_time_s"] for s in summaries if s.get("wall_time_s") is not None]
        again = [record["mean"] for record in map(latest_evaluation, groups[key]) if record is not None]
        rows.append([key[0], key[1], *([key[2]] if by else []), sum(1 for values in per_run if values),
                     mean_and_std(returns),
                     mean_and_std(areas), steps[0] if len(steps) == 1 else f"{steps[0]}–{steps[-1]}",
                     duration(statistics.fmean(walls)) if walls else "-", f"{mean_and_std(again)} ({len(again)})"])
    described = METRICS[metric].format(episodes=episodes, step=at, start=(at or 0) - ITERATION,
                                       at=f" up to step {at}" if at is not None else "")
    header = ["algo", "env", *([by] if by else []), "seeds", described,
              "mean eval return over the run (area under curve)", "steps", "wall time (mean)",
              "latest re-evaluation (mean ± sample std over seeds, runs)"]
    if all(row[-1] == "- (0)" for row in rows):  # nothing re-evaluated: no column
        header, rows = header[:-1], [row[:-1] for row in rows]
    return markdown(header, rows)
