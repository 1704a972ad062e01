"""What a pack stacks (docs/packs.md, "What a pack stacks"), row by row: frozen layers stay frozen, a layer's tensor
arguments are told apart as per seed or shared by what the first call shows, a module's own tensors broadcast as
alone or are refused at the first call, nn.Dropout, and the one-line refusals of a run. Each network is compared
with its seeds' plain networks, stepped alone by torch.optim.Adam (inputs from torch seed 0, seeds 1-3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from harness import PackError, SeedAdam, seed_state_dict, stacked
from tests.algo_utils import load_algo, tiny_args

dqn = load_algo("dqn")
SEEDS = [1, 2, 3]


def first_tensor(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else first_tensor(out[0])


def assert_steps_as_alone(make, inputs: list[torch.Tensor], steps: int = 3, exact: bool = True) -> nn.Module:
    """`steps` Adam steps of the pack of SEEDS and of each seed's plain network on its rows of `inputs`: each seed's
    outputs and, at the end, its state_dict equal alone's (bit for bit, or with `exact` False to float rounding)."""
    pack, alone = stacked(make, SEEDS), [stacked(make, [seed]) for seed in SEEDS]
    trainable = [p for p in pack.parameters() if p.requires_grad]
    optimizer = SeedAdam(trainable, len(SEEDS), lr=1e-2, fused=True)
    lone = [torch.optim.Adam([p for p in network.parameters() if p.requires_grad], lr=1e-2, fused=True)
            for network in alone]
    same = torch.equal if exact else lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    for _ in range(steps):
        optimizer.zero_grad()
        out = first_tensor(pack(*inputs))
        out.square().flatten(1).mean(-1).sum().backward()
        optimizer.step()
        for i, (network, adam) in enumerate(zip(alone, lone, strict=True)):
            adam.zero_grad()
            y = first_tensor(network(*[x[i].clone() for x in inputs]))
            y.square().mean().backward()
            adam.step()
            assert same(out[i], y), i
    for i, network in enumerate(alone):
        state = seed_state_dict(pack, i)
        assert all(same(state[key], value) for key, value in network.state_dict().items()), i
    return pack


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# ---- frozen layers ---------------------------------------------------------------------------------------------


class Frozen(nn.Module):
    """A frozen convolution and linear layer (a fixed random projection) under a trainable head."""

    def __init__(self):
        super().__init__()
        self.conv, self.embed = nn.Conv2d(2, 4, 3).requires_grad_(False), nn.Linear(36, 16).requires_grad_(False)
        self.norm, self.head = nn.LayerNorm(16).requires_grad_(False), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.norm(self.embed(self.conv(x).relu().flatten(-3))))


def test_a_frozen_layer_stays_frozen_in_a_pack():
    """nn.Conv2d, nn.Linear and nn.LayerNorm frozen with requires_grad_(False): in a pack their stacked tensors do
    not require gradients either, get none and keep their values through 3 Adam steps, and each seed trains as
    alone. Fails if SeedLinear or SeedConv2d make the frozen weights trainable parameters."""
    pack = assert_steps_as_alone(Frozen, [randn(3, 8, 2, 5, 5)], exact=False)
    frozen = [name for name, p in pack.named_parameters() if not p.requires_grad]
    assert frozen == ["conv.weight", "conv.bias", "embed.weight", "embed.bias", "norm.weight", "norm.bias"]
    for i, seed in enumerate(SEEDS):
        initial = stacked(Frozen, [seed]).state_dict()
        state = seed_state_dict(pack, i)
        assert all(torch.equal(state[name], initial[name]) for name in frozen)
        assert not torch.equal(state["head.weight"], initial["head.weight"])


# ---- a layer's tensor arguments: per seed or shared --------------------------------------------------------------


