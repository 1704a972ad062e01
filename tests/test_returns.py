"""buffers.lambda_returns against a brute-force forward-view reference: each lambda-return as the
(1 - lambda)-weighted mixture of the n-step returns of its own episode inside the slice, on random
trajectories with terminations and truncations mixed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers import lambda_returns


def forward_view(reward, discount, ended, next_value, lam):
    """G_t = (1 - lam) sum_{n<M} lam^(n-1) G_t^(n) + lam^(M-1) G_t^(M), with M the steps from t to the first
    episode end at or after t (or to the slice's end), and G_t^(n) the n-step return bootstrapped from the
    value of the n-th step's next observation: sum_k (prod_{j<k} d_{t+j}) r_{t+k} + (prod_{j<n} d_{t+j}) V_{t+n-1}.
    A termination stores d = 0 (so nothing after it counts); a truncation keeps d = gamma and ends the window."""
    batch, length = reward.shape
    out = np.zeros((batch, length))
    for b in range(batch):
        for t in range(length):
            end = next((j for j in range(t, length) if ended[b, j]), length - 1)
            horizon = end - t + 1
            n_step = []
            for n in range(1, horizon + 1):
                total, scale = 0.0, 1.0
                for k in range(n):
                    total += scale * reward[b, t + k]
                    scale *= discount[b, t + k]
                n_step.append(total + scale * next_value[b, t + n - 1])
            weights = [(1 - lam) * lam ** (n - 1) for n in range(1, horizon)] + [lam ** (horizon - 1)]
            out[b, t] = sum(w * g for w, g in zip(weights, n_step, strict=True))
    return out


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 4), length=st.integers(1, 9), lam=st.floats(0.0, 1.0), seed=st.integers(0, 10_000),
       p_end=st.sampled_from([0.0, 0.2, 0.5]))
def test_lambda_returns_equal_the_forward_view(batch, length, lam, seed, p_end):
    rng = np.random.default_rng(seed)
    reward = rng.normal(size=(batch, length))
    next_value = rng.normal(size=(batch, length)) * 10
    terminated = rng.random((batch, length)) < p_end
    truncated = ~terminated & (rng.random((batch, length)) < p_end)
    discount = np.where(terminated, 0.0, 0.97)
    ended = terminated | truncated
    expected = forward_view(reward, discount, ended, next_value, lam)
    got = lambda_returns(*(torch.as_tensor(x) for x in (reward, discount, ended, next_value)), lam)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-10)


def test_a_truncated_step_bootstraps_from_its_own_final_value_and_ignores_the_next_episode():
    """A slice crossing an episode end by truncation: step 1 is truncated, step 2 starts a new episode whose
    value must not leak into step 1's return, whatever lambda."""
    reward = torch.tensor([[1.0, 2.0, 100.0]])
    discount = torch.tensor([[0.5, 0.5, 0.5]])
    ended = torch.tensor([[False, True, False]])
    next_value = torch.tensor([[10.0, 20.0, 1000.0]])
    for lam in (0.0, 0.5, 1.0):
        g = lambda_returns(reward, discount, ended, next_value, lam)
        assert g[0, 1].item() == pytest.approx(2.0 + 0.5 * 20.0)
        assert g[0, 2].item() == pytest.approx(100.0 + 0.5 * 1000.0)
        step0 = 1.0 + 0.5 * ((1 - lam) * 10.0 + lam * g[0, 1].item())
        assert g[0, 0].item() == pytest.approx(step0)
