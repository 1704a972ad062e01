"""Watch and evaluate a trained agent: `python algos/<algo>.py --evaluate RUN_DIR` loads the run's arguments and
networks (model.pt, else checkpoint.pt), evaluates, and leaves one record in RUN_DIR/evaluations/ and nothing
else changed; `run.py evaluate` does it for many runs and `run.py table` shows the latest beside training's."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.algo_utils import ROOT, load_algo, parse, tiny_args

ALGOS = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn", "ddpg")}


pytestmark = pytest.mark.usefixtures("main_in_tmp_path")  # see conftest.py


def trained(name: str, **changes) -> Path:
    """A tiny run of algos/<name>.py on CartPole (DDPG: Pendulum), 3 evaluation episodes; its directory."""
    env = "Pendulum-v1" if name == "ddpg" else "CartPole-v1"
    args = tiny_args(ALGOS[name], env=env, eval_episodes=3, run_name="r", **{"save_model": True, **changes})
    ALGOS[name].main(args)
    return Path("runs") / "r"


def evaluate(name: str, run_dir: Path, *more: str) -> dict:
    algo = ALGOS[name]
    return algo.main(parse(algo, ["--evaluate", str(run_dir), *more]))


def files(run_dir: Path) -> dict[str, str]:
    """Every file of the run directory but evaluations/, by content hash."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.relative_to(run_dir).parts[0] != "evaluations"}


@pytest.mark.slow  # processes, or a run per algorithm
@pytest.mark.parametrize("name", list(ALGOS))
@pytest.mark.parametrize("source", ["model.pt", "checkpoint.pt"])
def test_evaluating_with_the_runs_settings_repeats_its_final_evaluation(name, source):
    """With the run's own settings the evaluation is the training's final one again, episode for episode, from
    model.pt or, when the run saved no model, from the networks in checkpoint.pt. One record is added; no other
    file of the run changes. Fails if the networks are not loaded (a fresh network plays other episodes), or
    the evaluation uses other settings or seeds than the run's."""
    run = trained(name, save_model=source == "model.pt", checkpoint_frequency=400 if source == "checkpoint.pt" else 0)
    assert (run / "model.pt").exists() == (source == "model.pt")
    summary = json.loads((run / "summary.json").read_text())
    before = files(run)
    record = evaluate(name, run)
    assert files(run) == before
    [saved] = list((run / "evaluations").glob("*.json"))
    assert json.loads(saved.read_text()) == record
    assert record["networks"] == source and record["global_step"] == 400 and record["seed"] == 1
    assert record["returns"] == summary["eval_returns"] and len(record["returns"]) == 3


def test_the_same_seed_gives_the_same_returns_and_another_epsilon_other_ones():
    run = trained("dqn")
    first = evaluate("dqn", run, "--eval-episodes", "5", "--seed", "4")
    again = evaluate("dqn", run, "--eval-episodes", "5", "--seed", "4")
    assert first["returns"] == again["returns"] and len(first["returns"]) == 5 and first["time"] != again["time"]
    random = evaluate("dqn", run, "--eval-episodes", "5", "--seed", "4", "--eval-epsilon", "1.0")
    assert random["eval_epsilon"] == 1.0 and first["eval_epsilon"] == 0.0
    assert random["returns"] != first["returns"]
    assert len(list((run / "evaluations").glob("*.json"))) == 3


@pytest.mark.slow  # processes, or a run per algorithm
def test_a_run_of_another_algorithm_and_other_flags_are_refused(tmp_path):
    run = trained("dqn")
    before = files(run)
    for name, argv, message in [
        ("per_dqn", ["--evaluate", str(run)], "is a run of algos/dqn.py, not per_dqn.py"),
        ("ddpg", ["--evaluate", str(run)], "is a run of algos/dqn.py, not ddpg.py"),
        ("dqn", ["--evaluate", str(run), "--learning-rate", "0.1"], "--evaluate evaluates a run with its own settings"),
        ("dqn", ["--evaluate", str(tmp_path / "nothing")], "cannot read the run's arguments"),
    ]:
        out = subprocess.run([sys.executable, str(ROOT / "algos" / f"{name}.py"), *argv], capture_output=True,
                             text=True)
        assert out.returncode != 0 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert files(run) == before and not (run / "evaluations").exists()


def test_a_cartpole_video_of_the_reported_episode():
    """--capture-video: the first episode's video beside the record, its return in the name, one frame per state
    from the first to the terminal one (CartPole pays 1 a step)."""
    imageio = pytest.importorskip("imageio.v2")
    pytest.importorskip("pygame")
    record = evaluate("dqn", trained("dqn"), "--capture-video", "--eval-episodes", "2")
    video = Path("runs/r/evaluations") / record["video"]
    assert video.name.endswith(f"-episode-0-return-{record['returns'][0]:g}.mp4")
    frames = imageio.mimread(video)
    assert len(frames) == record["returns"][0] + 1 and frames[0].shape == (400, 600, 3)


@pytest.mark.slow
def test_an_atari_video_shows_the_game_in_colour():
    """A Pong run evaluated with --capture-video: the video is the game at the emulator's 210x160, in colour."""
    imageio = pytest.importorskip("imageio.v2")
    algo = ALGOS["dqn"]
    args = parse(algo, ["--env", "PongNoFrameskip-v4", "--total-timesteps", "200", "--learning-starts", "100",
                            "--buffer-size", "1000", "--eval-episodes", "1", "--eval-frequency", "0",
                            "--checkpoint-frequency", "0", "--threads", "1", "--no-cuda", "--run-name", "pong",
                            "--save-model"])
    algo.main(args)
    record = evaluate("dqn", Path("runs/pong"), "--capture-video")
    frames = np.stack(imageio.mimread(Path("runs/pong/evaluations") / record["video"], memtest=False))
    assert frames.shape[1:] == (210, 160, 3) and len(frames) > 100
    assert np.abs(frames[..., 0].astype(int) - frames[..., 2].astype(int)).mean() > 1  # not grayscale


def test_track_logs_the_evaluation_to_the_runs_wandb_run(monkeypatch):
    """--track: the record goes to the run's own W&B run (the id in its wandb/ folder), resumed."""
    import wandb

    run = trained("dqn")
    (run / "wandb" / "offline-run-20261201_000000-abc123").mkdir(parents=True)
    seen = {}

    class FakeRun:
        def log(self, values):
            seen["logged"] = values

        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kwargs: seen.update(kwargs) or FakeRun())
    record = evaluate("dqn", run, "--track")
    assert seen["id"] == "abc123" and seen["resume"] == "allow"
    assert seen["logged"]["evaluate/return_mean"] == record["mean"]


@pytest.mark.slow  # processes, or a run per algorithm
def test_run_py_evaluates_many_runs_and_the_table_shows_the_latest(tmp_path):
    for seed in (1, 2):
        ALGOS["dqn"].main(tiny_args(ALGOS["dqn"], env="CartPole-v1", seed=seed, eval_episodes=2,
                                    run_name=f"r{seed}", save_model=True))
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "evaluate", "runs", "--eval-episodes", "3"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| runs/")]
    assert len(rows) == 2 and all("(3 episodes)" in row for row in rows)
    table = subprocess.run([sys.executable, str(ROOT / "run.py"), "table", "runs"], capture_output=True, text=True,
                           cwd=tmp_path)
    assert "latest re-evaluation" in table.stdout and "(2) |" in table.stdout
