"""Runs that lose nothing: --resume continues the run in the directory it is given (a copy, another working
directory), a signal during an evaluation leaves it due for the resumed run, extending a run keeps every schedule
continuous, a resumed W&B run holds each step once, and the small guards of the run machinery (negative
frequencies, DDPG slices longer than the batch, the CNN only for uint8 images, synced files, train_sps).

Each run here is `main` in this process on CartPole or Pendulum, stopped by a real SIGTERM that
a spy sends to this process, and resumed through `parse_args(["--resume", ...])` as the command line does."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

import harness.run
from buffers import PrioritizedReplayBuffer
from tests.algo_utils import load_algo, parse, tiny_args

ALGOS = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn", "ddpg")}
DQNS = ["dqn", "per_dqn", "nstep_dqn"]


pytestmark = pytest.mark.usefixtures("main_in_tmp_path")  # see conftest.py


def args_for(name: str, **changes):
    env = "Pendulum-v1" if name == "ddpg" else "CartPole-v1"  # the probes number their instances per process
    return tiny_args(ALGOS[name], **{"env": env, "eval_episodes": 3, "save_model": True, **changes})


def resume(name: str, run_dir: Path | str, *more: str) -> dict:
    algo = ALGOS[name]
    return algo.main(parse(algo, ["--resume", str(run_dir), *more]))


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock SPS records."""
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if "charts/SPS" not in r]


def model(run_dir: Path) -> dict:
    state = torch.load(run_dir / "model.pt", weights_only=True)
    return {f"{k}.{j}": w for k, v in state.items() for j, w in (v.items() if isinstance(v, dict) else [("", v)])}


def assert_same_run(a: Path, b: Path) -> None:
    assert records(a) == records(b)
    ma, mb = model(a), model(b)
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert sa["eval_returns"] == sb["eval_returns"] and len(sa["eval_returns"]) == 3 and not sb["interrupted"]


