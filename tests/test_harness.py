"""The run machinery (harness/), tested once: stacked layers and optimizer steps that equal each seed's plain ones,
configs typed through the dataclass, seeded evaluations that replay, packs that resume only where they were saved,
--evaluate of a pack's seed from the pack's checkpoint, files a kill cannot leave half-written, and the pack's
evaluation in one vector env. The algorithm runs here use dqn.py (CartPole) as the smallest whole run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import harness.products
import harness.run
from harness import PackError, SeedAdam, SeedConv2d, SeedLinear, clip_grad_norm, seed_state_dict, stacked
from harness.args import RunArgs, instance
from harness.files import read_json, write_atomic, write_json_atomic
from tests.algo_utils import load_algo, parse, tiny_args

dqn = load_algo("dqn")


# ---- stacked networks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch, inputs, outputs", [
    (1, 4, 256), (64, 4, 256), (64, 256, 256), (64, 256, 2), (32, 256, 1), (1, 256, 1), (32, 3136, 512),  # the files'
    (7, 5, 3), (4, 6, 5), (2, 3, 4), (9, 17, 3), (16, 25, 2), (64, 17, 256), (64, 23, 256), (100, 1, 8), (3, 5, 6),
])
def test_a_seed_linear_row_is_the_plain_linear_bit_for_bit(batch, inputs, outputs):
    """Forward and backward (input, weight and bias gradients) of each seed's row equal nn.Linear's on that seed's
    tensors exactly, a 1-wide output included (torch's matrix-vector path; seed 0, 5 seeds)."""
    torch.manual_seed(0)
    layers = [nn.Linear(inputs, outputs) for _ in range(5)]
    pack = SeedLinear(layers)
    x, grad = torch.randn(5, batch, inputs, requires_grad=True), torch.randn(5, batch, outputs)
    out = pack(x)
    out.backward(grad)
    for i, layer in enumerate(layers):
        xi = x.detach()[i].clone().requires_grad_()  # clones: a lone run's own (aligned) tensors
        alone = layer(xi)
        alone.backward(grad[i].clone())
        assert torch.equal(out[i], alone)
        assert torch.equal(x.grad[i], xi.grad)
        assert torch.equal(pack.weight.grad[i], layer.weight.grad) and torch.equal(pack.bias.grad[i], layer.bias.grad)


def test_a_seed_conv_row_is_the_plain_conv():
    """The grouped convolution of a pack computes each seed's nn.Conv2d (to float rounding: another kernel)."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(4, 8, 3, stride=2) for _ in range(3)]
    x = torch.randn(3, 2, 4, 9, 9)
    out = SeedConv2d(layers)(x)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(out[i], layer(x[i]), rtol=1e-5, atol=1e-6)


class Scaled(nn.Module):
    """A plain network with a buffer and a flatten over any leading dimensions, as the files' networks."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(-2), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
        self.register_buffer("scale", torch.tensor([2.0, 3.0]))

    def forward(self, x):
        return self.net(x) * self.scale


def test_stacked_is_the_plain_network_for_one_seed_and_each_seeds_for_a_pack():
    """One seed: the plain module itself (no seed dimension), initialised under that seed. A pack: each seed's
    network as that seed initialises it alone; seed_state_dict gives seed i's plain state_dict, cloned (a view
    would save the whole stack), which loads into the plain class."""
    one = stacked(Scaled, [7])
    assert type(one.net[1]) is nn.Linear and one(torch.zeros(4, 2, 3)).shape == (4, 2)
    pack = stacked(Scaled, [7, 8, 9])
    x = torch.randn(3, 4, 2, 3)
    for i, seed in enumerate([7, 8, 9]):
        alone = stacked(Scaled, [seed])
        state = seed_state_dict(pack, i)
        assert all(torch.equal(state[k], v) for k, v in alone.state_dict().items())
        assert all(v.untyped_storage().nbytes() == v.numel() * v.element_size() for v in state.values())
        assert torch.equal(pack(x)[i], alone(x[i]))
        Scaled().load_state_dict(state)


class Researchers(nn.Module):
    """A network as a researcher writes one: an embedding of a discrete input, LayerNorm, PReLU, a Linear without a
    bias, BatchNorm1d (running statistics), a bare parameter used elementwise and a registered buffer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.net = nn.Sequential(nn.Linear(7, 64), nn.LayerNorm(64), nn.PReLU(), nn.Linear(64, 64, bias=False),
                                 nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2))
        self.temperature = nn.Parameter(torch.rand(2) + 0.5)
        self.register_buffer("offset", torch.tensor([0.5, -0.5]))

    def forward(self, x, k):
        return self.net(torch.cat([x, self.embed(k)], -1)) * self.temperature + self.offset


def test_a_pack_of_a_researchers_network_steps_each_seed_as_alone():
    """Seeds 1-3 of Researchers packed, 20 Adam steps on random batches (seed 0): each seed's outputs, gradients
    and state_dict (BatchNorm's running statistics included) equal its plain network's, stepped alone, bit for bit.
    Fails if a layer's tensors are shared by the seeds (the first seed's LayerNorm for all) or stepped together."""
    seeds = [1, 2, 3]
    pack, alone = stacked(Researchers, seeds), [stacked(Researchers, [seed]) for seed in seeds]
    optimizer = SeedAdam(pack.parameters(), 3, lr=1e-2, fused=True)
    lone = [torch.optim.Adam(network.parameters(), lr=1e-2, fused=True) for network in alone]
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        x, k = torch.randn(3, 32, 4, generator=generator), torch.randint(5, (3, 32), generator=generator)
        optimizer.zero_grad()
        out = pack(x, k)
        out.square().flatten(1).mean(-1).sum().backward()  # each seed its own loss
        optimizer.step()
        for i, (network, adam) in enumerate(zip(alone, lone, strict=True)):
            adam.zero_grad()
            y = network(x[i].clone(), k[i].clone())
            y.square().mean().backward()
            adam.step()
            assert torch.equal(out[i], y)
    for i, network in enumerate(alone):
        state = seed_state_dict(pack, i)
        assert state.keys() == network.state_dict().keys()
        assert all(torch.equal(state[key], value) for key, value in network.state_dict().items()), i
        Researchers().load_state_dict(state)
    assert not torch.equal(seed_state_dict(pack, 0)["net.1.weight"], seed_state_dict(pack, 1)["net.1.weight"])


@pytest.mark.parametrize("make, shape", [
    (partial(nn.GRUCell, 17, 33), (5, 17)), (partial(nn.MultiheadAttention, 16, 2, batch_first=True), (4, 6, 16)),
    (partial(nn.Conv1d, 3, 5, 3), (4, 3, 10)), (partial(nn.BatchNorm2d, 3), (4, 3, 5, 5)),
    (partial(nn.GroupNorm, 2, 4), (4, 4, 5)), (partial(nn.PReLU, 6), (4, 6)),
    (partial(nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, batch_first=True), (4, 6, 16)),
])
def test_any_torch_layer_with_tensors_runs_once_per_seed_exactly(make, shape):
    """A torch.nn layer with no hand-written pack (a generic path: its forward once per seed, on the seed's rows and
    tensors): each seed's output and parameter gradients equal the layer alone, bit for bit (inputs of seed 0)."""
    seeds = [1, 2, 3]
    pack, alone = stacked(make, seeds), [stacked(make, [seed]) for seed in seeds]
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0))
    multihead = isinstance(alone[0], nn.MultiheadAttention)
    out = pack(x, x, x)[0] if multihead else pack(x)
    out.sum().backward()
    for i, network in enumerate(alone):
        xi = x[i].clone()
        y = network(xi, xi, xi)[0] if multihead else network(xi)
        y.sum().backward()
        assert torch.equal(out[i], y)
        for stack, single in zip(pack.parameters(), network.parameters(), strict=True):
            assert torch.equal(stack.grad[i], single.grad)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.b.weight = self.a.weight


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.LSTM(8, 8))


