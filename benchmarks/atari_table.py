"""The Atari runs: each run's curve, one table of every run beside the published numbers, and a figure per game.

    python benchmarks/atari_table.py                          # the table and figures, from the curves in results/
    python benchmarks/atari_table.py --curves                 # first each run's curve, from its directory in runs/
    python benchmarks/atari_table.py --curves --game Breakout # one game's runs (its table printed, not written)

A run is one entry of benchmarks/atari_runs.yaml: its curve's name, its run directory, its settings (the table's
column: "preset", or the flags that change what it learns), the machine it trained on and the command that trained it
(by default the run's own config.yaml, which trains it again). Adding a run is adding its entry; a game without a goal
or published numbers in GOALS and DOPAMINE still gets its rows and figure.

Curves (--curves): for each run whose directory is there, benchmarks/results/<name>.json and .png from its
metrics.jsonl (a run still training gives its curve so far): every evaluation and training episode with its agent
steps and wall time, losses every 1000 updates, the final evaluation (summary.json) and each `--evaluate` of the run
since (evaluations/*.json). Wall time is the run's own, evaluations and resumed processes included: the
`charts/wall_time_s` of the records every 1000 steps; a process that did not log it (older code) gets it from its
`charts/SPS` and a segment (its first step, the run's wall time when it started: a resume prints both).

The table (benchmarks/results/atari.md), per run: our metric, the evaluation (epsilon 0.001, 10 whole games) at 250k,
500k and 1M agent steps; the first evaluation at or above the game's goal (steps, hours of wall time); the last
evaluation. Then the sources' own metrics computed from our runs: Dopamine's, the mean training return of the episodes
that ended in the iteration (250k agent steps) that ends at the step; CleanRL's, the mean training return of the
episodes that ended in the 50k agent steps before the step. An empty cell: the run has not reached the step. Under the
table, per game and settings, the final evaluations of the seeds that ran to the end, mean ± sample std (and
Dopamine's metric at 1M where they reached it), then the seeds paused by --stop-step, each with its evaluation and
step. The figures
(benchmarks/results/atari_<game>.png): every run's evaluations and smoothed training returns against agent steps,
the published numbers marked at their steps, the goal dotted. README.md and docs/atari.md show the table and the
lines under it, between their BLOCK lines, written here too.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEPS = (250_000, 500_000, 1_000_000)
GOALS = {"Pong": 18.0, "Breakout": 30.0}
# Same-step anchors, agent steps (4 frames each). CleanRL dqn_atari: 3 seeds, read from its curves (training return).
# Dopamine: baselines/atari/data/<game>.json, the mean over its 5 runs of an iteration's value (the mean training
# return of the iteration's episodes; iteration k covers agent steps 250k k to 250k (k + 1), listed at its end),
# sticky actions; agents "DQN", "DQN (Adam + MSE in JAX)", "Rainbow" and "IQN".
DOPAMINE = {"Pong": {250_000: (-20.3, -20.2, -20.4, -19.4), 500_000: (-19.1, -18.5, -20.6, -13.8),
                     1_000_000: (-16.6, -13.9, -16.5, -1.8), 2_000_000: (-8.5, -0.8, 10.7, 12.8)},
            "Breakout": {250_000: (1.6, 1.8, 1.8, 4.1), 500_000: (3.1, 6.5, 4.5, 16.3),
                         1_000_000: (6.7, 18.9, 15.6, 31.6), 2_000_000: (16.3, 38.3, 32.4, 71.6)},
            "BeamRider": {250_000: (361.5, 374.0, 354.7, 421.5), 500_000: (331.4, 424.3, 371.0, 1218.0),
                          1_000_000: (357.3, 1116.4, 525.7, 5614.1), 2_000_000: (518.2, 5363.5, 4146.4, 4820.0)}}
AGENTS = ("Dopamine DQN", "Dopamine Adam-DQN", "Dopamine Rainbow", "Dopamine IQN")
ANCHORS = {game: [(name, step, value) for step, values in steps.items()
                  for name, value in zip(AGENTS, values, strict=True)] for game, steps in DOPAMINE.items()}
ANCHORS["Pong"] += [("CleanRL dqn_atari", 1_000_000, -14.0)]
ANCHORS["Breakout"] += [("CleanRL dqn_atari", 1_000_000, 30.0), ("CleanRL dqn_atari", 2_000_000, 100.0)]


@dataclass(frozen=True)
class Run:  # one entry of atari_runs.yaml (its header says what each field holds)
    name: str
    run_dir: str
    settings: str
    machine: str  # the table shows it up to the first comma outside parentheses
    command: str = ""
    segments: tuple[tuple[int, float], ...] = ()
    table: bool = True


def load_runs(path: Path = ROOT / "benchmarks" / "atari_runs.yaml") -> list[Run]:
    """The runs of atari_runs.yaml, each machine spelled out ("<cpu>, <how>"); a wrong entry is named."""
    data = yaml.safe_load(path.read_text())
    runs = []
    for i, entry in enumerate(data["runs"]):
        where = f"{path.name}, run {i + 1} ({entry.get('name', 'no name')})"
        missing = {"name", "run_dir", "settings", "cpu", "how"} - set(entry)
        unknown = set(entry) - {"name", "run_dir", "settings", "cpu", "how", "command", "segments", "table"}
        if missing or unknown or entry.get("cpu") not in data["cpus"]:
            raise ValueError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}, cpu "
                             f"{entry.get('cpu')!r} of {sorted(data['cpus'])}")
        machine = f"{data['cpus'][entry['cpu']]}, {entry['how']}"
        runs.append(Run(entry["name"], entry["run_dir"], str(entry["settings"]), machine, entry.get("command", ""),
                        tuple(tuple(s) for s in entry.get("segments", ())), entry.get("table", True)))
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        raise ValueError(f"{path.name}: a name given twice: {sorted({n for n in names if names.count(n) > 1})}")
    return runs


def game_and_seed(data: dict) -> tuple[str, int]:
    """The game ("Pong") and seed of a curve: as recorded, else read from the run's name."""
    env = data.get("env") or data["run"].split("__")[0]
    seed = data.get("seed")
    return env.removeprefix("ALE/").split("NoFrameskip")[0].split("-")[0], int(seed if seed is not None
                                                                            else data["run"].split("__")[-1])


