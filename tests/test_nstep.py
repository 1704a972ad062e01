"""NStepReturns against a brute-force reference computed from whole recorded episodes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from buffers import NStepReturns, ReplayBuffer
from buffers.nstep import REQUIRED

pytestmark = pytest.mark.usefixtures("single_thread")


def random_streams(num_envs: int, steps: int, seed: int, max_len: int = 8):
    """Vector-env steps of random episodes: (list of step TensorDicts, per-env list of step records).

    obs = (env, episode, t) names the step; next_obs = (env, episode, t + 1), also at an episode's
    end, where it stands for the real final observation (the next step's obs is (env, episode + 1,
    0)). Episodes last 1..max_len steps and end by termination, truncation or both.
    """
    rng = np.random.default_rng(seed)
    episode = [0] * num_envs
    t = [0] * num_envs
    length = [int(rng.integers(1, max_len + 1)) for _ in range(num_envs)]
    tds, records = [], [[] for _ in range(num_envs)]
    for s in range(steps):
        rows = []
        for e in range(num_envs):
            end = t[e] == length[e] - 1
            kind = rng.choice(["terminated", "truncated", "both"], p=[0.45, 0.45, 0.1]) if end else ""
            row = {
                "obs": (e, episode[e], t[e]),
                "action": int(rng.integers(0, 100)),
                "reward": float(np.float32(rng.normal())),
                "next_obs": (e, episode[e], t[e] + 1),
                "terminated": kind in ("terminated", "both"),
                "truncated": kind in ("truncated", "both"),
                "extra": s * num_envs + e,
                "step": s,
            }
            rows.append(row)
            records[e].append(row)
            if end:
                episode[e], t[e], length[e] = episode[e] + 1, 0, int(rng.integers(1, max_len + 1))
            else:
                t[e] += 1
        tds.append(
            TensorDict(
                {
                    "obs": torch.tensor([r["obs"] for r in rows], dtype=torch.float32),
                    "action": torch.tensor([r["action"] for r in rows]),
                    "reward": torch.tensor([r["reward"] for r in rows], dtype=torch.float32),
                    "next_obs": torch.tensor([r["next_obs"] for r in rows], dtype=torch.float32),
                    "terminated": torch.tensor([r["terminated"] for r in rows]),
                    "truncated": torch.tensor([r["truncated"] for r in rows]),
                    "info": {"extra": torch.tensor([r["extra"] for r in rows])},
                },
                batch_size=[num_envs],
            )
        )
    return tds, records


def reference(records, n: int, gamma: float) -> dict:
    """Every n-step transition that should have come out by now, straight from the definition.

    Keyed by the obs of the window's first step; the value also says at which step it is due.
    """
    out = {}
    for env_steps in records:
        episodes: dict[int, list] = {}
        for row in env_steps:
            episodes.setdefault(row["obs"][1], []).append(row)
        for steps in episodes.values():
            finished = steps[-1]["terminated"] or steps[-1]["truncated"]
            for t in range(len(steps)):
                m = min(n, len(steps) - t)
                if m < n and not finished:
                    continue  # the window is still open
                window = steps[t : t + m]
                terminated = any(row["terminated"] for row in window)
                out[window[0]["obs"]] = {
                    "action": window[0]["action"],
                    "extra": window[0]["extra"],
                    "reward": sum(gamma**k * row["reward"] for k, row in enumerate(window)),
                    "next_obs": window[-1]["next_obs"],
                    "terminated": terminated,
                    "truncated": window[-1]["truncated"],
                    "discount": 0.0 if terminated else gamma**m,
                    "step": window[-1]["step"],
                }
    return out


def collect(nstep: NStepReturns, tds) -> tuple[Counter, dict]:
    """Push every step; (how often each start obs came out, its fields as emitted)."""
    counts, got = Counter(), {}
    for s, td in enumerate(tds):
        ready = nstep.push(td)
        assert ready.batch_dims == 1
        for i in range(ready.batch_size[0]):
            key = tuple(int(v) for v in ready["obs"][i].tolist())
            counts[key] += 1
            got[key] = {
                "action": int(ready["action"][i]),
                "extra": int(ready["info", "extra"][i]),
                "reward": float(ready["reward"][i]),
                "next_obs": tuple(int(v) for v in ready["next_obs"][i].tolist()),
                "terminated": bool(ready["terminated"][i]),
                "truncated": bool(ready["truncated"][i]),
                "discount": float(ready["discount"][i]),
                "step": s,
            }
    return counts, got


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("seed, max_len", [(0, 8), (1, 3), (2, 12)])
def test_transitions_match_a_reference_built_from_whole_episodes(n, seed, max_len):
    """3 envs, 150 steps, random episode lengths 1..max_len, terminations and truncations mixed.

    The emitted transitions, as a multiset, equal the reference: each window start exactly once,
    each transition in the very push that completes its window, rewards to 1e-5 (float32
    folding against float64), discounts to 1e-6 relative."""
    gamma, num_envs = 0.9, 3
    tds, records = random_streams(num_envs, 150, seed, max_len)
    counts, got = collect(NStepReturns(n, gamma, num_envs), tds)
    want = reference(records, n, gamma)

    assert [key for key, c in counts.items() if c > 1] == []
    assert set(got) - set(want) == set(), "emitted transitions that should not exist (yet)"
    assert set(want) - set(got) == set(), "missing transitions"
    for key, expected in want.items():
        actual = got[key]
        assert actual["reward"] == pytest.approx(expected["reward"], abs=1e-5), key
        assert actual["discount"] == pytest.approx(expected["discount"], rel=1e-6, abs=0), key
        for field in ("action", "extra", "next_obs", "terminated", "truncated", "step"):
            assert actual[field] == expected[field], (key, field)

    # Every step of every finished episode started exactly one transition; some were cut short.
    finished_steps = [
        row["obs"]
        for env_steps in records
        for row in env_steps
        if any(
            later["terminated"] or later["truncated"]
            for later in env_steps
            if later["obs"][1] == row["obs"][1] and later["obs"][2] >= row["obs"][2]
        )
    ]
    assert set(finished_steps) <= set(got)
    if n > 1:
        assert any(v["discount"] not in (0.0, pytest.approx(gamma**n)) for v in got.values())


@pytest.mark.parametrize("gamma", [0.99, 0.5])
def test_n1_emits_every_step_at_once_unchanged(gamma):
    tds, _ = random_streams(num_envs=4, steps=60, seed=3, max_len=5)
    nstep = NStepReturns(1, gamma, 4)
    for td in tds:
        ready = nstep.push(td)
        assert ready.batch_size == torch.Size([4])
        order = torch.argsort(ready["obs"][:, 0])
        ready = ready[order]
        for key in td.keys(True, True):
            assert torch.equal(ready.get(key), td.get(key)), key
        discount = torch.where(td["terminated"], 0.0, torch.tensor(gamma, dtype=torch.float32))
        assert torch.equal(ready["discount"], discount)


def test_every_output_fits_one_replay_buffer():
    """Outputs, the empty ones included, share one layout, so they extend a ReplayBuffer directly."""
    tds, records = random_streams(num_envs=3, steps=50, seed=4)
    nstep = NStepReturns(3, 0.99, 3)
    rb = ReplayBuffer(1000, seed=0)
    sizes = []
    for td in tds:
        ready = nstep.push(td)
        sizes.append(ready.batch_size[0])
        rb.extend(ready)
    assert 0 in sizes
    assert rb.written == sum(sizes) == len(reference(records, 3, 0.99))
    assert {"discount", "reward", "next_obs", "terminated"} <= set(rb.storage.keys())


def test_input_on_another_device_gives_the_same_cpu_output(device):
    tds, _ = random_streams(num_envs=2, steps=20, seed=5)
    here, there = NStepReturns(3, 0.9, 2), NStepReturns(3, 0.9, 2)
    for td in tds:
        a, b = here.push(td), there.push(td.to(device))
        assert b.device is None or b.device.type == "cpu"
        assert (a == b).all()


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", REQUIRED)
def test_a_step_missing_a_key_raises_and_changes_nothing(snapshot, key):
    tds, _ = random_streams(num_envs=2, steps=12, seed=6)
    nstep, twin = NStepReturns(3, 0.9, 2), NStepReturns(3, 0.9, 2)
    for td in tds[:5]:
        nstep.push(td)
        twin.push(td)
    before = snapshot(nstep)
    with pytest.raises(ValueError, match=rf"missing keys \['{key}'\]"):
        nstep.push(tds[5].exclude(key))
    assert snapshot(nstep) == before
    for td in tds[5:]:
        assert (nstep.push(td) == twin.push(td)).all()


@pytest.mark.parametrize("batch_size", [[3], [1], [2, 1], []])
def test_a_step_of_the_wrong_batch_size_raises_and_changes_nothing(snapshot, batch_size):
    tds, _ = random_streams(num_envs=2, steps=6, seed=7)
    nstep = NStepReturns(2, 0.9, 2)
    nstep.push(tds[0])
    fields = {key: torch.zeros((*batch_size, *tds[0][key].shape[1:])) for key in REQUIRED}
    bad = TensorDict(fields, batch_size)
    before = snapshot(nstep)
    with pytest.raises(ValueError, match=r"batch size .* expected \(2,\)"):
        nstep.push(bad)
    assert snapshot(nstep) == before


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n": 0}, "n must be >= 1, got 0"),
        ({"n": -2}, "n must be >= 1, got -2"),
        ({"gamma": -0.1}, r"gamma must be in \[0, 1\], got -0.1"),
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\], got 1.5"),
        ({"gamma": float("nan")}, r"gamma must be in \[0, 1\]"),
        ({"num_envs": 0}, "num_envs must be >= 1, got 0"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NStepReturns(**{"n": 3, "gamma": 0.99, "num_envs": 2, **kwargs})
