"""run.py tune: the search space file and its one-line errors, trials x seeds as pack members, the objective over
seeds, a trial equal to its run alone, and a tune stopped by a signal and continued equal to one never stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import run
from launcher import halving, tune
from launcher.jobs import last_global_step
from launcher.sweeps import packable_keys
from tests.test_resume import assert_same, outcome

ROOT = Path(run.__file__).resolve().parent
TINY = {"algo": "dqn", "env": "CartPole-v1", "total_timesteps": 1500, "learning_starts": 500, "buffer_size": 2000,
        "batch_size": 32, "train_frequency": 4, "gradient_steps": 1, "target_network_frequency": 100,
        "eval_frequency": 0, "eval_episodes": 2, "threads": 1, "cuda": False}
SPACE = {"learning_rate": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
         "gamma": {"type": "float", "low": 0.9, "high": 0.999},
         "loss": {"type": "choice", "choices": ["mse", "huber"]}}


def write_yaml(path: Path, values: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values))
    return path


def tune_process(*args: str | Path, cwd: Path) -> subprocess.Popen:
    """run.py tune as a user starts it (the environment, PYTHONPATH included, as the test's)."""
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), "tune", *map(str, args)], cwd=cwd,
                            env={**os.environ, "WANDB_MODE": "offline"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen, code: int = 0) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == code, out
    return out


def study_trials(tune_dir: Path) -> list[tuple[int, str, dict, float | None]]:
    optuna = tune.optuna_module()
    study = optuna.load_study(study_name=tune_dir.name, storage=f"sqlite:///{tune_dir / 'study.db'}")
    return [(t.number, t.state.name, t.params, t.value) for t in study.get_trials()]


# ---------------------------------------------------------------- the space file, packing, the objective

def test_every_error_of_a_space_file_is_one_line_naming_the_file_the_key_and_what_is_wrong(tmp_path):
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY)
    closest = "(closest: learning_rate, learning_starts)"
    cases = [
        ({"learning_rte": SPACE["learning_rate"]}, f"learning_rte: dqn.py has no such setting {closest}"),
        ({"seed": {"type": "int", "low": 1, "high": 3}}, "seed: run.py tune sets seed itself"),
        ({"gamma": {"type": "float", "low": 0.99, "high": 0.9}}, "gamma: low 0.99 must be below high 0.9"),
        ({"gamma": {"type": "float", "low": 0.9, "high": 0.9}}, "gamma: low 0.9 must be below high 0.9"),
        ({"learning_rate": {"type": "float", "low": 0, "high": 1e-3, "log": True}},
         "learning_rate: log needs low > 0, got 0"),
        ({"gamma": {"type": "floot", "low": 0.9, "high": 0.99}}, "gamma: give a mapping with type: float, int or"),
        ({"gamma": 0.9}, "gamma: give a mapping with type"),
        ({"gamma": {"type": "float", "low": "a", "high": 0.99}}, "gamma: low must be a number, got 'a'"),
        ({"batch_size": {"type": "int", "low": 16.5, "high": 64}}, "batch_size: low must be an int, got 16.5"),
        ({"batch_size": {"type": "float", "low": 16, "high": 64}},
         "batch_size: batch_size is an int, so type: float cannot"),
        ({"gamma": {"type": "float", "low": 0.9, "high": 0.99, "choices": [1]}}, "gamma: a float takes high, log"),
        ({"loss": {"type": "choice", "choices": ["mse", "hubber"]}}, "loss: the choice 'hubber' is not one of 'mse'"),
        ({"loss": {"type": "choice", "choices": "mse"}}, "loss: choices must be a list of values, got 'mse'"),
        ({"batch_size": {"type": "int", "low": 16, "high": 64, "step": 0}},
         "batch_size: step must be a positive int, got 0"),
        ({}, "must map settings to what to try"),
    ]
    for space, message in cases:
        path = write_yaml(tmp_path / "space.yaml", space)
        with pytest.raises(SystemExit, match="^" + re.escape(f"error: space {path}: {message}")):
            run.main(["tune", str(config), "--space", str(path), "--trials", "2", "--runs-dir", str(tmp_path / "runs")])
    (tmp_path / "bad.yaml").write_text("gamma: [")
    with pytest.raises(SystemExit, match=f"^error: space {tmp_path / 'bad.yaml'}: cannot read it: "):
        run.main(["tune", str(config), "--space", str(tmp_path / "bad.yaml"), "--trials", "2"])
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), "tune", str(config), "--space",
                             str(tmp_path / "space.yaml"), "--trials", "2"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 1 and result.stderr == f"error: space {tmp_path / 'space.yaml'}: must map settings " \
        "to what to try, e.g. learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n"


