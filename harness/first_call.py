"""The first call of a pack: each seed as alone, or refused.

Before a pack's first call with inputs of ranks no call had before computes (_first_call_hook, which seeds.stacked
registers on every pack), _first_call runs each seed's plain network alone on its rows, then the pack on the same
inputs, in eval mode, without gradients, on copies of the tensors made distinct per seed:

- what each per-seed layer gets alone (_recorded, _Seen: the ranks of its arguments, _arguments) tells seeds.py's
  _each_seed which of its tensor arguments (in tuples and lists too) are each seed's rows and which are shared by
  the seeds (a mask, positions); a later call that check did not show a layer is refused;
- a pack whose modules compute otherwise than each seed alone (a 0-d temperature over [batch, actions], a shared
  tensor into nn.Linear) is refused before it computes, in one line naming the first module whose output differs
  from its seeds' alone (_difference), its type and why (_why).

A module of its own because it is the pack's check, not its computation: it runs once per kind of call, and the
pack computes the same without it whenever the check passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import chain

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .kinds import OWN, PackError, _is_torch_layer


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
    # Without the CPU's bf16 autocast: its rounding (and a layout of a seed's own alone: precision.pixels) is coarser
    # than the check's tolerance, and the check is of which tensors are each seed's, not of a number format.
    with torch.random.fork_rng(devices=[]), torch.no_grad(), _evaluating(pack), _evaluating(template), \
            torch.autocast("cpu", enabled=False):
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