def logged(module: nn.Module, args, output) -> None:
    """A researcher's forward hook."""


@pytest.mark.parametrize("make, message", [
    (Recurrent, "body.1 (LSTM): recurrent layers keep flat copies of their weights"),
    (partial(nn.LazyLinear, 3), "the network (LazyLinear): a lazy layer has no tensors to stack"),
    (lambda: nn.utils.parametrizations.weight_norm(nn.Linear(3, 3)), "the network (ParametrizedLinear): a "
     "parametrized layer"),
    (lambda: nn.Sequential(nn.utils.spectral_norm(nn.Linear(3, 3))), "0 (Linear): its hooks (SpectralNorm; the "
     "hook-based torch.nn.utils.spectral_norm and weight_norm are such) would run on the pack's stacked tensors"),
    (lambda: nn.Sequential(nn.ReLU(), nn.utils.weight_norm(nn.Conv2d(3, 3, 1))), "1 (Conv2d): its hooks (WeightNorm;"),
    (lambda: _hooked(), "the network (Sequential): its hooks (logged;"),
    (lambda: _hooked(backward=True), "the network (Sequential): its hooks (logged;"),
    (lambda: nn.Embedding(5, 3, max_norm=1.0), "the network (Embedding): max_norm renormalises the embedding's weight "
     "in place"),
    (lambda: nn.ModuleDict({"bag": nn.EmbeddingBag(5, 3, max_norm=1.0)}), "bag (EmbeddingBag): max_norm"),
    (Tied, "b.weight (Linear): tied to a.weight"),
])
@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")
def test_a_layer_that_cannot_be_stacked_is_refused_with_its_name(make, message):
    """Recurrent, lazy and parametrized layers, hooks (the old hook-based spectral_norm and weight_norm, which
    compute the weight from weight_orig before each call, a forward hook, a backward hook), an embedding's in-place
    max_norm and tied tensors: a PackError naming the module, its type and why, when stacked; one seed is the plain
    network."""
    with pytest.raises(PackError, match="^" + re.escape(message)):
        stacked(make, [1, 2])
    stacked(make, [1])  # one seed: the plain network, whatever it holds


