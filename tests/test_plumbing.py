"""The four algorithm files carry one block of plumbing (arguments and configs, the run directory, W&B,
checkpoints, signals) after `main`, byte for byte the same in each, so that a fix is made once and copied; and
each file stays a page of algorithm a reader meets before any plumbing (DESIGN.md's budgets)."""

from __future__ import annotations

import difflib

import pytest

from tests.algo_utils import ROOT

NAMES = ["dqn", "per_dqn", "nstep_dqn", "ddpg"]
MARKER = "\n# ---- plumbing:"


def plumbing(name: str) -> str:
    text = (ROOT / "algos" / f"{name}.py").read_text()
    assert text.count(MARKER) == 1, f"algos/{name}.py must have one plumbing block starting with {MARKER.strip()!r}"
    return text[text.index(MARKER):]


def non_empty(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


@pytest.mark.parametrize("name", NAMES[1:])
def test_the_plumbing_block_is_the_same_in_every_file(name):
    ours, theirs = plumbing("dqn"), plumbing(name)
    drift = "".join(difflib.unified_diff(ours.splitlines(True), theirs.splitlines(True), "algos/dqn.py",
                                         f"algos/{name}.py", n=1))
    assert ours == theirs, f"the plumbing blocks differ: make the change in all four files\n{drift}"


@pytest.mark.parametrize("name", NAMES)
def test_the_algorithm_comes_first_and_within_its_budget(name):
    """Top of the file to the end of `main` <= 290 non-empty lines (230 before the seed dimension: stacked layers,
    per-seed clipping and evaluation); `main` ends where the plumbing starts."""
    text = (ROOT / "algos" / f"{name}.py").read_text()
    algorithm = text[: text.index(MARKER)]
    assert "\ndef main(" in algorithm and "\nclass Run" not in algorithm
    assert non_empty(algorithm) <= 290, non_empty(algorithm)


@pytest.mark.parametrize("name, budget", [("per_dqn", 60), ("nstep_dqn", 35)])
def test_a_variant_differs_from_dqn_by_its_own_change_only(name, budget):
    """Lines removed plus lines added, as `diff algos/dqn.py algos/<name>.py | grep -c '^[<>]'` counts them."""
    dqn, variant = ((ROOT / "algos" / f"{n}.py").read_text().splitlines() for n in ("dqn", name))
    opcodes = difflib.SequenceMatcher(None, dqn, variant, autojunk=False).get_opcodes()
    changed = sum(i2 - i1 + j2 - j1 for tag, i1, i2, j1, j2 in opcodes if tag != "equal")
    assert changed <= budget