def hashes(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def sigterm_at_evaluation(monkeypatch, calls: set[int]) -> list[int]:
    """Make the evaluations numbered in `calls` (from 1) receive a SIGTERM as they start; returns the call count."""
    count = [0]
    evaluate = harness.run.evaluate

    def spy(*args, **kwargs):
        count[0] += 1
        if count[0] in calls:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the run: the evaluation stops at its first step
            time.sleep(0.01)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(harness.run, "evaluate", spy)
    return count


# ---- the run directory ------------------------------------------------------------------------------------


def test_resuming_a_copy_continues_the_copy_and_leaves_the_original_alone(tmp_path):
    """`cp -r runs/r1 runs/r1copy`, then --resume runs/r1copy with more steps: the copy goes on (its config.yaml
    names it), the original's files are byte for byte what they were. Fails if the run directory comes from the
    checkpoint's run_name."""
    ALGOS["dqn"].main(args_for("dqn", run_name="r1", total_timesteps=300, checkpoint_frequency=300, anneal_lr=False))
    original = tmp_path / "runs" / "r1"
    before = hashes(original)
    shutil.copytree(original, tmp_path / "runs" / "r1copy")
    summary = resume("dqn", "runs/r1copy", "--total-timesteps", "500")
    assert hashes(original) == before
    copy = tmp_path / "runs" / "r1copy"
    assert summary["global_step"] == 500 and summary["run_name"] == "r1copy"
    assert "run_name: r1copy" in (copy / "config.yaml").read_text()
    assert records(copy)[-1]["global_step"] == 500 and records(copy)[: len(records(original))] == records(original)


def test_resuming_from_another_working_directory_writes_only_there(tmp_path, monkeypatch):
    """A run under /elsewhere/runs/r1 resumed from another working directory continues in /elsewhere/runs/r1 and
    writes nothing into ./runs. Fails if the directory is ./runs/<run_name>."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    ALGOS["dqn"].main(args_for("dqn", run_name="r1", total_timesteps=300, checkpoint_frequency=300, anneal_lr=False))
    run = tmp_path / "elsewhere" / "runs" / "r1"
    length = len(records(run))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    summary = resume("dqn", run, "--total-timesteps", "500")
    assert summary["global_step"] == 500 and not (tmp_path / "work" / "runs").exists()
    metrics = (run / "metrics.jsonl").read_bytes()
    assert b"\0" not in metrics and len(records(run)) > length and records(run)[-1]["global_step"] == 500


# ---- signals during evaluations ---------------------------------------------------------------------------


@pytest.mark.slow  # several whole runs
@pytest.mark.parametrize("name", list(ALGOS))
@pytest.mark.parametrize("interrupted", [{2}, {2, 4}, {4}], ids=["periodic", "periodic-twice", "last"])
def test_a_sigterm_during_an_evaluation_leaves_it_due_for_the_resumed_run(monkeypatch, tmp_path, name, interrupted):
    """SIGTERM as the 2nd periodic evaluation starts (and again as the resumed run's 2nd starts), or as the last one
    starts (at step 400, also the final one): each resumed run runs the interrupted evaluation first, and the last
    ends with the same metrics records (SPS aside), model.pt and final evaluation as the run left alone. Fails if
    the evaluation a signal cut short is lost (the old behaviour: evaluations at steps [100, 300, 400] instead of
    [100, 200, 300, 400])."""
    algo = ALGOS[name]
    changes = dict(total_timesteps=400, eval_frequency=100, learning_starts=50)
    algo.main(args_for(name, run_name="alone", **changes))
    sigterm_at_evaluation(monkeypatch, interrupted)
    summary = algo.main(args_for(name, run_name="stopped", **changes))
    assert summary["interrupted"] and summary["eval_returns"] == []
    while summary["interrupted"]:
        summary = resume(name, tmp_path / "runs" / "stopped")
    alone, stopped = tmp_path / "runs" / "alone", tmp_path / "runs" / "stopped"
    assert [r["global_step"] for r in records(alone) if "eval/episodic_return" in r] == [100, 200, 300, 400]
    assert_same_run(alone, stopped)


@pytest.mark.slow  # several whole runs
@pytest.mark.parametrize("name", ["dqn", "ddpg"])
def test_stop_return_acts_the_same_across_a_resume(monkeypatch, tmp_path, name):
    """--stop-return below any return: the run stops at its first evaluation. Cut short by SIGTERM, that evaluation
    runs on resume and stops the run at the same step, with the same records. Fails if the resumed run skips it and
    trains on."""
    algo = ALGOS[name]
    changes = dict(total_timesteps=400, eval_frequency=100, learning_starts=50, stop_return=-1e9)
    alone = algo.main(args_for(name, run_name="alone", **changes))
    sigterm_at_evaluation(monkeypatch, {1})
    algo.main(args_for(name, run_name="stopped", **changes))
    resumed = resume(name, tmp_path / "runs" / "stopped")
    assert alone["global_step"] == resumed["global_step"] == 100
    assert_same_run(tmp_path / "runs" / "alone", tmp_path / "runs" / "stopped")


# ---- extending a run ---------------------------------------------------------------------------------------


def schedule_spies(monkeypatch, name: str) -> list[SimpleNamespace]:
    """Per gradient step: the learning rate Adam used, the epsilon of that loop step (DQN) and PER's beta."""
    seen, algo = [], ALGOS[name]
    step, sample = torch.optim.Adam.step, PrioritizedReplayBuffer.sample
    epsilons = []

    def step_spy(self, *args, **kwargs):
        seen.append(SimpleNamespace(lr=float(self.param_groups[0]["lr"]), epsilon=epsilons[-1] if epsilons else None,
                                    beta=betas[-1] if betas else None))
        return step(self, *args, **kwargs)

    betas = []

    def sample_spy(self, batch_size):
        betas.append(self.beta)
        return sample(self, batch_size)

    if name != "ddpg":
        epsilon_at = algo.epsilon_at
        monkeypatch.setattr(algo, "epsilon_at", lambda s, a: epsilons.append(epsilon_at(s, a)) or epsilons[-1])
    monkeypatch.setattr(torch.optim.Adam, "step", step_spy)
    monkeypatch.setattr(PrioritizedReplayBuffer, "sample", sample_spy)
    return seen


@pytest.mark.slow  # several whole runs
@pytest.mark.parametrize("name", DQNS)
@pytest.mark.parametrize("stop_at", [300, 600], ids=["mid-run", "finished"])
def test_extending_a_run_continues_every_schedule_without_a_jump(monkeypatch, tmp_path, name, stop_at):
    """A run of 600 steps (epsilon to end_e over its first 360 steps, the learning rate annealed to 0, beta to 1)
    stopped at step 300 (or finished), then resumed with --total-timesteps 1800. One update per step, so each step's
    values are seen: the annealed learning rate and beta go on from their values at the resume step along straight
    lines to 0 and 1 at step 1800; epsilon reaches end_e at step 360 as before, and stays. Fails if a schedule
    is recomputed from the new total (epsilon back up, the learning rate up to a third of its start, beta down)."""
    algo = ALGOS[name]
    seen = schedule_spies(monkeypatch, name)
    changes = dict(total_timesteps=600, learning_starts=100, train_frequency=1, exploration_fraction=0.6,
                   start_e=1.0, end_e=0.1, learning_rate=1e-3, anneal_lr=True, checkpoint_frequency=600, beta_start=0.2)
    record = algo.TransitionRecorder.record
    if stop_at < 600:
        count = [0]

        def stop(self, *args):  # SIGTERM while the loop step that reaches `stop_at` runs
            count[0] += 1
            if count[0] == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return record(self, *args)

        monkeypatch.setattr(algo.TransitionRecorder, "record", stop)
    first = algo.main(args_for(name, run_name="r", **changes))
    assert first["global_step"] == stop_at
    before = len(seen)
    monkeypatch.setattr(algo.TransitionRecorder, "record", record)
    if stop_at == 600:  # its learning rate reached 0: training on would not learn, so it is refused
        files = hashes(tmp_path / "runs" / "r")
        with pytest.raises(SystemExit, match="annealed its learning rate to 0 at step 600"):
            resume(name, tmp_path / "runs" / "r", "--total-timesteps", "1800")
        assert hashes(tmp_path / "runs" / "r") == files
        # the same run without annealing extends
        changes["anneal_lr"] = False
        seen.clear()
        algo.main(args_for(name, run_name="r2", **changes))
        before = len(seen)
        resume(name, tmp_path / "runs" / "r2", "--total-timesteps", "1800")
        lr = np.array([s.lr for s in seen])
        assert len(lr) == 1700 and np.allclose(lr, 1e-3, rtol=1e-6)
        return
    resume(name, tmp_path / "runs" / "r", "--total-timesteps", "1800")
    steps = np.arange(101, 1801)  # the step counter at each update, one update per step after learning_starts
    assert len(seen) == len(steps)
    lr = np.array([s.lr for s in seen])
    epsilon = np.array([s.epsilon for s in seen])

    def line(at: np.ndarray, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
        return y0 + (at - x0) * (y1 - y0) / (x1 - x0)

    # Up to the resume step, the original run's schedules; after it, the continuation to the new end.
    old, new = steps <= stop_at, steps > stop_at
    np.testing.assert_allclose(lr[old], 1e-3 * (1 - steps[old] / 600), rtol=1e-5, atol=1e-12)
    lr_at_stop = 1e-3 * (1 - stop_at / 600)
    np.testing.assert_allclose(lr[new], line(steps[new], stop_at, lr_at_stop, 1800, 0.0), rtol=1e-5, atol=1e-12)
    # epsilon is read at the step before the env step (the counter then), 1 -> 0.1 over 360 steps
    np.testing.assert_allclose(epsilon, np.maximum(0.1, 1.0 - 0.9 * (steps - 1) / 360), rtol=1e-7, atol=1e-12)
    if name == "per_dqn":
        beta = np.array([s.beta for s in seen])
        np.testing.assert_allclose(beta[old], 0.2 + 0.8 * steps[old] / 600, rtol=1e-9)
        np.testing.assert_allclose(beta[new], line(steps[new], stop_at, 0.2 + 0.8 * stop_at / 600, 1800, 1.0),
                                   rtol=1e-9)
    assert before == int(old.sum())
    config = (tmp_path / "runs" / "r" / "config.yaml").read_text()
    assert f"schedule_start: {stop_at}" in config and "total_timesteps: 1800" in config


def test_a_total_below_the_step_reached_is_refused(tmp_path):
    ALGOS["dqn"].main(args_for("dqn", run_name="r", total_timesteps=300, checkpoint_frequency=300,
                                              anneal_lr=False))
    before = hashes(tmp_path / "runs" / "r")
    with pytest.raises(SystemExit, match="below the step the run reached, 300"):
        resume("dqn", "runs/r", "--total-timesteps", "200")
    assert hashes(tmp_path / "runs" / "r") == before


# ---- W&B ---------------------------------------------------------------------------------------------------


def wandb_history(run_dir: Path) -> dict[str, list[list[dict]]]:
    """Every history record in a run directory's offline W&B files, per W&B run id, one list per file (a resumed
    run adds a file), each record as a dict of its items (`_step`, `global_step`, the tags). Read from the files
    themselves: LevelDB-style log records (32 KiB blocks, 7-byte headers) of wandb's protobuf Records, after a
    7-byte file header. A run record that asks W&B to rewind or fork a run (a branch point: W&B's run rewind, a
    preview feature) fails the test."""
    import struct

    from wandb.proto import wandb_internal_pb2

    found: dict[str, list[list[dict]]] = {}
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, chunks, history = path.read_bytes(), 7, b"", []
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
            if left < 7 or length == kind == 0:  # the zero padding at a block's end
                pos += left
                continue
            chunks, pos = chunks + data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(chunks)
                chunks = b""
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                if record.WhichOneof("record_type") == "history" and "_step" in items:
                    history.append({key: json.loads(value) for key, value in items.items()
                                    if not key.startswith("_") or key == "_step"})
                if record.WhichOneof("record_type") == "run":
                    assert not record.run.HasField("branch_point"), record.run.branch_point
        found.setdefault(path.stem.removeprefix("run-"), []).append(history)
    return found


def wandb_files(run_dir: Path, last_step: int) -> list[list[dict]]:
    """The two offline files of the run's one W&B run, once the second one's history reaches `last_step` (wandb-core
    may write the last records a moment after finish(); up to a minute)."""
    deadline = time.monotonic() + 60
    while True:
        runs = wandb_history(run_dir)
        files = next(iter(runs.values())) if len(runs) == 1 else []
        if (len(files) == 2 and files[1] and files[1][-1]["global_step"] == last_step) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(runs) == 1 and len(files) == 2, runs  # one W&B run, written by two processes
    return files


def wandb_offline(monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB__SERVICE_WAIT", "300")  # a loaded CI machine can be slow to start wandb-core


def without_times(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in ("_step", "charts/SPS")} for record in history]


@pytest.mark.slow  # W&B's service starts twice
def test_a_resumed_wandb_run_continues_with_each_record_once(monkeypatch, tmp_path):
    """--track, SIGTERM at step 250 (after the last checkpoint, at 200), --resume: offline, with the real wandb,
    the resumed W&B run has the first run's id, W&B's step is the record's line in metrics.jsonl, and the resumed
    run's records start after the last one the first run sent (between steps 200 and 250), so the run's history
    (both offline files) holds each record of metrics.jsonl once, in order, and ends at the final step. Fails if the
    resumed run starts a new W&B run, sends the records between the checkpoint and the stop again, or needs W&B's
    run rewind (resume_from)."""
    wandb_offline(monkeypatch)
    count = [0]
    record = ALGOS["dqn"].TransitionRecorder.record

    def stop(self, *args):
        count[0] += 1
        if count[0] == 250:
            os.kill(os.getpid(), signal.SIGTERM)
        return record(self, *args)

    monkeypatch.setattr(ALGOS["dqn"].TransitionRecorder, "record", stop)
    changes = dict(run_name="r", track=True, total_timesteps=400, checkpoint_frequency=200, eval_frequency=100)
    assert ALGOS["dqn"].main(args_for("dqn", **changes))["interrupted"]
    monkeypatch.setattr(ALGOS["dqn"].TransitionRecorder, "record", record)
    resume("dqn", tmp_path / "runs" / "r")
    first, second = wandb_files(tmp_path / "runs" / "r", 400)
    assert 200 < first[-1]["global_step"] <= 250 and second[0]["global_step"] >= first[-1]["global_step"]
    history = first + second
    assert [r["_step"] for r in history] == list(range(len(history)))  # each record once, in order
    logged = [json.loads(line) for line in (tmp_path / "runs" / "r" / "metrics.jsonl").open()]
    assert without_times(history) == without_times(logged)  # the records of metrics.jsonl


@pytest.mark.slow  # W&B's service starts twice
@pytest.mark.parametrize("total", [2000, 1000], ids=["periodic", "final"])
def test_an_evaluation_cut_short_by_a_signal_reaches_wandb_after_resume(monkeypatch, tmp_path, total):
    """A pack of 2 with --track, SIGTERM as the evaluation at step 1000 starts (a periodic one, of 2000 steps, or
    the final one), --resume: each seed's W&B history gets that evaluation's eval/episodic_return at step 1000,
    once, as metrics.jsonl does. Fails if the resumed run drops it for W&B because W&B already has a record at
    that step (the SPS record, written every 1000 steps before the evaluation)."""
    wandb_offline(monkeypatch)
    evaluate = harness.run.evaluate

    def stopped(*args, **kwargs):  # the signal lands as the evaluation starts: it is cut short, left due
        os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(harness.run, "evaluate", stopped)
    changes = dict(run_name="r", track=True, total_timesteps=total, eval_frequency=1000 if total > 1000 else 0,
                   num_seeds=2)
    assert all(s["interrupted"] for s in ALGOS["dqn"].main(args_for("dqn", **changes)))
    monkeypatch.setattr(harness.run, "evaluate", evaluate)
    resume("dqn", tmp_path / "runs" / "r__1")
    for seed in (1, 2):
        run = tmp_path / "runs" / f"r__{seed}"
        history = [r for file in wandb_files(run, total) for r in file]
        logged = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        evaluations = [r["global_step"] for r in history if "eval/episodic_return" in r]
        assert evaluations == [r["global_step"] for r in logged if "eval/episodic_return" in r] and 1000 in evaluations
        assert [r["_step"] for r in history] == list(range(len(logged)))


# ---- small guards ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALGOS))
@pytest.mark.parametrize("key", ["eval_frequency", "checkpoint_frequency"])
def test_negative_frequencies_are_refused_before_the_run_directory(tmp_path, name, key):
    with pytest.raises(SystemExit, match=f"--{key.replace('_', '-')} must be >= 0"):
        ALGOS[name].main(args_for(name, **{key: -5}))
    assert not (tmp_path / "runs").exists()


def test_ddpg_refuses_lambda_slices_longer_than_the_batch(tmp_path):
    with pytest.raises(SystemExit, match="--td-lambda-steps <= --batch-size, got 0.5, 1, 8 > 4"):
        ALGOS["ddpg"].main(args_for("ddpg", td_lambda=0.5, td_lambda_steps=8, batch_size=4))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", DQNS)
def test_the_cnn_is_for_uint8_images_only(name):
    """A rank-3 float observation (a feature map) is not divided by 255 and gets the MLP; uint8 stacks the CNN."""
    algo, actions = ALGOS[name], gym.spaces.Discrete(3)
    floats = algo.QNetwork(gym.spaces.Box(-1.0, 1.0, (2, 5, 5), np.float32), actions)
    pixels = algo.QNetwork(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), actions)
    assert not floats.image and not any(isinstance(m, torch.nn.Conv2d) for m in floats.modules())
    assert pixels.image and any(isinstance(m, torch.nn.Conv2d) for m in pixels.modules())
    assert floats(torch.randn(7, 2, 5, 5)).shape == (7, 3)


@pytest.mark.parametrize("name", list(ALGOS))
def test_checkpoints_are_synced_before_and_after_the_rename(monkeypatch, name):
    """The temporary file is fsynced before it is renamed into place and the directory after, so a node crash
    cannot leave an empty checkpoint.pt. Fails if either fsync is missing or out of order."""
    calls = []
    fsync, rename = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
                        or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("rename", str(Path(b).resolve()))) or rename(a, b))
    ALGOS[name].main(args_for(name, run_name="r", total_timesteps=200, checkpoint_frequency=200))
    run = str(Path("runs/r").resolve())
    renames = [i for i, c in enumerate(calls) if c[0] == "rename"]
    written = [calls[i][1].removeprefix(run + "/") for i in renames]
    # checkpoints at step 200 and after the final evaluation; config.yaml, model.pt and summary.json the same way
    assert written == ["config.yaml", "checkpoint.pt", "checkpoint.pt", "model.pt", "summary.json"]
    for i in renames:
        assert calls[i - 1] == ("fsync", calls[i][1] + ".tmp") and calls[i + 1] == ("fsync", run)


