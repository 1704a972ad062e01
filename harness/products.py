"""The stacked products of a pack: nn.Linear and nn.Conv2d of N seeds as one layer each, taking one row per seed.

- nn.Linear becomes SeedLinear, whose products (forward and backward) are the ones nn.Linear's autograd computes
  for each row; nn.Conv2d becomes SeedConv2d (the seeds as groups of one convolution). Both take one row per seed,
  and a frozen layer (requires_grad False) stays frozen.
- A product is batched over the seeds only where that gives each seed the bits of its own product (_batched: found
  once per shape, layout, dtype and thread count on the CPU), else computed seed by seed (_linear, _bmm).

They hold the arithmetic of a pack and nothing of its structure: seeds.py puts them in place of a network's
nn.Linear and nn.Conv2d (tests/test_harness.py checks each row against the layer alone).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class _SeedLinearProduct(torch.autograd.Function):
    """x [seeds, batch, in] @ weight[s].T (+ bias[s]), with nn.Linear's products per seed, in both directions."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # (ctx in forward, not setup_context: the latter binds the arguments with inspect at every call, 5x slower)
        ctx.save_for_backward(x, weight)
        ctx.bias = bias is not None
        return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        # The weight's gradient as grad^T x, the orientation nn.Linear's autograd uses; bmm's own backward
        # computes (x^T grad)^T, which rounds differently.
        needs = ctx.needs_input_grad  # a frozen layer's weight or bias (requires_grad False) gets none
        grad_x = _bmm(grad, weight) if needs[0] else None
        return grad_x, _bmm(grad.mT, x) if needs[1] else None, grad.sum(1) if ctx.bias and needs[2] else None


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Each seed's nn.Linear: batched where that gives each seed its own bits (see _batched), else seed by seed."""
    if _batched(x, weight.mT, bias):
        return torch.bmm(x, weight.mT) if bias is None else torch.baddbmm(bias.unsqueeze(1), x, weight.mT)
    if bias is None:
        return torch.stack([xs.clone().mm(w.clone().t()) for xs, w in zip(x, weight, strict=True)])
    rows = zip(x, weight, bias, strict=True)  # each seed's tensors as a lone run allocates them (aligned)
    return torch.stack([torch.addmm(b.clone(), xs.clone(), w.clone().t()) for xs, w, b in rows])


_BATCHED: dict[tuple, bool] = {}  # (shapes, layouts, dtype, bias, threads) -> whether the batched product is exact


def _batched(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether the batched product a @ b (+ bias) of [seeds, m, k] and [seeds, k, n] matrices gives each seed the bits
    of its own matrix product, as nn.Linear computes it alone on its own (aligned) tensors. On the CPU that depends
    on the shapes and on the kernels torch picks (a naive one under 400 multiply-adds, a matrix-vector one for one
    column, MKL's batched and single products, which round the edges of some shapes, and of rows that do not start
    on a 64-byte boundary, differently): it is found once per shape and layout by computing both on random
    matrices laid out as a and b, at the thread count of the moment (MKL splits a product among its threads: with 4
    it rounds shapes that it does not with 1). Otherwise one product per seed. On CUDA, and inside torch.compile,
    always batched (a seed in a pack is not claimed equal to it alone there)."""
    key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, bias is None, torch.get_num_threads())  # (cheap)
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


def _stacked_parameter(parameters: list[nn.Parameter]) -> nn.Parameter:
    """The seeds' parameters stacked [seeds, ...], frozen where they are (requires_grad as the first seed's)."""
    return nn.Parameter(torch.stack([p.detach() for p in parameters]), parameters[0].requires_grad)


class SeedLinear(nn.Module):
    """The nn.Linear of each seed of a pack: [seeds, ..., in] -> [seeds, ..., out] (with or without a bias)."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = _stacked_parameter([layer.weight for layer in layers])  # [seeds, out, in]
        self.bias = None if layers[0].bias is None else _stacked_parameter([layer.bias for layer in layers])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # a lone nn.Linear multiplies its input's leading dimensions as one batch too
        x = x.reshape(shape[0], -1, shape[-1]) if x.dim() != 3 else x
        if not torch.is_grad_enabled():  # acting, targets: no graph to record (saves the Function's overhead)
            y = _linear(x, self.weight, self.bias)
        else:
            y = _SeedLinearProduct.apply(x, self.weight, self.bias)
        return y if len(shape) == 3 else y.reshape(*shape[:-1], y.shape[-1])


class SeedConv2d(nn.Module):
    """The nn.Conv2d of each seed: [seeds, batch, C, H, W] in and out, the seeds as groups of one convolution (the
    layer's own groups within each seed's); stride, padding (any padding_mode), dilation and bias as the layer's."""

    def __init__(self, layers: list[nn.Conv2d]):
        super().__init__()
        c = layers[0]
        self.weight = _stacked_parameter([layer.weight for layer in layers])  # [seeds, out, in/g, ...]
        self.bias = None if c.bias is None else _stacked_parameter([layer.bias for layer in layers])
        self.stride, self.padding, self.dilation, self.groups = c.stride, c.padding, c.dilation, c.groups
        self.padding_mode, self.pad = c.padding_mode, c._reversed_padding_repeated_twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seeds = x.shape[0]
        x, padding = x.transpose(0, 1).flatten(1, 2), self.padding
        if self.padding_mode != "zeros":  # as nn.Conv2d pads: each channel on its own, then no padding
            x, padding = F.pad(x, self.pad, mode=self.padding_mode), 0
        x = F.conv2d(x, self.weight.flatten(0, 1), None if self.bias is None else self.bias.flatten(), self.stride,
                     padding, self.dilation, self.groups * seeds)
        return x.unflatten(1, (seeds, -1)).transpose(0, 1)