REFUSED = {  # case: (the config's values beyond TINY, the space beyond SPACE, more arguments, the line)
    "halving a round too small": ({}, {}, ["--rungs", "3", "--round", "2"],
                                  "--round 2 is too small for --rungs 3 with --eta 2: a round needs 4 trials or more"),
    "halving too few trials": ({}, {}, ["--rungs", "4", "--trials", "4"],
                               "--trials 4 is too few for --rungs 4 with --eta 2: halving needs 8 trials or more"),
    "seed below 0": ({}, {}, ["--seeds", "2", "-1"], "--seeds -1: a seed must be from 0 to 2**32 - 1"),
    "sampler seed below 0": ({}, {}, ["--sampler-seed", "-1"], "--sampler-seed must be >= 0, got -1"),
    "sampler seed above NumPy's": ({}, {}, ["--sampler", "qmc", "--sampler-seed", str(2**32)],
                                   f"--sampler-seed {2**32}: QMCSampler cannot take it"),
    "halving atari packs": ({"env": "PongNoFrameskip-v4"}, {}, ["--rungs", "2", "--num-seeds", "2"],
                            "successive halving cuts packs, and a pack of Atari games cannot be cut"),
    "int log and step": ({}, {"batch_size": {"type": "int", "low": 100, "high": 1000, "log": True, "step": 100}}, [],
                         "batch_size: an int takes log or step, not both"),
    "set stop_step": ({}, {}, ["--set", "stop_step=500"], "--set stop_step=...: run.py tune sets stop_step itself"),
    "set members": ({}, {}, ["--set", "members=a"], "--set members=...: run.py tune sets members itself"),
    "set resume": ({}, {}, ["--set", "resume=runs/x"], "--set resume=...: run.py sets resume itself"),
    "set evaluate": ({}, {}, ["--set", "evaluate=runs/x"], "--set evaluate=...: run.py tune sets evaluate itself"),
    "config stop_step": ({"stop_step": 500}, {}, [], "sets stop_step, which run.py tune sets itself"),
    "space total_timesteps": ({}, {"total_timesteps": {"type": "int", "low": 1000, "high": 2000}}, [],
                              "total_timesteps: every trial trains the same budget"),
    "space stop_return": ({}, {"stop_return": {"type": "float", "low": 100, "high": 200}}, [],
                          "stop_return: it stops a run early"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_tune_it_could_not_finish_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch,
                                                                                      case):
    """What a tune would accept and then fail on after training (or halve nothing while announcing halving) is
    refused up front in one line naming what is wrong (the file and the key for the space and the config); no tune
    directory is written."""
    values, keys, more, message = REFUSED[case]
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY | values)
    space = write_yaml(tmp_path / "space.yaml", SPACE | keys)
    where = f"space {space}: " if keys else f"config {config} " if values and "env" not in values else ""

    def trains(*_):
        raise AssertionError("the tune went on to train")

    monkeypatch.setattr(tune, "LocalJobs", trains)
    with pytest.raises(SystemExit, match="^" + re.escape(f"error: {where}{message}")):
        run.main(["tune", str(config), "--space", str(space), "--trials", "8", "--seeds", "1", *more, "--runs-dir",
                  str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()


def test_halving_asks_rounds_big_enough_to_halve(tmp_path, monkeypatch):
    """--rungs 3 with one trial a process and one process at a time: a round is 4 trials (not --jobs x 1), so each
    rung keeps half the trials."""
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)
    jobs = ScriptedJobs(tmp_path / "runs", 1500, lambda trial, step: float(trial))
    assert scripted_tune(tmp_path, monkeypatch, jobs, str(config), "--space", str(space), "--trials", "4", "--seeds",
                         "1", "--rungs", "3", "--sampler", "random") == 0
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    assert json.loads((tune_dir / "tune.json").read_text())["round"] == 4
    assert sorted(state for _, state, _, _ in study_trials(tune_dir)) == ["COMPLETE"] + ["PRUNED"] * 3


def test_every_round_of_halving_holds_enough_trials_to_halve_the_last_and_an_extension_included(tmp_path, monkeypatch,
                                                                                                 capsys):
    """--rungs 3 (rounds of 4 or more): 6 trials in rounds of 4 would leave a last round of 2, so the 6 are one round
    (and it says so). Continued with --trials 8, 2 more trials would be a round of 2: refused in one line, nothing
    asked; with --trials 10, a round of 4. Every rung of every round keeps fewer trials than it had."""
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)

    def value(trial: int, step: int) -> float:
        return float(trial % 3)

    assert scripted_tune(tmp_path, monkeypatch, ScriptedJobs(tmp_path / "runs", 1500, value), str(config), "--space",
                         str(space), "--trials", "6", "--seeds", "1", "--rungs", "3", "--sampler", "random") == 0
    said = capsys.readouterr().out
    assert "trials 0-5 are one round: after a round of 4, the 2 left would be too few to halve" in said, said
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    asked = (tune_dir / "tune.json").read_text(), study_trials(tune_dir)
    with pytest.raises(SystemExit, match="^" + re.escape(
            "error: --trials 8: the tune has asked 6 trials, and a round of the 2 more would be too small for "
            "--rungs 3 with --eta 2: a round needs 4 trials or more; give --trials 10 or more")):
        scripted_tune(tmp_path, monkeypatch, ScriptedJobs(tmp_path / "runs", 1500, value), "--resume", str(tune_dir),
                      "--trials", "8")
    assert ((tune_dir / "tune.json").read_text(), study_trials(tune_dir)) == asked
    assert scripted_tune(tmp_path, monkeypatch, ScriptedJobs(tmp_path / "runs", 1500, value), "--resume",
                         str(tune_dir), "--trials", "10") == 0
    rounds = json.loads((tune_dir / "rounds.json").read_text())
    assert {first: len(entry["asked"]["trials"]) for first, entry in rounds.items()} == {"0": 6, "6": 4}
    for entry in rounds.values():
        assert [len(rung["kept"]) < len(rung["alive"]) for rung in entry["rungs"]] == [True, True], entry["rungs"]
    assert len(study_trials(tune_dir)) == 10


