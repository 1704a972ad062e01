"""Packed sweeps (--pack KEY=V1,V2,...): the members of a pack differ in their settings, not only their seeds. A
member ends with the model.pt, metrics and evaluation returns of the same run alone, bit for bit on the CPU, for
every setting its file can pack; settings that change shapes or the loop's schedule are refused; run directories,
config.yaml and W&B name each member by its values; a packed sweep resumes bit for bit."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import torch
import yaml

import run
from harness.members import carried, members
from launcher.results import results_table
from launcher.resume import resumed_jobs
from launcher.sweeps import jobs_for, packable_keys
from tests.algo_utils import ROOT, load_algo, parse, tiny_args
from tests.test_resume import CASES, assert_same, finished, outcome, start, wait_for
from tests.test_resume import COMMON as RESUME_COMMON

# Every packable setting of each file, at a value other than the file's default (the lone run's) and not a power of
# two (0.5 rounds alike in formulas where 0.3 does not: a member's max_grad_norm of 0.5 hid a true division).
DQN = dict(learning_rate=3e-4, adam_eps=1e-5, gamma=0.9, tau=0.3, start_e=0.8, end_e=0.1, exploration_fraction=0.3,
           max_grad_norm=0.3, loss="mse")
CHANGED = {
    "dqn": DQN,
    "nstep_dqn": DQN,
    "per_dqn": DQN | dict(alpha=0.3, beta_start=0.7, prio_eps=1e-3),
    "ddpg": dict(learning_rate=3e-4, gamma=0.9, tau=0.02, exploration_noise=0.35, ou_theta=0.15),
    "ddpg_lambda": dict(td_lambda=0.95),
}
BASE = {"ddpg_lambda": dict(td_lambda=0.7, n_step=1, td_lambda_steps=4)}
COMMON = {name: dict(num_envs=2, total_timesteps=1200, eval_frequency=600, n_step=3, save_model=True)
          for name in ("dqn", "nstep_dqn", "per_dqn")}
COMMON["ddpg"] = dict(env="Pendulum-v1", num_envs=2, total_timesteps=800, eval_frequency=400, learning_starts=300,
                      n_step=3, save_model=True)


def pack_flags(values: list[dict]) -> tuple[str, ...]:
    """--pack's KEY=V1,V2,... for members with these values (repr: the float exactly)."""
    return tuple(f"{key}={','.join(repr(v[key]) for v in values)}" for key in values[0])


@pytest.mark.usefixtures("main_in_tmp_path")
@pytest.mark.parametrize("case", list(CHANGED))
def test_a_member_of_a_packed_sweep_trains_exactly_as_the_same_run_alone(case):
    """A pack of three: seed 1 at the file's values, seed 2 with every packable setting changed, seed 2 at the
    file's values. Member 2 (seed 2, changed) equals seed 2 alone with those values, bit for bit; member 3 (seed 2,
    unchanged) follows another trajectory; each config.yaml holds its member's own values."""
    name = case.removesuffix("_lambda")
    module = load_algo(name)
    common = COMMON[name] | BASE.get(case, {})
    default = {key: getattr(tiny_args(module, **common), key) for key in CHANGED[case]}
    members = [default | {"seed": 1}, CHANGED[case] | {"seed": 2}, default | {"seed": 2}]
    first = next(iter(CHANGED[case]))
    summaries = module.main(tiny_args(module, pack=pack_flags(members), run_name=f"pack__{{seed}}__{{{first}}}",
                                      **common))
    module.main(tiny_args(module, seed=2, run_name="alone", **(common | CHANGED[case])))
    dirs = [Path("runs") / s["run_name"] for s in summaries]
    assert [s["seed"] for s in summaries] == [1, 2, 2] and len(set(dirs)) == 3
    assert_same(outcome(dirs[1]), outcome(Path("runs/alone")), episodes=2)
    for directory, values in zip(dirs, members, strict=True):
        config = yaml.safe_load((directory / "config.yaml").read_text())
        assert {key: config[key] for key in values} == values and config["pack"] == []
    assert outcome(dirs[1])[2] != outcome(dirs[2])[2]  # the values, not only the seed, changed member 2's run


