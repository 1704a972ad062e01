"""The number format of the update's products: fp32, or bf16 autocast where the CPU has bf16 instructions.

`--precision auto` (the default) takes bf16 autocast for image networks (uint8 pixel observations: the Nature CNN)
on a CPU whose flags include amx_bf16 or avx512_bf16, and fp32 everywhere else (MLPs, GPUs, CPUs without them).
On such a CPU the CNN's convolutions and matrix products run in bf16 with fp32 accumulation (oneDNN), about 1.7x
faster per Pong update than fp32 on one thread (benchmarks/cpu_learner.py). Without those instructions bf16 is
emulated and slower than fp32, and some CPUs refuse Conv2d's bf16 backward, so `--precision bf16` is refused there.

What bf16 autocast changes: inside the update, each convolution and linear layer casts its input and weights to bf16
(8 bits of mantissa) and returns bf16; the networks' own weights, their gradients and Adam's state stay fp32 (the
master copy), and the Q-values leave the network as fp32, so the TD target, the loss, the TD errors and PER's
priorities are computed in fp32. Acting and evaluation run the fp32 network. A run is still reproducible bit for bit
on one machine; a pack's members equal their runs alone to float rounding, as their convolutions already did.

What a run records (harness/run.py): config.yaml keeps the precision asked (auto, say), so that `--config` of it
chooses again on the machine it runs on; the checkpoint keeps the one chosen, so that `--resume` computes as the run
did, and refuses where that bf16 cannot run; `--resume DIR --precision fp32` then goes on in fp32, said in one line
and recorded in summary.json's `precision_changes` (from that step the run computes otherwise than it would have).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from .args import fail

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 products (Intel AMX, AVX512-BF16)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere: no bf16 is assumed)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def bf16_runs() -> str | None:
    """None when a bf16 autocast convolution's forward and backward run on this CPU, else torch's error."""
    conv = torch.nn.Conv2d(2, 2, 3)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            conv(torch.ones(1, 2, 5, 5)).float().sum().backward()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


def is_image(space: gym.Space) -> bool:
    """uint8 (frames, height, width) pixels: the observations the DQN files give a CNN."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def chosen_precision(asked: str, device: torch.device, space: gym.Space, source: str = "--precision bf16:",
                     advice: str | None = None) -> tuple[str, str]:
    """(precision, why) for --precision `asked` on `device` with observations `space`; a bf16 this CPU cannot run
    well is refused in one line, starting with `source` (the flag, or the resumed run that asks for it) and ending with
    `advice` (by default: which --precision to use instead)."""
    if device.type != "cpu":
        if asked == "bf16":
            fail(f"{source} bf16 is the CPU's path (bf16 autocast on oneDNN); "
                 f"{advice or 'on a GPU train with fp32 (--precision auto or fp32)'}")
        return "fp32", "fp32"
    if asked == "fp32" or (asked == "auto" and not is_image(space)):
        return "fp32", "fp32"
    found = [flag for flag in BF16_FLAGS if flag in cpu_flags()]
    if not found:
        if asked == "auto":
            return "fp32", "fp32: this CPU has no amx_bf16 or avx512_bf16, where bf16 would be slower"
        fail(f"{source} this CPU has neither amx_bf16 nor avx512_bf16, so bf16 would be emulated and slower "
             f"than fp32; {advice or 'use --precision fp32 (or auto)'}")
    error = bf16_runs()
    if error is not None:
        if asked == "auto":
            return "fp32", f"fp32: bf16 autocast does not run here ({error})"
        fail(f"{source} a bf16 convolution's backward does not run on this CPU ({error}); "
             f"{advice or 'use --precision fp32'}")
    return "bf16", f"bf16 autocast in the update (the CPU has {found[0]}; --precision fp32 turns it off)"


def pixels(obs: torch.Tensor) -> torch.Tensor:
    """uint8 pixels [..., C, H, W] as obs / 255 for the first convolution: fp32, or under the CPU's bf16 autocast
    the same numbers as the bf16 cast of the fp32 quotient (every uint8 is exact in bf16, and a bf16 division rounds
    the fp32 quotient), without writing that fp32 copy; a batch [B, C, H, W] in channels_last there, the layout
    oneDNN's bf16 convolutions compute in, so no reorder runs before and after each of them. With AMX the update's
    results stay bit for bit those of `obs.float() / 255` (with AVX512-BF16 alone, oneDNN's kernels for the two
    layouts sum in other orders: equal up to rounding; tests/test_precision.py); about 1.14x faster per Pong update
    on one thread of an Intel Xeon with AMX (benchmarks/cpu_learner.py, variants bf16_fp32_in and bf16)."""
    if obs.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return obs.float() / 255.0
    x = obs.to(torch.get_autocast_dtype("cpu")) / 255.0
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def autocast(update: Callable, precision: str, device: torch.device) -> Callable:
    """update, run under bf16 autocast when precision is bf16 (the CPU's path), else update itself."""
    if precision != "bf16":
        return update

    @functools.wraps(update)
    def update_in_bf16(*args, **kwargs):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return update(*args, **kwargs)

    return update_in_bf16