def test_the_spaces_in_configs_are_valid_and_a_sampler_is_found_by_name(tmp_path):
    for algo in ("dqn", "per_dqn", "nstep_dqn", "ddpg"):
        script = ROOT / "algos" / f"{algo}.py"
        paths = sorted((ROOT / "configs" / algo / "spaces").glob("*.yaml"))  # the default and the narrower ones
        assert ROOT / "configs" / algo / "spaces" / "default.yaml" in paths
        for path in paths:
            space = tune.space_from(path, tune.args_class(script), {})
            assert set(space) <= packable_keys(script), path  # they pack: no setting splits the trials
    assert type(tune.sampler_named("random", 1)).__name__ == "RandomSampler"
    assert type(tune.sampler_named("TPESampler", 1)).__name__ == "TPESampler"
    with pytest.raises(SystemExit, match="^error: --sampler tpee: Optuna has no such sampler"):
        tune.sampler_named("tpee", 1)
    with pytest.raises(SystemExit, match="^error: --sampler GridSampler: it needs more than a seed"):
        tune.sampler_named("GridSampler", 1)


def test_a_tune_without_optuna_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY)
    with pytest.raises(SystemExit, match=r'^error: run.py tune needs Optuna: pip install -e "\.\[tune\]"'):
        run.main(["tune", str(config), "--trials", "2", "--runs-dir", str(tmp_path / "runs")])


def test_the_objective_rewards_settings_that_hold_on_every_seed():
    steady, lucky = [480.0, 470.0, 490.0], [500.0, 500.0, 460.0]
    assert tune.objective(steady, "mean") < tune.objective(lucky, "mean")  # the mean prefers one lucky seed ...
    for how in ("mean-std", "min"):  # ... these do not
        assert tune.objective(steady, how) > tune.objective(lucky, how)
    assert tune.objective(steady, "mean-std") == pytest.approx(480 - 10) and tune.objective(steady, "min") == 470


def test_trials_x_seeds_are_packed_by_their_settings_that_cannot_be_packed(tmp_path):
    """Trials 0-2 on seeds 1 2 in packs of at most 4: trials 0 and 2 share batch_size (not packable), so their runs
    share packs; trial 1's are a pack of their own. Each member's values go through --pack where the members differ,
    as flags where they agree, and each run's directory names its trial and seed."""
    trials = [(0, {"learning_rate": 1e-3, "batch_size": 32}), (1, {"learning_rate": 3e-4, "batch_size": 64}),
              (2, {"learning_rate": 0.1 + 0.2, "batch_size": 32})]
    packs = tune.trial_packs(trials, [1, 2], 4, {"learning_rate"})
    assert [[(m["trial"], m["seed"]) for m in pack] for pack in packs] == [[(0, 1), (0, 2), (2, 1), (2, 2)],
                                                                          [(1, 1), (1, 2)]]
    jobs = tune.trial_jobs(packs, "CartPole-v1", "dqn", "t__1", tmp_path, ["--env", "CartPole-v1"])
    names = [f"CartPole-v1__dqn__trial={t}__{s}__t__1" for t, s in ((0, 1), (0, 2), (2, 1), (2, 2))]
    assert jobs[0].names == names
    assert jobs[0].argv == ["--pack", "seed=1,2,1,2", "learning_rate=0.001,0.001,0.30000000000000004,"
                            "0.30000000000000004", f"run_name={','.join(names)}", "--env", "CartPole-v1",
                            "--batch-size", "32"]
    assert jobs[1].argv[-4:] == ["--learning-rate", "0.0003", "--batch-size", "64"]
    one = tune.trial_jobs(tune.trial_packs(trials[:1], [5], 4, set()), "CartPole-v1", "dqn", "t__1", tmp_path, [])
    assert one[0].argv == ["--seed", "5", "--learning-rate", "0.001", "--batch-size", "32", "--run-name",
                           "CartPole-v1__dqn__trial=0__5__t__1"]


def test_a_setting_that_may_be_null_is_written_as_the_script_reads_it_and_never_packed_with_values(tmp_path):
    """ddpg's td_lambda may be null: trials with it null and trials with a value go to packs of their own (the script
    refuses a pack that mixes them), and each pack's arguments give every member the value its trial asked."""
    import torch

    from harness.members import carried, members
    from tests.algo_utils import load_algo, parse

    script, ddpg = ROOT / "algos" / "ddpg.py", load_algo("ddpg")
    trials = [(0, {"td_lambda": None, "tau": 0.005}), (1, {"td_lambda": 0.9, "tau": 0.01}),
              (2, {"td_lambda": None, "tau": 0.02}), (3, {"td_lambda": 0.8, "tau": 0.005}),
              (4, {"td_lambda": None, "tau": 0.005})]
    packs = tune.trial_packs(trials, [1], 2, packable_keys(script))
    assert [[m["trial"] for m in pack] for pack in packs] == [[0, 2], [4], [1, 3]]
    jobs = tune.trial_jobs(packs, "Pendulum-v1", "ddpg", "t__1", tmp_path, [])
    for job, pack in zip(jobs, packs, strict=True):
        args = parse(ddpg, job.argv)
        runs = members(args)
        assert [(run.td_lambda, run.tau) for run in runs] == [(m["td_lambda"], m["tau"]) for m in pack], job.argv
        carried(args, runs, torch.device("cpu"))  # what the file refuses in a pack, it refuses here