@pytest.mark.usefixtures("main_in_tmp_path")
@pytest.mark.parametrize("case, key", [(case, key) for case in CHANGED for key in CHANGED[case]],
                         ids=lambda x: x)
def test_each_packable_setting_of_a_member_trains_it_exactly_as_alone(case, key):
    """A pack of two seed-1 members, the file's values and one setting changed to a value that is not a power of two:
    the second member equals the same run alone, bit for bit, and differs from the first. Fails where the pack
    computes a member's value otherwise than the lone run computes its number (max_grad_norm divided as a tensor)."""
    value = CHANGED[case][key]
    assert not isinstance(value, float) or math.frexp(value)[0] != 0.5, "a power of two rounds alike too often"
    name = case.removesuffix("_lambda")
    module = load_algo(name)
    common = COMMON[name] | BASE.get(case, {})
    default = getattr(tiny_args(module, **common), key)
    module.main(tiny_args(module, pack=pack_flags([{key: default}, {key: value}]) + ("seed=1,1", "run_name=a,b"),
                          **common))
    module.main(tiny_args(module, run_name="alone", **(common | {key: value})))
    assert_same(outcome(Path("runs/b")), outcome(Path("runs/alone")), episodes=2)
    assert outcome(Path("runs/a"))[2] != outcome(Path("runs/b"))[2]


def test_a_setting_that_changes_shapes_or_the_schedule_is_refused_in_one_line(tmp_path, monkeypatch):
    module = load_algo("ddpg")
    monkeypatch.chdir(tmp_path)
    for key, values in (("batch_size", "16,32"), ("policy_frequency", "1,2"), ("n_step", "1,3")):
        with pytest.raises(SystemExit, match=f"^error: --pack {key}: {key} changes a tensor's shape or when the "
                                             "loop's events happen"):
            module.main(tiny_args(module, pack=(f"{key}={values}",)))
    with pytest.raises(SystemExit, match="^error: --pack td_lambda: the members of a pack must all have a value"):
        module.main(tiny_args(module, pack=("td_lambda=null,0.9",)))
    with pytest.raises(SystemExit, match="^error: --pack alhpa: there is no such setting"):
        module.main(tiny_args(module, pack=("alhpa=0,1",)))
    with pytest.raises(SystemExit, match="one value per member"):
        module.main(tiny_args(module, num_seeds=3, pack=("tau=0.1,0.2",)))
    assert not Path("runs").exists()


@pytest.mark.usefixtures("main_in_tmp_path")
def test_members_that_share_a_value_other_than_the_files_take_it():
    """--pack gamma=0.9,0.9 seed=2,3: member seed 2 equals seed 2 alone with gamma 0.9 (not the file's 0.99)."""
    module = load_algo("dqn")
    common = COMMON["dqn"]
    module.main(tiny_args(module, pack=("gamma=0.9,0.9", "seed=2,3"), run_name="pack__{seed}", **common))
    module.main(tiny_args(module, seed=2, gamma=0.9, run_name="alone", **common))
    assert_same(outcome(Path("runs/pack__2")), outcome(Path("runs/alone")), episodes=2)


