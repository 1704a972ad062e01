"""Some members of a pack going on as a smaller pack (`--resume HOLDER --members NAME ...`, successive halving's rungs):
a pack of 4 paused at a step (--stop-step) and resumed with two of its members, or one, each kept member ends as the
same member of the pack never paused, which is its run alone: model.pt, final evaluation and metrics.jsonl, bit for
bit. A member's config.yaml reruns it alone; a member left out keeps its networks; what cannot be cut is refused in
one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.algo_utils import ROOT
from tests.test_resume import CASES, assert_same, outcome

pytestmark = pytest.mark.slow

# Each file's pack: 4 seeds and a packable setting that differs in every member.
PACKS = {
    "dqn": ["seed=1,2,3,4", "learning_rate=0.001,0.002,0.0015,0.0007"],
    "per_dqn": ["seed=1,2,3,4", "alpha=0.6,0.3,0.6,0.9"],
    "nstep_dqn": ["seed=1,2,3,4", "gamma=0.99,0.97,0.95,0.98"],
    "ddpg": ["seed=1,2,3,4", "exploration_noise=0.1,0.2,0.3,0.15"],
}
STOP = {"dqn": "1000", "per_dqn": "1000", "nstep_dqn": "1500", "ddpg": "600"}  # a step of an evaluation
COMMON = ["--eval-episodes", "2", "--no-cuda", "--threads", "1"]


def trained(cwd: Path, algo: str, *argv: str, code: int = 0) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "algos" / f"{algo}.py"), *argv], cwd=cwd, text=True,
                          capture_output=True)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout + done.stderr


def packed(cwd: Path, algo: str, prefix: str, *more: str) -> None:
    names = ",".join(f"{prefix}{i}" for i in range(4))
    evaluations = ["--eval-frequency", STOP[algo]]  # the pause's evaluation falls on one the pack makes anyway
    trained(cwd, algo, *CASES[algo], *COMMON, *evaluations, "--pack", *PACKS[algo], f"run_name={names}", *more)


@pytest.mark.parametrize("algo", list(PACKS))
def test_members_of_a_paused_pack_go_on_as_a_smaller_pack_each_as_never_paused(tmp_path, algo):
    """Kept: members 1 and 3 (the holder, member 0, is not: the checkpoint moves to member 1's directory)."""
    packed(tmp_path, algo, "whole")
    packed(tmp_path, algo, "cut", "--stop-step", STOP[algo])
    out = trained(tmp_path, algo, "--resume", "runs/cut0", "--members", "cut3", "cut1")
    assert "resuming runs/cut1 (and 1 more seeds beside it)" in out, out
    runs = tmp_path / "runs"
    for i in (1, 3):
        assert_same(outcome(runs / f"cut{i}"), outcome(runs / f"whole{i}"), episodes=2)
    assert json.loads((runs / "cut3" / "summary.json").read_text())["pack_dirs"] == ["cut1", "cut3"]


@pytest.mark.parametrize("algo", ["dqn", "per_dqn"])
def test_a_pack_cut_to_one_member_goes_on_as_its_lone_run(tmp_path, algo):
    packed(tmp_path, algo, "whole")
    packed(tmp_path, algo, "cut", "--stop-step", STOP[algo])
    trained(tmp_path, algo, "--resume", "runs/cut0", "--members", "cut2")
    assert_same(outcome(tmp_path / "runs" / "cut2"), outcome(tmp_path / "runs" / "whole2"), episodes=2)


def test_kept_members_that_share_a_setting_go_on_as_a_pack_holding_it_once(tmp_path):
    """per_dqn's members 0 and 2 share alpha 0.6: the smaller pack holds it as one number, as their runs alone do."""
    packed(tmp_path, "per_dqn", "whole")
    packed(tmp_path, "per_dqn", "cut", "--stop-step", STOP["per_dqn"])
    trained(tmp_path, "per_dqn", "--resume", "runs/cut0", "--members", "cut0", "cut2")
    for i in (0, 2):
        assert_same(outcome(tmp_path / "runs" / f"cut{i}"), outcome(tmp_path / "runs" / f"whole{i}"), episodes=2)


def test_the_config_of_a_member_that_went_on_or_was_left_out_reruns_it_alone(tmp_path):
    """A pack of 4 paused at a step, then members 1 and 3 went on: `--config` of member 3's config.yaml (it went on)
    and of member 2's (left out at the pause) each trains a new run alone, to the end, equal to that member of the
    pack never paused. Fails if config.yaml holds the one-off options of the process that wrote it: member 3's rerun
    resumed the pack's checkpoint as one run (`zip() argument 2 is longer than argument 1`), member 2's paused."""
    packed(tmp_path, "dqn", "whole")
    packed(tmp_path, "dqn", "cut", "--stop-step", STOP["dqn"])
    trained(tmp_path, "dqn", "--resume", "runs/cut0", "--members", "cut1", "cut3")
    runs = tmp_path / "runs"
    for i in (3, 2):
        trained(tmp_path, "dqn", "--config", f"runs/cut{i}/config.yaml", "--run-name", f"again{i}")
        assert json.loads((runs / f"again{i}" / "summary.json").read_text())["interrupted"] is False
        assert_same(outcome(runs / f"again{i}"), outcome(runs / f"whole{i}"), episodes=2)


def test_a_member_left_out_keeps_its_networks_without_model_pt(tmp_path):
    """--no-save-model: a pack of 4 paused at a step holds its networks only in its checkpoint; members 0 and 1 go on
    and pause again, writing their checkpoint over it. `--evaluate` of member 2 (left out) still plays its final
    evaluation again, from its own model.pt. Fails if the left-out members' networks are kept nowhere else ("'cut2'
    is not in list")."""
    packed(tmp_path, "dqn", "cut", "--stop-step", STOP["dqn"], "--no-save-model")
    runs = tmp_path / "runs"
    assert not list(runs.glob("*/model.pt"))
    out = trained(tmp_path, "dqn", "--resume", "runs/cut0", "--members", "cut0", "cut1", "--stop-step", "2000")
    assert "kept the networks of cut2, cut3, left out, in their model.pt" in out, out
    assert not (runs / "cut0" / "model.pt").exists()  # a kept member saves none, as asked
    for i in (2, 3):
        out = trained(tmp_path, "dqn", "--evaluate", f"runs/cut{i}")
        record = json.loads(next((runs / f"cut{i}" / "evaluations").glob("*.json")).read_text())
        assert record["networks"] == "model.pt" and record["global_step"] == int(STOP["dqn"]), out
        assert record["returns"] == json.loads((runs / f"cut{i}" / "summary.json").read_text())["eval_returns"]


def test_a_lone_run_resumed_from_a_copy_of_its_directory_leaves_the_original_as_it_was(tmp_path):
    """A lone run paused with --no-save-model (its networks only in its checkpoint), its directory copied and the
    copy resumed: the copy finishes and the original's files are untouched (no model.pt written into it). Fails if
    the resume takes the original, named in the checkpoint, for a member left out of a pack."""
    trained(tmp_path, "dqn", *CASES["dqn"], *COMMON, "--stop-step", STOP["dqn"], "--no-save-model",
            "--run-name", "alone")
    runs = tmp_path / "runs"
    before = {path.name: path.read_bytes() for path in (runs / "alone").iterdir()}
    shutil.copytree(runs / "alone", runs / "copy")
    trained(tmp_path, "dqn", "--resume", "runs/copy")
    assert json.loads((runs / "copy" / "summary.json").read_text())["interrupted"] is False
    assert {path.name: path.read_bytes() for path in (runs / "alone").iterdir()} == before


def test_evaluate_of_a_member_whose_networks_were_overwritten_says_so_in_one_line(tmp_path):
    """A left-out member whose networks the pack's checkpoint no longer holds (as a pack that went on before its
    left-out members were kept leaves it): --evaluate says what happened in one line, not "'cut2' is not in list"."""
    packed(tmp_path, "dqn", "cut", "--stop-step", STOP["dqn"], "--no-save-model")
    trained(tmp_path, "dqn", "--resume", "runs/cut0", "--members", "cut0", "cut1", "--stop-step", "2000")
    (tmp_path / "runs" / "cut2" / "model.pt").unlink(missing_ok=True)  # what a pack that kept none leaves
    out = trained(tmp_path, "dqn", "--evaluate", "runs/cut2", code=1)
    assert out.strip().splitlines()[-1] == (
        "error: runs/cut2 has no model.pt, and the checkpoint in runs/cut0 no longer holds it: its pack went on "
        "without it, and no model.pt of it was kept (its members now: cut0, cut1)"), out


def test_what_cannot_be_cut_is_refused_in_one_line(tmp_path):
    packed(tmp_path, "dqn", "cut", "--stop-step", STOP["dqn"])
    trained(tmp_path, "dqn", *CASES["dqn"], *COMMON, "--run-name", "lone", "--stop-step", "1000")
    members = "cut0, cut1, cut2, cut3"
    cases = [
        (["--resume", "runs/cut0", "--members", "cut1", "nope"],
         f"error: --members nope: not a member of the pack in runs/cut0 (its members: {members})"),
        (["--resume", "runs/cut0", "--members", "cut1", "cut1"], "error: --members names a member twice: cut1 cut1"),
        (["--resume", "runs/lone", "--members", "lone"],
         "error: --members picks members of a pack, and runs/lone holds a lone run's checkpoint"),
        (["--members", "cut1"], "error: --members picks the members of a pack that go on: give it with --resume"),
    ]
    before = (tmp_path / "runs" / "cut0" / "checkpoint.pt").read_bytes()
    for argv, message in cases:
        out = trained(tmp_path, "dqn", *argv, code=1)
        assert out.strip().splitlines()[-1].startswith(message), out
    assert (tmp_path / "runs" / "cut0" / "checkpoint.pt").read_bytes() == before


def test_rows_like_cuts_each_value_by_the_layout_of_the_resumed_part():
    """rows_like alone, on a state shaped like a pack of 3 members cut to members 2 and 0 (in that order), and to
    member 1 alone: stacked rows, k rows per member, shared values and counts; a layout it cannot match raises."""
    import torch

    from harness.cut import rows_like

    saved = {"w": torch.arange(6.0).reshape(3, 2), "envs": torch.arange(6), "shared": torch.ones(4),
             "gens": ["g0", "g1", "g2"], "num_envs": 6, "step": 7}
    template = {"w": torch.zeros(2, 2), "envs": torch.zeros(4), "shared": torch.zeros(4),
                "gens": [None, None], "num_envs": 4, "step": 0}
    cut = rows_like(saved, template, [2, 0], 3)
    assert cut["w"].tolist() == [[4.0, 5.0], [0.0, 1.0]]
    assert cut["envs"].tolist() == [4, 5, 0, 1]  # two env rows per member
    assert cut["shared"] is saved["shared"] and cut["step"] == 7
    assert cut["gens"] == ["g2", "g0"] and cut["num_envs"] == 4
    lone = rows_like({"w": saved["w"]}, {"w": torch.zeros(2)}, [1], 3)  # one member's row, without the pack axis
    assert lone["w"].tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="for 3 members"):
        rows_like({"w": torch.zeros(3, 2)}, {"w": torch.zeros(5, 2)}, [0, 1], 3)