class Positions(nn.Module):
    """Tokens [batch, length, 4] plus a learned embedding of their positions, torch.arange(length): shared by the
    seeds, where the tokens are each seed's."""

    def __init__(self, length: int, normed: bool = False):
        super().__init__()
        self.length, self.tokens, self.positions = length, nn.Linear(4, 8), nn.Embedding(length, 8)
        self.norm, self.head = nn.LayerNorm(8) if normed else nn.Identity(), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.tokens(x) + self.norm(self.positions(torch.arange(self.length))))


class Causal(nn.Module):
    """A transformer layer under a causal mask [length, length], shared by the seeds."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x, src_mask=nn.Transformer.generate_square_subsequent_mask(x.shape[-2]))


class Cell(nn.Module):
    """An LSTM cell stepped twice, its state a tuple (h, c) of each seed's rows."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(4, 6)

    def forward(self, x, h=None, c=None):
        if h is None:  # a first state made here: shared by the seeds
            h = c = torch.zeros(x.shape[-2], 6)
        return self.cell(x, self.cell(x, (h, c)))


@pytest.mark.parametrize("make, inputs", [
    (lambda: Positions(3), [randn(3, 5, 3, 4)]),  # as many positions as seeds: slicing them by seed went unnoticed
    (lambda: Positions(4), [randn(3, 5, 4, 4)]),
    (lambda: Positions(4, normed=True), [randn(3, 5, 4, 4)]),  # a LayerNorm of each seed's positions [seeds, 1, ...]
    (Causal, [randn(3, 2, 5, 8)]),
    (Cell, [randn(3, 5, 4), randn(3, 5, 6), randn(3, 5, 6)]),
    (Cell, [randn(3, 5, 4)]),
])
def test_a_layer_gets_each_seeds_rows_and_the_tensors_shared_by_the_seeds_whole(make, inputs):
    """torch.arange positions (and a LayerNorm of each seed's embedding of them), a causal mask and a first state of
    zeros (shared), an LSTMCell's (h, c) (per seed, in a tuple): each seed trains as alone, bit for bit. Fails if
    every tensor argument is cut by seed, or tensors in a tuple are not."""
    assert_steps_as_alone(make, inputs)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(x) if x.shape[-2] > 1 else self.norm(x, 1)  # other arguments at a later call


def test_a_layer_called_otherwise_than_at_the_first_call_is_refused():
    pack = stacked(Twice, SEEDS)
    pack(randn(3, 5, 4))
    with pytest.raises(PackError, match=r"^norm \(LayerNorm\): called with other arguments than at the pack's first"):
        pack(randn(3, 1, 4))


def assert_calls_as_alone(make, calls: list[list]) -> None:
    """The pack of SEEDS called with each list of inputs in turn, and each seed's plain network with its rows: every
    output equals the seed's alone, bit for bit, shape and all. An input may be a function of the previous call's
    outputs (a state passed on), given the pack's or the seed's."""
    pack, alone = stacked(make, SEEDS), [stacked(make, [seed]) for seed in SEEDS]
    last, lone = None, [None] * len(SEEDS)
    for inputs in calls:
        last = pack(*[x(last) if callable(x) else x for x in inputs])
        for i, network in enumerate(alone):
            lone[i] = network(*[x(lone[i]) if callable(x) else x[i].clone() for x in inputs])
            mine, theirs = tree_flatten(last)[0], tree_flatten(lone[i])[0]
            assert len(mine) == len(theirs) and all(a.shape[1:] == b.shape and torch.equal(a[i], b)
                                                    for a, b in zip(mine, theirs, strict=True)), i


def test_a_later_call_with_inputs_of_other_ranks_is_checked_as_a_first_call():
    """A LayerNorm then a Linear called on [seeds, batch, time, n], then on [seeds, batch, n]: at the second call the
    LayerNorm gets each seed's rows, not every seed's rows as a tensor the seeds share, and each call equals each
    seed's alone. Fails if the first call's ranks are kept for the second (a [3, 1, 3, 7, 2] output, seeds mixed)."""
    assert_calls_as_alone(lambda: nn.Sequential(nn.LayerNorm(5), nn.Linear(5, 2)),
                          [[randn(3, 4, 6, 5)], [randn(3, 7, 5)], [randn(3, 2, 6, 5)]])


