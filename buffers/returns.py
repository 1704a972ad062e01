"""TD(lambda) targets over replayed trajectory slices (see ReplayBuffer.sample_slices)."""

import torch


def lambda_returns(reward: torch.Tensor, discount: torch.Tensor, ended: torch.Tensor, next_value: torch.Tensor,
                   lam: float | torch.Tensor) -> torch.Tensor:
    """TD(lambda) targets for [..., L] slices of consecutive steps (lam: a number, or a float64 tensor that
    broadcasts over the slices, [seeds, 1] for a pack's [seeds, B, L]): G_t = r_t + d_t ((1 - lam) V_t + lam G_{t+1}),
    with V_t the target value of next_obs_t and d_t the stored discount (0 after a termination). Where the
    episode ends (terminated or truncated) or the slice does, G_{t+1} is replaced by V_t: a truncated step
    bootstraps from its real final observation and never reads the next episode. lam = 0 gives r_t + d_t V_t."""
    keep = 1 - lam  # in float64, then in the values' dtype: a number rounds so too
    if isinstance(lam, torch.Tensor):
        keep, lam = keep.to(next_value.device, next_value.dtype), lam.to(next_value.device, next_value.dtype)
    returns, following = torch.empty_like(reward), next_value[..., -1]
    for t in reversed(range(reward.shape[-1])):
        following = torch.where(ended[..., t], next_value[..., t], following)
        returns[..., t] = reward[..., t] + discount[..., t] * (keep * next_value[..., t] + lam * following)
        following = returns[..., t]
    return returns
