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


def trials_figure(trials: list, returns: dict[int, list[float]], how: str, space: dict[str, dict[str, Any]]) -> Any:
    """The trials: each one's value and seeds' returns by trial number with the best so far (a pruned trial: its value
    at the last rung it reached), and its value against each setting tried (a log axis for a log-scaled one)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    done = [t for t in trials if t.state.name == "COMPLETE"]  # a pruned trial's value is a rung's
    fig = Figure(figsize=(4.5 * (1 + len(space)), 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 1 + len(space), squeeze=False)[0]
    for t in done:
        axes[0].scatter([t.number] * len(returns[t.number]), returns[t.number], color="0.7", s=8)
    numbers, values = [t.number for t in done], [t.value for t in done]
    axes[0].scatter(numbers, values, label=OBJECTIVES[how])
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
    if pruned:  # successive halving: where each pruned trial stood at the last rung it reached
        axes[0].scatter([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                        marker="x", color="0.5", label="pruned: at its last rung")
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
