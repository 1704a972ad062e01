"""benchmarks/breakdown.py, small, in its own process (it wraps torch, gymnasium and buffer methods globally)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_breakdown_times_every_call_of_the_dqn_loop(tmp_path):
    """1200 steps of the CartPole config (learning starts after 1000, an update every 4 steps): every wrapped
    call is seen as often as the loop makes it, and the shares add up to the loop. Fails if a timer misses
    its call or also counts the final evaluation's (seen: env step at 1.08 calls per step)."""
    out = tmp_path / "breakdown.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "breakdown.py"), "--steps", "1200", "--out", str(out)],
                   check=True, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    result = json.loads(out.read_text())
    rows = {row["call"]: row for row in result["rows"]}
    assert rows["env step"]["calls_per_step"] == rows["record"]["calls_per_step"] == 1.0
    assert rows["extend"]["calls_per_step"] == 1.0
    updates = 200 / 4  # steps 1001-1200
    for call in ("backward", "Adam step", "Adam zero_grad", "clip_grad_norm", "sample"):
        assert rows[call]["calls_per_step"] * 1200 == updates, call
    assert rows["QNetwork forward, update"]["calls_per_step"] * 1200 == 2 * updates  # target, online
    assert 0 < rows["QNetwork forward, act"]["calls_per_step"] <= 1.0  # none while exploring
    assert sum(row["us_per_step"] for row in rows.values()) * 1200 / 1e6 == pytest.approx(result["loop_s"])
    assert not (tmp_path / "runs").exists()  # the run directory went to a temporary directory
