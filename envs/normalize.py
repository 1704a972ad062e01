"""Observation normalisation by running statistics, applied where observations are used (not stored)."""

import torch
import torch.nn as nn


class RunningMeanStd(nn.Module):
    """Observations scaled by the running mean and variance of all those collected so far (Chan et al.'s
    parallel update). Replay keeps raw observations and batches pass through this when used, so every update
    sees the latest statistics (as SB3's VecNormalize does). With enabled=False it passes observations
    through unchanged and ignores updates, so a caller needs no branch for the option.

    `update` takes observations [..., n, *shape] and folds the n rows in; leading dimensions must match the
    statistics', so a pack of seeds (harness.stacked: statistics [seeds, 1, *shape]) keeps each seed's own
    statistics of its rows [seeds, n, *shape]. The count is kept per element, like the mean, for the same reason."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, enabled: bool = True):
        super().__init__()
        self.clip, self.enabled, self.batch_dim = clip, enabled, -1 - len(shape)  # the dim before the observation's
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.full(shape, 1e-4, dtype=torch.float64))  # no 0/0 before the first batch

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:  # in place, so that CUDA graphs read the new statistics
        if not self.enabled:
            return
        obs = obs.to(self.mean.device, torch.float64)
        n = obs.shape[self.batch_dim]
        total, delta = self.count + n, obs.mean(self.batch_dim).view_as(self.mean) - self.mean
        batch_var = obs.var(self.batch_dim, unbiased=False).view_as(self.var)
        moments = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.var.copy_(moments / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return obs
        return ((obs - self.mean.float()) / (self.var.float() + 1e-8).sqrt()).clamp(-self.clip, self.clip)