def test_the_trials_figure_is_a_grid_naming_a_choice_by_its_values_with_the_settings_importances():
    """Five settings: a grid of at most 3 panels a row (not one row 3240 pixels wide); a choice's axis names its
    values (mse, huber; null, 0.9), not 0.0-1.0; a panel of Optuna's importances names every setting."""
    optuna = tune.optuna_module()
    space = SPACE | {"td_lambda": {"type": "choice", "choices": [None, 0.9]},
                     "batch_size": {"type": "int", "low": 16, "high": 64}}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for value in range(8):
        study.tell(study.ask(tune.distributions(space)), float(value))
    trials = study.get_trials()
    fig = tune.trials_figure(trials, {t.number: [t.value - 1, t.value + 1] for t in trials}, "mean-std", space)
    width, height = fig.get_size_inches() * 120
    assert width <= 3 * 4.5 * 120 and height >= 2 * 3.5 * 120
    fig.canvas.draw()
    by_label = {ax.get_xlabel(): ax for ax in fig.axes}
    assert [t.get_text() for t in by_label["loss"].get_xticklabels()] == ["mse", "huber"]
    assert [t.get_text() for t in by_label["td_lambda"].get_xticklabels()] == ["null", "0.9"]
    [importances] = [ax for ax in fig.axes if ax.get_title().startswith("importance")]
    assert {t.get_text() for t in importances.get_yticklabels()} == set(space)


# ---------------------------------------------------------------- tunes of the real script

@pytest.mark.slow
def test_a_trial_equals_its_run_alone_and_the_best_config_reruns_it(tmp_path):
    """Two trials x seeds 1 2 in one pack of 4 (the trials differ in packable settings): the best trial's seed-2 member
    ends as `python algos/dqn.py --config best.yaml --seed 2` alone, bit for bit (model.pt, evaluation, metrics)."""
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)
    out = finished(tune_process(config, "--space", space, "--trials", "2", "--seeds", "1", "2", "--num-seeds", "4",
                                "--sampler", "random", cwd=tmp_path))
    assert "round of trials 0-1: 4 run(s) in 1 process(es)" in out, out
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    trials = study_trials(tune_dir)
    assert [state for _, state, _, _ in trials] == ["COMPLETE"] * 2 and trials[0][2] != trials[1][2]
    best = max(trials, key=lambda t: t[3])
    assert yaml.safe_load((tune_dir / "best.yaml").read_text()) == TINY | best[2]
    subprocess.run([sys.executable, str(ROOT / "algos" / "dqn.py"), "--config", str(tune_dir / "best.yaml"), "--seed",
                    "2", "--run-name", "alone"], cwd=tmp_path, check=True, capture_output=True)
    [member] = (tmp_path / "runs").glob(f"CartPole-v1__dqn__trial={best[0]}__2__*")
    assert_same(outcome(member), outcome(tmp_path / "runs" / "alone"), episodes=2)
    assert (tune_dir / "trials.png").is_file()
    assert f"| {best[0]} | {best[3]:.1f} |" in (tune_dir / "trials.md").read_text()


@pytest.mark.slow
def test_a_tune_stopped_by_a_signal_and_continued_equals_one_never_stopped(tmp_path):
    """4 trials in rounds of 2 (TPE), seeds 1 2, packs of 4, each run 3000 steps: one tune left alone; one stopped by
    SIGTERM in its second round's training and continued with --resume, its stopped pack from its checkpoint. Both end
    with the same trials (settings) and the same values."""
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY | {"total_timesteps": 3000})
    space = write_yaml(tmp_path / "space.yaml", SPACE)
    argv = [config, "--space", space, "--trials", "4", "--seeds", "1", "2", "--num-seeds", "4", "--round", "2"]
    alone = tune_process(*argv, "--runs-dir", tmp_path / "alone", cwd=tmp_path)
    stopped = tune_process(*argv, "--runs-dir", tmp_path / "stopped", cwd=tmp_path)
    deadline = time.time() + 300
    while not any((last_global_step(path) or 0) >= 1000
                  for path in (tmp_path / "stopped").glob("*__trial=2__1__*/metrics.jsonl")):
        assert stopped.poll() is None and time.time() < deadline, "the second round never trained"
        time.sleep(0.1)
    stopped.send_signal(signal.SIGTERM)
    out = finished(stopped, 130)
    [tune_dir] = (tmp_path / "stopped").glob("tiny__tune__*")
    assert f"continue: python run.py tune --resume {tune_dir}" in out
    assert [state for _, state, _, _ in study_trials(tune_dir)] == ["COMPLETE"] * 2 + ["RUNNING"] * 2
    again = finished(tune_process("--resume", tune_dir, cwd=tmp_path))
    assert "resume [1/1]" in again, again  # the stopped pack went on from its checkpoint
    finished(alone)
    [alone_dir] = (tmp_path / "alone").glob("tiny__tune__*")
    assert study_trials(tune_dir) == study_trials(alone_dir)
    assert [state for _, state, _, _ in study_trials(tune_dir)] == ["COMPLETE"] * 4


# ---------------------------------------------------------------- successive halving's rungs

