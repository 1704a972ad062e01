"""benchmarks/atari_table.py on runs made up here: the curve it reads from a run directory (wall time, capped games,
the final evaluation), the sources' metrics and the final evaluations under its table; and atari_runs.yaml, the runs
it lists, each with its curve committed."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from benchmarks import atari_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def write_run(path: Path, records: list[dict], summary: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_a_curve_gives_each_evaluation_and_episode_its_wall_time_and_capped_games(tmp_path):
    """Wall time: the run's last clock reading at or before the step; capped games: logged only when any."""
    run = write_run(tmp_path / "run", [
        {"global_step": 1000, "charts/SPS": 100.0, "charts/wall_time_s": 10.0},
        {"global_step": 1500, "charts/episodic_return": 2.0, "charts/epsilon": 0.9},
        {"global_step": 2000, "charts/SPS": 100.0, "charts/wall_time_s": 20.0},
        {"global_step": 2000, "eval/episodic_return": 5.0},
        {"global_step": 2000, "eval/capped_episodes": 3},
        {"global_step": 2500, "charts/episodic_return": 4.0, "charts/epsilon": 0.8},
        {"global_step": 3000, "charts/SPS": 100.0, "charts/wall_time_s": 31.0},
        {"global_step": 3000, "eval/episodic_return": 6.0},
    ], summary={"eval_return_mean": 6.0, "eval_return_std": 1.5, "eval_returns": [6.0], "eval_capped": 0,
                "global_step": 3000, "wall_time_s": 31.0, "interrupted": False, "num_seeds": 1})
    (run / "evaluations").mkdir()
    (run / "evaluations" / "seed3.json").write_text(json.dumps({"seed": 3, "eval_episodes": 10, "eval_epsilon": 0.001,
                                                                 "returns": [7.0], "mean": 7.0, "std": 0.0,
                                                                 "capped": 1, "path": "ignored"}))
    data = atari_table.curve(run, ())
    assert data["evaluations"] == [
        {"global_step": 2000, "wall_s": 20.0, "eval/episodic_return": 5.0, "capped": 3},
        {"global_step": 3000, "wall_s": 31.0, "eval/episodic_return": 6.0, "capped": 0}]
    assert data["training_episodes"] == [
        {"global_step": 1500, "wall_s": 10.0, "episodic_return": 2.0, "epsilon": 0.9},
        {"global_step": 2500, "wall_s": 20.0, "episodic_return": 4.0, "epsilon": 0.8}]
    assert (data["last_step"], data["last_wall_s"]) == (3000, 31.0)
    assert data["final_evaluation"] == {"eval_return_mean": 6.0, "eval_return_std": 1.5, "eval_returns": [6.0],
                                        "eval_capped": 0, "global_step": 3000, "wall_time_s": 31.0,
                                        "interrupted": False}
    assert data["evaluated_again"] == [{"seed": 3, "eval_episodes": 10, "eval_epsilon": 0.001, "returns": [7.0],
                                        "mean": 7.0, "std": 0.0, "capped": 1}]


def test_a_process_that_logged_no_wall_time_gets_it_from_its_speed_and_segment(tmp_path):
    """Two processes of older code: the second started at step 2000 after 50 s; wall = segment's + steps / SPS."""
    run = write_run(tmp_path / "run", [
        {"global_step": 1000, "charts/SPS": 100.0},
        {"global_step": 1500, "charts/episodic_return": 1.0},
        {"global_step": 3000, "charts/SPS": 50.0},
        {"global_step": 3000, "eval/episodic_return": 2.0},
    ])
    data = atari_table.curve(run, ((0, 0.0), (2000, 50.0)))
    assert data["training_episodes"][0]["wall_s"] == 10.0  # 1000 / 100
    assert data["evaluations"][0]["wall_s"] == 70.0  # 50 + 1000 / 50
    assert data["final_evaluation"] == {}  # no summary.json: still training


def made_up(seed: int, episodes: list[tuple[int, float]], evaluations: list[tuple[int, float]], last_step: int,
            final: dict | None = None, settings: str = "preset") -> dict:
    return {"env": "BreakoutNoFrameskip-v4", "seed": seed, "run": f"Breakout__{seed}", "settings": settings,
            "machine": "2-vCPU AMD EPYC VM (avx512_bf16, no AMX), torch: bf16, 1 thread", "last_step": last_step,
            "training_episodes": [{"global_step": s, "wall_s": s / 100, "episodic_return": r} for s, r in episodes],
            "evaluations": [{"global_step": s, "wall_s": s / 100, "eval/episodic_return": r, "capped": 0}
                            for s, r in evaluations],
            "final_evaluation": final or {}}


def test_the_sources_metrics_take_the_episodes_that_ended_in_their_window():
    """Dopamine's: the episodes ended in the 250k agent steps up to the step, the step itself included; CleanRL's:
    those of the 50k before 1M. A window the run has not finished is empty."""
    episodes = [(100_000, 1.0), (250_000, 3.0), (250_001, 10.0), (500_000, 20.0), (949_999, 100.0),
                (950_001, 30.0), (1_000_000, 40.0)]
    data = made_up(1, episodes, [(250_000, 5.0), (500_000, 6.0), (1_000_000, 7.0)], 1_000_000)
    assert atari_table.training_mean(data, 0, 250_000) == 2.0
    assert atari_table.training_mean(data, 250_000, 500_000) == 15.0
    assert atari_table.training_mean(data, 950_000, 1_000_000) == 35.0
    row = atari_table.table([data]).splitlines()[2].split(" | ")
    assert row[4:7] == ["5.0", "6.0", "7.0"]  # our evaluations at 250k, 500k, 1M
    assert row[-2:] == [f"2.0 / 15.0 / {statistics.mean([100.0, 30.0, 40.0]):.1f}", "35.0 |"]
    short = made_up(2, episodes[:4], [(250_000, 5.0)], 600_000)
    assert atari_table.training_mean(short, 500_000, 750_000) is None
    row = atari_table.table([short]).splitlines()[2].split(" | ")
    assert row[4:7] == ["5.0", "-", "-"]
    assert row[-2:] == ["2.0 / 15.0 / -", "- |"]


