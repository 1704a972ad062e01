"""Shared fixtures: the device buffer tests run on, whole-object state snapshots, a chi-square test."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)


@pytest.fixture(autouse=True)
def subnormals_kept():
    """Each test ends with torch's default, subnormal floats kept: a run (harness.Run) flushes them process-wide."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture
def main_in_tmp_path(tmp_path, monkeypatch):
    """For tests that call an algorithm's main(): runs write under tmp_path, W&B is off, and main's
    thread count is put back afterwards (flush-to-zero: subnormals_kept)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["cpu", _CUDA])
def device(request) -> torch.device:
    """Every buffer test runs on the CPU, and on CUDA when a GPU is present."""
    return torch.device(request.param)


def _tensor_bytes(x: torch.Tensor) -> tuple:
    # Bytes, not values: storage comes from torch.empty, and NaN garbage never compares equal.
    flat = x.detach().to("cpu").contiguous().reshape(-1)
    return (str(x.dtype), tuple(x.shape), str(x.device.type), flat.view(torch.uint8).numpy().tobytes())


IGNORED = ("_scratch", "_columns")


def _state(value):
    if isinstance(value, torch.Tensor):
        return _tensor_bytes(value)
    if isinstance(value, TensorDictBase):
        return {str(k): _tensor_bytes(v) for k, v in value.items(True, True)}, tuple(value.batch_size)
    if isinstance(value, torch.Generator):
        return "generator", _tensor_bytes(value.get_state())
    if isinstance(value, dict):
        return {k: _state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_state(v) for v in value]
    if hasattr(value, "__dict__") and not callable(value):
        # `_scratch`: buffers reused between calls to save ops, declared to hold no state; `_columns`: the
        # storage's own tensors by key (a lookup table, compared through `storage`).
        return type(value).__name__, {k: _state(v) for k, v in vars(value).items() if k not in IGNORED}
    return value


@pytest.fixture
def snapshot():
    """snapshot(obj) -> a plain, ==-comparable picture of every attribute of obj, recursively.

    Tensors and TensorDicts become their bytes (plus dtype, shape and device), generators their
    state, nested objects (the segment trees) their own attributes, except an attribute named
    `_scratch` (reused memory that holds no state) and `_columns` (views of `storage`). Two snapshots
    are equal exactly when nothing observable about the object changed.
    """
    return _state


def chi2_critical(df: int, significance: float) -> float:
    """Upper `significance` quantile of chi-square(df), Wilson–Hilferty approximation.

    chi2_q ~= df * (1 - 2/(9 df) + z_q sqrt(2/(9 df)))^3 with z_q the standard-normal quantile
    (Wilson & Hilferty 1931). It is within 1% of the exact quantile for df >= 9 at these levels,
    e.g. at significance 1e-3: df=31 gives 61.20 (exact 61.10), df=39 gives 72.14 (exact 72.05).
    """
    z = NormalDist().inv_cdf(1.0 - significance)
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi2_statistic(counts, probs) -> tuple[float, int]:
    """Pearson's statistic of observed `counts` against cell probabilities `probs`; (stat, df)."""
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    assert counts.shape == probs.shape
    expected = counts.sum() * probs / probs.sum()
    assert expected.min() >= 5, "too few draws per cell for the chi-square approximation"
    return float(((counts - expected) ** 2 / expected).sum()), counts.size - 1


@pytest.fixture
def chi_square():
    """chi_square(counts, probs, significance) -> (statistic, critical value) for a goodness-of-fit test."""

    def test(counts, probs, significance: float = 1e-3) -> tuple[float, float]:
        stat, df = chi2_statistic(counts, probs)
        return stat, chi2_critical(df, significance)

    return test


@pytest.fixture(scope="module")
def single_thread():
    """Run a module on one intra-op thread, restoring the setting after.

    The buffer tests push many small tensors through indexing ops; on a busy two-core machine
    torch's thread pool then spends ~100x longer waiting on its workers than computing.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
