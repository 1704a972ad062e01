"""Packs of seeds: the plain networks of N seeds as one module whose parameters have a leading seed dimension.

    q_network = stacked(partial(QNetwork, obs_space, action_space), seeds)   # one seed: QNetwork itself
    q = q_network(obs)                            # a pack: obs [seeds, batch, ...] -> [seeds, batch, actions]
    grad_norm = clip_grad_norm(q_network.parameters(), max_norm, len(seeds))  # each seed's own norm
    model = seed_state_dict(q_network, i)         # seed i's state_dict, as the plain network's

Invariant (tests/test_seeds.py checks it on the CPU): row i of everything a pack computes is, bit for bit, what
seed i's plain network computes alone. Each seed's network is initialised under its own torch seed, as a lone
run initialises it; nn.Linear becomes SeedLinear, whose products (forward and backward) are the ones
nn.Linear's autograd computes for each row; nn.Conv2d becomes SeedConv2d (the seeds as groups of one
convolution); buffers get a seed dimension and a batch dimension of 1, so they broadcast over [seeds, batch, ...].
The plain modules need no change beyond working on any leading dimensions (nn.Flatten(-3), not Flatten(1)).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.adam import adam as adam_step


class _SeedLinearProduct(torch.autograd.Function):
    """x [seeds, batch, in] @ weight[s].T + bias[s], with nn.Linear's products per seed, in both directions."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # (ctx in forward, not setup_context: the latter binds the arguments with inspect at every call, 5x slower)
        ctx.save_for_backward(x, weight)
        return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        # The weight's gradient as grad^T x, the orientation nn.Linear's autograd uses; bmm's own backward
        # computes (x^T grad)^T, which rounds differently.
        grad_x = _bmm(grad, weight) if ctx.needs_input_grad[0] else None
        return grad_x, _bmm(grad.mT, x), grad.sum(1)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Each seed's nn.Linear: batched where that gives each seed its own bits (see _batched), else seed by seed."""
    if _batched(x, weight.mT, bias):
        return torch.baddbmm(bias.unsqueeze(1), x, weight.mT)
    rows = zip(x, weight, bias, strict=True)  # each seed's tensors as a lone run allocates them (aligned)
    return torch.stack([torch.addmm(b.clone(), xs.clone(), w.clone().t()) for xs, w, b in rows])


_BATCHED: dict[tuple, bool] = {}  # (shapes, layouts, dtype, with a bias) -> whether the batched product is exact