def curve(run_dir: Path, segments: tuple[tuple[int, float], ...]) -> dict:
    """A run's evaluations and training episodes with agent steps and wall time, from its directory."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    clock = []  # (step, wall time) from the records every 1000 steps
    for record in records:
        if "charts/wall_time_s" in record:
            clock.append((record["global_step"], record["charts/wall_time_s"]))
        elif "charts/SPS" in record and segments:
            start, wall = max((s for s in segments if s[0] < record["global_step"]), default=segments[0])
            clock.append((record["global_step"], wall + (record["global_step"] - start) / record["charts/SPS"]))

    def wall_at(step: int) -> float | None:  # the clock's last reading at or before the step (within 1000 steps)
        readings = [wall for at, wall in clock if at <= step]
        return round(readings[-1], 1) if readings else None

    capped = {r["global_step"]: int(r["eval/capped_episodes"]) for r in records if "eval/capped_episodes" in r}
    evaluations = [{"global_step": r["global_step"], "wall_s": wall_at(r["global_step"]),
                    "eval/episodic_return": r["eval/episodic_return"],
                    "capped": capped.get(r["global_step"], 0)}  # games the episode cap ended (logged when any)
                   for r in records if "eval/episodic_return" in r]
    episodes = [{"global_step": r["global_step"], "wall_s": wall_at(r["global_step"]),
                 "episodic_return": r["charts/episodic_return"], "epsilon": r.get("charts/epsilon")}
                for r in records if "charts/episodic_return" in r]
    losses = [{k.removeprefix("losses/"): v for k, v in r.items()} for r in records if "losses/td_loss" in r]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    final = {key: summary[key] for key in ("eval_return_mean", "eval_return_std", "eval_returns", "eval_capped",
                                           "global_step", "wall_time_s", "interrupted") if key in summary}
    again = [{key: e.get(key) for key in ("seed", "eval_episodes", "eval_epsilon", "returns", "mean", "std", "capped")}
             for e in (json.loads(p.read_text()) for p in sorted((run_dir / "evaluations").glob("*.json")))]
    return {"final_evaluation": final, "evaluated_again": again,
            "last_step": records[-1]["global_step"] if records else 0, "last_wall_s": clock[-1][1] if clock else None,
            "evaluations": evaluations, "training_episodes": episodes, "losses_every_100_updates": losses[::10]}


def write_curve(run: Run) -> None:
    """benchmarks/results/<name>.json and .png from the run's directory."""
    run_dir = ROOT / "runs" / run.run_dir
    config = run_dir / "config.yaml"
    settings = yaml.safe_load(config.read_text()) if config.is_file() else {}
    command = run.command or f"python algos/{settings['algo']}.py --config runs/{run.run_dir}/config.yaml"
    data = {"command": command, "machine": run.machine, "run": run_dir.name, "env": settings.get("env"),
            "seed": settings.get("seed"), "config": settings, **curve(run_dir, run.segments)}
    (RESULTS / f"{run.name}.json").write_text(json.dumps(data, indent=1))
    best = max((e["eval/episodic_return"] for e in data["evaluations"]), default=None)
    hours = (data["last_wall_s"] or 0) / 3600
    run_figure(data, RESULTS / f"{run.name}.png", f"{run_dir.name}: {data['last_step']} agent steps, "
                                                  f"{hours:.2f} h\n{run.machine}")
    print(f"{run.run_dir}: {data['last_step']} agent steps, {hours:.2f} h, {len(data['evaluations'])} evaluations "
          f"(best {best}), {len(data['training_episodes'])} training episodes -> results/{run.name}.json, .png")