def _hooked(backward: bool = False) -> nn.Module:
    network = nn.Sequential(nn.Linear(3, 3))
    (network.register_full_backward_hook if backward else network.register_forward_hook)(logged)
    return network


def test_a_pack_of_an_unstackable_network_stops_before_anything_is_written(monkeypatch):
    monkeypatch.setattr(dqn, "QNetwork", lambda *spaces: Recurrent())
    with pytest.raises(SystemExit, match=r"^error: --num-seeds 2: body.1 \(LSTM\): recurrent"):
        dqn.main(tiny_args(dqn, num_seeds=2))
    assert not Path("runs").exists()


@pytest.mark.parametrize("options", [dict(padding=1, padding_mode="circular"), dict(dilation=2), dict(groups=2),
                                     dict(bias=False), dict(padding="same"), dict(padding=2, padding_mode="reflect",
                                                                                  stride=2)])
def test_a_seed_conv_has_the_layers_padding_dilation_groups_and_bias(options):
    """SeedConv2d computes each seed's nn.Conv2d with the layer's own settings (to float rounding). Fails if
    padding_mode is ignored (circular padding wraps the edges) or dilation/groups are dropped."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(4, 6, 3, **options) for _ in range(3)]
    x = torch.randn(3, 2, 4, 9, 9)
    out = SeedConv2d(layers)(x)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(out[i], layer(x[i]), rtol=1e-5, atol=1e-5)


def test_a_seed_linear_takes_any_leading_dimensions_and_no_bias():
    torch.manual_seed(0)
    layers = [nn.Linear(6, 5, bias=False) for _ in range(3)]
    x = torch.randn(3, 4, 7, 6)
    out = SeedLinear(layers)(x)
    assert out.shape == (3, 4, 7, 5)
    assert all(torch.equal(out[i], layer(x[i].clone())) for i, layer in enumerate(layers))


@pytest.mark.parametrize("batch, inputs, outputs", [(256, 17, 256), (256, 256, 17), (256, 23, 256)])
def test_a_seed_linear_is_exact_after_the_thread_count_changes(monkeypatch, batch, inputs, outputs):
    """Products checked at 1 thread, then run at 4 (as two main() calls in one process with --threads 1 and 4):
    forward and backward of each row still equal nn.Linear's at 4 threads. Fails if the check of a shape is kept
    across thread counts (MKL's batched products with 17 inputs round otherwise at 4 threads)."""
    monkeypatch.setattr(harness.products, "_BATCHED", {})
    torch.manual_seed(0)
    layers = [nn.Linear(inputs, outputs) for _ in range(3)]
    pack = SeedLinear(layers)
    x, grad = torch.randn(3, batch, inputs, requires_grad=True), torch.randn(3, batch, outputs)
    torch.set_num_threads(1)
    pack(x).backward(grad)
    torch.set_num_threads(4)
    pack.zero_grad()
    x.grad = None
    out = pack(x)
    out.backward(grad)
    for i, layer in enumerate(layers):
        xi = x.detach()[i].clone().requires_grad_()
        alone = layer(xi)
        alone.backward(grad[i].clone())
        assert torch.equal(out[i], alone) and torch.equal(x.grad[i], xi.grad)
        assert torch.equal(pack.weight.grad[i], layer.weight.grad) and torch.equal(pack.bias.grad[i], layer.bias.grad)


@pytest.mark.parametrize("size", [2, 3, 6, 9, 18, 64, 256])
def test_seed_adam_and_clipping_step_each_seed_as_alone(size):
    """30 steps of clipped Adam on 10 seeds' rows equal 10 lone Adams exactly, for tensors of any size (the fused
    CPU kernel rounds the scalar tail of a small tensor otherwise), with gradients of 1e-4 to 1e2 (seed 0)."""
    torch.manual_seed(0)
    pack = nn.Parameter(torch.randn(10, size))
    rows = [nn.Parameter(pack.detach()[i].clone()) for i in range(10)]
    optimizer = SeedAdam([pack], 10, lr=torch.tensor(1e-3), fused=True)
    alone = [torch.optim.Adam([row], lr=torch.tensor(1e-3), fused=True) for row in rows]
    for _ in range(30):
        grad = torch.randn(10, size) * 10 ** float(torch.randint(-4, 3, (1,)))
        pack.grad = grad.clone()
        norms = clip_grad_norm([pack], 1.0, 10)
        optimizer.step()
        for i, (row, adam) in enumerate(zip(rows, alone, strict=True)):
            row.grad = grad[i].clone()
            assert torch.equal(clip_grad_norm([row], 1.0), norms[i])
            adam.step()
    assert all(torch.equal(pack.detach()[i], row.detach()) for i, row in enumerate(rows))


@pytest.mark.parametrize("options", [dict(amsgrad=True), dict(weight_decay=0.1), dict(weight_decay=0.1,
                                     decoupled_weight_decay=True), dict(maximize=True), dict(betas=(0.5, 0.9))])
def test_seed_adam_takes_adams_options(options):
    """SeedAdam with amsgrad, (decoupled) weight decay, maximize or other betas steps each seed as torch.optim.Adam
    with the same options steps it alone, bit for bit (15 steps, seed 0). Fails if an option is dropped."""
    torch.manual_seed(0)
    pack = nn.Parameter(torch.randn(3, 70))
    rows = [nn.Parameter(pack.detach()[i].clone()) for i in range(3)]
    optimizer = SeedAdam([pack], 3, lr=1e-2, fused=True, **options)
    alone = [torch.optim.Adam([row], lr=1e-2, fused=True, **options) for row in rows]
    for _ in range(15):
        grad = torch.randn(3, 70)
        pack.grad = grad.clone()
        optimizer.step()
        for i, (row, adam) in enumerate(zip(rows, alone, strict=True)):
            row.grad = grad[i].clone()
            adam.step()
    assert all(torch.equal(pack.detach()[i], row.detach()) for i, row in enumerate(rows))


def test_seed_adam_calls_the_closure_and_returns_its_loss():
    pack = nn.Parameter(torch.ones(2, 3))
    optimizer = SeedAdam([pack], 2, lr=0.1, fused=True)

    def closure():
        optimizer.zero_grad()
        loss = pack.square().sum()
        loss.backward()
        return loss

    assert optimizer.step(closure).item() == 6.0 and (pack < 1).all()


def test_each_members_own_max_norm_clips_as_the_number_alone():
    """A pack's max norms [0.3, 10] ([members, 1], float64, as a packed sweep gives them) clip member 0's gradient
    as clip_grad_norm with the number 0.3 clips it alone, bit for bit, over 200 random gradients (seed 0). Fails if
    the pack divides by the norms where a number over a tensor is the tensor's reciprocal times the number (about a
    quarter of them differ in the last bit; a power of two such as 0.5 hides it)."""
    torch.manual_seed(0)
    max_norms = torch.tensor([[0.3], [10.0]], dtype=torch.float64)
    for _ in range(200):
        grad = torch.randn(2, 40)
        pack, alone = nn.Parameter(torch.zeros(2, 40)), nn.Parameter(torch.zeros(40))
        pack.grad, alone.grad = grad.clone(), grad[0].clone()
        clip_grad_norm([pack], max_norms, 2)
        clip_grad_norm([alone], 0.3)
        assert torch.equal(pack.grad[0], alone.grad)


def test_clipping_without_gradients_gives_a_norm_of_zero():
    """As nn.utils.clip_grad_norm_: no parameter with a gradient is a norm of 0, not an error."""
    parameters = [nn.Parameter(torch.ones(2, 3))]
    assert torch.equal(clip_grad_norm(parameters, 1.0), nn.utils.clip_grad_norm_(parameters, 1.0))
    assert torch.equal(clip_grad_norm(parameters, 1.0, 2), torch.zeros(2))


# ---- arguments ----------------------------------------------------------------------------------------------


@dataclass
class ToyArgs(RunArgs):
    rate: float = 0.1  # a float
    steps: int = 3  # an int
    flag: bool = False  # a bool
    mode: Literal["a", "b"] = "a"  # a choice
    limit: float | None = None  # an optional float


@pytest.mark.parametrize("values, message", [
    ({"rate": "fast"}, "rate must be a float, got 'fast'"), ({"steps": 2.5}, "steps must be an int, got 2.5"),
    ({"steps": True}, "steps must be an int"), ({"flag": "yes"}, "flag must be a bool"),
    ({"mode": "c"}, "mode must be one of 'a', 'b', got 'c'"), ({"limit": "x"}, "limit must be a float or null"),
    ({"rat": 1.0}, "unknown key 'rat' \\(closest: rate"),
])
def test_config_values_are_checked_against_the_dataclass(values, message):
    with pytest.raises(SystemExit, match=f"error: c.yaml: {message}"):
        instance(ToyArgs, values, "c.yaml")


def test_config_values_of_the_right_type_are_taken():
    args = instance(ToyArgs, {"rate": "1e-3", "steps": 4, "flag": True, "mode": "b", "limit": 5}, "c.yaml")
    assert (args.rate, args.steps, args.flag, args.mode, args.limit) == (1e-3, 4, True, "b", 5.0)
    assert isinstance(args.limit, float)


def test_a_config_holding_the_options_of_a_process_gives_the_runs_settings_alone(tmp_path, capsys):
    """A run directory's config.yaml as it was written before it kept only the run's settings (resume, stop_step,
    members: the options of the process that wrote it): --config of it drops them, said in one line, and takes the
    rest. Fails if they are taken (the rerun resumed the old run, or paused at its step)."""
    path = tmp_path / "config.yaml"
    path.write_text("algo: dqn\nresume: runs/s\nstop_step: 1000\nmembers: [a, b]\nevaluate: null\nseed: 3\n")
    args = parse(dqn, ["--config", str(path), "--run-name", "s2"])
    assert (args.resume, args.stop_step, args.members, args.evaluate, args.seed) == (None, 0, (), None, 3)
    assert f"config {path}: ignoring resume, stop_step, members (options of one process" in capsys.readouterr().out


# ---- runs of dqn.py: evaluations, packs, --evaluate ---------------------------------------------------------


pytestmark = pytest.mark.usefixtures("main_in_tmp_path")


def hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_an_epsilon_greedy_evaluation_is_seeded_and_replays_the_final_one():
    """A run evaluated with --eval-epsilon 0.3: --evaluate with its own settings plays the final evaluation again,
    episode for episode, and two --evaluate with --eval-epsilon 0.5 --seed 7 give the same returns. Fails if
    an evaluation's exploration draws from an unseeded generator."""
    summary = dqn.main(tiny_args(dqn, run_name="r", eval_epsilon=0.3, eval_episodes=8, seed=1))
    again = dqn.main(parse(dqn, ["--evaluate", "runs/r"]))
    assert again["returns"] == summary["eval_returns"] and len(set(again["returns"])) > 1
    first, second = (dqn.main(parse(dqn, ["--evaluate", "runs/r", "--eval-epsilon", "0.5", "--seed", "7"]))
                     for _ in range(2))
    assert first["returns"] == second["returns"] != again["returns"]


def test_a_packs_evaluation_plays_every_seed_in_one_vector_env(monkeypatch):
    """A pack of 3 evaluates its seeds in one call of envs.evaluate (one vector env, one policy call per step for
    all seeds), each seed with its own seed + 10000. Fails if each seed is evaluated on its own."""
    calls = []
    evaluate = harness.run.evaluate

    def spy(env_id, policy, episodes, seeds, **kwargs):
        calls.append(seeds)
        return evaluate(env_id, policy, episodes, seeds, **kwargs)

    monkeypatch.setattr(harness.run, "evaluate", spy)
    dqn.main(tiny_args(dqn, run_name="pack", num_seeds=3, eval_frequency=200))
    assert calls == [[10_001, 10_002, 10_003]] * 2  # at step 200, and the final one at 400


def test_stop_return_in_a_pack_is_refused():
    with pytest.raises(SystemExit, match="--stop-return stops a run at its own evaluation"):
        dqn.main(tiny_args(dqn, num_seeds=2, stop_return=100.0, eval_frequency=100))
    assert not Path("runs").exists()


def test_a_pack_resumes_in_a_copy_of_its_folder_and_nowhere_else(tmp_path):
    """A pack of 2 stopped by its checkpoint: its folder copied elsewhere resumes there, the original's files
    unchanged (hashes); a renamed first directory, or one copied without the other seed's, is refused with one
    line and nothing written. Fails if the resume writes into the directories beside the named one by name."""
    args = tiny_args(dqn, run_name="pack", num_seeds=2, checkpoint_frequency=200, anneal_lr=False)
    dqn.main(args)
    before = hashes(tmp_path / "runs")
    shutil.copytree(tmp_path / "runs", tmp_path / "copy")
    summaries = dqn.main(parse(dqn, ["--resume", "copy/pack__1", "--total-timesteps", "600"]))
    assert [s["global_step"] for s in summaries] == [600, 600] and hashes(tmp_path / "runs") == before
    assert json.loads((tmp_path / "copy" / "pack__2" / "summary.json").read_text())["global_step"] == 600
    shutil.copytree(tmp_path / "runs" / "pack__1", tmp_path / "runs" / "renamed")
    with pytest.raises(SystemExit, match="saved in pack__1: resume it under that name"):
        dqn.main(parse(dqn, ["--resume", "runs/renamed", "--total-timesteps", "600"]))
    (tmp_path / "alone").mkdir()
    shutil.copytree(tmp_path / "runs" / "pack__1", tmp_path / "alone" / "pack__1")
    with pytest.raises(SystemExit, match=r"its other seeds \(pack__2\) are not beside it"):
        dqn.main(parse(dqn, ["--resume", "alone/pack__1", "--total-timesteps", "600"]))
    assert hashes(tmp_path / "runs") == {**before, **{f"renamed/{k.split('/', 1)[1]}": v for k, v in before.items()
                                                       if k.startswith("pack__1/")}}


def test_evaluate_finds_a_packs_seed_in_the_packs_checkpoint():
    """Seed 2 of a pack run with --no-save-model: --evaluate loads its row of the pack's checkpoint (in seed 1's
    directory) and plays the training's final evaluation again."""
    summaries = dqn.main(tiny_args(dqn, run_name="pack", num_seeds=2, save_model=False, checkpoint_frequency=400))
    record = dqn.main(parse(dqn, ["--evaluate", "runs/pack__2"]))
    assert record["networks"] == "checkpoint.pt" and record["seed"] == 2
    assert record["returns"] == summaries[1]["eval_returns"] and record["global_step"] == 400


def test_evaluate_finds_the_packs_checkpoint_when_the_pack_was_killed_before_its_summaries(monkeypatch):
    """Seed 2 of a pack of 2 with --no-save-model, killed after its last checkpoint and before any summary.json:
    --evaluate finds the checkpoint that holds it (seed 1's directory, beside it) and evaluates its row. Fails if
    the pack's directories are known only from a summary.json."""
    def killed(value, path):
        raise KeyboardInterrupt  # the kill, as the first summary.json is written

    monkeypatch.setattr(harness.run, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        dqn.main(tiny_args(dqn, run_name="pack", num_seeds=2, save_model=False, checkpoint_frequency=200))
    monkeypatch.setattr(harness.run, "write_json_atomic", write_json_atomic)
    assert not list(Path("runs").glob("*/summary.json")) and Path("runs/pack__1/checkpoint.pt").exists()
    record = dqn.main(parse(dqn, ["--evaluate", "runs/pack__2"]))
    assert record["networks"] == "checkpoint.pt" and record["seed"] == 2 and record["global_step"] == 400
    assert record["returns"] == dqn.main(parse(dqn, ["--evaluate", "runs/pack__2"]))["returns"]


def test_evaluate_finds_the_checkpoint_of_a_killed_pack_whose_seeds_are_not_consecutive(monkeypatch):
    """--pack seed=1,3 run_name=a,b with --no-save-model, killed as its first summary.json is written: --evaluate
    runs/b finds the checkpoint in a, whose list of the pack's directories holds b, and evaluates b's row. Fails if
    the holder is looked for among the directories of the seeds just before b's (2 and 3)."""
    def killed(value, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.run, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        dqn.main(tiny_args(dqn, pack=("seed=1,3", "run_name=a,b"), save_model=False, checkpoint_frequency=200))
    monkeypatch.setattr(harness.run, "write_json_atomic", write_json_atomic)
    assert not Path("runs/b/checkpoint.pt").exists() and Path("runs/a/checkpoint.pt").exists()
    record = dqn.main(parse(dqn, ["--evaluate", "runs/b"]))
    assert record["networks"] == "checkpoint.pt" and record["seed"] == 3 and record["global_step"] == 400


def test_evaluate_of_a_renamed_copy_of_a_run_without_model_pt_reads_its_checkpoint():
    """A single run with --no-save-model, copied under another name: --evaluate of the copy loads the checkpoint
    (saved under the old name) and plays the final evaluation again. Fails if the row is looked up by name."""
    summary = dqn.main(tiny_args(dqn, run_name="r", save_model=False, checkpoint_frequency=400))
    shutil.copytree("runs/r", "runs/renamed")
    record = dqn.main(parse(dqn, ["--evaluate", "runs/renamed"]))
    assert record["networks"] == "checkpoint.pt" and record["returns"] == summary["eval_returns"]


def test_evaluate_says_when_the_checkpoint_is_of_an_earlier_step_than_the_run_trained_to(capsys):
    """A run without model.pt whose checkpoint is older than its end (a tune's member, cut at a rung, as summary.json
    of a later step says; made here by editing summary.json): --evaluate still evaluates the checkpoint's networks,
    and says in a line which step they are of and how far the run went. Fails if it stays silent."""
    dqn.main(tiny_args(dqn, run_name="r", save_model=False, checkpoint_frequency=400))
    summary = json.loads(Path("runs/r/summary.json").read_text())
    assert "note:" not in capsys.readouterr().out
    Path("runs/r/summary.json").write_text(json.dumps({**summary, "global_step": 800}))
    record = dqn.main(parse(dqn, ["--evaluate", "runs/r"]))
    assert record["global_step"] == 400 and record["networks"] == "checkpoint.pt"
    assert ("note: runs/r kept no model.pt; its networks come from the checkpoint in runs/r, of step 400, not of the "
            "step 800 it trained to") in capsys.readouterr().out


def test_a_kill_during_a_write_leaves_the_previous_file(tmp_path):
    """write_atomic writes beside the file and renames: a write that dies halfway leaves the old summary whole
    (and read_json reads a truncated file as None, so run.py counts such a run unfinished)."""
    path = tmp_path / "summary.json"
    write_json_atomic({"global_step": 1}, path)

    def dies(f):
        f.write(b'{"global_st')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, dies)
    assert read_json(path) == {"global_step": 1}
    path.write_text('{"global_st')
    assert read_json(path) is None


def test_model_pt_of_a_run_loads_into_the_plain_network():
    dqn.main(tiny_args(dqn, run_name="r"))
    env = gym.make("CartPole-v1")
    network = dqn.QNetwork(env.observation_space, env.action_space)
    network.load_state_dict(torch.load("runs/r/model.pt", weights_only=True))
    assert network(torch.zeros(2, 4)).shape == (2, 2)
    with torch.no_grad():
        assert np.isfinite(F.softmax(network(torch.zeros(1, 4)), -1).numpy()).all()


SUBNORMALS_AFTER_RUN = """
import torch
from harness.run import Run
from tests.algo_utils import load_algo, parse

algo = load_algo("dqn")
Run(parse(algo, ["--env", "CartPole-v1", "--threads", "2", "--no-cuda", "--run-name", "r"]))
x = torch.full((4_000_000,), 1 << 20, dtype=torch.int32).view(torch.float32)  # 1.5e-39 from its bits, no rounding
x = x * 1.0  # one op the 2 threads split: each flushes its half or keeps it
print(int((x != 0).sum()))
"""


def test_a_run_flushes_subnormals_on_every_thread(tmp_path):
    """A run computes with subnormal floats flushed to zero (x86 computes with them many times slower: Adam's
    moments of weights whose gradient stays 0 decay through them), on every thread of a 2-thread run, in a fresh
    process as a user starts one. Fails if the run keeps subnormals (4M stay), or sets the flag after the thread pool
    started (the workers keep them: about 2M stay)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", SUBNORMALS_AFTER_RUN], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "0", f"{done.stdout.split()[-1]} of 4000000 subnormals were kept"