@pytest.mark.slow
def test_a_pack_paused_at_a_rung_and_resumed_equals_the_pack_never_paused(tmp_path):
    """Two trials (learning rates) on seed 1, one pack, 3000 steps: paused by --stop-step 1500 (a rung: evaluated,
    checkpointed, summary.json interrupted with the rung's evaluation), then --resume'd; each member ends as the same
    pack never paused, bit for bit (model.pt, final evaluation, metrics), its schedules the 3000 steps' throughout."""
    script = ROOT / "algos" / "dqn.py"
    argv = ["--config", str(write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY)), "--total-timesteps", "3000",
            "--eval-frequency", "1500", "--pack", "learning_rate=1e-3,3e-4", "seed=1,1"]

    def trained(*more: str) -> str:
        done = subprocess.run([sys.executable, str(script), *more], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    trained(*argv, "--run-name", "alone__{learning_rate}")
    assert "paused at step 1500 (--stop-step)" in trained(*argv, "--run-name", "rung__{learning_rate}",
                                                         "--stop-step", "1500")
    rung = json.loads((tmp_path / "runs" / "rung__3e-4" / "summary.json").read_text())
    assert rung["global_step"] == 1500 and rung["interrupted"] and len(rung["eval_returns"]) == 2
    trained("--resume", "runs/rung__1e-3")
    for rate in ("1e-3", "3e-4"):
        assert_same(outcome(tmp_path / "runs" / f"rung__{rate}"), outcome(tmp_path / "runs" / f"alone__{rate}"),
                    episodes=2)


def test_rungs_end_at_fractions_of_the_budget_and_the_best_trials_go_on():
    assert halving.rung_steps(100_000, 4, 2) == [12_500, 25_000, 50_000, 100_000]
    assert halving.rung_steps(50_000, 1, 2) == [50_000]
    assert halving.rung_steps(90_000, 3, 3) == [10_000, 30_000, 90_000]
    with pytest.raises(SystemExit, match=r"^error: --rungs 3 with --eta 2 cuts a budget of 2 steps into rungs of "
                                         r"\[0, 1, 2\]: use fewer rungs$"):
        halving.rung_steps(2, 3, 2)
    with pytest.raises(SystemExit, match="^error: --rungs must be >= 1 and --eta >= 2, got 2 and 1$"):
        halving.rung_steps(1000, 2, 1)
    values = {0: 10.0, 1: 30.0, 2: 30.0, 3: -5.0, 4: 20.0}
    assert halving.kept(values, 2) == [1, 2, 4]  # ceil(5 / 2) = 3, best first
    assert halving.kept(values, 3) == [1, 2]  # a tie at the cut: the earlier trial
    assert halving.kept({7: 1.0}, 2) == [7]


@pytest.mark.slow
def test_halving_continues_the_best_trials_as_smaller_packs_each_equal_to_its_run_alone(tmp_path):
    """4 trials x seeds 1 2 (random sampler) in one pack of 8, 6000 steps, rungs at 1500, 3000 and 6000 (--rungs 3
    --eta 2): 2 trials pruned at 1500, 1 at 3000, 1 trained to the end in a pack of its 2 members cut from the pack
    of 4 that was cut from the pack of 8. Each of its members ends as `python algos/dqn.py --config best.yaml --seed S`
    alone, never stopped, bit for bit (model.pt, final evaluation, metrics: the rungs' evaluations fall on the
    config's own, eval_frequency 1500). A second tune, stopped by SIGTERM in its last rung and continued with
    --resume, ends with the same study."""
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY | {"total_timesteps": 6000, "eval_frequency": 1500})
    space = write_yaml(tmp_path / "space.yaml", SPACE)
    argv = [config, "--space", space, "--trials", "4", "--seeds", "1", "2", "--num-seeds", "8", "--rungs", "3",
            "--sampler", "random"]
    alone = tune_process(*argv, "--runs-dir", tmp_path / "alone", cwd=tmp_path)
    stopped = tune_process(*argv, "--runs-dir", tmp_path / "stopped", cwd=tmp_path)
    deadline = time.time() + 300
    while not any((last_global_step(path) or 0) >= 3500 for path in (tmp_path / "stopped").glob("*/metrics.jsonl")):
        assert stopped.poll() is None and time.time() < deadline, "the last rung never trained"
        time.sleep(0.1)
    stopped.send_signal(signal.SIGTERM)
    finished(stopped, 130)
    [tune_dir] = (tmp_path / "stopped").glob("tiny__tune__*")
    again = finished(tune_process("--resume", tune_dir, cwd=tmp_path))
    assert "resume [1/1]" in again, again
    out = finished(alone)
    assert "rung 1/3 at step 1500: 2 of 4 trials go on" in out and "rung 2/3 at step 3000: 1 of 2 trials go on" in out
    assert re.search(r"round of trials 0-3, rung 3/3 \(to step 6000\): 2 run\(s\) in 1 process\(es\)", out), out
    [alone_dir] = (tmp_path / "alone").glob("tiny__tune__*")
    trials = study_trials(alone_dir)
    assert study_trials(tune_dir) == trials
    assert sorted(state for _, state, _, _ in trials) == ["COMPLETE"] + ["PRUNED"] * 3
    [(best, _, params, value)] = [t for t in trials if t[1] == "COMPLETE"]
    assert f"| {best} | {value:.1f} |" in (alone_dir / "trials.md").read_text()
    assert "pruned at step 1500" in (alone_dir / "trials.md").read_text()
    for seed in (1, 2):
        subprocess.run([sys.executable, str(ROOT / "algos" / "dqn.py"), "--config", str(alone_dir / "best.yaml"),
                        "--seed", str(seed), "--run-name", f"alone{seed}"], cwd=tmp_path, check=True,
                       capture_output=True)
        [member] = (tmp_path / "alone").glob(f"CartPole-v1__dqn__trial={best}__{seed}__*")
        assert_same(outcome(member), outcome(tmp_path / "runs" / f"alone{seed}"), episodes=2)


# ---------------------------------------------------------------- a tune's record: failures, stops and kills

