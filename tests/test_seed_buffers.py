"""Buffers with a seed dimension (num_seeds=N): row i of everything a pack buffer returns equals, bit for bit, what a
buffer of seed i alone returns for the same calls, for uniform and prioritized replay (a deep tree too), Atari frames
stored once (with transitions dropped when their frames go), n-step windows that close unevenly across seeds,
lambda-return slices, priority updates (stale indices included) and a state round trip; and seeds never mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from buffers import NStepReturns, PrioritizedReplayBuffer, ReplayBuffer
from envs import TransitionRecorder
from tests.test_frames import ScriptedFrameEnv

pytestmark = pytest.mark.usefixtures("single_thread")

SEEDS = [3, 4, 5]  # a pack of seed 3 with num_seeds 3, against lone buffers of seeds 3, 4 and 5


class DeepTree(PrioritizedReplayBuffer):
    tree_arity, tree_top = 2, 2  # a few dozen leaves in 5 levels: the descent goes through every level


KINDS = {"uniform": ReplayBuffer, "prioritized": PrioritizedReplayBuffer, "deep": DeepTree}


def vector_steps(envs: int, count: int, frames: bool, seed: int):
    """`count` recorded vector-env steps [envs] of one seed's envs: stacked frames from a scripted env whose every
    frame is unique (episodes of 1-5 steps, so frames go fast), or small float observations that say (seed, t, env)."""
    recorder = TransitionRecorder(envs)
    if frames:
        env = ScriptedFrameEnv(envs, 4, seed=seed, max_len=5)
        obs = env.reset()
    for t in range(count):
        action = np.full(envs, t % 2)
        if frames:
            next_obs, reward, terminated, truncated, info = env.step(action)
        else:
            obs = np.array([[seed, t, e] for e in range(envs)], dtype=np.float32)
            next_obs, reward = obs + 1, np.full(envs, float(t))
            terminated, truncated = np.arange(envs) == t % 7, np.arange(envs) == t % 5
            info = {"final_obs": next_obs + 100}
        yield recorder.record(obs, action, reward, next_obs, terminated, truncated, info)[0]
        obs = next_obs


def assert_rows_equal(batch: TensorDict, lone: TensorDict, i: int) -> None:
    assert set(batch.keys()) == set(lone.keys())
    for key in lone.keys():  # noqa: SIM118 (TensorDict)
        assert torch.equal(batch[key][i], lone[key]), (i, key)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("frames, n", [(False, 1), (False, 3), (True, 1), (True, 3)],
                         ids=["plain", "nstep", "frames", "frames-nstep"])
def test_each_seed_of_a_pack_buffer_is_that_seeds_buffer_alone(kind, frames, n):
    """Seeds 3-5, 2 envs each, a ring of 40 that wraps many times; with frames, episodes of 1-5 steps drop
    transitions as their frames go. After every step the indices extend returns, and every few steps a sample
    (stacks, weights, indices) and a priority update (stale indices included) of each seed equal a lone buffer's."""
    make = KINDS[kind]
    stack = 4 if frames else 0
    pack = make(40, seed=SEEDS[0], frame_stack=stack, num_seeds=len(SEEDS))
    alone = [make(40, seed=seed, frame_stack=stack) for seed in SEEDS]
    pack_nstep = NStepReturns(n, 0.9, 2, num_seeds=len(SEEDS))
    lone_nstep = [NStepReturns(n, 0.9, 2) for _ in SEEDS]
    streams = [vector_steps(2, 120, frames, seed) for seed in SEEDS]
    generator = torch.Generator().manual_seed(0)
    for t, steps in enumerate(zip(*streams, strict=True)):
        index = pack.extend(pack_nstep.push(pack.add_frames(torch.cat(steps))))
        lone_index = [buffer.extend(folder.push(buffer.add_frames(step)))
                      for buffer, folder, step in zip(alone, lone_nstep, steps, strict=True)]
        if n == 1:
            assert all(torch.equal(index.view(len(SEEDS), -1)[i], lone_index[i]) for i in range(len(SEEDS)))
        assert len(pack) == min(len(buffer) for buffer in alone)
        if t % 3 or len(pack) < 8:
            continue
        size = 16 if t % 2 else 7  # a batch of 7: rows of priorities that do not fill the CPU's vector lanes
        batch = pack.sample(size)
        assert batch.batch_size == (len(SEEDS), size)
        for i, buffer in enumerate(alone):
            assert_rows_equal(batch, buffer.sample(size), i)
        if kind != "uniform":
            priority = torch.rand(len(SEEDS), size, generator=generator, dtype=torch.float64) * 10
            stale = batch["index"].clone()
            stale[:, 0] = torch.clamp(stale[:, 0] - 40, min=0)  # an index overwritten since: ignored
            pack.update_priority(stale, priority)
            for i, buffer in enumerate(alone):
                buffer.update_priority(stale[i], priority[i])
    assert all(torch.equal(pack._priorities()[i], buffer._priorities()) for i, buffer in enumerate(alone)) \
        if kind != "uniform" else True
    if frames:  # the scripted episodes are short: transitions were dropped, and the check above covered them
        assert (pack.frame_store.last_dropped >= 0).all()
    restored = make(40, seed=0, frame_stack=stack, num_seeds=len(SEEDS))
    restored.load_state_dict(pack.state_dict())
    again, expected = restored.sample(8), pack.sample(8)
    assert all(torch.equal(again[key], expected[key]) for key in expected.keys())  # noqa: SIM118


