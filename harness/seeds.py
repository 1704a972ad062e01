"""Packs of seeds: the plain networks of N seeds as one module whose tensors have a leading seed dimension.

    q_network = stacked(partial(QNetwork, obs_space, action_space), seeds)   # one seed: QNetwork itself
    q = q_network(obs)                            # a pack: obs [seeds, batch, ...] -> [seeds, batch, actions]
    grad_norm = clip_grad_norm(q_network.parameters(), max_norm, len(seeds))  # each seed's own norm
    model = seed_state_dict(q_network, i)         # seed i's state_dict, as the plain network's

Invariant (tests/test_seeds.py, test_harness.py and test_pack_layers.py check it on the CPU): row i of everything a
pack computes is, bit for bit, what seed i's plain network computes alone (convolutions: to float rounding). Each
seed's network is initialised under its own torch seed, as a lone run initialises it, then its layers are stacked:

- nn.Linear becomes SeedLinear, whose products (forward and backward) are the ones nn.Linear's autograd computes
  for each row; nn.Conv2d becomes SeedConv2d (the seeds as groups of one convolution). Both take one row per seed,
  and a frozen layer (requires_grad False) stays frozen.
- Any other layer of torch.nn that holds parameters or buffers (nn.LayerNorm, nn.BatchNorm1d, nn.Embedding,
  nn.PReLU, nn.GRUCell, nn.MultiheadAttention, ...) keeps its class and gets its tensors stacked [seeds, ...]; its
  forward runs once per seed, on that seed's rows and tensors (its running statistics updated in its own row), so
  each seed computes exactly what it computes alone. Its tensor arguments (in tuples and lists too) are each seed's
  rows or shared by the seeds (a mask, positions), told apart by what the pack's first call with inputs of those
  ranks shows (_each_seed); a later call that check did not show a layer is refused.
  Containers (nn.Sequential, nn.ModuleList, nn.ModuleDict) are looked into.
- The parameters and buffers of the network's own modules (a bare nn.Parameter, a registered buffer, an
  nn.ParameterList or nn.ParameterDict) get a seed dimension and a batch dimension of 1, [seeds, 1, ...], so they
  broadcast over [seeds, batch, ...] as alone over [batch, ...]: use them over one batch dimension in front of
  their own (a layer that multiplies by its own matrix belongs in a torch.nn layer).
- Refused at start, with the layer's name, type and why (_unstackable): recurrent layers (nn.RNN, nn.LSTM, nn.GRU
  keep flat copies of their weights), lazy layers, parametrized layers (torch.nn.utils.parametrize), modules with
  hooks (the hook-based spectral_norm and weight_norm), embeddings with max_norm, and tied parameters.
- Refused at the first call (and the first with inputs of other ranks), before it computes (_first_call): a pack
  whose modules compute otherwise than each seed alone (a 0-d temperature over [batch, actions], a shared tensor
  into nn.Linear), found by running each seed's plain network on its rows and the pack on the same inputs.

The plain modules need no change beyond working on any leading dimensions (nn.Flatten(-3), not Flatten(1)).
docs/packs.md lists what a pack supports and how fast each path is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import NoReturn

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.adam import adam as adam_step
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten


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


class PackError(ValueError):
    """A network a pack cannot hold, or one its first call showed computing a seed otherwise than alone."""


def _pack_error(message: str) -> NoReturn:
    raise PackError(message)


def _each_seed(module: nn.Module, plain: nn.Module, *inputs, **options):
    """A layer's forward in a pack: once per seed, `plain` (the layer on the meta device) given that seed's rows of
    the inputs and of the layer's stacked tensors. Parameters and inputs go in as a lone run allocates them (a row
    that does not start on a 64-byte boundary as a copy: some kernels round such rows differently), with their
    gradients flowing back into the stack; buffers as views, so a running statistic is updated in its seed's row.

    Which tensor arguments (positional, keyword, in tuples and lists) are per seed is what the pack's first call with
    inputs of these ranks showed (_first_call): with one dimension more than the layer gets alone, a seed's rows
    [seeds, ...]; with two more, a seed's value without a batch [seeds, 1, ...]; with as many, shared by all seeds (a
    mask, positions) and given whole to each. A layer given no batched rows returns its seeds' outputs without a
    batch, [seeds, 1, ...], so that they broadcast over [seeds, batch, ...] as the output alone broadcasts over
    [batch, ...]. A call that check did not show (other arguments, None where it saw a tensor, tensors of other
    ranks) is refused: which of its tensors are per seed cannot be told."""
    if plain.training != module.training:
        plain.train(module.training)
    leaves, spec, key, ranks = _arguments(inputs, options)
    known = module._seed_ranks.get(key)
    if known is None:
        module._seed_refuse(f"{module._seed_path} ({type(module).__name__}): called with other arguments than at the "
                            "pack's first call with inputs of these ranks, so which of its tensors are per seed is not "
                            "known (docs/packs.md)")
    if known.open:  # the check's own run of the pack: what this layer gets in it
        known.pack.add(ranks)
    elif ranks not in known.pack:
        shown = " or ".join(str(_tensor_ranks(r)) for r in sorted(known.pack, key=_tensor_ranks))
        module._seed_refuse(f"{module._seed_path} ({type(module).__name__}): called with tensors of ranks "
                            f"{_tensor_ranks(ranks)} where the pack's first call with inputs of these ranks gave it "
                            f"{shown}, so which of its tensors are per seed cannot be told (docs/packs.md)")
    slots = [(getattr(plain_sub, kind), name, kind == "_parameters", value.unbind(0))
             for sub, plain_sub in zip(module.modules(), plain.modules(), strict=True)
             for kind in ("_parameters", "_buffers") for name, value in getattr(sub, kind).items() if value is not None]
    seeds = len(slots[0][3])
    extra = [None if rank is None else x.dim() - rank for x, rank in zip(leaves, known.alone, strict=True)]
    for j, (x, more) in enumerate(zip(leaves, extra, strict=True)):
        if more not in (None, 0) and (more not in (1, 2) or x.shape[:more] != (seeds, 1)[:more]):
            module._seed_refuse(f"{module._seed_path} ({type(module).__name__}): its tensor argument {j} has shape "
                                f"{list(x.shape)} in a pack of {seeds} seeds and {x.dim() - more} dimensions alone: "
                                "neither shared nor one row per seed (docs/packs.md)")
    outputs = []
    for i in range(seeds):
        for tensors, name, parameter, rows in slots:
            tensors[name] = _aligned(rows[i]) if parameter else rows[i]
        copies: dict[int, torch.Tensor] = {}  # one row per input tensor (a layer may check `query is key`)
        for x, more in zip(leaves, extra, strict=True):
            if more and id(x) not in copies:
                copies[id(x)] = _aligned(x[i] if more == 1 else x[i, 0])
        args, kwargs = tree_unflatten([copies[id(x)] if more else x for x, more in zip(leaves, extra, strict=True)],
                                      spec)
        outputs.append(plain(*args, **kwargs))
    out = _stack_outputs(outputs)
    batched = 1 in extra
    return out if batched else tree_map(lambda x: x.unsqueeze(1) if isinstance(x, torch.Tensor) else x, out)


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x, or a contiguous copy of it where it is not contiguous or does not start on a 64-byte boundary."""
    return x if x.is_contiguous() and x.data_ptr() % 64 == 0 else x.clone(memory_format=torch.contiguous_format)


