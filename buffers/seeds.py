"""Many seeds in one process: one replay buffer (or n-step folder) per seed, behind one call.

    rb = SeedStack([ReplayBuffer(capacity, seed=s) for s in seeds])    # or PrioritizedReplayBuffer(...)
    rb.extend(rb.add_frames(step))      # step: TensorDict [N * E] as a vector env of N * E envs gives it,
                                        # seed i's envs in rows i * E ... (i + 1) * E - 1; or [N, E]
    batch = rb.sample(64)               # TensorDict [N, 64]; "index" (and "weight") [N, 64]
    rb.update_priority(batch["index"], td_error.abs())                  # [N, 64]
    nstep = SeedStack([NStepReturns(3, 0.99, E) for s in seeds])
    rb.extend(nstep.push(step))         # n-step windows close unevenly: one TensorDict per seed

Invariant (tests/test_seeds.py checks it): seed i's rows of everything that goes in reach part i only, and
row i of everything that comes out is what part i alone returns for the same calls; so each seed's
replay keeps the single-seed semantics of replay.py, prioritized.py, frames.py and nstep.py exactly,
and two seeds' data never mix. Each part draws from its own generator, seeded with its seed, so a
seed samples the same batches in a pack as in a run of its own.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from .prioritized import PrioritizedReplayBuffer, SegmentTree


class SeedStack:
    """A list of per-seed parts (ReplayBuffer, PrioritizedReplayBuffer or NStepReturns) used as one."""

    def __init__(self, parts: list):
        if not parts:
            raise ValueError("a SeedStack needs at least one part (one per seed)")
        self.parts, self.tree = list(parts), None
        shapes = {(part.capacity, part.device, part.tree.arity, part.tree.top) if isinstance(
            part, PrioritizedReplayBuffer) else None for part in self.parts}
        if len(self.parts) > 1 and len(shapes) == 1 and None not in shapes:
            # One sum tree per seed, all slices of one tensor per level, so that one descent samples every seed.
            self.tree, views = SegmentTree.stacked(self.parts[0].tree, len(self.parts))
            for part, view in zip(self.parts, views, strict=True):
                view.assign(part.tree.leaves[: part.capacity])  # the part's priorities so far
                part.tree = view

    def __len__(self) -> int:
        """The fewest items any seed holds: a batch can be drawn for every seed when this reaches it."""
        return min(len(part) for part in self.parts)

    def __repr__(self) -> str:
        return f"SeedStack({len(self.parts)} x {self.parts[0]!r})"

    def _rows(self, data: TensorDict | list) -> list:
        """Seed i's part of `data`: item i of a list, row i of a TensorDict [N, B], or rows i * B ... (i + 1) * B - 1
        of a TensorDict [N * B] (one seed: `data` itself, no copy and no TensorDict op)."""
        if isinstance(data, TensorDict) and data.batch_dims == 1:
            if len(self.parts) == 1:
                return [data]
            if len(data) % len(self.parts):
                raise ValueError(f"{len(data)} rows do not split evenly over {len(self.parts)} seeds")
            return list(data.split(len(data) // len(self.parts)))
        rows = data.unbind(0) if isinstance(data, TensorDict) else list(data)
        if len(rows) != len(self.parts):
            raise ValueError(f"expected one row per seed ({len(self.parts)}), got {len(rows)}")
        return rows

    def add_frames(self, transitions: TensorDict) -> TensorDict:
        """Each seed's add_frames on its rows of one vector-env step; returns them in the same layout."""
        if all(part.frame_store is None for part in self.parts):
            return transitions
        rows = [part.add_frames(row) for part, row in zip(self.parts, self._rows(transitions), strict=True)]
        return (rows[0] if len(rows) == 1 else torch.cat(rows)) if transitions.batch_dims == 1 else _stack(rows)

    def push(self, steps: TensorDict) -> list[TensorDict]:
        """n-step folding, each seed on its rows of one vector-env step: the transitions that finished, per seed
        (a list, as seeds finish different numbers of windows)."""
        return [part.push(row) for part, row in zip(self.parts, self._rows(steps), strict=True)]

    def extend(self, data: TensorDict | list[TensorDict]) -> list[torch.Tensor]:
        """Append seed i's rows (see _rows: [N * B], [N, B] or a list of N TensorDicts) to seed i's buffer;
        returns each seed's indices."""
        return [part.extend(row) for part, row in zip(self.parts, self._rows(data), strict=True)]

    def sample(self, batch_size: int) -> TensorDict:
        """A batch per seed, each drawn by its own buffer (PER: each seed's draws, one descent of all the trees):
        TensorDict [N, batch_size]."""
        if self.tree is None:
            return _stack([part.sample(batch_size) for part in self.parts])
        slots = self.tree.find_prefix_parts(torch.stack([part._fractions(batch_size) for part in self.parts]))
        return _stack([part._sample_at(row) for part, row in zip(self.parts, slots, strict=True)])

    def sample_slices(self, batch_size: int, length: int, stride: int = 1) -> TensorDict:
        """Slices per seed (see ReplayBuffer.sample_slices): TensorDict [N, batch_size, length]."""
        return _stack([part.sample_slices(batch_size, length, stride) for part in self.parts])

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Seed i's new priorities (row i of [N, B]) to seed i's tree."""
        for part, rows, values in zip(self.parts, self._rows(index), self._rows(priority), strict=True):
            part.update_priority(rows, values)

    @property
    def beta(self) -> float:
        return self.parts[0].beta

    @beta.setter
    def beta(self, value: float) -> None:
        for part in self.parts:
            part.beta = value

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict, **options) -> None:
        """Each part's state (options such as copy=False go to every part)."""
        if len(state["parts"]) != len(self.parts):
            raise ValueError(f"state is for {len(state['parts'])} seeds, this stack has {len(self.parts)}")
        for part, part_state in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(part_state, **options)


def _stack(rows: list[TensorDict]) -> TensorDict:
    """One TensorDict [N, ...] of per-seed TensorDicts [...]; one seed: a view, no copy."""
    return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)