class Pooled(nn.Module):
    """A LayerNorm of tokens [batch, length, 4], or with `pool` of their mean [batch, 4]: the same inputs give the
    layer tensors of another rank at a later call."""

    def __init__(self):
        super().__init__()
        self.norm, self.pool = nn.LayerNorm(4), False

    def forward(self, x):
        return self.norm(x.mean(-2) if self.pool else x)


def test_a_layer_given_other_ranks_than_its_check_showed_is_refused():
    """Pooled called on [seeds, batch, length, 4], then with `pool` set on inputs of the same ranks: the LayerNorm's
    [seeds, batch, 4] could be each seed's rows or a tensor the seeds share; one line, not a guess. Fails if it runs
    it as shared (every seed's layer on every seed's rows)."""
    pack = stacked(Pooled, SEEDS)
    pack(randn(3, 5, 6, 4))
    pack.pool = True
    with pytest.raises(PackError, match=r"^norm \(LayerNorm\): called with tensors of ranks \[3\] where the pack's "
                                        r"first call with inputs of these ranks gave it \[4\]"):
        pack(randn(3, 5, 6, 4))


class Recurrent(nn.Module):
    """A GRU cell over the steps of [batch, time, 4] from a state h, None at first (as a recurrent encoder loops):
    the values of the last step and the state."""

    def __init__(self):
        super().__init__()
        self.cell, self.head = nn.GRUCell(4, 6), nn.Linear(6, 2)

    def forward(self, x, h=None):
        for t in range(x.shape[-2]):
            h = self.cell(x[..., t, :], h)
        return self.head(h), h


def test_a_gru_cell_looped_from_no_state_trains_each_seed_as_alone():
    """h = None, then h = cell(x_t, h) over 4 steps: each seed trains as alone, bit for bit. Fails if None and a
    state look alike to the rank bookkeeping (refused: "called twice with the same arguments of other ranks")."""
    assert_steps_as_alone(Recurrent, [randn(3, 5, 4, 4)])


def test_a_state_passed_after_a_first_call_without_one_equals_alone():
    """A first call from no state, then calls given the state it returned: each seed's outputs and state equal
    alone. Fails if the state is taken as a tensor the seeds share (torch's own error on its shape)."""
    state = lambda out: out[1]  # noqa: E731
    assert_calls_as_alone(Recurrent, [[randn(3, 5, 1, 4)], [randn(3, 5, 2, 4), state], [randn(3, 5, 1, 4), state]])


# ---- a module's own tensors ------------------------------------------------------------------------------------


class Tempered(nn.Module):
    """Q-values divided by a learned temperature of the given shape ([]: 0-d), or, with `per_batch`, values [batch]
    scaled by it; with `listed` the temperature sits in an nn.ParameterList, with `named` in an nn.ParameterDict."""

    def __init__(self, shape: tuple[int, ...] = (), per_batch: bool = False, listed: bool = False,
                 named: bool = False):
        super().__init__()
        self.net, self.per_batch = nn.Linear(4, 3), per_batch
        temperature = nn.Parameter(torch.rand(shape) + 0.5)
        self.temperature = nn.ParameterList([temperature]) if listed else \
            nn.ParameterDict({"0": temperature}) if named else temperature

    def forward(self, x):
        q = self.net(x)
        temperature = next(self.temperature.parameters()) if isinstance(self.temperature, nn.Module) else \
            self.temperature
        return (q.sum(-1) if self.per_batch else q) / temperature


@pytest.mark.parametrize("make", [lambda: Tempered((1,)), lambda: Tempered((3,)), lambda: Tempered(per_batch=True),
                                  lambda: Tempered((3,), listed=True), lambda: Tempered(per_batch=True, listed=True),
                                  lambda: Tempered((1,), named=True)])