def _batched(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether the batched product a @ b (+ bias) of [seeds, m, k] and [seeds, k, n] matrices gives each seed the bits
    of its own matrix product, as nn.Linear computes it alone on its own (aligned) tensors. On the CPU that depends
    on the shapes and on the kernels torch picks (a naive one under 400 multiply-adds, a matrix-vector one for one
    column, MKL's batched and single products, which round the edges of some shapes, and of rows that do not start
    on a 64-byte boundary, differently): it is found once per shape and layout by computing both on random
    matrices laid out as a and b. Otherwise one product per seed. On CUDA, and inside torch.compile, always batched
    (a seed in a pack is not claimed equal to it alone there)."""
    key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, bias is None)  # (cheap: this runs at every product)
    if key in _BATCHED:
        return _BATCHED[key]
    if a.device.type != "cpu" or torch.compiler.is_compiling():
        return True
    if a.shape[1] * a.shape[2] * b.shape[2] < 400:  # torch's naive kernel, whose order varies with the values
        _BATCHED[key] = False
    else:
        probe = torch.Generator().manual_seed(0)

        def like(x: torch.Tensor) -> torch.Tensor:  # random values in x's exact layout (strides decide the kernel)
            storage = 1 + sum((n - 1) * stride for n, stride in zip(x.shape, x.stride(), strict=True))
            return torch.randn(storage, generator=probe, dtype=x.dtype).as_strided(x.shape, x.stride())

        pa, pb, pbias = like(a), like(b), torch.randn(a.shape[0], b.shape[2], generator=probe, dtype=a.dtype)
        batched = torch.baddbmm(pbias.unsqueeze(1), pa, pb) if bias is not None else pa.bmm(pb)
        alone = [torch.addmm(pbias[i].clone(), pa[i].clone(), pb[i].clone()) if bias is not None else
                 pa[i].clone().mm(pb[i].clone()) for i in range(a.shape[0])]  # clones: a lone run's own allocations
        _BATCHED[key] = all(torch.equal(batched[i], alone[i]) for i in range(a.shape[0]))
    return _BATCHED[key]


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b per seed, as each seed's own matrix product would compute it."""
    return a.bmm(b) if _batched(a, b) else torch.stack([x.clone().mm(y.clone()) for x, y in zip(a, b, strict=True)])


class SeedLinear(nn.Module):
    """The nn.Linear of each seed of a pack: [seeds, batch, in] -> [seeds, batch, out]."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))  # [seeds, out, in]
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))  # [seeds, out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # acting, targets: no graph to record (saves the Function's overhead)
            return _linear(x, self.weight, self.bias)
        return _SeedLinearProduct.apply(x, self.weight, self.bias)


class SeedConv2d(nn.Module):
    """The nn.Conv2d of each seed: [seeds, batch, C, H, W] in and out, the seeds as groups of one convolution."""

    def __init__(self, layers: list[nn.Conv2d]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))  # [seeds, out, in, k, k]
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))
        self.stride, self.padding = layers[0].stride, layers[0].padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seeds = x.shape[0]
        x = F.conv2d(x.transpose(0, 1).flatten(1, 2), self.weight.flatten(0, 1), self.bias.flatten(), self.stride,
                     self.padding, groups=seeds)
        return x.unflatten(1, (seeds, -1)).transpose(0, 1)


def seeded(make: Callable[[], nn.Module], seed: int) -> nn.Module:
    """make() under torch seed `seed`, leaving the global generator as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def stacked(make: Callable[[], nn.Module], seeds: list[int]) -> nn.Module:
    """make() for one seed, initialised under that torch seed; for several, each seed's make() stacked into one
    module (see the module docstring). `seed_shapes` on a stacked module maps each tensor of its state_dict to
    its shape in the plain network."""
    networks = [seeded(make, seed) for seed in seeds]
    if len(networks) == 1:
        return networks[0]
    pack = networks[0]
    plain = {name: tensor.shape for name, tensor in pack.state_dict().items()}
    for name, layer in list(pack.named_modules()):
        if type(layer) in (nn.Linear, nn.Conv2d):
            if layer.bias is None:
                raise ValueError(f"{name}: a layer without a bias cannot be stacked")
            seed_layer = SeedLinear if isinstance(layer, nn.Linear) else SeedConv2d
            pack.set_submodule(name, seed_layer([network.get_submodule(name) for network in networks]))
        elif isinstance(layer, nn.Conv1d | nn.Conv3d | nn.ConvTranspose2d | nn.Bilinear | nn.RNNBase | nn.BatchNorm2d):
            raise ValueError(f"{name}: {type(layer).__name__} layers cannot be stacked on a seed dimension")
    for name, _ in list(pack.named_buffers()):
        module_name, _, buffer_name = name.rpartition(".")
        module = pack.get_submodule(module_name)
        stack = torch.stack([network.get_buffer(name) for network in networks]).unsqueeze(1)
        module.register_buffer(buffer_name, stack)
    pack.seed_shapes = plain
    return pack


def seed_state_dict(network: nn.Module, i: int) -> dict[str, torch.Tensor]:
    """Seed i's state_dict of a `stacked` module, shaped as the plain network's (one seed: the state_dict),
    cloned: a view of a stacked tensor would save the whole stack."""
    state = network.state_dict()
    shapes = getattr(network, "seed_shapes", None)
    if shapes is None:
        return state
    return {name: tensor[i].reshape(shapes[name]).clone() for name, tensor in state.items()}


class SeedAdam(torch.optim.Adam):
    """torch.optim.Adam (fused) over a pack's stacked parameters that steps each seed as a lone run's Adam would.

    The fused CPU kernel computes the last (numel % vector width) entries of a tensor with scalar code that rounds
    differently from its vector lanes, so a small tensor (an output layer's bias: [actions] alone, [seeds, actions]
    stacked) would not be stepped as alone. A parameter whose per-seed size is a multiple of 64 is stepped whole
    (each seed's entries fall on the same lanes as alone); any other is stepped as one tensor per seed (its rows,
    views of it): bit for bit what Adam does to each seed's plain network.
    """

    def __init__(self, params, seeds: int, **kwargs):
        super().__init__(params, **kwargs)
        self.seeds = seeds

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            tensors: list[list[torch.Tensor]] = [[], [], [], [], []]  # params, grads, exp_avgs, exp_avg_sqs, steps
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                whole = p[0].numel() % 64 == 0
                if not state:
                    state["step"] = torch.zeros(() if whole else self.seeds, dtype=torch.float32, device=p.device)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                parts = (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
                for out, part in zip(tensors, parts, strict=True):
                    out.extend([part] if whole else part.unbind(0))
            beta1, beta2 = group["betas"]
            adam_step(*tensors[:4], [], tensors[4], fused=group["fused"], capturable=group["capturable"],
                      amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                      eps=group["eps"], maximize=group["maximize"])


def adam(parameters: Iterable[torch.Tensor], seeds: int = 1, **kwargs) -> torch.optim.Adam:
    """torch.optim.Adam(parameters, fused=True, **kwargs); a pack's: SeedAdam, each seed stepped as alone."""
    return torch.optim.Adam(parameters, fused=True, **kwargs) if seeds == 1 else \
        SeedAdam(parameters, seeds, fused=True, **kwargs)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, seeds: int = 1) -> torch.Tensor:
    """nn.utils.clip_grad_norm_ for each seed on its own (row i of every .grad of a pack), since a norm over the
    stack would couple the seeds; returns the norms before clipping ([seeds], or a 0-d tensor for one seed).
    Each norm is taken of each seed's own rows, as contiguous tensors of the plain network's shapes (a reduction
    over the rows of a [seeds, n] tensor may add in another order), so a seed clips as it would alone."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if seeds == 1:
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm
    rows = [row for grad in grads for row in grad.unbind(0)]  # parameter by parameter
    norms = torch.stack(torch._foreach_norm(rows)).view(-1, seeds).T.contiguous()  # [seeds, parameters]
    norms = torch.linalg.vector_norm(norms, dim=1)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(scale.view(-1, *[1] * (grad.dim() - 1)))
    return norms