def _stack_outputs(outputs: list):
    """The seeds' outputs stacked on a leading dimension: tensors, and tuples or lists of them (None stays None)."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(outputs)
    if isinstance(first, tuple | list):
        return type(first)(_stack_outputs(list(parts)) for parts in zip(*outputs, strict=True))
    return first


def _per_seed(layer: nn.Module, copies: list[nn.Module], path: str, refuse: Callable) -> nn.Module:
    """`layer` (copies[0]) with every tensor it holds stacked from the seeds' copies, [seeds, ...], and a forward
    that runs once per seed (_each_seed)."""
    plain = copy.deepcopy(layer).to("meta")  # the layer's code and settings; its tensors are replaced at each call
    for sub, subs in zip(layer.modules(), zip(*(c.modules() for c in copies), strict=True), strict=True):
        _stack_own(sub, list(subs), batch=False)
    layer.forward = partial(_each_seed, layer, plain)  # the instance's forward; the class's stays the plain one
    layer._seed_path, layer._seed_refuse, layer._seed_ranks = path or "the network", refuse, {}
    return layer


CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
OWN = (nn.ParameterList, nn.ParameterDict)  # tensors of the module holding them, as its own


def _is_torch_layer(module: nn.Module) -> bool:
    """A layer of torch.nn, or a subclass of one (not a container, not a plain nn.Module of the user's)."""
    return any(cls.__module__.startswith("torch.nn") for cls in type(module).__mro__
               if cls not in (nn.Module, object, *CONTAINERS))


def _unstackable(module: nn.Module) -> str | None:
    """Why a pack cannot stack `module`, or None."""
    if isinstance(module, nn.RNNBase):
        return ("recurrent layers keep flat copies of their weights, which cannot be stacked on a seed dimension: "
                "use nn.RNNCell, nn.LSTMCell or nn.GRUCell in a loop")
    if isinstance(module, nn.modules.lazy.LazyModuleMixin):
        return "a lazy layer has no tensors to stack before its first call: give it its sizes"
    if torch.nn.utils.parametrize.is_parametrized(module):
        return ("a parametrized layer (torch.nn.utils.parametrizations: weight_norm, spectral_norm, ...) computes "
                "its weight from other tensors at each call, which a pack would not")
    hooks = [hook for hooks in (module._forward_pre_hooks, module._forward_hooks, module._backward_pre_hooks,
                                module._backward_hooks) for hook in hooks.values()]
    if hooks:
        names = ", ".join(sorted({getattr(hook, "__name__", type(hook).__name__) for hook in hooks}))
        return (f"its hooks ({names}; the hook-based torch.nn.utils.spectral_norm and weight_norm are such) would "
                "run on the pack's stacked tensors, not on each seed's, or be dropped with the layer")
    if isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.max_norm is not None:
        return ("max_norm renormalises the embedding's weight in place at each call, which a pack cannot do in "
                "each seed's row: drop max_norm, or renormalise in the network's forward")
    return None


def _stacked_layer(module: nn.Module, copies: list[nn.Module], path: str, refuse: Callable) -> nn.Module:
    """`module` (copies[0]) as the pack's: its layers replaced or stacked, its own tensors [seeds, 1, ...]."""
    if type(module) is nn.Linear:
        return SeedLinear(copies)
    if type(module) is nn.Conv2d:
        return SeedConv2d(copies)
    if isinstance(module, OWN):
        _stack_own(module, copies, batch=True)
        return module
    if _is_torch_layer(module):
        has_state = any(True for _ in module.parameters()) or any(True for _ in module.buffers())
        return _per_seed(module, copies, path, refuse) if has_state else module
    for child_name, child in list(module.named_children()):
        module._modules[child_name] = _stacked_layer(child, [c.get_submodule(child_name) for c in copies],
                                                     f"{path}.{child_name}" if path else child_name, refuse)
    _stack_own(module, copies, batch=True)  # the user's own tensors: they broadcast over the batch
    return module


def _stack_own(module: nn.Module, copies: list[nn.Module], batch: bool) -> None:
    """The module's own parameters and buffers replaced by the copies' stacked, [seeds, ...] ([seeds, 1, ...] with
    `batch`), parameters as parameters."""
    for kind in ("_parameters", "_buffers"):
        for name, value in list(getattr(module, kind).items()):
            if value is not None:
                stack = torch.stack([getattr(c, kind)[name].detach() for c in copies])
                stack = stack.unsqueeze(1) if batch else stack
                getattr(module, kind)[name] = nn.Parameter(stack, value.requires_grad) if kind == "_parameters" \
                    else stack


# ---- the first call: each seed as alone, or refused ---------------------------------------------------------


def _first_call_hook(pack: nn.Module, args: tuple, kwargs: dict) -> None:
    """Before each call of the pack: inputs of ranks no call had before are checked first (_first_call), and the
    per-seed layers are given what the check of inputs of these ranks showed them (a [seeds, batch, time, n] input
    and a [seeds, batch, n] one may give a layer a seed's rows where the other gives it a shared tensor)."""
    if pack._seed_checking:
        return  # the check's own call of the pack
    signature = _signature(args, kwargs)
    if signature == pack._seed_signature:
        return
    pack._seed_signature = None  # until the layers hold this signature's ranks (a refused check leaves them not)
    if signature not in pack._seed_known:
        pack._seed_checking = True
        try:
            pack._seed_known[signature] = _first_call(pack, args, kwargs)  # refused: the next call is checked again
        finally:
            pack._seed_checking = False
    for path, layer in pack._seed_layers.items():
        layer._seed_ranks = pack._seed_known[signature].get(path, {})
    pack._seed_signature = signature


def _arguments(args: tuple, kwargs: dict) -> tuple[list, object, tuple, tuple]:
    """A call's arguments as the checks see them: the leaves, their structure, the key a layer's ranks are kept by
    (the structure and which leaves are tensors: None for an optional tensor is another call than a tensor) and each
    leaf's rank (None where it is not a tensor)."""
    leaves, spec = tree_flatten((args, kwargs))
    ranks = tuple(x.dim() if isinstance(x, torch.Tensor) else None for x in leaves)
    return leaves, spec, (spec, tuple(rank is not None for rank in ranks)), ranks


def _tensor_ranks(ranks: tuple) -> list[int]:
    return [rank for rank in ranks if rank is not None]


@dataclass
class _Seen:
    """What a pack's check showed a per-seed layer for one kind of call (see _arguments): the ranks of its
    arguments alone, and those it got in the pack (added by the check's own run of the pack while `open`)."""

    alone: tuple
    pack: set[tuple] = field(default_factory=set)
    open: bool = True


def _signature(args: tuple, kwargs: dict) -> tuple:
    """What tells a pack's calls apart for the check: its inputs' structure and their ranks (a call of tensors
    alone, as the files make, cheaply: the pack's every call computes it)."""
    if not kwargs and all(isinstance(x, torch.Tensor) for x in args):
        return tuple(x.dim() for x in args)
    _, spec, _, ranks = _arguments(args, kwargs)
    return spec, ranks


@torch.compiler.disable  # eagerly, once per signature, even where the call is inside a compiled update
def _first_call(pack: nn.Module, args: tuple, kwargs: dict) -> dict[str, dict]:
    """Before the pack's first call with inputs of these ranks computes: each seed's plain network runs alone on
    its rows, which shows what every per-seed layer gets alone (_each_seed's shared and per-seed tensors), then the
    pack runs on the same inputs, and each module's output must be, row by row, each seed's alone (to float
    rounding), else the pack is refused in one line naming the first module that differs. Both run in eval mode,
    without gradients, on copies of the tensors made distinct per seed (seeds initialised alike, a temperature of 1,
    would hide a mix of seeds), so nothing of the pack's state changes. Returns what each per-seed layer got, by
    its path: {key: _Seen}."""
    seeds, template, refuse = len(pack._seed_list), pack.__dict__["_seed_plain"], pack._seed_refuse
    leaves, spec = tree_flatten((args, kwargs))
    for x in leaves:
        if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[0] != seeds):
            refuse(f"the network ({type(template).__name__}): an input of shape {list(x.shape)} in a pack of {seeds} "
                   "seeds, whose inputs are one row per seed, [seeds, ...] (docs/packs.md)")
    shapes = {name: t.shape for name, t in chain(template.named_parameters(), template.named_buffers())}
    layers = pack._seed_layers
    with torch.random.fork_rng(devices=[]), torch.no_grad(), _evaluating(pack), _evaluating(template):
        probe = {name: _distinct(t) for name, t in chain(pack.named_parameters(), pack.named_buffers())}
        alone = []
        for i in range(seeds):
            rows = tree_unflatten([x[i] if isinstance(x, torch.Tensor) else x for x in leaves], spec)
            with _recorded(template, layers if i == 0 else {}, refuse) as outputs:
                torch.func.functional_call(template, {n: t[i].reshape(shapes[n]) for n, t in probe.items()}, *rows)
            alone.append(outputs)
        with _recorded(pack, {}, refuse) as outputs:
            try:
                torch.func.functional_call(pack, probe, args, kwargs)
            except PackError:
                raise
            except Exception as e:  # the innermost module that was running
                path = outputs.running[-1] if outputs.running else ""
                refuse(f"{_named(pack, path)}: fails in a pack of {seeds} seeds where each seed alone does not "
                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {_why(pack, path)}")
    calls: dict[str, int] = {}
    for path, out in outputs:
        k = calls[path] = calls.get(path, -1) + 1
        theirs = [[o for p, o in each if p == path][k:k + 1] for each in alone]
        difference = _difference(out, [o[0] for o in theirs], pack._seed_list, path == "") if all(theirs) else \
            "called more often than alone"
        if difference:
            refuse(f"{_named(pack, path)}: {difference} in a pack of {seeds} seeds; {_why(pack, path)}")
    for layer in layers.values():
        for seen in layer._seed_ranks.values():
            seen.open = False  # what a later call with inputs of these ranks is checked against
    return {path: layer._seed_ranks for path, layer in layers.items()}


class _Outputs(list):
    """(path, output) of each module's call, in the order the calls ended; `running`: the calls not ended."""

    running: list[str]


@contextmanager
def _recorded(network: nn.Module, layers: dict[str, nn.Module], refuse: Callable) -> Iterator[_Outputs]:
    """Hooks on every module of `network` recording its outputs; on those named in `layers` (the pack's per-seed
    layers), the ranks of the tensors they get alone, set as those layers' _seed_ranks ({key: _Seen}, the ranks in
    the pack left for the pack's own run to fill in)."""
    outputs, handles = _Outputs(), []
    outputs.running = []
    ranks: dict[str, dict] = {name: {} for name in layers}

    def before(path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        outputs.running.append(path)
        if path in layers:
            _, _, key, seen = _arguments(args, kwargs)
            if ranks[path].setdefault(key, _Seen(seen)).alone != seen:
                refuse(f"{path} ({type(module).__name__}): called twice with the same arguments of other ranks, so "
                       "which of its tensors are per seed cannot be told (docs/packs.md)")

    def after(path: str, module: nn.Module, args: tuple, output) -> None:
        outputs.running.pop()
        outputs.append((path, output))

    for path, module in network.named_modules():
        handles.append(module.register_forward_pre_hook(partial(before, path), with_kwargs=True))
        handles.append(module.register_forward_hook(partial(after, path)))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()
    for path, layer in layers.items():
        layer._seed_ranks = ranks[path]


@contextmanager
def _evaluating(network: nn.Module) -> Iterator[None]:
    """`network` in eval mode (no dropout, no running statistics updated), then each module's mode as it was."""
    modes = [(module, module.training) for module in network.modules()]
    network.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _distinct(x: torch.Tensor) -> torch.Tensor:
    """A copy of a stacked tensor [seeds, ...] whose seeds' rows differ (floating tensors; others as they are)."""
    if not x.is_floating_point():
        return x.clone()
    step = torch.arange(1, len(x) + 1, dtype=x.dtype, device=x.device).view(-1, *[1] * (x.dim() - 1)) / 16
    return x + (x.abs() + 1) * step


def _difference(pack, alone: list, seeds: list[int], root: bool) -> str | None:
    """How the pack's output differs from the seeds' outputs alone, or None: a tensor must be [seeds, *alone] (or,
    inside the network, [seeds, 1, *alone]: a value without a batch) with each row its seed's to float rounding."""
    leaves, spec = tree_flatten(pack)
    each = [tree_flatten(out) for out in alone]
    if any(other != spec for _, other in each):
        return f"its output is {spec} where each seed alone gives {each[0][1]}"
    for j, x in enumerate(leaves):
        if not isinstance(x, torch.Tensor):
            continue
        ys = [out[j] for out, _ in each]
        shape = list(ys[0].shape)
        if list(x.shape) != [len(ys), *shape] and (root or list(x.shape) != [len(ys), 1, *shape]):
            return f"its output has shape {list(x.shape)}, not {[len(ys), *shape]} (each seed alone: {shape})"
        for i, y in enumerate(ys):
            mine = x[i].reshape(y.shape)
            if not (torch.allclose(mine.double(), y.double(), rtol=1e-4, atol=1e-5 * max(1.0, y.abs().max().item()),
                                   equal_nan=True) if y.is_floating_point() else torch.equal(mine, y)):
                return f"seed {seeds[i]} computes otherwise than alone"
    return None


def _named(pack: nn.Module, path: str) -> str:
    """The module at `path` as a refusal names it: its path and the type it has in the plain network."""
    return f"{path or 'the network'} ({type(pack.__dict__['_seed_plain'].get_submodule(path)).__name__})"


def _why(pack: nn.Module, path: str) -> str:
    """Why a module may compute otherwise in a pack: its own tensors' shapes, where it holds any."""
    plain = pack.__dict__["_seed_plain"].get_submodule(path)
    own = [(name, tensor.shape) for name, tensor in chain(plain.named_parameters(recurse=False),
                                                            plain.named_buffers(recurse=False))]
    own += [(f"{child}.{name}", tensor.shape) for child, sub in plain.named_children() if isinstance(sub, OWN)
            for name, tensor in sub.named_parameters()]
    if type(plain) in (nn.Linear, nn.Conv2d):
        return (f"a pack's nn.{type(plain).__name__} takes one row per seed, [seeds, ...], not a tensor the seeds "
                "share (docs/packs.md)")
    if not own or _is_torch_layer(plain):
        return "docs/packs.md says what a pack supports"
    listed = ", ".join(f"{name} {list(shape)}" for name, shape in own)
    return (f"its own tensors ({listed}) are stacked [seeds, 1, *shape], which broadcast as alone over one batch "
            "dimension in front of their own (an [n] offset over [batch, n], a 0-d scale over [batch]): give each "
            "the shape it is used at (a scale of [batch, n]: [1] or [n]), or hold it in a torch.nn layer "
            "(docs/packs.md)")


def seeded(make: Callable[[], nn.Module], seed: int) -> nn.Module:
    """make() under torch seed `seed`, leaving the global generator as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def stacked(make: Callable[[], nn.Module], seeds: list[int], refuse: Callable[[str], NoReturn] = _pack_error
            ) -> nn.Module:
    """make() for one seed, initialised under that torch seed; for several, each seed's make() stacked into one
    module (see the module docstring). What a pack cannot hold is refused before anything runs, and what only a
    call shows at the pack's first call (_first_call), each with one line naming the module, its type and why,
    given to `refuse` (by default raised as a PackError). An error of make() itself is raised as it is.
    `seed_shapes` on a stacked module maps each tensor of its state_dict to its shape in the plain network."""
    networks = [seeded(make, seed) for seed in seeds]
    if len(networks) == 1:
        return networks[0]
    pack, owners = networks[0], {}
    for name, module in pack.named_modules(remove_duplicate=False):
        why = _unstackable(module)
        if why:
            refuse(f"{name or 'the network'} ({type(module).__name__}): {why} (docs/packs.md)")
        for tensor_name, tensor in list(module._parameters.items()) + list(module._buffers.items()):
            full = f"{name}.{tensor_name}" if name else tensor_name
            if tensor is not None and owners.setdefault(id(tensor), full) != full:
                refuse(f"{full} ({type(module).__name__}): tied to {owners[id(tensor)]}; tied or shared tensors "
                       "cannot be stacked on a seed dimension (docs/packs.md)")
    plain = {name: tensor.shape for name, tensor in pack.state_dict().items()}
    template = copy.deepcopy(pack).to("meta")  # the plain network, which _first_call runs on each seed's tensors
    pack = _stacked_layer(pack, networks, "", refuse)
    pack.seed_shapes = plain
    pack.__dict__["_seed_plain"] = template  # not a submodule: no tensors of its own in the pack's state_dict
    pack._seed_list, pack._seed_refuse = list(seeds), refuse
    pack._seed_layers = {name: m for name, m in pack.named_modules() if isinstance(m.__dict__.get("forward"), partial)}
    pack._seed_known, pack._seed_signature, pack._seed_checking = {}, None, False  # checks by input ranks
    pack.register_forward_pre_hook(_first_call_hook, with_kwargs=True)
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
