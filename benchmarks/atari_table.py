"""The Atari results: one table row per run and one figure per game, beside published numbers at the same steps.

    python benchmarks/atari_table.py                       # every *_cpu_bf16*.json and *_buffer1M_*.json curve
    python benchmarks/atari_table.py benchmarks/results/pong_cpu_bf16.json benchmarks/results/pong_cpu_bf16_2.json

Reads the curves that benchmarks/pong_curve.py writes (one JSON per run: its evaluations and training episodes with
agent steps and wall time) and prints a markdown table, also written to benchmarks/results/atari.md, and a figure per
game, benchmarks/results/atari_<game>.png: every run's evaluations (10 episodes each) and the rolling mean of its
training returns against agent steps, the published numbers marked at their steps.

Columns, per run: the settings (the preset, or the flags that change what it learns); our metric, the evaluation
(greedy, epsilon 0.001, 10 whole games) at 250k, 500k and 1M agent steps; the first evaluation at or above the game's
goal (steps, hours of wall time); the last evaluation. Then the same runs in the sources' own metrics where ours can
be computed in them: Dopamine's, the mean training return of the episodes that ended in the iteration (250k agent
steps) that ends at the step; CleanRL's, the training episodic return averaged over the episodes that ended in the
50k agent steps before the step (its curves are of training episodes). A cell is empty where the run has not
reached the step. Under the table, per game and settings: the final evaluations of the seeds that ran to the end,
their mean and sample standard deviation.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEPS = (250_000, 500_000, 1_000_000)
GOALS = {"Pong": 18.0, "Breakout": 30.0}
# Same-step anchors, agent steps (4 frames each). CleanRL dqn_atari: 3 seeds, read from its curves (training return).
# Dopamine: baselines/atari/data/<game>.json, the mean over its 5 runs of an iteration's value (the mean training
# return of the iteration's episodes; iteration k covers agent steps 250k k to 250k (k + 1), listed at its end),
# sticky actions; agents "DQN", "DQN (Adam + MSE in JAX)" and "Rainbow".
DOPAMINE = {"Pong": {250_000: (-20.3, -20.2, -20.4), 500_000: (-19.1, -18.5, -20.6), 1_000_000: (-16.6, -13.9, -16.5)},
            "Breakout": {250_000: (1.6, 1.8, 1.8), 500_000: (3.1, 6.5, 4.5), 1_000_000: (6.7, 18.9, 15.6),
                         2_000_000: (16.3, 38.3, 32.4)}}
AGENTS = ("Dopamine DQN", "Dopamine Adam-DQN", "Dopamine Rainbow")
ANCHORS = {game: [(name, step, value) for step, values in steps.items()
                  for name, value in zip(AGENTS, values, strict=True)] for game, steps in DOPAMINE.items()}
ANCHORS["Pong"] += [("CleanRL dqn_atari", 1_000_000, -14.0)]
ANCHORS["Breakout"] += [("CleanRL dqn_atari", 1_000_000, 30.0), ("CleanRL dqn_atari", 2_000_000, 100.0)]


def game_and_seed(data: dict) -> tuple[str, int]:
    """The game ("Pong") and seed of a curve: recorded by pong_curve.py, else read from the run's name."""
    env = data.get("env") or data["run"].split("__")[0]
    seed = data.get("seed")
    return env.removeprefix("ALE/").split("NoFrameskip")[0].split("-")[0], int(seed if seed is not None
                                                                            else data["run"].split("__")[-1])


def settings(data: dict) -> str:
    """The flags of a run's command that change what the preset learns ("preset" where it has none)."""
    flags = re.findall(r"--(?:buffer-size|batch-size|train-frequency) \d+", data.get("command", ""))
    return ", ".join(flags) or "preset"


def evaluation_at(data: dict, step: int) -> float | None:
    found = [e["eval/episodic_return"] for e in data["evaluations"] if e["global_step"] == step]
    return found[-1] if found else None


def training_mean(data: dict, start: int, end: int) -> float | None:
    """Mean training return of the episodes that ended in (start, end]; None before the run reached `end`."""
    if data["last_step"] < end:
        return None
    returns = [e["episodic_return"] for e in data["training_episodes"] if start < e["global_step"] <= end]
    return statistics.mean(returns) if returns else None


def first_at_goal(data: dict, goal: float) -> tuple[int, float | None] | None:
    return next(((e["global_step"], e["wall_s"]) for e in data["evaluations"] if e["eval/episodic_return"] >= goal),
                None)


def machine(data: dict) -> str:
    """The machine's short name: its description up to the first comma outside parentheses."""
    return re.match(r"[^,(]*(\([^)]*\))?", data.get("machine", "")).group(0).strip()


