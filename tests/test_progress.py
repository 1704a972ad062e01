"""What a run prints while it trains (harness/progress.py): a line for each periodic evaluation with the values that
metrics.jsonl holds, and, where stderr is not a terminal (pytest's capture here, a batch job's log), a plain progress
line in place of the bar. dqn.py on CartPole, a few hundred steps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import harness.progress
from harness.progress import duration, evaluation_line
from tests.algo_utils import load_algo, tiny_args

dqn = load_algo("dqn")
pytestmark = pytest.mark.usefixtures("main_in_tmp_path")


def evaluations(run_dir: str) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    return [(r["global_step"], r["eval/episodic_return"]) for r in records if "eval/episodic_return" in r]


def test_each_periodic_evaluation_prints_its_line_with_the_logged_mean(capsys):
    """Evaluations every 100 steps of 400: a line for each, in order, with the mean that metrics.jsonl logged, then
    the final evaluation's own line last. Fails if periodic evaluations are silent or print other values."""
    summary = dqn.main(tiny_args(dqn, run_name="r", eval_frequency=100, eval_episodes=3))
    lines = capsys.readouterr().out.strip().splitlines()
    printed = [line for line in lines if line.startswith("evaluation at step")]
    logged = evaluations("runs/r")
    assert [step for step, _ in logged] == [100, 200, 300, 400]
    assert len(printed) == len(logged), lines
    for line, (step, mean) in zip(printed, logged, strict=True):
        assert line.startswith(f"evaluation at step {step:,}: {mean:.1f} ± ") and line.endswith(" over 3 episodes")
    assert lines[-1].startswith(f"final evaluation: {summary['eval_return_mean']:.1f} ±")


def test_a_packs_evaluation_line_gives_each_seeds_mean(capsys):
    """A pack of 3: the line gives the mean ± sample std of the seeds' means, each seed's beside, as each seed's
    metrics.jsonl logged them."""
    dqn.main(tiny_args(dqn, run_name="p", num_seeds=3, eval_frequency=200))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("evaluation at step")]
    seeds = [evaluations(f"runs/p__{seed}") for seed in (1, 2, 3)]
    assert len(printed) == 2
    for i, line in enumerate(printed):
        means = [seed[i][1] for seed in seeds]
        expected = (f"evaluation at step {seeds[0][i][0]:,}: {np.mean(means):.1f} ± {np.std(means, ddof=1):.1f} "
                    f"over 3 seeds ({', '.join(f'{m:.1f}' for m in means)})")
        assert line == expected


@pytest.mark.parametrize("every, lines", [(0.0, 2), (300.0, 0)])
def test_without_a_terminal_a_plain_progress_line_replaces_the_bar(capsys, monkeypatch, every, lines):
    """stderr is not a terminal under pytest, so no bar is drawn; with the interval at 0 s a line is printed at each
    1000 steps (2 in 2000), at the default 300 s none in a run of seconds."""
    monkeypatch.setattr(harness.progress, "PLAIN_EVERY_S", every)
    dqn.main(tiny_args(dqn, run_name="r", total_timesteps=2000, eval_frequency=0))
    out = capsys.readouterr()
    progress = [line for line in out.out.splitlines() if line.startswith("step ")]
    assert len(progress) == lines, out.out
    pattern = r"step (1,000|2,000) of 2,000 \((50|100)%\) \| \d+ steps/s \| recent return [\d.]+ \| about \d+ min of"
    assert all(re.fullmatch(pattern + " training left", line) for line in progress), progress
    assert "\r" not in out.err  # no bar redrawn into the log


def test_durations_read_in_minutes_then_hours():
    assert [duration(s) for s in (59, 600, 5399, 5400, 9000)] == ["1 min", "10 min", "90 min", "1.5 h", "2.5 h"]
    assert evaluation_line(25_000, [[1.0, 2.0, 3.0]]) == "evaluation at step 25,000: 2.0 ± 1.0 over 3 episodes"
