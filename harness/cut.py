"""Some members of a pack resumed as a smaller pack: `--resume HOLDER --members NAME ...` (successive halving's rungs).

The checkpoint holds N members; the resumed process builds the file's parts for the M members kept (M = 1: a lone
run's plain parts), each as the file builds it for them (their own settings), and loads into each part the saved
state cut to the kept members' rows. So a kept member goes on bit for bit as it would have in the pack it left,
which is bit for bit its run alone.

Most parts are cut by `rows_like`, a walk of the saved state beside the same part's fresh state (the template): the
template says the layout the resumed process wants, so the walk needs to know no part's own layout. A tensor (or list)
whose size on one axis is N * k in the saved state and M * k in the template holds k rows per member there (a network's
stacked parameters: k = 1; the env rows of a recorder: k = num_envs); one that is the same in both is shared by the
members (a counter, a space's generator) and kept; a tensor with one more dimension than the template is a member's
row of a pack cut to one member. Parts whose fresh state lacks the shapes (storage allocated at the first write, an
optimizer's moments at its first step) cut themselves: `members_state(state, rows)` on the replay buffers and n-step
windows, `optim.members_state` on the optimizers.

An Atari pack cannot be cut: its emulators' state cannot be saved (envs/state.py), so its members would not go on as
they would have; nor can a pack whose replay stores frames once (the frame store's rows are not cut).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .optim import members_state as optimizer_state


def member_rows(rows: list[int], k: int) -> list[int]:
    """The indices of the members `rows` in a layout of k rows per member (member i's at i * k ... i * k + k - 1)."""
    return [i * k + j for i in rows for j in range(k)]


def rows_like(saved: Any, template: Any, rows: list[int], n: int) -> Any:
    """`saved` (a state of a pack of n members) cut to the members `rows`, in the layout of `template` (the same
    part's state as built for those members); a value whose layout cannot be matched raises ValueError."""
    m = len(rows)
    if isinstance(saved, dict):
        if not isinstance(template, dict):
            raise ValueError(f"a dict where the resumed run holds a {type(template).__name__}")
        out = type(saved)((key, rows_like(value, template[key], rows, n) if key in template else value)
                          for key, value in saved.items())
        if hasattr(template, "_metadata"):  # a state_dict's own record (a TensorDict's batch size: the template's)
            out._metadata = template._metadata
        return out
    if isinstance(saved, list | tuple):
        if isinstance(template, list | tuple) and len(saved) == len(template):
            return type(saved)(rows_like(s, t, rows, n) for s, t in zip(saved, template, strict=True))
        if isinstance(template, list | tuple) and len(saved) % n == 0 and len(template) == m * (len(saved) // n):
            k = len(saved) // n
            return type(saved)(saved[i] for i in member_rows(rows, k))
        if m == 1 and len(saved) == n:  # one member's value where the pack held one per member
            return rows_like(saved[rows[0]], template, [0], 1)
        raise ValueError(f"a list of {len(saved)} for {n} members, the resumed run's has {_size(template)}")
    if isinstance(saved, torch.Tensor | np.ndarray):
        return _tensor_rows(saved, template, rows, n)
    if isinstance(saved, int) and not isinstance(saved, bool) and isinstance(template, int) and saved != template \
            and saved % n == 0 and template == m * (saved // n):
        return template  # a count of rows (num_envs, num_seeds)
    return saved


def _tensor_rows(saved, template, rows: list[int], n: int):
    m, shape = len(rows), tuple(template.shape) if hasattr(template, "shape") else None
    if shape is None:
        raise ValueError(f"a tensor of shape {tuple(saved.shape)} where the resumed run holds no tensor")
    if tuple(saved.shape) == shape:
        return saved  # shared by the members
    if saved.ndim == len(shape) + 1 and m == 1 and saved.shape[0] == n:  # to a lone run: the member's row
        return saved[rows[0]].reshape(shape)
    same_rank = saved.ndim == len(shape)
    differ = [axis for axis, (a, b) in enumerate(zip(saved.shape, shape, strict=True)) if a != b] if same_rank else []
    if len(differ) != 1 or saved.shape[differ[0]] % n or shape[differ[0]] != m * (saved.shape[differ[0]] // n):
        raise ValueError(f"a tensor of shape {tuple(saved.shape)} for {n} members, the resumed run's is {shape}")
    axis, k = differ[0], saved.shape[differ[0]] // n
    index = member_rows(rows, k)
    if isinstance(saved, torch.Tensor):
        return saved.index_select(axis, torch.as_tensor(index, device=saved.device))
    return np.take(saved, index, axis=axis)


def _size(value: Any) -> str:
    return str(len(value)) if isinstance(value, list | tuple) else type(value).__name__


def part_rows(part: Any, saved: Any, rows: list[int], n: int, env_template=None) -> Any:
    """A checkpoint part's saved state cut to the members `rows`, for `part` as the resumed process built it
    (`env_template`: the env's fresh env_state, for the env)."""
    if env_template is not None:
        return rows_like(saved, env_template, rows, n)
    if isinstance(part, list):  # a NumPy generator per member
        return [saved[i] for i in rows]
    if hasattr(part, "members_state"):
        return part.members_state(saved, rows)
    if isinstance(part, torch.optim.Optimizer):
        return optimizer_state(part, saved, rows)
    return rows_like(saved, part.state_dict(), rows, n)