def cell(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def order(data: dict) -> tuple[str, bool, int]:
    game, seed = game_and_seed(data)
    return game, settings(data) != "preset", seed


def finals(game: str, other: bool, curves: list[dict]) -> str | None:
    """One line for a game and its settings: the final evaluations of the seeds that ran to the end, mean ± std."""
    runs = sorted((d for d in curves if order(d)[:2] == (game, other) and d.get("final_evaluation")
                   and not d["final_evaluation"].get("interrupted")), key=order)
    if not runs:
        return None
    values = [d["final_evaluation"]["eval_return_mean"] for d in runs]
    spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    seeds = ", ".join(str(game_and_seed(d)[1]) for d in runs)
    return (f"- {game}, {settings(runs[0])}: final evaluation {statistics.mean(values):.1f}{spread} over seeds {seeds} "
            f"({', '.join(f'{v:.1f}' for v in values)})")


def table(curves: list[dict]) -> str:
    head = ("| game | settings | seed | machine | eval 250k | eval 500k | eval 1M | first eval >= goal (steps, h) "
            "| last eval (steps) | Dopamine's metric 250k / 500k / 1M | CleanRL's metric 1M |")
    lines = [head, "| --- " * 11 + "|"]
    for data in sorted(curves, key=order):
        game, seed = game_and_seed(data)
        goal = GOALS.get(game)
        reached = first_at_goal(data, goal) if goal is not None else None
        to_goal = (f"{reached[0] / 1e3:.0f}k, {reached[1] / 3600:.2f} h" if reached and reached[1] is not None
                   else f"{reached[0] / 1e3:.0f}k" if reached else "not yet")
        last = data["evaluations"][-1] if data["evaluations"] else None
        dopamine = " / ".join(cell(training_mean(data, step - 250_000, step)) or "-" for step in STEPS)
        cleanrl = cell(training_mean(data, 950_000, 1_000_000)) or "-"
        lines.append(f"| {game} | {settings(data)} | {seed} | {machine(data)} | "
                     + " | ".join(cell(evaluation_at(data, step)) or "-" for step in STEPS)
                     + f" | {to_goal} (goal {goal}) | "
                     + (f"{last['eval/episodic_return']:.1f} ({last['global_step'] / 1e3:.0f}k)" if last else "-")
                     + f" | {dopamine} | {cleanrl} |")
    lines.append("")
    groups = sorted({order(d)[:2] for d in curves})
    lines += [line for game, other in groups if (line := finals(game, other, curves))]
    for game in sorted({game_and_seed(d)[0] for d in curves}):
        anchors = "; ".join(f"{name} {value:g} at {step / 1e6:g}M" for name, step, value in ANCHORS.get(game, []))
        lines.append(f"\n{game} anchors (the sources' metrics): {anchors}")
    return "\n".join(lines)


def figure(game: str, curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, data in enumerate(sorted(curves, key=order)):
        _, seed = game_and_seed(data)
        colour = f"C{i}"
        episodes = data["training_episodes"]
        ys = [e["episodic_return"] for e in episodes]
        smooth = [statistics.mean(ys[max(0, j - 19):j + 1]) for j in range(len(ys))]
        ax.plot([e["global_step"] / 1e6 for e in episodes], smooth, color=colour, alpha=0.45, linewidth=1)
        ax.plot([e["global_step"] / 1e6 for e in data["evaluations"]],
                [e["eval/episodic_return"] for e in data["evaluations"]], "o-", color=colour, markersize=3,
                label=f"seed {seed}, {settings(data)}: evaluation (line: training, mean of 20)")
    markers = {"CleanRL dqn_atari": "X", "Dopamine DQN": "o", "Dopamine Adam-DQN": "s", "Dopamine Rainbow": "^"}
    for name, marker in markers.items():
        points = [(step / 1e6, value) for source, step, value in ANCHORS.get(game, []) if source == name]
        if points:
            ax.plot(*zip(*points, strict=True), marker=marker, color="k", markerfacecolor="none", linestyle="none",
                    markersize=8, label=name + (" (training return)" if "CleanRL" in name else
                                                " (mean training return of the iteration)"))
    if game in GOALS:
        ax.axhline(GOALS[game], color="k", linestyle=":", linewidth=1, label=f"goal ({GOALS[game]:g})")
    ax.set_xlabel("agent steps (millions)")
    ax.set_ylabel("return (game score)")
    ax.set_title(f"{game}: per_dqn's Atari preset (and the flags named) on a 2-core CPU; black: published numbers in "
                 "their metrics", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center right", bbox_to_anchor=(1, 0.6))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("curves", nargs="*", type=Path)
    options = parser.parse_args()
    paths = options.curves or sorted([*RESULTS.glob("*_cpu_bf16*.json"), *RESULTS.glob("*_buffer1M_*.json")])
    curves = [json.loads(path.read_text()) for path in paths]
    text = table(curves)
    print(text)
    (RESULTS / "atari.md").write_text(text + "\n")
    for game in sorted({game_and_seed(d)[0] for d in curves}):
        path = RESULTS / f"atari_{game.lower()}.png"
        figure(game, [d for d in curves if game_and_seed(d)[0] == game], path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
