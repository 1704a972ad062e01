"""What a pack makes of each kind of module, and what it refuses at start. Both the stacking (seeds.py) and the
first call's check (first_call.py) tell these kinds apart; held here, below both, seeds.py imports first_call.py
without a cycle.

- A layer of torch.nn or a subclass of one (_is_torch_layer): nn.Linear and nn.Conv2d become SeedLinear and
  SeedConv2d (products.py); any other that holds tensors runs once per seed (seeds.py).
- A container (CONTAINERS: nn.Sequential, nn.ModuleList, nn.ModuleDict) is looked into.
- An nn.ParameterList or nn.ParameterDict (OWN) holds tensors of the module holding it, as that module's own.
- Refused at start, with the layer's name, type and why (_unstackable): recurrent layers (nn.RNN, nn.LSTM, nn.GRU
  keep flat copies of their weights), lazy layers, parametrized layers (torch.nn.utils.parametrize), modules with
  hooks (the hook-based spectral_norm and weight_norm), embeddings with max_norm. (Tied parameters are
  refused by seeds.stacked, which sees the whole network.)

Every refusal, at start or at the first call, is one line given to the pack's `refuse`: by default raised as a
PackError (_pack_error).
"""

from __future__ import annotations

from typing import NoReturn

import torch
import torch.nn as nn


class PackError(ValueError):
    """A network a pack cannot hold, or one its first call showed computing a seed otherwise than alone."""


def _pack_error(message: str) -> NoReturn:
    raise PackError(message)


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
