"""--precision: bf16 autocast for the DQN files' CNN on a CPU with bf16 instructions, chosen per CPU, refused in one
line where it cannot run well, kept by a resumed run; fp32 Q-values, targets and TD errors under it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

import harness.precision
import harness.run
from harness.precision import chosen_precision
from tests.algo_utils import load_algo, parse

IMAGES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
VECTORS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
CPU = torch.device("cpu")
HAS_BF16 = bool(set(harness.precision.BF16_FLAGS) & harness.precision.cpu_flags()) and not harness.precision.bf16_runs()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no amx_bf16 or avx512_bf16")


@pytest.fixture
def flags(monkeypatch):
    """Set the CPU flags the choice sees: flags({"avx512_bf16"})."""
    return lambda found: monkeypatch.setattr(harness.precision, "cpu_flags", lambda: set(found))


def test_auto_takes_bf16_for_images_on_a_bf16_cpu_and_fp32_elsewhere(flags, monkeypatch):
    """auto: bf16 for uint8 image observations on a CPU with amx_bf16 or avx512_bf16 (where bf16 runs), fp32 for
    vector observations, on a CPU without those flags, on a GPU, and where a bf16 convolution's backward raises;
    fp32 asked is fp32 everywhere. The reason is said."""
    monkeypatch.setattr(harness.precision, "bf16_runs", lambda: None)
    for found in ({"amx_bf16", "avx512f"}, {"avx512_bf16"}):
        flags(found)
        precision, why = chosen_precision("auto", CPU, IMAGES)
        assert precision == "bf16" and next(iter(found & {"amx_bf16", "avx512_bf16"})) in why
        assert chosen_precision("fp32", CPU, IMAGES)[0] == "fp32"
        assert chosen_precision("auto", CPU, VECTORS)[0] == "fp32"
        assert chosen_precision("auto", torch.device("cuda"), IMAGES)[0] == "fp32"
    flags({"avx512f", "avx2", "avx512_vnni"})
    precision, why = chosen_precision("auto", CPU, IMAGES)
    assert precision == "fp32" and "no amx_bf16 or avx512_bf16" in why
    flags({"amx_bf16"})
    monkeypatch.setattr(harness.precision, "bf16_runs", lambda: "could not create a primitive")
    precision, why = chosen_precision("auto", CPU, IMAGES)
    assert precision == "fp32" and "could not create a primitive" in why


def test_bf16_is_refused_in_one_line_where_it_cannot_run_well(flags, monkeypatch):
    """--precision bf16 without the CPU's bf16 instructions, where the convolution's backward raises, or on a GPU:
    one line naming the flag and what to use instead."""
    flags({"avx2"})
    with pytest.raises(SystemExit, match=r"^error: --precision bf16: this CPU has neither amx_bf16 nor avx512_bf16.*"
                                         r"use --precision fp32") as refused:
        chosen_precision("bf16", CPU, IMAGES)
    assert "\n" not in str(refused.value)
    flags({"avx512_bf16"})
    monkeypatch.setattr(harness.precision, "bf16_runs", lambda: "could not create a primitive descriptor")
    with pytest.raises(SystemExit, match="backward does not run on this CPU .could not create a primitive descriptor"):
        chosen_precision("bf16", CPU, IMAGES)
    with pytest.raises(SystemExit, match="bf16 is the CPU's path"):
        chosen_precision("bf16", torch.device("cuda"), IMAGES)


def test_the_file_refuses_bf16_before_writing_anything(tmp_path, monkeypatch, flags):
    """`python algos/per_dqn.py --env PongNoFrameskip-v4 --precision bf16` on a CPU without bf16: one line, no run
    directory."""
    flags({"avx2"})
    monkeypatch.chdir(tmp_path)
    algo = load_algo("per_dqn")
    with pytest.raises(SystemExit, match="^error: --precision bf16: this CPU has neither"):
        algo.main(parse(algo, ["--env", "PongNoFrameskip-v4", "--precision", "bf16", "--no-cuda"]))
    assert not (tmp_path / "runs").exists()


def pong(name: str, *more: str) -> list[str]:
    """A Pong run of the Atari preset that reaches 80 gradient steps in seconds (fake evaluations, below)."""
    return ["--env", "PongNoFrameskip-v4", "--total-timesteps", "480", "--learning-starts", "160", "--num-envs", "2",
            "--buffer-size", "2000", "--eval-frequency", "240", "--eval-episodes", "1", "--checkpoint-frequency", "0",
            "--threads", "1", "--no-cuda", "--run-name", name, *more]


def model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def records(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if "charts/SPS" not in r]


@pytest.fixture
def fake_evaluations(monkeypatch):
    """Evaluations that play no Pong (their games are not under test) and send SIGTERM at the calls asked for."""
    calls, stop_at = [0], set()

    def evaluate(*args, **kwargs):
        calls[0] += 1
        if calls[0] in stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        return [[0.0]]

    monkeypatch.setattr(harness.run, "evaluate", evaluate)
    return stop_at


@needs_bf16
def test_bf16_trains_reproducibly_with_fp32_q_values(tmp_path, monkeypatch, fake_evaluations):
    """On a bf16 CPU, auto trains Pong's CNN under bf16 autocast: two runs are the same bit for bit, both differ from
    the fp32 run (so autocast is on), their weights are fp32 and moved from the initial ones as far as the fp32
    run's did, within a factor of 2 (bf16 master weights would round most of Adam's steps of 1e-4 away), and the
    logged Q-values and TD errors are fp32 numbers. config.yaml records the precision asked, summary.json the one
    the run took."""
    monkeypatch.chdir(tmp_path)
    algo = load_algo("per_dqn")
    took = {name: algo.main(parse(algo, pong(name, "--precision", precision)))["precision"]
            for name, precision in (("a", "auto"), ("b", "bf16"), ("c", "fp32"))}
    assert took == {"a": "bf16", "b": "bf16", "c": "fp32"}
    assert algo.main(parse(algo, pong("init", "--learning-starts", "480")))["updates"] == 0  # the initial weights
    a, b, c, init = (model(tmp_path / "runs" / name) for name in ("a", "b", "c", "init"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert records(tmp_path / "runs" / "a") == records(tmp_path / "runs" / "b")
    assert not all(torch.equal(a[k], c[k]) for k in a)

    def moved(weights: dict) -> float:
        return float(torch.cat([(weights[k] - init[k]).flatten() for k in init]).norm())

    assert all(a[k].dtype == torch.float32 for k in a) and 0.5 < moved(a) / moved(c) < 2
    assert yaml.safe_load((tmp_path / "runs" / "a" / "config.yaml").read_text())["precision"] == "auto"
    assert yaml.safe_load((tmp_path / "runs" / "c" / "config.yaml").read_text())["precision"] == "fp32"
    losses = [r for r in records(tmp_path / "runs" / "a") if "losses/q_values" in r]
    in_bf16 = [torch.tensor(r[key]).bfloat16().float().item() == r[key] for r in losses
               for key in ("losses/q_values", "losses/abs_td_error")]
    assert losses and not all(in_bf16)  # Q-values left in bf16 would all be bf16 numbers

@needs_bf16
def test_a_bf16_checkpoint_resumes_in_bf16_and_is_refused_where_bf16_is_not(tmp_path, monkeypatch, fake_evaluations):
    """A bf16 run stopped by SIGTERM at its first evaluation: on a CPU without bf16 its resume is refused in one line
    naming the run (auto is not chosen again: the checkpoint holds bf16) and changes nothing; resumed here, it and a
    copy of it resumed end the same bit for bit, in bf16 (Atari resumes start new games, so a resumed Atari run is
    compared with a resumed one, not with the run left alone)."""
    monkeypatch.chdir(tmp_path)
    algo = load_algo("per_dqn")
    fake_evaluations.add(1)
    summary = algo.main(parse(algo, pong("stopped")))
    assert summary["interrupted"] and summary["global_step"] == 240
    stopped, copy = tmp_path / "runs" / "stopped", tmp_path / "runs" / "copy"
    shutil.copytree(stopped, copy)
    checkpoint = (stopped / "checkpoint.pt").read_bytes()
    with monkeypatch.context() as m:
        m.setattr(harness.precision, "cpu_flags", lambda: {"avx2"})
        with pytest.raises(SystemExit, match=r"^error: runs/stopped trained with bf16 autocast, but this CPU has "):
            algo.main(parse(algo, ["--resume", str(Path("runs") / "stopped")]))
    assert (stopped / "checkpoint.pt").read_bytes() == checkpoint
    for run_dir in (stopped, copy):
        summary = algo.main(parse(algo, ["--resume", str(run_dir)]))
        assert not summary["interrupted"] and summary["global_step"] == 480 and summary["precision"] == "bf16"
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["precision"] == "auto"  # as asked
    assert records(stopped) == records(copy) and any("losses/td_loss" in r for r in records(stopped))
    assert all(torch.equal(model(copy)[k], v) for k, v in model(stopped).items())


@needs_bf16
def test_a_packs_cnn_under_bf16_computes_each_seed_as_alone_to_bf16_rounding():
    """per_dqn's Nature CNN stacked for seeds 1-3, forward and backward under bf16 autocast: each seed's Q-values (fp32)
    and weight gradients equal its network's alone under the same autocast to bf16 rounding (relative 2e-2 of the
    largest value; the pack's grouped products round otherwise), and differ from fp32's (autocast is applied)."""
    from harness.seeds import stacked

    algo = load_algo("per_dqn")
    space, actions = IMAGES, gym.spaces.Discrete(6)
    seeds = [1, 2, 3]
    pack = stacked(lambda: algo.QNetwork(space, actions), seeds)
    alone = [stacked(lambda: algo.QNetwork(space, actions), [seed]) for seed in seeds]
    obs = torch.randint(0, 256, (3, 8, 4, 84, 84), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = pack(obs)
        q.sum().backward()
        q_alone = []
        for network, rows in zip(alone, obs, strict=True):
            q_alone.append(network(rows))
            q_alone[-1].sum().backward()
    assert q.dtype == torch.float32 and q.shape == (3, 8, 6)
    for i, network in enumerate(alone):
        scale = q_alone[i].detach().abs().max()
        assert torch.allclose(q[i], q_alone[i], rtol=0, atol=2e-2 * float(scale))
        for (name, stacked_p), p in zip(pack.named_parameters(), network.parameters(), strict=True):
            grad_scale = float(p.grad.abs().max())
            assert torch.allclose(stacked_p.grad[i], p.grad, rtol=0, atol=2e-2 * grad_scale), name
    assert not torch.equal(q_alone[0], alone[0](obs[0]))  # fp32 outside autocast: another number


def test_pixels_under_bf16_autocast_are_the_bf16_cast_of_the_fp32_quotient():
    """Every uint8 value: pixels() under the CPU's bf16 autocast equals (x.float() / 255).bfloat16() bit for bit; a
    batch of images comes out channels_last, a pack's [seeds, batch, ...] in its own layout; outside autocast it is
    the fp32 quotient."""
    from harness.precision import pixels

    values = torch.arange(256, dtype=torch.uint8).view(1, 4, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = pixels(values)
        packed = pixels(values.unsqueeze(0))
    assert x.dtype == torch.bfloat16 and torch.equal(x, (values.float() / 255.0).bfloat16())
    assert x.is_contiguous(memory_format=torch.channels_last) and packed.is_contiguous()
    assert torch.equal(packed[0], x)
    outside = pixels(values)
    assert outside.dtype == torch.float32 and torch.equal(outside, values.float() / 255.0)


@needs_bf16
@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_the_cnn_update_under_bf16_is_the_one_of_the_fp32_quotient_bit_for_bit(name):
    """Each DQN file's Nature CNN, three Adam steps of a TD-like loss under bf16 autocast on random Pong-sized
    batches: on a CPU with AMX, the Q-values, gradients and weights equal bit for bit those of the same network fed
    `(obs.float() / 255)` in the default layout (how it computed before pixels()), and differ from fp32's. With
    AVX512-BF16 alone (AMD EPYC), oneDNN's kernels for the two layouts sum in other orders: the two differ by
    rounding, by at most a tenth of how far fp32 is from either (0.023 of it, measured on an EPYC)."""
    algo = load_algo(name)

    class Before(algo.QNetwork):
        def forward(self, obs):
            return self.net(obs.float() / 255.0).float()

    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (16, 4, 84, 84), generator=generator, dtype=torch.uint8) for _ in range(3)]
    runs = {}
    for key, cls, precision in (("now", algo.QNetwork, torch.bfloat16), ("before", Before, torch.bfloat16),
                                ("fp32", algo.QNetwork, None)):
        torch.manual_seed(1)
        network = cls(IMAGES, gym.spaces.Discrete(6))
        optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)
        outputs = []
        for obs in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision is not None):
                q = network(obs)
                loss = (q - q.detach().roll(1, 0) - 1.0).square().mean()
            optimizer.zero_grad()
            loss.backward()
            outputs += [q.detach().clone()] + [p.grad.clone() for p in network.parameters()]
            optimizer.step()
        runs[key] = outputs + [p.detach().clone() for p in network.parameters()]
    def apart(x: str, y: str) -> float:  # the norm of all the differences of two runs
        return float(torch.cat([(a - b).flatten() for a, b in zip(runs[x], runs[y], strict=True)]).norm())

    if "amx_bf16" in harness.precision.cpu_flags():
        assert all(torch.equal(a, b) for a, b in zip(runs["now"], runs["before"], strict=True))
    else:
        assert apart("now", "before") <= 0.1 * apart("now", "fp32")
    assert not all(torch.equal(a, b) for a, b in zip(runs["now"], runs["fp32"], strict=True))


def test_a_bf16_checkpoint_refused_here_gives_advice_that_works(tmp_path, monkeypatch, flags, capsys):
    """A run whose checkpoint says bf16, resumed on a CPU without bf16 and on a GPU: each refusal names the
    run and advises `--resume DIR --precision fp32`, which --resume takes: the run goes on in fp32, says so in one
    line, and summary.json records the step from which it computed in fp32. Fails if the advice is a flag --resume
    refuses. (The checkpoint is a CartPole run's marked bf16, as one saved on a bf16 CPU is: the choice is the
    same for any network once bf16 is asked.)"""
    monkeypatch.chdir(tmp_path)
    algo = load_algo("dqn")
    tiny = ["--total-timesteps", "600", "--learning-starts", "100", "--eval-episodes", "2", "--no-cuda"]
    algo.main(parse(algo, [*tiny, "--run-name", "s", "--stop-step", "300"]))
    state = torch.load("runs/s/checkpoint.pt", weights_only=True)
    state["args"]["precision"] = "bf16"
    torch.save(state, "runs/s/checkpoint.pt")
    advice = "go on in fp32: --resume runs/s --precision fp32"
    flags({"avx2"})
    with pytest.raises(SystemExit, match=r"^error: runs/s trained with bf16 autocast, but this CPU has neither") as no:
        algo.main(parse(algo, ["--resume", "runs/s"]))
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        state["args"]["cuda"] = True
        torch.save(state, "runs/s/checkpoint.pt")
        with pytest.raises(SystemExit, match="^error: runs/s trained with bf16 autocast, but bf16 is the CPU's") as gpu:
            algo.main(parse(algo, ["--resume", "runs/s"]))
    assert advice in str(no.value) and advice in str(gpu.value) and "\n" not in str(no.value) + str(gpu.value)
    state["args"]["cuda"] = False
    torch.save(state, "runs/s/checkpoint.pt")
    capsys.readouterr()
    summary = algo.main(parse(algo, ["--resume", "runs/s", "--precision", "fp32"]))
    assert "runs/s trained with bf16 to step 300 and goes on in fp32 (--precision)" in capsys.readouterr().out
    assert summary["global_step"] == 600 and not summary["interrupted"] and summary["precision"] == "fp32"
    assert summary["precision_changes"] == [{"step": 300, "from": "bf16", "to": "fp32"}]


@needs_bf16
def test_config_yaml_keeps_the_precision_asked_so_it_reruns_where_bf16_is_not(tmp_path, monkeypatch, flags,
                                                                               fake_evaluations):
    """A Pong run of auto on a bf16 CPU trains in bf16: its config.yaml says auto (summary.json: bf16), so `--config`
    of it on a CPU without bf16 trains a new run in fp32. Fails if config.yaml holds the precision chosen (that
    rerun was refused: bf16 asked where it cannot run)."""
    monkeypatch.chdir(tmp_path)
    algo = load_algo("per_dqn")
    summary = algo.main(parse(algo, pong("a")))
    assert summary["precision"] == "bf16"
    assert yaml.safe_load(Path("runs/a/config.yaml").read_text())["precision"] == "auto"
    flags({"avx2"})
    summary = algo.main(parse(algo, ["--config", "runs/a/config.yaml", "--run-name", "b"]))
    assert summary["precision"] == "fp32" and summary["global_step"] == 480
