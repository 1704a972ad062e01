"""Each algorithm file is one page (DESIGN.md's budgets): at most 300 lines, the algorithm and nothing else (the run
around it is harness/'s), and a variant differs from dqn.py by its own change only."""

from __future__ import annotations

import difflib

import pytest

from tests.algo_utils import ROOT

NAMES = ["dqn", "per_dqn", "nstep_dqn", "ddpg"]


@pytest.mark.parametrize("name", NAMES)
def test_an_algorithm_file_is_one_page_of_algorithm(name):
    text = (ROOT / "algos" / f"{name}.py").read_text()
    assert len(text.splitlines()) <= 300
    assert "\ndef main(" in text and "from harness import" in text
    for machinery in ("import tyro", "import wandb", "import yaml", "signal.signal", "torch.save", "tqdm"):
        assert machinery not in text, f"{machinery}: the run machinery belongs in harness/"


@pytest.mark.parametrize("name, budget", [("per_dqn", 60), ("nstep_dqn", 35)])
def test_a_variant_differs_from_dqn_by_its_own_change_only(name, budget):
    """Lines removed plus lines added, as `diff algos/dqn.py algos/<name>.py | grep -c '^[<>]'` counts them."""
    dqn, variant = ((ROOT / "algos" / f"{n}.py").read_text().splitlines() for n in ("dqn", name))
    opcodes = difflib.SequenceMatcher(None, dqn, variant, autojunk=False).get_opcodes()
    changed = sum(i2 - i1 + j2 - j1 for tag, i1, i2, j1, j2 in opcodes if tag != "equal")
    assert changed <= budget


def test_the_mountaincar_value_iteration_return_is_called_a_bound_from_its_grid():
    """benchmarks/mountaincar_optimum.py measures the return of a policy greedy in a value iteration on a grid: a
    bound from below on the best policy's, which a finer grid raises (451 points: -97.66, 751: -97.58). The pages
    that quote it say so, and never call it the optimum or the best any policy does."""
    pages = {path: (ROOT / path).read_text() for path in ("README.md", "benchmarks/results.md",
                                                         "benchmarks/mountaincar_optimum.py")}
    for path, text in pages.items():
        flat = " ".join(text.split())
        assert not any(claim in flat for claim in ("the optimum", "best any policy", "near the best there is")), path
        assert "-97.58" in flat and "751" in flat and "bound" in flat, path
