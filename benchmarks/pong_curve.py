"""A Pong run's curve: evaluations and training returns against agent steps and wall time, as JSON and a figure.

    python benchmarks/pong_curve.py runs/PongNoFrameskip-v4__per_dqn__cpu_bf16__1 --name pong_cpu_bf16 \\
        --command "python algos/per_dqn.py --env PongNoFrameskip-v4 ..." --machine "2-vCPU AMD EPYC VM"

Reads the run directory's metrics.jsonl (the run may still be training: the curve is as far as it went) and writes
benchmarks/results/<name>.json and <name>.png. Wall time is the run's own, evaluations and every resumed process
included: the `charts/wall_time_s` of the records every 1000 steps. Records written by code that did not log it
take it from their process's `charts/SPS` (agent steps per second of training since that process started, so
evaluations are left out there): `--segments STEP:WALL ...` gives each such process's first step and the run's
wall time when it started (a resume prints both in its stop line). The run's final evaluation (summary.json) and
each `--evaluate` of it since (evaluations/*.json: other evaluation seeds) are copied in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from pathlib import Path

import yaml
from atari_table import GOALS, game_and_seed  # beside this file: the dotted line is the game's goal

ROOT = Path(__file__).resolve().parents[1]


def curve(run_dir: Path, segments: list[tuple[int, float]]) -> dict:
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

    evaluations = [{"global_step": r["global_step"], "wall_s": wall_at(r["global_step"]),
                    "eval/episodic_return": r["eval/episodic_return"]} for r in records if "eval/episodic_return" in r]
    episodes = [{"global_step": r["global_step"], "wall_s": wall_at(r["global_step"]),
                 "episodic_return": r["charts/episodic_return"], "epsilon": r.get("charts/epsilon")}
                for r in records if "charts/episodic_return" in r]
    losses = [{k.removeprefix("losses/"): v for k, v in r.items()} for r in records if "losses/td_loss" in r]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    final = {key: summary[key] for key in ("eval_return_mean", "eval_return_std", "eval_returns", "global_step",
                                           "wall_time_s", "interrupted") if key in summary}
    again = [{key: e[key] for key in ("seed", "eval_episodes", "eval_epsilon", "returns", "mean", "std")}
             for e in (json.loads(p.read_text()) for p in sorted((run_dir / "evaluations").glob("*.json")))]
    return {"final_evaluation": final, "evaluated_again": again,
            "last_step": records[-1]["global_step"] if records else 0, "last_wall_s": clock[-1][1] if clock else None,
            "evaluations": evaluations, "training_episodes": episodes, "losses_every_100_updates": losses[::10]}


def figure(data: dict, path: Path, title: str) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True, help="the results' file name, without extension")
    parser.add_argument("--command", default="", help="the command that trains the run (recorded)")
    parser.add_argument("--machine", default="", help="the machine it trains on (recorded)")
    parser.add_argument("--segments", nargs="*", default=[], help="STEP:WALL of processes that logged no wall time")
    options = parser.parse_args()
    if not (options.run_dir / "metrics.jsonl").is_file():
        sys.exit(f"error: {options.run_dir} has no metrics.jsonl")
    segments = sorted((int(s.split(":")[0]), float(s.split(":")[1])) for s in options.segments)
    config = options.run_dir / "config.yaml"
    settings = yaml.safe_load(config.read_text()) if config.is_file() else {}
    data = {"command": options.command, "machine": options.machine, "run": options.run_dir.name,
            "env": settings.get("env"), "seed": settings.get("seed"), **curve(options.run_dir, segments)}
    out = ROOT / "benchmarks" / "results"
    (out / f"{options.name}.json").write_text(json.dumps(data, indent=1))
    best = max((e["eval/episodic_return"] for e in data["evaluations"]), default=None)
    hours = (data["last_wall_s"] or 0) / 3600
    figure(data, out / f"{options.name}.png", f"{options.run_dir.name}: {data['last_step']} agent steps, "
                                              f"{hours:.2f} h\n{options.machine}")
    print(f"{data['last_step']} agent steps, {hours:.2f} h, {len(data['evaluations'])} evaluations (best {best}), "
          f"{len(data['training_episodes'])} training episodes -> {out / options.name}.json, .png")


if __name__ == "__main__":
    main()