def test_the_launcher_packs_a_sweep_of_packable_settings_and_splits_it_by_the_others(tmp_path):
    """alpha (packable) x batch_size (not) x seeds 1 2, --num-seeds 3: a pack per batch size, of at most 3 runs,
    each run with its own seed and alpha and the run directory it would have alone; a resumed launch keeps them."""
    args = run.launch_parser().parse_args(["c.yaml", "--seeds", "1", "2", "--sweep", "alpha=0,0.6", "--sweep",
                                           "batch_size=32,64", "--num-seeds", "3"])
    jobs = jobs_for(args, {"env": "CartPole-v1"}, "per_dqn", "c__7", tmp_path,
                    packable_keys(ROOT / "algos" / "per_dqn.py"))
    assert [len(job.names) for job in jobs] == [3, 1, 3, 1] and [job.values for job in jobs] == \
        [{"batch_size": "32"}] * 2 + [{"batch_size": "64"}] * 2
    names = [f"CartPole-v1__per_dqn__alpha={a}__batch_size=32__{s}__c__7" for a, s in (("0", 1), ("0", 2), ("0.6", 1))]
    assert jobs[0].names == names and jobs[1].names == [names[0].replace("0__", "0.6__", 1).replace("__1__", "__2__")]
    assert jobs[0].argv == ["--pack", "seed=1,2,1", "alpha=0,0,0.6", f"run_name={','.join(names)}", "--env",
                            "CartPole-v1", "--batch-size", "32"]
    assert [jobs[0].run_values(i) for i in range(3)] == [(1, {"batch_size": "32", "alpha": "0"}),
                                                         (2, {"batch_size": "32", "alpha": "0"}),
                                                         (1, {"batch_size": "32", "alpha": "0.6"})]
    record = {"launch_id": "c__7", "jobs": [{"run_name": job.run_name, "env": job.env, "seed": job.seed,
                                            "values": job.values, "argv": job.argv, "pack": job.pack,
                                            "members": job.members} for job in jobs]}
    assert [job.names for job in resumed_jobs(record, tmp_path / "runs")] == [job.names for job in jobs]
    assert packable_keys(ROOT / "algos" / "dqn.py") >= {"learning_rate", "gamma", "tau", "max_grad_norm"}
    assert not packable_keys(ROOT / "algos" / "dqn.py") & {"batch_size", "buffer_size", "train_frequency"}


def test_the_launcher_packs_runs_without_a_value_apart_from_runs_with_one(tmp_path):
    """ddpg's --sweep td_lambda=null,0.9 --seeds 1 2 3 --num-seeds 2: packs of the null runs and packs of the 0.9
    runs, each one ddpg.py takes (its members' arguments as the file reads them). Fails if the runs are packed in
    order whatever their values (seed 3 at null with seed 1 at 0.9, which ddpg.py refuses)."""
    args = run.launch_parser().parse_args(["c.yaml", "--seeds", "1", "2", "3", "--sweep", "td_lambda=null,0.9",
                                           "--num-seeds", "2"])
    jobs = jobs_for(args, {"env": "Pendulum-v1"}, "ddpg", "c__7", tmp_path,
                    packable_keys(ROOT / "algos" / "ddpg.py"))
    assert [[(m["td_lambda"], m["seed"]) for m in job.members] for job in jobs] == \
        [[("null", 1), ("null", 2)], [("null", 3)], [("0.9", 1), ("0.9", 2)], [("0.9", 3)]]
    ddpg = load_algo("ddpg")
    for job in jobs:
        script = parse(ddpg, job.argv)
        carried(script, members(script), torch.device("cpu"))  # what the file refuses, it refuses here


@pytest.mark.usefixtures("main_in_tmp_path")
def test_wandb_and_the_table_name_each_member_by_its_values(monkeypatch):
    """A pack of alpha 0 and 0.6 (seed 1 each): each W&B run is named by its run directory, which names its alpha,
    with its own alpha in its config; run.py table --by alpha has a row per alpha; --evaluate of the second member
    plays its final evaluation again."""
    import wandb

    started = []

    class FakeRun:
        id, summary = "x", {}

        def define_metric(self, *a, **k): ...

        def log(self, *a, **k): ...

        def finish(self): ...

    monkeypatch.setattr(wandb, "init", lambda **kwargs: started.append(kwargs) or FakeRun())
    module = load_algo("per_dqn")
    module.main(tiny_args(module, pack=("alpha=0,0.6", "seed=1,1"), run_name="sweep__alpha={alpha}__{seed}",
                          track=True))
    assert [(kw["name"], kw["config"]["alpha"], kw["config"]["seed"]) for kw in started] == \
        [("sweep__alpha=0__1", 0.0, 1), ("sweep__alpha=0.6__1", 0.6, 1)]
    table = results_table([Path("runs")], by="alpha")
    assert "| per_dqn | CartPole-v1 | 0.0 |" in table and "| per_dqn | CartPole-v1 | 0.6 |" in table, table
    record = module.main(parse(module, ["--evaluate", "runs/sweep__alpha=0.6__1"]))  # a member, as any run
    assert record["returns"] == json.loads(Path("runs/sweep__alpha=0.6__1/summary.json").read_text())["eval_returns"]


