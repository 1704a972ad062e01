"""A trial's value over its seeds, and what a tune reports of its trials: a table, a figure, the best settings as a
config."""

from __future__ import annotations

import statistics
from typing import Any

import yaml

OBJECTIVES = {  # a trial's value from its seeds' final evaluation returns; the first two reward settings that hold
    "mean-std": "mean minus sample std over seeds",  # on every seed, not one lucky seed
    "min": "worst seed",
    "mean": "mean over seeds",
}


def objective(returns: list[float], how: str) -> float:
    """A trial's value from its seeds' final evaluation returns (see OBJECTIVES)."""
    if how == "min":
        return min(returns)
    mean = statistics.fmean(returns)
    if how == "mean":
        return mean
    return mean - (statistics.stdev(returns) if len(returns) > 1 else 0.0)


def text(value: Any) -> str:
    """A setting's value as the command line and --pack read it back exactly (a float: its repr)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def state_of(trial) -> str:
    """An unfinished trial's state; a pruned one's with its value at the last rung it reached."""
    if trial.state.name == "PRUNED" and trial.intermediate_values:
        step = max(trial.intermediate_values)
        return f"pruned at step {step}: {trial.intermediate_values[step]:.1f}"
    return trial.state.name.lower()


def trials_table(trials: list, returns: dict[int, list[float]], how: str) -> str:
    """Markdown, a row per trial (best first, then unfinished ones): its number, value, seeds' final evaluation
    returns (`returns`, by trial number) and settings."""
    keys = list(dict.fromkeys(key for trial in trials for key in trial.params))
    done = sorted((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)
    rows = [[t.number, f"{t.value:.1f}" if t.state.name == "COMPLETE" else state_of(t),
             " ".join(f"{r:.1f}" for r in returns.get(t.number, [])) or "-",
             *(f"{t.params[key]:.4g}" if isinstance(t.params.get(key), float) else text(t.params.get(key, "-"))
               for key in keys)]
            for t in done + [t for t in trials if t.state.name != "COMPLETE"]]
    header = ["trial", OBJECTIVES[how], "final eval return per seed", *keys]
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def importances(trials: list) -> tuple[str, dict[str, float]]:
    """(the evaluator's name, each setting's importance to the value over the finished trials, the largest first):
    Optuna's PED-ANOVA (fANOVA needs scikit-learn); none when fewer than two trials finished, or Optuna cannot tell."""
    import optuna

    done = [t for t in trials if t.state.name == "COMPLETE"]
    if len(done) < 2:
        return "", {}
    study = optuna.create_study(direction="maximize")
    study.add_trials(done)
    try:
        return "PED-ANOVA", optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ZeroDivisionError):  # e.g. every finished trial with the same settings
        return "", {}


def trials_figure(trials: list, returns: dict[int, list[float]], how: str, space: dict[str, dict[str, Any]]) -> Any:
    """The trials, in a grid of at most 3 panels a row: each one's value and seeds' returns by trial number with the
    best so far (a pruned trial: its value at the last rung it reached); the settings' importances (Optuna's);
    and the value against each setting tried (a log axis for a log-scaled one, a choice's values by name)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    done = [t for t in trials if t.state.name == "COMPLETE"]  # a pruned trial's value is a rung's
    evaluator, weights = importances(trials)
    panels = 1 + bool(weights) + len(space)
    columns = min(3, panels)
    rows = -(-panels // columns)
    fig = Figure(figsize=(4.5 * columns, 3.5 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, columns, squeeze=False).flat)
    for ax in axes[panels:]:
        ax.set_axis_off()
    history = axes.pop(0)
    for t in done:
        history.scatter([t.number] * len(returns[t.number]), returns[t.number], color="0.7", s=8)
    numbers, values = [t.number for t in done], [t.value for t in done]
    history.scatter(numbers, values, label=OBJECTIVES[how])
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
    if pruned:  # successive halving: where each pruned trial stood at the last rung it reached
        history.scatter([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                        marker="x", color="0.5", label="pruned: at its last rung")
    best = [max(values[:i + 1]) for i in range(len(values))]
    history.step(numbers, best, where="post", color="C1", label="best so far")
    history.set(xlabel="trial", ylabel="final eval return", title="the trials (grey: each seed)")
    history.legend(fontsize="small")
    history.xaxis.get_major_locator().set_params(integer=True)
    if weights:
        bars = axes.pop(0)
        keys = list(weights)[::-1]  # the largest at the top
        bars.barh(keys, [weights[key] for key in keys])
        bars.set(xlabel="importance", title=f"importance ({evaluator}, Optuna's; finished trials)")
    for ax, (key, spec) in zip(axes, space.items(), strict=False):
        if spec["type"] == "choice":  # a choice's values by their place in the list, named
            names = [text(choice) for choice in spec["choices"]]
            ax.scatter([names.index(text(t.params[key])) for t in done], values)
            ax.set_xticks(range(len(names)), names)
            ax.set_xlim(-0.5, len(names) - 0.5)
        else:
            ax.set_xscale("log" if spec.get("log") else "linear")
            ax.scatter([t.params[key] for t in done], values)
            ax.xaxis.set_minor_formatter("")  # a log axis's minor labels run into each other
        ax.set(xlabel=key, ylabel=OBJECTIVES[how])
    return fig


def best_config(config_text: str, overrides: dict[str, Any], best, how: str, seeds: list[int], tune_id: str) -> str:
    """The tuned config: the tune's config with its --set values and the best trial's settings, headed by what chose
    them (so `python algos/<file>.py --config` runs it)."""
    values = (yaml.safe_load(config_text) or {}) | overrides | best.params
    header = (f"# The best trial of run.py tune {tune_id}: trial {best.number}, {OBJECTIVES[how]} {best.value:.1f}\n"
              f"# over seeds {' '.join(map(str, seeds))}, the seeds that chose these settings: try them on others\n")
    return header + yaml.safe_dump(values, sort_keys=False)