@pytest.mark.parametrize("name", ["dqn", "ddpg"])
def test_train_sps_counts_the_training_loop_only(monkeypatch, name):
    """A final evaluation that takes 1 s does not lower train_sps: it is the loop's steps over the loop's time.
    Fails if train_sps is measured to the end of the run (final evaluation and checkpoint included)."""
    algo = ALGOS[name]
    evaluate = harness.run.evaluate

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(harness.run, "evaluate", slow)
    summary = algo.main(args_for(name, total_timesteps=300, eval_frequency=0))
    # the loop took at most the wall time less the 1 s sleep: steps over it is at least steps over that
    assert summary["train_sps"] * (summary["wall_time_s"] - 1.0) >= summary["global_step"]


def test_a_resumed_runs_wall_time_counts_the_time_before_its_checkpoint(monkeypatch, tmp_path):
    """A run whose evaluations sleep 1 s each (three, to its checkpoint at step 300), resumed to step 400 without the
    sleep: its summary's wall time is the first process's time to the checkpoint plus the resumed process's. Fails
    if wall_time_s counts the resumed process alone (it takes well under the first one's 3 s)."""
    evaluate = harness.run.evaluate

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(harness.run, "evaluate", slow)
    first = ALGOS["dqn"].main(args_for("dqn", run_name="r", total_timesteps=300, checkpoint_frequency=300,
                                       eval_frequency=100, anneal_lr=False))
    assert first["wall_time_s"] >= 3.0
    monkeypatch.setattr(harness.run, "evaluate", evaluate)
    tick = time.time()
    resumed = resume("dqn", tmp_path / "runs" / "r", "--total-timesteps", "400")
    took = time.time() - tick
    assert took < first["wall_time_s"]  # else the resumed process alone could pass the test below
    # the checkpoint is written after the final evaluation, at most a model.pt and summary.json before `first`'s end
    assert first["wall_time_s"] - 0.5 <= resumed["wall_time_s"] <= first["wall_time_s"] + took