def test_layouts_seed_by_seed_or_as_rows_of_seeds_are_the_same():
    """[N * E] rows seed by seed (a vector env's step) and [N, E] store the same; seeds never mix (each seed's
    observations carry its tag)."""
    flat, rows = (ReplayBuffer(30, seed=1, num_seeds=3) for _ in range(2))
    for t in range(25):
        step = TensorDict(obs=torch.tensor([[[s, t]] * 2 for s in range(3)], dtype=torch.float32),
                          reward=torch.full((3, 2), float(t)), batch_size=[3, 2])
        assert torch.equal(flat.extend(step.reshape(-1)).view(3, 2), rows.extend(step))
    a, b = flat.sample(10), rows.sample(10)
    assert torch.equal(a["obs"], b["obs"]) and all((a["obs"][i, :, 0] == i).all() for i in range(3))
    with pytest.raises(ValueError, match="do not split evenly"):
        flat.extend(TensorDict(obs=torch.zeros(4, 2), reward=torch.zeros(4), batch_size=[4]))
    with pytest.raises(ValueError, match="one row per seed"):
        flat.extend(TensorDict(obs=torch.zeros(2, 2, 2), reward=torch.zeros(2, 2), batch_size=[2, 2]))


def test_slices_of_each_seed_are_that_seeds_slices():
    """sample_slices [N, B, L]: seed i's starts from its own generator, its own consecutive steps."""
    pack, alone = ReplayBuffer(50, seed=3, num_seeds=3), [ReplayBuffer(50, seed=seed) for seed in SEEDS]
    for steps in zip(*(vector_steps(2, 40, False, seed) for seed in SEEDS), strict=True):
        pack.extend(torch.cat(steps))
        for buffer, step in zip(alone, steps, strict=True):
            buffer.extend(step)
    batch = pack.sample_slices(6, 4, stride=2)
    assert batch.batch_size == (3, 6, 4)
    for i, buffer in enumerate(alone):
        assert_rows_equal(batch, buffer.sample_slices(6, 4, stride=2), i)


def test_a_pack_refuses_what_a_lone_buffer_refuses():
    pack = PrioritizedReplayBuffer(20, seed=1, num_seeds=2)
    with pytest.raises(RuntimeError, match="empty buffer"):
        pack.sample(4)
    pack.extend(TensorDict(obs=torch.zeros(2, 3, 1), batch_size=[2, 3]))
    index = pack.sample(4)["index"]
    before = pack._priorities()
    for bad, message in ((torch.full((2, 4), float("nan")), "finite"), (-torch.ones(2, 4), ">= 0")):
        with pytest.raises(ValueError, match=message):
            pack.update_priority(index, bad)
    with pytest.raises(ValueError, match="never written"):
        pack.update_priority(index + 3, torch.ones(2, 4))
    with pytest.raises(ValueError, match="N = 2 seeds"):
        pack.update_priority(index[:1], torch.ones(1, 4))
    assert torch.equal(pack._priorities(), before)
