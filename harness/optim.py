"""The optimiser side of a pack: each seed's Adam step and gradient clipping, as its lone run's.

    optimizer = adam(q_network.parameters(), len(seeds), lr=lr)              # one seed: torch.optim.Adam, fused
    grad_norm = clip_grad_norm(q_network.parameters(), max_norm, len(seeds))  # each seed's own norm

SeedAdam steps each seed's rows of a pack's stacked parameters as Adam steps the plain network's (an lr and eps
one for all seeds or one per seed); clip_grad_norm clips each seed's rows by that seed's own norm (a norm over the
stack would couple the seeds). They need only the stacked tensors and the number of seeds, nothing of how a
network was stacked (seeds.py); tests/test_harness.py and test_seeds.py check them against a lone run's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.adam import adam as adam_step


class SeedAdam(torch.optim.Adam):
    """torch.optim.Adam (fused) over a pack's stacked parameters that steps each seed as a lone run's Adam would,
    with Adam's options (amsgrad, weight_decay, decoupled_weight_decay, maximize, a closure), and `lr` and `eps`
    either one for all seeds or one per seed, [seeds, 1]: float64 for the numbers a lone run passes, float32 for an
    lr a lone run holds as a tensor (a schedule writes it in place).

    The fused CPU kernel computes the last (numel % vector width) entries of a tensor with scalar code that rounds
    differently from its vector lanes, so a small tensor (an output layer's bias: [actions] alone, [seeds, actions]
    stacked) would not be stepped as alone. A parameter whose per-seed size is a multiple of 64 is stepped whole
    (each seed's entries fall on the same lanes as alone); any other is stepped as one tensor per seed (its rows,
    views of it): bit for bit what Adam does to each seed's plain network. With an lr or eps per seed, every
    parameter is stepped seed by seed, one fused call per seed with that seed's lr and eps.
    """

    def __init__(self, params, seeds: int, **kwargs):
        own = {key: kwargs.pop(key) for key in ("lr", "eps") if isinstance(kwargs.get(key), torch.Tensor)
               and kwargs[key].numel() > 1}  # one per seed: Adam's checks take one number
        super().__init__(params, **kwargs)
        self.seeds = seeds
        for group in self.param_groups:
            group.update({key: value.reshape(seeds, 1).clone() for key, value in own.items()})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            amsgrad, lr, eps = group["amsgrad"], group["lr"], group["eps"]
            own = any(isinstance(value, torch.Tensor) and value.numel() > 1 for value in (lr, eps))
            tensors: list[list[torch.Tensor]] = [[], [], [], [], [], []]  # params, grads, moments, max, steps
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                whole = p[0].numel() % 64 == 0 and not own
                if not state:
                    state["step"] = torch.zeros(() if whole else self.seeds, dtype=torch.float32, device=p.device)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(p)
                parts = (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"), state["step"])
                for out, part in zip(tensors, parts, strict=True):
                    if part is not None:
                        out.extend([part] if whole else part.unbind(0))
            beta1, beta2 = group["betas"]
            options = dict(fused=group["fused"], capturable=group["capturable"], amsgrad=amsgrad, beta1=beta1,
                           beta2=beta2, weight_decay=group["weight_decay"], maximize=group["maximize"],
                           decoupled_weight_decay=group.get("decoupled_weight_decay", False))
            if not own:
                adam_step(*tensors, lr=lr, eps=eps, **options)
                continue
            for i in range(self.seeds):  # seed i's rows are every seeds-th tensor of each list
                # A float64 lr or eps: each seed's number, as a lone run passes it; a float32 lr: its tensor's row.
                lr_i = lr.view(-1)[i] if isinstance(lr, torch.Tensor) and lr.numel() > 1 else lr
                lr_i = float(lr_i) if isinstance(lr_i, torch.Tensor) and lr_i.dtype == torch.float64 else lr_i
                eps_i = float(eps.view(-1)[i]) if isinstance(eps, torch.Tensor) else eps
                adam_step(*[part[i::self.seeds] for part in tensors], lr=lr_i, eps=eps_i, **options)
        return loss


def adam(parameters: Iterable[torch.Tensor], seeds: int = 1, **kwargs) -> torch.optim.Adam:
    """torch.optim.Adam(parameters, fused=True, **kwargs); a pack's: SeedAdam, each seed stepped as alone."""
    return torch.optim.Adam(parameters, fused=True, **kwargs) if seeds == 1 else \
        SeedAdam(parameters, seeds, fused=True, **kwargs)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float | torch.Tensor, seeds: int = 1) -> torch.Tensor:
    """nn.utils.clip_grad_norm_ for each seed on its own (row i of every .grad of a pack), since a norm over the
    stack would couple the seeds; max_norm is one number, or one per seed ([seeds, 1]); returns the norms before
    clipping ([seeds], or a 0-d tensor for one seed). Each norm is taken of each seed's own rows, as contiguous
    tensors of the plain network's shapes (a reduction over the rows of a [seeds, n] tensor may add in another
    order), so a seed clips as it would alone."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:  # as nn.utils.clip_grad_norm_: nothing to clip, a norm of 0
        return torch.zeros(()) if seeds == 1 else torch.zeros(seeds)
    if seeds == 1:
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, _clip_scale(max_norm, norm))
        return norm
    rows = [row for grad in grads for row in grad.unbind(0)]  # parameter by parameter
    norms = torch.stack(torch._foreach_norm(rows)).view(-1, seeds).T.contiguous()  # [seeds, parameters]
    norms = torch.linalg.vector_norm(norms, dim=1)
    if isinstance(max_norm, torch.Tensor):  # one per seed, [seeds, 1]: in the norms' dtype, as a number would be
        max_norm = max_norm.to(norms.device, norms.dtype).view(-1)
    scale = _clip_scale(max_norm, norms)
    for grad in grads:
        grad.mul_(scale.view(-1, *[1] * (grad.dim() - 1)))
    return norms


def _clip_scale(max_norm: float | torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """min(1, max_norm / (norm + 1e-6)), rounded alike for a number and a tensor of max norms: torch computes a
    number over a tensor as the tensor's reciprocal times the number, and a true division of two tensors differs
    from that in the last bit about a quarter of the time."""
    return ((norm + 1e-6).reciprocal() * max_norm).clamp(max=1.0)


def members_state(optimizer: torch.optim.Optimizer, state: dict, rows: list[int]) -> dict:
    """An optimizer's state_dict of a pack cut to the seeds `rows`, for `optimizer` as built for them (SeedAdam, or
    torch's Adam for one seed; see cut.py): each seed's moments in the shape of its parameters here, the step count
    (the seeds step together) 0-d or one per seed as SeedAdam.step keeps it, and lr and eps in the form this optimizer
    holds them: one per seed, or the one value the seeds kept share."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    seeds = getattr(optimizer, "seeds", 1)
    own = seeds > 1 and any(isinstance(group[key], torch.Tensor) and group[key].numel() > 1
                            for group in optimizer.param_groups for key in ("lr", "eps"))
    moments = {}
    for index, saved in state["state"].items():
        p, moments[index] = params[index], {}
        for key, value in saved.items():
            if key == "step":  # every seed has taken as many steps
                step = value.reshape(-1)[rows[0] if value.numel() > 1 else 0].clone()
                whole = seeds == 1 or p[0].numel() % 64 == 0 and not own
                moments[index][key] = step if whole else step.expand(seeds).clone()
            else:
                moments[index][key] = value[rows].reshape(p.shape).clone()
    groups = [dict(saved, **{key: _setting_rows(saved[key], group[key], rows) for key in ("lr", "eps")})
              for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True)]
    return {"state": moments, "param_groups": groups}


def _setting_rows(saved, fresh, rows: list[int]):
    """A group's lr or eps: per seed in a pack ([seeds, 1]), cut to `rows`, in the form the fresh optimizer holds."""
    if not (isinstance(saved, torch.Tensor) and saved.numel() > 1):
        return saved  # the pack's seeds shared it
    kept = saved.reshape(-1)[rows]
    if isinstance(fresh, torch.Tensor) and fresh.numel() > 1:
        return kept.reshape(fresh.shape).clone()
    if not bool((kept == kept[0]).all()):
        raise ValueError(f"the seeds kept have other values {kept.tolist()} than the one the resumed run holds")
    return kept[0].clone().reshape(fresh.shape) if isinstance(fresh, torch.Tensor) else float(kept[0])