def test_a_modules_own_tensors_broadcast_over_the_batch_as_alone(make):
    """A temperature of shape [1] or [actions] over q [batch, actions], a 0-d one over values [batch], in an
    nn.ParameterList or nn.ParameterDict too: each seed trains as alone, bit for bit. Fails if a ParameterList's
    tensors are stacked without the batch dimension ([seeds, 3] does not broadcast over [seeds, batch, 3] as [3]
    over [batch, 3])."""
    assert_steps_as_alone(make, [randn(3, 7, 4)])


@pytest.mark.parametrize("batch, seeds, what", [
    (32, 3, r"fails in a pack of 3 seeds where each seed alone does not \(RuntimeError: The size of tensor"),
    (1, 3, r"its output has shape \[3, 3, 3\], not \[3, 1, 3\] \(each seed alone: \[1, 3\]\) in a pack of 3 seeds"),
    (3, 3, r"seed 1 computes otherwise than alone in a pack of 3 seeds"),  # a temperature of 1: a mix hides
])
@pytest.mark.parametrize("listed", [False, True])
def test_a_0d_temperature_over_q_values_is_refused_at_the_first_call(batch, seeds, what, listed):
    """A 0-d temperature over q [batch, actions] ([seeds, 1] against [seeds, batch, actions]): refused at the pack's
    first call, before it computes, in one PackError naming the module, its own tensors and the shape to give: at a
    batch of 32 (a shape error), of 1 (acting: a wrong shape) and of as many rows as seeds (the shapes agree, the
    seeds' temperatures mix), for a temperature initialised to 1 in every seed too. Fails if the pack runs on."""
    def make():
        network = Tempered(listed=listed)
        nn.init.ones_(network.temperature[0] if listed else network.temperature)
        return network

    pack = stacked(make, list(range(1, seeds + 1)))
    own = r"temperature\.0 \[\]" if listed else r"temperature \[\]"
    for _ in range(2):  # refused, it is checked again at its next call
        with pytest.raises(PackError, match=rf"^the network \(Tempered\): {what}.*; its own tensors \({own}\) are "
                           r"stacked \[seeds, 1, \*shape\].*give each the shape it is used at"):
            pack(randn(seeds, batch, 4))


class Affine(nn.Module):
    """A researcher's own linear layer: a bare weight in a matrix product, which the [seeds, 1, ...] shape breaks."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return x @ self.weight


def test_a_modules_own_tensor_in_a_matrix_product_is_refused_at_the_first_call():
    with pytest.raises(PackError, match=r"^the network \(Affine\): .*its own tensors \(weight \[4, 3\]\)"):
        stacked(Affine, SEEDS)(randn(3, 5, 4))


def test_a_packs_input_without_the_seed_dimension_is_refused():
    with pytest.raises(PackError, match=r"^the network \(Linear\): an input of shape \[5, 4\] in a pack of 3 seeds"):
        stacked(lambda: nn.Linear(4, 2), SEEDS)(randn(5, 4))


# ---- nn.Dropout ------------------------------------------------------------------------------------------------


def test_dropout_runs_as_it_is_and_equals_alone_in_eval_mode():
    """nn.Dropout keeps its class: in eval mode each seed equals alone, bit for bit; in training its masks come from
    the global generator in the pack's order, so a seed's output differs from its own alone (seeds 1-3, p = 0.5)."""
    def make():
        return nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), nn.Linear(64, 2))

    pack, alone = stacked(make, SEEDS), [stacked(make, [seed]) for seed in SEEDS]
    assert type(pack[1]) is nn.Dropout
    x = randn(3, 5, 4)
    pack.eval()
    out = pack(x)
    assert all(torch.equal(out[i], network.eval()(x[i].clone())) for i, network in enumerate(alone))
    pack.train()
    torch.manual_seed(0)
    out = pack(x)
    torch.manual_seed(0)
    assert not torch.equal(out[1], alone[1].train()(x[1].clone()))


# ---- runs ------------------------------------------------------------------------------------------------------


class SpectralQ(nn.Module):
    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        self.net = nn.Sequential(nn.utils.spectral_norm(nn.Linear(int(np.prod(observation_space.shape)), 32)),
                                 nn.ReLU(), nn.Linear(32, int(action_space.n)))

    def forward(self, obs):
        return self.net(obs.float())


class TemperedQ(nn.Module):
    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        self.net = nn.Linear(int(np.prod(observation_space.shape)), int(action_space.n))
        self.temperature = nn.Parameter(torch.tensor(1.0))

    def forward(self, obs):
        return self.net(obs.float()) / self.temperature


class GroupsQ(nn.Module):
    """A researcher's bug: 6 output channels in 4 groups."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, groups=4)