def test_the_first_evaluation_at_the_goal_and_its_hours():
    data = made_up(1, [], [(250_000, 29.9), (500_000, 30.0), (750_000, 12.0)], 750_000)
    assert atari_table.first_at_goal(data, 30.0) == (500_000, 5000.0)
    assert "| 500k, 1.39 h (goal 30.0) | 12.0 (750k) |" in atari_table.table([data])
    assert "| not yet (goal 30.0) |" in atari_table.table([made_up(1, [], [(250_000, 29.9)], 250_000)])


def test_the_line_under_the_table_gives_the_seeds_that_ended_and_apart_those_paused():
    ended = {"eval_return_mean": 10.0, "global_step": 1_000_000, "interrupted": False}
    curves = [made_up(1, [(750_000, 99.0), (800_000, 300.0), (1_000_000, 500.0)], [], 1_000_000, ended),
              made_up(2, [(900_000, 600.0)], [], 1_000_000, {**ended, "eval_return_mean": 20.0}),
              made_up(3, [], [], 375_000, {"eval_return_mean": 4.7, "global_step": 375_000, "interrupted": True}),
              made_up(4, [], [], 200_000),  # still training: no final evaluation
              made_up(5, [], [], 1_000_000, {**ended, "eval_return_mean": 99.0}, settings="--buffer-size 100000")]
    lines = atari_table.table(curves).splitlines()
    assert ("- Breakout, preset: final evaluation 15.0 ± 7.1 over seeds 1, 2 (10.0, 20.0); Dopamine's metric at 1M "
            "500.0 ± 141.4 (400.0, 600.0); paused by --stop-step: seed 3 4.7 at 375k") in lines
    assert "- Breakout, --buffer-size 100000: final evaluation 99.0 over seeds 5 (99.0)" in lines


def test_every_listed_run_has_its_curve_committed_and_every_curve_is_listed():
    runs = atari_table.load_runs()
    for run in runs:
        data = json.loads((RESULTS / f"{run.name}.json").read_text())
        assert data["run"] == run.run_dir and data["machine"] == run.machine, run.name
        assert (RESULTS / f"{run.name}.png").is_file(), run.name
    curves = {p.stem for p in RESULTS.glob("*.json") if "training_episodes" in json.loads(p.read_text())}
    assert curves == {run.name for run in runs}


@pytest.mark.parametrize("entry, named", [
    ("{name: a, run_dir: A, settings: preset, cpu: arm, how: x}", "cpu 'arm'"),
    ("{name: a, run_dir: A, settings: preset, how: x}", "missing ['cpu']"),
    ("{name: a, run_dir: A, settings: preset, cpu: epyc, how: x, seed: 3}", "unknown ['seed']"),
])
def test_a_wrong_entry_of_the_run_list_is_named(tmp_path, entry, named):
    path, head = tmp_path / "runs.yaml", "cpus:\n  epyc: an EPYC\nruns:\n"
    ok = "  - {name: ok, run_dir: B, settings: preset, cpu: epyc, how: y}\n"
    path.write_text(f"{head}{ok}  - {entry}\n")
    with pytest.raises(ValueError, match=r"runs.yaml, run 2 \(a\): .*" + re.escape(named)):
        atari_table.load_runs(path)
    path.write_text(head + ok.replace("ok", "a") * 2)
    with pytest.raises(ValueError, match=r"a name given twice: \['a'\]"):
        atari_table.load_runs(path)


def test_the_pages_show_the_table_of_results_atari_md():
    """README.md and docs/atari.md carry the table and its final evaluations as atari_table.py last wrote them."""
    block = atari_table.pages_block((RESULTS / "atari.md").read_text().rstrip("\n"))
    assert block.startswith("| game | settings |") and "\n- " in block and "anchors" not in block
    for page in atari_table.PAGES:
        shown = page.read_text().split(atari_table.BLOCK[0] + "\n\n", 1)[1].split("\n\n" + atari_table.BLOCK[1], 1)[0]
        assert shown == block, f"{page.name}: its table is not results/atari.md's (python benchmarks/atari_table.py)"


def test_writing_the_pages_replaces_only_the_block(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    start, end = atari_table.BLOCK
    page.write_text(f"before\n\n{start}\nold table\n{end}\n\nafter\n")
    monkeypatch.setattr(atari_table, "PAGES", (page,))
    monkeypatch.setattr(atari_table, "ROOT", tmp_path)
    atari_table.write_pages("| rows |\n\n- finals\n\nPong anchors: none")
    assert page.read_text() == f"before\n\n{start}\n\n| rows |\n\n- finals\n\n{end}\n\nafter\n"
    page.write_text("no block\n")
    with pytest.raises(SystemExit, match="has no lines"):
        atari_table.write_pages("| rows |")