def run_figure(data: dict, path: Path, title: str) -> None:
    """One run: training episodes and evaluations against agent steps and against wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    episodes, evaluations = data["training_episodes"], data["evaluations"]
    goal = GOALS.get(game_and_seed(data)[0])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    for ax, key, scale, label in ((axes[0], "global_step", 1e3, "agent steps (thousands)"),
                                  (axes[1], "wall_s", 3600, "wall time (hours)")):
        points = [e for e in episodes if e[key] is not None]
        xs = [e[key] / scale for e in points]
        ys = [e["episodic_return"] for e in points]
        smooth = [statistics.mean(ys[max(0, i - 19):i + 1]) for i in range(len(ys))]
        ax.plot(xs, ys, ".", color="0.75", markersize=3, label="training episode")
        ax.plot(xs, smooth, color="C0", label="training, mean of the last 20")
        points = [e for e in evaluations if e[key] is not None]
        ax.plot([e[key] / scale for e in points], [e["eval/episodic_return"] for e in points], "o-", color="C3",
                label="evaluation (10 episodes)")
        if goal is not None:
            ax.axhline(goal, color="k", linestyle=":", linewidth=1, label=f"goal ({goal:g})")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("return")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("\n".join(textwrap.fill(line, 120) for line in title.splitlines()), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def order(data: dict) -> tuple[str, bool, str, int]:
    """Rows by game, the preset's first, then by settings and seed."""
    game, seed = game_and_seed(data)
    return game, data["settings"] != "preset", data["settings"], seed


def finals(group: tuple[str, bool, str], curves: list[dict]) -> str | None:
    """One line for a game and its settings: the final evaluations of the seeds that ran to the end, mean ± std,
    then those of the seeds paused where they were evaluated (--stop-step), each with its step."""
    mine = sorted((d for d in curves if order(d)[:3] == group and d.get("final_evaluation")
                   and d["final_evaluation"].get("eval_return_mean") is not None), key=order)  # stopped: no value
    runs = [d for d in mine if not d["final_evaluation"].get("interrupted")]
    paused = "; ".join(f"seed {game_and_seed(d)[1]} {d['final_evaluation']['eval_return_mean']:.1f} at "
                       f"{d['final_evaluation']['global_step'] // 1000}k" for d in mine if d not in runs)
    if not runs:
        return f"- {group[0]}, {group[2]}: paused by --stop-step: {paused}" if paused else None
    values = [d["final_evaluation"]["eval_return_mean"] for d in runs]
    seeds = ", ".join(str(game_and_seed(d)[1]) for d in runs)
    line = (f"- {group[0]}, {group[2]}: final evaluation {mean_std(values)} over seeds {seeds} "
            f"({', '.join(f'{v:.1f}' for v in values)})")
    dopamine = [training_mean(d, 750_000, 1_000_000) for d in runs]
    if None not in dopamine:
        line += f"; Dopamine's metric at 1M {mean_std(dopamine)} ({', '.join(f'{v:.1f}' for v in dopamine)})"
    return line + (f"; paused by --stop-step: {paused}" if paused else "")


def mean_std(values: list[float]) -> str:
    """Mean ± sample std (the mean alone for one value)."""
    return f"{statistics.mean(values):.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")


