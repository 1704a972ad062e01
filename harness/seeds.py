"""Packs of seeds: the plain networks of N seeds as one module whose tensors have a leading seed dimension.

    q_network = stacked(partial(QNetwork, obs_space, action_space), seeds)   # one seed: QNetwork itself
    q = q_network(obs)                            # a pack: obs [seeds, batch, ...] -> [seeds, batch, actions]
    model = seed_state_dict(q_network, i)         # seed i's state_dict, as the plain network's

Invariant (tests/test_seeds.py, test_harness.py and test_pack_layers.py check it on the CPU): row i of everything a
pack computes is, bit for bit, what seed i's plain network computes alone (convolutions: to float rounding). Each
seed's network is initialised under its own torch seed, as a lone run initialises it, then its layers are stacked:

- nn.Linear becomes SeedLinear and nn.Conv2d SeedConv2d, one row per seed (products.py: their exact products).
- Any other layer of torch.nn that holds parameters or buffers (nn.LayerNorm, nn.BatchNorm1d, nn.Embedding,
  nn.PReLU, nn.GRUCell, nn.MultiheadAttention, ...) keeps its class and gets its tensors stacked [seeds, ...]; its
  forward runs once per seed, on that seed's rows and tensors (its running statistics updated in its own row), so
  each seed computes exactly what it computes alone. Its tensor arguments (in tuples and lists too) are each seed's
  rows or shared by the seeds (a mask, positions), told apart by what the pack's first call with inputs of those
  ranks shows (_each_seed; first_call.py); a later call that check did not show a layer is refused.
  Containers (nn.Sequential, nn.ModuleList, nn.ModuleDict) are looked into.
- The parameters and buffers of the network's own modules (a bare nn.Parameter, a registered buffer, an
  nn.ParameterList or nn.ParameterDict) get a seed dimension and a batch dimension of 1, [seeds, 1, ...], so they
  broadcast over [seeds, batch, ...] as alone over [batch, ...]: use them over one batch dimension in front of
  their own (a layer that multiplies by its own matrix belongs in a torch.nn layer).
- Refused at start, with the layer's name, type and why: what kinds.py's _unstackable names, and tied parameters.
- Refused at the first call (and the first with inputs of other ranks), before it computes: a pack whose modules
  compute otherwise than each seed alone (first_call.py).

The plain modules need no change beyond working on any leading dimensions (nn.Flatten(-3), not Flatten(1)).
A pack's parts, one module each: products.py (SeedLinear, SeedConv2d), kinds.py (the kinds of module, PackError),
first_call.py (the check), this file (stacking a network, the per-seed path), optim.py (SeedAdam, clip_grad_norm).
docs/packs.md lists what a pack supports and how fast each path is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import NoReturn

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map, tree_unflatten

from .first_call import _arguments, _first_call_hook, _tensor_ranks
from .kinds import OWN, _is_torch_layer, _pack_error, _unstackable
from .products import SeedConv2d, SeedLinear


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