@pytest.mark.usefixtures("main_in_tmp_path")
def test_a_hook_based_spectral_norm_is_refused_before_anything_is_written(monkeypatch):
    """dqn.py with nn.utils.spectral_norm (the hook-based one) in its QNetwork: one line naming the layer, before
    any run directory. Fails if it trains (its computed weight stacked as a free parameter, the norm dropped) and
    fails at the end saving model.pt."""
    monkeypatch.setattr(dqn, "QNetwork", SpectralQ)
    with pytest.raises(SystemExit, match=r"^error: --num-seeds 2: net\.0 \(Linear\): its hooks \(SpectralNorm;"):
        dqn.main(tiny_args(dqn, num_seeds=2))
    assert not Path("runs").exists()


@pytest.mark.usefixtures("main_in_tmp_path")
def test_a_run_whose_network_the_first_call_refuses_stops_in_one_line_before_a_training_step(monkeypatch):
    """dqn.py with a 0-d temperature over its Q-values and 2 seeds: one line at the pack's first call (acting on one
    env from step 1 with epsilon 0), before any gradient step is logged. Fails if the run trains on."""
    monkeypatch.setattr(dqn, "QNetwork", TemperedQ)
    with pytest.raises(SystemExit, match=r"^error: --num-seeds 2: the network \(TemperedQ\): its output has shape "
                                         r"\[2, 2, 2\], not \[2, 1, 2\] .*temperature \[\]"):
        dqn.main(tiny_args(dqn, num_seeds=2, start_e=0.0, end_e=0.0))
    records = [json.loads(line) for line in Path("runs/smoke__1/metrics.jsonl").read_text().splitlines()]
    assert not any(key.startswith("losses/") for record in records for key in record)


@pytest.mark.usefixtures("main_in_tmp_path")
@pytest.mark.parametrize("num_seeds", [1, 2])
def test_an_error_of_the_network_itself_keeps_its_traceback(monkeypatch, num_seeds):
    """A network whose own code raises a ValueError (nn.Conv2d's groups): the ValueError itself, with its traceback,
    for a lone run and a pack alike, not a one-line pack error. Fails if it becomes "error: --num-seeds 1: ..."."""
    monkeypatch.setattr(dqn, "QNetwork", GroupsQ)
    with pytest.raises(ValueError, match="^out_channels must be divisible by groups$") as raised:
        dqn.main(tiny_args(dqn, num_seeds=num_seeds))
    assert not isinstance(raised.value, PackError)
    assert any(re.search(r"GroupsQ|__init__", str(entry.name)) for entry in raised.traceback)


class SharedIntoLinear(nn.Module):
    """A tensor the seeds share (made in forward) given to an nn.Linear, which in a pack takes one row per seed."""

    def __init__(self, length: int):
        super().__init__()
        self.length, self.lin = length, nn.Linear(4, 8)

    def forward(self, x):
        return self.lin(x) + self.lin(torch.ones(self.length, 4)).mean(-2)


@pytest.mark.parametrize("length", [3, 5])
def test_a_shared_tensor_given_to_a_linear_layer_is_refused_at_the_first_call(length):
    """As many shared rows as seeds included (each seed would get one row of them, silently)."""
    with pytest.raises(PackError, match=r"^lin \(Linear\): .*a pack's nn\.Linear takes one row per seed"):
        stacked(lambda: SharedIntoLinear(length), SEEDS)(randn(3, 5, 4))