@pytest.mark.usefixtures("main_in_tmp_path")
def test_a_members_config_reruns_that_member_alone():
    """per_dqn members alpha 0 and 0.6, both seed 1: --config with the second member's config.yaml (and another
    --run-name) trains that run alone, bit for bit. Fails if config.yaml holds the pack's num_seeds (it trained a
    pack of seeds 1 and 2 at alpha 0.6)."""
    module = load_algo("per_dqn")
    module.main(tiny_args(module, pack=("alpha=0,0.6", "seed=1,1", "run_name=a,b"), total_timesteps=600,
                          save_model=True))
    summary = module.main(parse(module, ["--config", "runs/b/config.yaml", "--run-name", "again"]))
    assert summary["run_name"] == "again" and summary["num_seeds"] == 1
    assert_same(outcome(Path("runs/b")), outcome(Path("runs/again")), episodes=2)


@pytest.mark.slow
def test_a_packed_sweep_stopped_by_sigterm_resumes_bit_for_bit(tmp_path):
    """per_dqn, members alpha 0 / 0.6 and learning rate 1e-3 / 3e-4 (seed 1 each): SIGTERM after the first checkpoint,
    --resume of the first member's directory; both end as the pack left alone (model.pt, evaluation, metrics)."""
    argv = [*CASES["per_dqn"], *RESUME_COMMON, "--pack", "alpha=0,0.6", "learning_rate=1e-3,3e-4", "seed=1,1"]
    alone, stopped = (start(tmp_path, "per_dqn", *argv, "--run-name", name + "__{alpha}") for name in ("alone", "stop"))
    wait_for(lambda: (tmp_path / "runs" / "stop__0" / "checkpoint.pt").exists(), stopped, "a checkpoint")
    stopped.send_signal(signal.SIGTERM)
    assert "stopped by SIGTERM" in finished(stopped)
    out = finished(start(tmp_path, "per_dqn", "--resume", str(Path("runs") / "stop__0")))
    assert "resuming runs/stop__0 (and 1 more seeds beside it)" in out
    finished(alone)
    for alpha in ("0", "0.6"):
        assert_same(outcome(tmp_path / "runs" / f"alone__{alpha}"), outcome(tmp_path / "runs" / f"stop__{alpha}"))


@pytest.mark.usefixtures("main_in_tmp_path")
def test_a_packed_sweep_extended_by_resume_trains_each_member_on_as_alone():
    """A finished pack (exploration_fraction 0.1 / 0.5, beta_start 0.4 / 0.7) resumed with a larger
    --total-timesteps: each member's schedules go on from its own values, as that run alone extended does."""
    module = load_algo("per_dqn")
    common = dict(total_timesteps=1200, eval_frequency=600, anneal_lr=False, checkpoint_frequency=600,
                  save_model=True)
    module.main(tiny_args(module, pack=("exploration_fraction=0.1,0.5", "beta_start=0.4,0.7", "seed=1,1"),
                          run_name="pack__{exploration_fraction}", **common))
    module.main(tiny_args(module, exploration_fraction=0.5, beta_start=0.7, run_name="alone", **common))
    for name in ("pack__0.1", "alone"):
        module.main(parse(module, ["--resume", f"runs/{name}", "--total-timesteps", "2000"]))
    assert_same(outcome(Path("runs/pack__0.5")), outcome(Path("runs/alone")), episodes=2)
    assert yaml.safe_load(Path("runs/pack__0.5/config.yaml").read_text())["beta_start"] == \
        yaml.safe_load(Path("runs/alone/config.yaml").read_text())["beta_start"] != 0.7