def table(curves: list[dict]) -> str:
    head = ("| game | settings | seed | machine | eval 250k | eval 500k | eval 1M | first eval >= goal (steps, h) "
            "| last eval (steps) | games capped | Dopamine's metric 250k / 500k / 1M | CleanRL's metric 1M |")
    lines = [head, "| --- " * 12 + "|"]
    for data in sorted(curves, key=order):
        game, seed = game_and_seed(data)
        goal = GOALS.get(game)
        reached = first_at_goal(data, goal) if goal is not None else None
        to_goal = (f"{reached[0] / 1e3:.0f}k, {reached[1] / 3600:.2f} h" if reached and reached[1] is not None
                   else f"{reached[0] / 1e3:.0f}k" if reached else "not yet")
        last = data["evaluations"][-1] if data["evaluations"] else None
        dopamine = " / ".join(cell(training_mean(data, step - 250_000, step)) or "-" for step in STEPS)
        cleanrl = cell(training_mean(data, 950_000, 1_000_000)) or "-"
        known = [int(e["capped"]) for e in data["evaluations"] if "capped" in e]  # curves before the count: "-"
        capped = f"{sum(known)} in {len(known)} evals" if known else "-"
        lines.append(f"| {game} | {data['settings']} | {seed} | {machine(data)} | "
                     + " | ".join(cell(evaluation_at(data, step)) or "-" for step in STEPS)
                     + (f" | {to_goal} (goal {goal}) | " if goal is not None else " | - (no goal) | ")
                     + (f"{last['eval/episodic_return']:.1f} ({last['global_step'] / 1e3:.0f}k)" if last else "-")
                     + f" | {capped} | {dopamine} | {cleanrl} |")
    lines.append("")
    lines += [line for group in sorted({order(d)[:3] for d in curves}) if (line := finals(group, curves))]
    for game in sorted({game_and_seed(d)[0] for d in curves}):
        anchors = "; ".join(f"{name} {value:g} at {step / 1e6:g}M" for name, step, value in ANCHORS.get(game, []))
        lines.append(f"\n{game} anchors (the sources' metrics): {anchors or 'none'}")
    return "\n".join(lines)


def figure(game: str, curves: list[dict], path: Path) -> None:
    """One game: every run's evaluations and smoothed training returns, the published numbers, the goal."""
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
                label=f"seed {seed}, {data['settings']}: evaluation (line: training, mean of 20)")
    markers = {"CleanRL dqn_atari": "X", "Dopamine DQN": "o", "Dopamine Adam-DQN": "s", "Dopamine Rainbow": "^",
               "Dopamine IQN": "D"}
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


PAGES = (ROOT / "README.md", ROOT / "docs" / "atari.md")
BLOCK = ("<!-- the Atari table: benchmarks/atari_table.py writes it from benchmarks/results/atari.md's curves -->",
         "<!-- end of the Atari table -->")


def pages_block(text: str) -> str:
    """The part of the table's text the pages show: the rows and the final evaluations, not the anchors."""
    return "\n\n".join(text.split("\n\n")[:2])


def write_pages(text: str) -> None:
    """Each page's copy of the table, between its BLOCK lines, replaced by this one."""
    for page in PAGES:
        before, found, rest = page.read_text().partition(BLOCK[0])
        if not found or BLOCK[1] not in rest:
            sys.exit(f"error: {page.relative_to(ROOT)} has no lines {BLOCK} around its table")
        page.write_text(f"{before}{BLOCK[0]}\n\n{pages_block(text)}\n\n{BLOCK[1]}{rest.split(BLOCK[1], 1)[1]}")
        print(f"wrote the table in {page.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curves", action="store_true", help="first write each run's curve from its run directory")
    parser.add_argument("--game", help="only this game's runs (Pong, Breakout, ...): the table printed, not written")
    options = parser.parse_args(argv)
    runs = load_runs()
    for run in runs if options.curves else []:
        config = ROOT / "runs" / run.run_dir / "config.yaml"
        if not config.is_file():
            print(f"{run.run_dir}: not in runs/, its curve stays as it was")
        elif options.game in (None, game_and_seed({"env": yaml.safe_load(config.read_text())["env"], "seed": 0})[0]):
            write_curve(run)
    curves = [{**json.loads((RESULTS / f"{run.name}.json").read_text()), "settings": run.settings}
              for run in runs if run.table and (RESULTS / f"{run.name}.json").is_file()]
    curves = [d for d in curves if options.game in (None, game_and_seed(d)[0])]
    if not curves:
        sys.exit(f"error: no curve of {options.game} in atari_runs.yaml")
    text = table(curves)
    print(text)
    if options.game is None:
        (RESULTS / "atari.md").write_text(text + "\n")
        write_pages(text)
    for game in sorted({game_and_seed(d)[0] for d in curves}):
        path = RESULTS / f"atari_{game.lower()}.png"
        figure(game, [d for d in curves if game_and_seed(d)[0] == game], path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