class ScriptedJobs:
    """Jobs that do at once what the script would leave behind (summary.json, a pack's checkpoint.pt): a run's
    evaluation return at a step is `value(trial, step)`; `outcome(job, step)` may say a job fails ("fail") or is
    stopped by a signal ("stop") instead. Every job's arguments are kept, to check how each pack went on."""

    grace_s = 0.0

    def __init__(self, runs_dir: Path, total: int, value, outcome=lambda job, step: "ok"):
        self.runs_dir, self.total, self.value, self.outcome, self.argvs = runs_dir, total, value, outcome, []

    def start(self, job) -> None:
        import torch

        argv, self.argvs = job.argv, [*self.argvs, job.argv]
        step = int(argv[argv.index("--stop-step") + 1]) if "--stop-step" in argv else self.total
        if argv[0] == "--resume":  # the pack it goes on from holds every member, saved before this rung, and the
            # job names every directory of that pack (a Ray task is shipped those)
            held = torch.load(self.runs_dir / argv[1].removeprefix("runs/") / "checkpoint.pt", weights_only=True)
            assert set(job.names) <= set(held["dirs"]) and held["counts"][0] < step, (argv, held)
            assert set(held["dirs"]) <= set(job.shipped), (job.shipped, held)
        job.handle = self.outcome(job, step)
        if job.handle == "fail":
            return
        for name, member in zip(job.names, job.members, strict=True):
            value = self.value(member["trial"], step)
            (self.runs_dir / name).mkdir(parents=True, exist_ok=True)
            summary = {"global_step": step, "eval_returns": [value], "eval_return_mean": value,
                       "interrupted": step < self.total}
            if job.handle != "stop":
                (self.runs_dir / name / "summary.json").write_text(json.dumps(summary))
        if job.handle != "stop":
            torch.save({"dirs": job.names, "counts": [step]}, self.runs_dir / job.names[0] / "checkpoint.pt")

    def returncode(self, job) -> int | None:
        if job.handle == "stop":
            job.handle = "stopping"
            raise KeyboardInterrupt  # as Ctrl-C reaches the launcher while the job trains
        return {"fail": 1, "stopping": 130}.get(job.handle, 0)

    def interrupt(self, job) -> None:
        pass

    def kill(self, job) -> None:
        pass

    def close(self) -> None:
        pass


def scripted_tune(tmp_path: Path, monkeypatch, jobs: ScriptedJobs, *argv: str) -> int:
    import types

    monkeypatch.setattr(tune, "LocalJobs", lambda *_: jobs)
    monkeypatch.setattr("launcher.jobs.time", types.SimpleNamespace(time=time.time, sleep=lambda _: None))  # no waits
    return run.main(["tune", *argv, "--runs-dir", str(tmp_path / "runs")])


def test_a_halving_tune_whose_process_failed_then_stopped_continues_from_its_recorded_decisions(tmp_path,
                                                                                                monkeypatch):
    """4 trials, one process each, rungs at 1000, 2000 and 4000 steps: trials 1 and 2 go on from the first rung. At
    the second, trial 1's process fails; the tune is stopped while trial 2 trains to the end. Continued, the first
    rung's decision is the one taken (not taken again over trials 0, 2 and 3, which would revive the pruned trial 0):
    trial 2 goes on from its checkpoint to the end, 0 and 3 stay pruned, 1 failed."""
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY | {"total_timesteps": 4000})
    space = write_yaml(tmp_path / "space.yaml", SPACE)
    rung_one = {0: 10.0, 1: 30.0, 2: 20.0, 3: 5.0}

    def value(trial: int, step: int) -> float:
        return rung_one[trial] + step / 1000

    def outcome(job, step: int) -> str:
        trial = job.members[0]["trial"]
        return {(1, 2000): "fail", (2, 4000): "stop"}.get((trial, step), "ok")

    argv = [str(config), "--space", str(space), "--trials", "4", "--seeds", "1", "--round", "4", "--rungs", "3",
            "--sampler", "random"]
    assert scripted_tune(tmp_path, monkeypatch, ScriptedJobs(tmp_path / "runs", 4000, value, outcome), *argv) == 130
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    assert [state for _, state, _, _ in study_trials(tune_dir)] == ["PRUNED", "FAIL", "RUNNING", "PRUNED"]
    jobs = ScriptedJobs(tmp_path / "runs", 4000, value)
    assert scripted_tune(tmp_path, monkeypatch, jobs, "--resume", str(tune_dir)) == 0
    trials = study_trials(tune_dir)
    assert [state for _, state, _, _ in trials] == ["PRUNED", "FAIL", "COMPLETE", "PRUNED"]
    assert trials[2][3] == value(2, 4000)
    assert jobs.argvs == [["--resume", f"runs/CartPole-v1__dqn__trial=2__1__{tune_dir.name}"]]
    rounds = json.loads((tune_dir / "rounds.json").read_text())
    assert rounds["0"]["rungs"][0] == {"step": 1000, "alive": [0, 1, 2, 3], "kept": [1, 2],
                                       "values": {str(n): v + 1 for n, v in rung_one.items()}}
    assert rounds["0"]["rungs"][1] == {"step": 2000, "alive": [1, 2], "kept": [2], "values": {"2": value(2, 2000)}}


def killed_with_its_jobs(proc: subprocess.Popen) -> None:
    """SIGKILL to a process and every process under it at once, as a machine that loses power: nothing saves."""
    def children(pid: int) -> list[int]:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with __import__("contextlib").suppress(OSError, IndexError, ValueError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(stat.parent.name))
        return found

    frozen, todo = [], [proc.pid]
    while todo:  # frozen first, so that none starts another process while the tree is read
        pid = todo.pop()
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
            todo.extend(children(pid))
    for pid in frozen:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.mark.slow
