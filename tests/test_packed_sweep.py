"""Packed sweeps (--pack KEY=V1,V2,...): the members of a pack differ in their settings, not only their seeds. A
member ends with the model.pt, metrics and evaluation returns of the same run alone, bit for bit on the CPU, for
every setting its file can pack; settings that change shapes or the loop's schedule are refused; run directories,
config.yaml and W&B name each member by its values; a packed sweep resumes bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.algo_utils import load_algo, tiny_args
from tests.test_resume import assert_same, outcome

# Every packable setting of each file, at a value other than the file's default (the lone run's).
DQN = dict(learning_rate=3e-4, adam_eps=1e-5, gamma=0.9, tau=0.5, start_e=0.8, end_e=0.1, exploration_fraction=0.3,
           max_grad_norm=0.5)
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


def test_a_setting_that_changes_shapes_or_the_schedule_is_refused_in_one_line(tmp_path, monkeypatch):
    module = load_algo("ddpg")
    monkeypatch.chdir(tmp_path)
    for key, values in (("batch_size", "16,32"), ("policy_frequency", "1,2"), ("n_step", "1,3")):
        with pytest.raises(SystemExit, match=f"^error: --pack {key}: {key} changes a tensor's shape or when the "
                                             "loop's events happen"):
            module.main(tiny_args(module, pack=(f"{key}={values}",)))
    with pytest.raises(SystemExit, match="one value per member"):
        module.main(tiny_args(module, num_seeds=3, pack=("tau=0.1,0.2",)))
    assert not Path("runs").exists()
