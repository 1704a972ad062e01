"""Successive halving inside packs (run.py tune --rungs K --eta E): a round's trials trained to a fraction of the
budget, the best 1/E of them continued, the others stopped, rung by rung, in fewer and fewer pack members.

Rung r of K ends at step total / E**(K-1-r), the last at the full budget. Every pack of the round pauses at a rung
(the scripts' --stop-step: an evaluation, a checkpoint; the schedules are the full budget's from the start); a
trial's value there is the objective over its seeds' evaluations at that step, reported to Optuna as the trial's
intermediate value; the best ceil(n / E) trials go on and the others are pruned (Optuna's PRUNED, with that value).
A pack goes on with the members of its trials that were kept, as a smaller pack (--resume HOLDER --members NAME...:
the checkpoint cut to their rows), so a trial continued to the end trains bit for bit as it would have without
stopping; a pack none of whose trials was kept ends at the rung, its runs' model.pt and summary.json those of the
rung. The packs are the round's first packs with the pruned members taken out: never merged, so a pack's members
always come from one checkpoint.

A tune stopped mid-rung goes on from its record (the decisions of the rungs taken, read back, never taken again),
what the study holds (each trial's values at the rungs it reached, its state) and what the runs' directories hold
(which members reached a rung, which members a checkpoint holds and at which step): the rung that was running
continues from the latest checkpoint holding each pack's members.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from launcher import fail
from launcher.results import finished, summary_in


def rung_steps(total: int, rungs: int, eta: int) -> list[int]:
    """The step each rung ends at: total / eta**(rungs - 1 - r), the last at total; refused in one line when two rungs
    would end at the same step (too many rungs for the budget)."""
    if rungs < 1 or eta < 2:
        fail(f"--rungs must be >= 1 and --eta >= 2, got {rungs} and {eta}")
    steps = [total // eta ** (rungs - 1 - r) for r in range(rungs)]
    if steps[0] < 1 or len(set(steps)) < rungs:
        fail(f"--rungs {rungs} with --eta {eta} cuts a budget of {total} steps into rungs of {steps}: use fewer rungs")
    return steps


def round_checked(asked: int | None, default: int, trials: int, rungs: int, eta: int) -> int:
    """The trials a round of halving asks: --round (`asked`) or the default raised to eta**(rungs - 1), so that each
    rung keeps fewer trials than it had; a round or a tune too small for that is refused in one line."""
    needed = eta ** (rungs - 1)
    if asked is not None and asked < needed:
        fail(f"--round {asked} is too small for --rungs {rungs} with --eta {eta}: a round needs {needed} trials or "
             f"more (each rung keeps 1 in {eta}), or use fewer rungs")
    if trials < needed:
        fail(f"--trials {trials} is too few for --rungs {rungs} with --eta {eta}: halving needs {needed} trials or "
             "more, or fewer rungs")
    return asked or max(default, needed)


def round_size(first: int, trials: int, size: int, rungs: int, eta: int) -> int:
    """The trials of the round asked from trial `first` on, in a tune of `trials` asked in rounds of `size`: `size`,
    or every trial left when fewer than eta**(rungs - 1) would be left after it (a round that small could not be
    halved: its rungs would keep as many trials as they had, or rank them against one rival), so they join this one."""
    left = trials - first
    return left if left - size < eta ** (rungs - 1) else size


def more_trials_checked(trials: int, asked: int, rungs: int, eta: int) -> None:
    """--resume --trials: the trials beyond the `asked` ones (the rounds asked so far) are asked in rounds of halving,
    so there must be none or eta**(rungs - 1) or more; fewer are refused in one line."""
    needed = eta ** (rungs - 1)
    if 0 < trials - asked < needed:
        fail(f"--trials {trials}: the tune has asked {asked} trials, and a round of the {trials - asked} more would be "
             f"too small for --rungs {rungs} with --eta {eta}: a round needs {needed} trials or more; give --trials "
             f"{asked + needed} or more")


def kept(values: dict[int, float], eta: int) -> list[int]:
    """The trials that go on from a rung: the best ceil(n / eta) by value (a tie: the earlier trial), in order."""
    best = sorted(values, key=lambda number: (-values[number], number))[:math.ceil(len(values) / eta)]
    return sorted(best)


def reached(run_dir: Path, step: int, final: bool) -> bool:
    """Whether a run reached a rung: finished (the last rung), or paused at or after its step with an evaluation there
    (a run stopped by a signal has none)."""
    if final:
        return finished(run_dir)
    summary = summary_in(run_dir)
    return summary.get("global_step", -1) >= step and bool(summary.get("eval_returns"))


def rung_returns(run_dirs: list[Path], step: int, final: bool) -> list[float] | None:
    """A trial's seeds' evaluation returns at a rung (each run's mean over its episodes), or None if one has not
    reached it."""
    if not all(reached(run_dir, step, final) for run_dir in run_dirs):
        return None
    return [summary_in(run_dir)["eval_return_mean"] for run_dir in run_dirs]


def held_by(checkpoint: Path) -> tuple[list[str], int] | None:
    """The run directories whose members a checkpoint.pt holds and the step it was saved at (None: there is none, or
    it cannot be read)."""
    import torch

    try:
        state = torch.load(checkpoint, weights_only=True, mmap=True)
        return list(state["dirs"]), int(state["counts"][0])
    except Exception:  # missing or cut short by a kill: torch raises several types
        return None


def rung_packs(first: list[list[dict[str, Any]]], alive: set[int]) -> list[list[dict[str, Any]]]:
    """Each of the round's first packs with only the members of the trials alive at a rung (None: none left)."""
    return [[member for member in pack if member["trial"] in alive] or None for pack in first]


def resume_argv(names: list[str], holders: list[str], runs_dir: Path, stop: list[str], since: int,
                until: int) -> list[str] | None:
    """How a pack of these runs goes on to the rung ending at step `until`, the last one having ended at `since` (0:
    this is the first): from the latest checkpoint that holds all its members, saved at `since` or later, in one of
    `holders` (the directories of the pack it was cut from): its own (it was stopped on the way), or the one of the
    pack it was cut from, with --members. None: there is none, and the pack starts from its first step (the same
    runs, bit for bit, trained again)."""
    best = None
    for name in dict.fromkeys([names[0], *holders]):
        held = held_by(runs_dir / name / "checkpoint.pt")
        if held and set(names) <= set(held[0]) and since <= held[1] < until and (best is None or held[1] > best[2]):
            best = (name, held[0], held[1])
    if best is None:
        return None
    if best[1] == names:
        return ["--resume", f"runs/{best[0]}", *stop]
    return ["--resume", f"runs/{best[0]}", "--members", *names, *stop]