def test_a_halving_tune_killed_at_random_moments_continues_to_the_trials_and_values_of_one_never_stopped(tmp_path):
    """4 trials on seed 1 in packs of 2 (rounds of 2), 3000 steps, rungs at 1500 and 3000: one tune left alone; one
    killed with SIGKILL, jobs and all, at three random moments (each after a share of the time the whole tune takes),
    each time continued with --resume. Both end with the same trials, states and values."""
    import random

    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY | {"total_timesteps": 3000, "eval_frequency": 1500})
    space = write_yaml(tmp_path / "space.yaml", SPACE)
    argv = [config, "--space", space, "--trials", "4", "--seeds", "1", "--num-seeds", "2", "--rungs", "2"]
    start = time.time()
    finished(tune_process(*argv, "--runs-dir", tmp_path / "alone", cwd=tmp_path))
    took = time.time() - start
    [alone_dir] = (tmp_path / "alone").glob("tiny__tune__*")
    moments = random.Random(59).sample(range(5, 35), 3)  # percent of the time the tune takes alone, from each start
    proc = tune_process(*argv, "--runs-dir", tmp_path / "killed", cwd=tmp_path)
    for percent in moments:
        time.sleep(took * percent / 100)
        assert proc.poll() is None, "the tune ended before it was killed: " + proc.communicate()[0]
        killed_with_its_jobs(proc)
        begun = [path.parent for path in (tmp_path / "killed").glob("tiny__tune__*/tune.json")]
        proc = tune_process("--resume", begun[0], cwd=tmp_path) if begun else \
            tune_process(*argv, "--runs-dir", tmp_path / "killed", cwd=tmp_path)  # killed before it began: again
    finished(proc)
    [tune_dir] = [path.parent for path in (tmp_path / "killed").glob("tiny__tune__*/tune.json")]
    assert study_trials(tune_dir) == study_trials(alone_dir)
    assert sorted(state for _, state, _, _ in study_trials(alone_dir)) == ["COMPLETE"] * 2 + ["PRUNED"] * 2


def test_a_tune_killed_while_a_round_enters_the_study_continues_to_the_trials_of_one_never_stopped(tmp_path,
                                                                                                  monkeypatch):
    """Rounds of 2 trials (TPE): a tune killed between the two trials of its second round entering the study, then
    continued, asks and scores the same 4 trials as one never stopped (no round cut short, none asked again)."""
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)
    argv = [str(config), "--space", str(space), "--trials", "4", "--seeds", "1", "--round", "2"]

    def value(trial: int, step: int) -> float:
        return float(trial % 3)

    assert scripted_tune(tmp_path / "alone", monkeypatch, ScriptedJobs(tmp_path / "alone" / "runs", 1500, value),
                         *argv) == 0

    class Killed(BaseException):
        pass

    optuna, created = tune.optuna_module(), []
    create_new_trial = optuna.storages.RDBStorage._create_new_trial  # each trial entering the study, in one write

    def killed_at_the_fourth(self, *args, **kwargs):
        created.append(1)
        if len(created) == 4:
            raise Killed
        return create_new_trial(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(optuna.storages.RDBStorage, "_create_new_trial", killed_at_the_fourth)
        with pytest.raises(Killed):
            scripted_tune(tmp_path, monkeypatch, ScriptedJobs(tmp_path / "runs", 1500, value), *argv)
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    assert len(study_trials(tune_dir)) == 3
    assert scripted_tune(tmp_path, monkeypatch, ScriptedJobs(tmp_path / "runs", 1500, value),
                         "--resume", str(tune_dir)) == 0
    [alone_dir] = (tmp_path / "alone" / "runs").glob("tiny__tune__*")
    assert study_trials(tune_dir) == study_trials(alone_dir)


@pytest.mark.slow
def test_halving_on_ray_ships_each_task_the_pack_it_is_cut_from(tmp_path, monkeypatch):
    """Two trials in one pack on a local Ray, --rungs 2: the second rung's task resumes the kept trial's member from
    the pack's checkpoint, which needs the pack's every directory beside it; the trial ends as on this machine."""
    ray = pytest.importorskip("ray")
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)
    argv = [str(config), "--space", str(space), "--trials", "2", "--seeds", "1", "--num-seeds", "2", "--rungs", "2",
            "--sampler", "random"]
    monkeypatch.chdir(tmp_path)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert run.main(["tune", *argv, "--ray", "local", "--runs-dir", str(tmp_path / "ray")]) == 0
    finally:
        ray.shutdown()
    assert run.main(["tune", *argv, "--runs-dir", str(tmp_path / "here")]) == 0
    [on_ray], [here] = (tmp_path / "ray").glob("tiny__tune__*"), (tmp_path / "here").glob("tiny__tune__*")
    assert study_trials(on_ray) == study_trials(here)
    assert sorted(state for _, state, _, _ in study_trials(here)) == ["COMPLETE", "PRUNED"]


@pytest.mark.slow
def test_halving_on_ray_without_model_files_sends_back_the_networks_of_the_trials_it_prunes(tmp_path, monkeypatch):
    """4 trials in one pack on a local Ray, --rungs 3, save_model off: with learning_starts past the second rung no
    trial learns before it, so every rung ties and keeps the earliest trials (0 1, then 0): the second rung's task
    cuts the pack to trials 0 and 1 from the checkpoint in trial 0's directory, writing the networks of trials 2 and
    3 to their model.pt before it writes the smaller pack's checkpoint over it. On the head, each pruned trial then
    evaluates with the networks of the rung it was pruned at, and plays that rung's evaluation again."""
    ray = pytest.importorskip("ray")
    config = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY | {"total_timesteps": 2000, "learning_starts": 1100,
                                                                "save_model": False})
    space = write_yaml(tmp_path / "space.yaml", SPACE)
    monkeypatch.chdir(tmp_path)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert run.main(["tune", str(config), "--space", str(space), "--trials", "4", "--seeds", "1", "--num-seeds",
                         "4", "--rungs", "3", "--sampler", "random", "--ray", "local"]) == 0
    finally:
        ray.shutdown()
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    rungs = json.loads((tune_dir / "rounds.json").read_text())["0"]["rungs"]
    assert [rung["kept"] for rung in rungs] == [[0, 1], [0]]  # the premise: trial 0's directory holds the pack
    for rung in rungs:
        for trial in set(rung["alive"]) - set(rung["kept"]):
            [run_dir] = (tmp_path / "runs").glob(f"CartPole-v1__dqn__trial={trial}__1__*")
            subprocess.run([sys.executable, str(ROOT / "algos" / "dqn.py"), "--evaluate", f"runs/{run_dir.name}"],
                           cwd=tmp_path, check=True, capture_output=True)
            [record] = [json.loads(path.read_text()) for path in (run_dir / "evaluations").glob("*.json")]
            assert record["global_step"] == rung["step"], (trial, record)
            assert record["mean"] == json.loads((run_dir / "summary.json").read_text())["eval_return_mean"]


def test_a_qmc_tune_asks_in_rounds_the_sequence_one_sampler_asks(tmp_path, monkeypatch):
    """QMC in rounds of 2 trials: the 6 trials are the ones a single QMCSampler asks of one study, 2 at a time (each
    round goes on along one sequence, not the start of a new one)."""
    optuna = tune.optuna_module()
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)
    jobs = ScriptedJobs(tmp_path / "runs", 1500, lambda trial, step: float(trial))
    assert scripted_tune(tmp_path, monkeypatch, jobs, str(config), "--space", str(space), "--trials", "6", "--seeds",
                         "1", "--round", "2", "--sampler", "qmc", "--sampler-seed", "7") == 0
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    one = optuna.create_study(direction="maximize", sampler=optuna.samplers.QMCSampler(seed=7))
    for _ in range(3):
        asked = [one.ask(tune.distributions(tune.space_from(space, tune.args_class(ROOT / "algos" / "dqn.py"), {})))
                 for _ in range(2)]
        for trial in asked:
            one.tell(trial, float(trial.number))
    assert [params for _, _, params, _ in study_trials(tune_dir)] == [t.params for t in one.get_trials()]


def test_a_tune_continued_with_another_value_of_what_it_was_asked_is_refused_in_one_line(tmp_path, monkeypatch):
    """--resume with --objective, --seeds, --space, --rungs, --eta (...) other than the tune's, or with --trials or
    --jobs below 1: one line, nothing run or written; given again with the same values, the tune goes on, the values
    compared as what they name (the sampler by its class name or short name, the space and --set's values as read
    from YAML, however written)."""
    config, space = write_yaml(tmp_path / "dqn" / "tiny.yaml", TINY), write_yaml(tmp_path / "space.yaml", SPACE)
    jobs = ScriptedJobs(tmp_path / "runs", 1500, lambda trial, step: float(trial))
    assert scripted_tune(tmp_path, monkeypatch, jobs, str(config), "--space", str(space), "--trials", "2", "--seeds",
                         "1", "2", "--sampler", "random", "--set", "cuda=false") == 0
    [tune_dir] = (tmp_path / "runs").glob("tiny__tune__*")
    other = write_yaml(tmp_path / "other.yaml", {"gamma": SPACE["gamma"]})
    for option, asked in ((["--objective", "min"], "mean-std"), (["--seeds", "1", "3"], "1 2"),
                          (["--space", str(other)], str(space)), (["--rungs", "2"], "1"), (["--eta", "3"], "2"),
                          (["--num-seeds", "2"], "1"), (["--sampler", "tpe"], "random"),
                          (["--set", "cuda=true"], "cuda=false"), (["--set", "cuda=false", "threads=1"], "cuda=false")):
        with pytest.raises(SystemExit, match="^" + re.escape(f"error: {option[0]} {' '.join(option[1:])}: the tune in "
                                                             f"{tune_dir} was asked with {asked}, and --resume")):
            run.main(["tune", "--resume", str(tune_dir), *option])
    for option, value in (("--trials", "0"), ("--trials", "-2"), ("--jobs", "0"), ("--jobs", "-1")):
        with pytest.raises(SystemExit, match="^" + re.escape(f"error: {option} must be >= 1, got {value}")):
            run.main(["tune", "--resume", str(tune_dir), option, value])
    assert json.loads((tune_dir / "tune.json").read_text())["trials"] == 2
    same_space = tmp_path / "same.yaml"  # the space, written otherwise
    same_space.write_text("# the tune's space\n" + yaml.safe_dump(dict(reversed(SPACE.items())), sort_keys=False,
                                                                  default_flow_style=True))
    jobs = ScriptedJobs(tmp_path / "runs", 1500, lambda trial, step: float(trial))
    assert scripted_tune(tmp_path, monkeypatch, jobs, "--resume", str(tune_dir), "--trials", "3", "--seeds", "1", "2",
                         "--space", str(same_space), "--objective", "mean-std", "--sampler", "RandomSampler", "--set",
                         "cuda=False") == 0
    assert len(study_trials(tune_dir)) == 3
