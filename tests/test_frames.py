"""Frames stored once (buffers/frames.py): sampled stacks are bit for bit what the env returned.

The harness is a scripted vector env whose every frame is unique and says which env, episode and
step it comes from, run through envs.TransitionRecorder (SAME_STEP: at an episode end next_obs is
the real final stack, and the next obs a reset stack), with terminations, truncations, life losses
(terminated without a stack reset), next_obs that are not shifts, obs that do not continue the
previous next_obs, n-step windows, ring wrap-around and very short episodes. A reference keeps,
for every index extend returned, the stacks that went in; every sampled item must equal them.

Which transitions may be sampled is checked against a model of the storage rule written here
independently of buffers/frames.py: per env, an obs that is not byte-equal to the previous
next_obs costs k frames, a next_obs costs 1 frame when it is obs shifted by one frame and k
otherwise; a transition is sampleable while the first frame of its obs is among its env's last L.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import buffers.frames
from buffers import FrameStore, NStepReturns, PrioritizedReplayBuffer, ReplayBuffer
from envs import TransitionRecorder, make_vector_env

pytestmark = pytest.mark.usefixtures("single_thread")

FRAME = (2, 3)  # small frames keep the tests fast; the store does not care about their shape


class ScriptedFrameEnv:
    """A SAME_STEP vector env of uint8 frame stacks [E, k, 2, 3] whose frames are all distinct.

    A frame's pixels are (id low byte, id middle byte, id high byte, env, episode % 256, t % 256)
    with a global frame id. Episodes last 1..max_len steps and end by termination or truncation;
    with probability p_life a step is a life loss (info["life_loss"], the stack goes on); with
    p_jump the next stack is k new frames (not a shift). A reset stack is zero-padded like
    ale-py's ([0, ..., 0, f0]) or k new frames, at random.
    """

    def __init__(self, num_envs: int, k: int, seed: int, max_len: int = 30, p_life: float = 0.05,
                 p_jump: float = 0.03):
        self.num_envs, self.k, self.max_len, self.p_life, self.p_jump = num_envs, k, max_len, p_life, p_jump
        self.rng = np.random.default_rng(seed)
        self.next_id = 1
        self.episode = np.zeros(num_envs, dtype=np.int64)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.stack = np.zeros((num_envs, k, *FRAME), dtype=np.uint8)

    def frame(self, env: int) -> np.ndarray:
        i = self.next_id
        self.next_id += 1
        pixels = [i & 255, (i >> 8) & 255, (i >> 16) & 255, env, self.episode[env] % 256, self.t[env] % 256]
        return np.array(pixels, dtype=np.uint8).reshape(FRAME)

    def _reset(self, env: int) -> None:
        self.t[env] = 0
        self.length[env] = self.rng.integers(1, self.max_len + 1)
        if self.rng.random() < 0.5:
            self.stack[env] = 0
            self.stack[env, -1] = self.frame(env)
        else:
            self.stack[env] = np.stack([self.frame(env) for _ in range(self.k)])

    def reset(self) -> np.ndarray:
        for env in range(self.num_envs):
            self._reset(env)
        return self.stack.copy()

    def step(self, action: np.ndarray):
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        life_loss = np.zeros(self.num_envs, dtype=bool)
        final = np.zeros_like(self.stack)
        for env in range(self.num_envs):
            self.t[env] += 1
            if self.rng.random() < self.p_jump:
                self.stack[env] = np.stack([self.frame(env) for _ in range(self.k)])
            else:
                self.stack[env] = np.concatenate([self.stack[env, 1:], self.frame(env)[None]])
            if self.t[env] >= self.length[env]:
                if self.rng.random() < 0.5:
                    terminated[env] = True
                else:
                    truncated[env] = True
                final[env] = self.stack[env]
                self.episode[env] += 1
                self._reset(env)
            else:
                life_loss[env] = self.rng.random() < self.p_life
        reward = self.rng.normal(size=self.num_envs)
        info = {"final_obs": final, "life_loss": life_loss}
        return self.stack.copy(), reward, terminated, truncated, info


class StorageModel:
    """The storage rule, per env, written from the spec (see the module docstring)."""

    def __init__(self, num_envs: int, k: int):
        self.k = k
        self.count = np.zeros(num_envs, dtype=np.int64)
        self.last_next: list[np.ndarray | None] = [None] * num_envs

    def step(self, obs: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        """Count this step's frames; return each env's obs first frame number."""
        first = np.zeros(len(obs), dtype=np.int64)
        for env in range(len(obs)):
            if self.last_next[env] is None or not np.array_equal(obs[env], self.last_next[env]):
                self.count[env] += self.k
            first[env] = self.count[env] - self.k
            shift = np.array_equal(next_obs[env, :-1], obs[env, 1:])
            self.count[env] += 1 if shift else self.k
            self.last_next[env] = next_obs[env].copy()
        return first


class Run:
    """Drive a buffer with a scripted env through the recorder, add_frames, NStepReturns and extend."""

    def __init__(self, rb: ReplayBuffer, num_envs: int, k: int, n: int, seed: int, **env_kwargs):
        self.rb, self.num_envs, self.k = rb, num_envs, k
        self.env = ScriptedFrameEnv(num_envs, k, seed, **env_kwargs)
        self.recorder = TransitionRecorder(num_envs)
        self.nstep = NStepReturns(n, 0.9, num_envs)  # on positions
        self.nstep_ref = NStepReturns(n, 0.9, num_envs)  # on the stacks themselves
        self.model = StorageModel(num_envs, k)
        self.obs = self.env.reset()
        self.ref: dict[int, TensorDict] = {}  # index -> the transition as it went in, stacks included
        self.first: dict[int, tuple[int, int]] = {}  # index -> (env, first frame number of its obs)
        self.first_by_step: list[np.ndarray] = []  # the model's obs first frame numbers, per step and env
        self.steps = 0

    def step(self, glitch: float = 0.0) -> None:
        obs = self.obs
        if glitch and self.env.rng.random() < glitch:  # an obs that does not continue the last next_obs
            env = int(self.env.rng.integers(self.num_envs))
            self.env.stack[env] = np.stack([self.env.frame(env) for _ in range(self.k)])
            obs = obs.copy()
            obs[env] = self.env.stack[env]
        action = self.env.rng.integers(0, 6, size=self.num_envs)
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        td, _ = self.recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        self.first_by_step.append(self.model.step(td["obs"].numpy(), td["next_obs"].numpy()))
        td["start"] = torch.arange(self.num_envs) + self.steps * self.num_envs  # names (step, env)
        ready_ref = self.nstep_ref.push(td)
        ready = self.nstep.push(self.rb.add_frames(td))
        index = self.rb.extend(ready).cpu()
        for key in ("start", "action", "reward", "terminated", "truncated", "discount"):
            assert torch.equal(ready[key], ready_ref[key])
        for i, idx in enumerate(index.tolist()):
            self.ref[idx] = ready_ref[i].clone()
            start = int(ready_ref["start"][i])
            env, step = start % self.num_envs, start // self.num_envs
            self.first[idx] = (env, int(self.first_by_step[step][env]))
        self.obs = next_obs
        self.steps += 1

    def run(self, steps: int, glitch: float = 0.0, check_every: int = 0, batch_size: int = 64) -> None:
        for s in range(steps):
            self.step(glitch)
            if check_every and s % check_every == check_every - 1 and self.rb.written:
                self.check_sample(self.rb.sample(batch_size))

    # ---- what must hold ----

    def live(self) -> list[int]:
        return list(range(max(0, self.rb.written - self.rb.capacity), self.rb.written))

    def sampleable(self) -> set[int]:
        """Live indices whose obs first frame is still stored, by the model."""
        length = self.rb.frame_store.frames_per_env
        out = set()
        for idx in self.live():
            env, first = self.first[idx]
            if first >= self.model.count[env] - length:
                out.add(idx)
        return out

    def check_sample(self, batch: TensorDict) -> list[int]:
        """Every sampled item is sampleable and equals, bit for bit, what went in."""
        index = batch["index"].cpu().tolist()
        allowed = self.sampleable()
        for i, idx in enumerate(index):
            assert idx in allowed, f"index {idx} sampled but its frames were overwritten (or it is stale)"
            want = self.ref[idx]
            for key in ("obs", "next_obs", "action", "reward", "terminated", "truncated", "discount", "start"):
                got = batch[key][i].cpu()
                assert got.dtype == want[key].dtype and torch.equal(got, want[key]), (key, idx)
        return index


def make_buffer(prioritized: bool, capacity: int, device, k: int = 4, seed: int = 0) -> ReplayBuffer:
    if prioritized:
        return PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4, device=device, seed=seed, frame_stack=k)
    return ReplayBuffer(capacity, device=device, seed=seed, frame_stack=k)


# ---- bit-exact stacks ----------------------------------------------------------------------------


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    "capacity, max_len, p_jump, glitch",
    [(120, 300, 0.0, 0.0), (48, 25, 0.03, 0.02), (30, 2, 0.1, 0.05)],
    ids=["roomy", "wrapping", "very-short-episodes"],
)
def test_sampled_stacks_are_what_the_env_returned(device, prioritized, n, capacity, max_len, p_jump, glitch):
    """3 envs, 150 steps, a batch of 64 checked every 10 steps, then 4000 draws that must reach every
    sampleable transition (a miss has probability < 120 * (1 - 1/120)**4000 under uniform sampling;
    under PER every live item holds the same initial priority here). Seed 0. With episodes of
    150 steps on average nothing is dropped; with episodes of 1-2 steps much is."""
    rb = make_buffer(prioritized, capacity, device)
    run = Run(rb, num_envs=3, k=4, n=n, seed=0, max_len=max_len, p_jump=p_jump)
    run.run(150, glitch=glitch, check_every=10)
    assert rb.written > 2 * capacity  # the ring wrapped
    assert np.array_equal(rb.frame_store.count.numpy(), run.model.count)  # the storage rule, frame for frame
    seen = set(run.check_sample(rb.sample(4000)))
    assert seen == run.sampleable()
    dropped = set(run.live()) - run.sampleable()
    if max_len == 300:
        assert not dropped
    if max_len == 2:
        assert len(dropped) > capacity // 4, "very short episodes must overwrite live transitions' frames"


def test_one_step_samples_gather_k_plus_one_frames_and_n_step_samples_2k(device):
    """n = 1 transitions share k - 1 frames between obs and next_obs: one gather of k + 1 frames
    gives both (views of one tensor); with n-step windows of several lengths the two stacks come
    from one [2, B, k] gather."""
    for n, shared in ((1, True), (3, False)):
        rb = make_buffer(False, 100, device)
        run = Run(rb, num_envs=2, k=4, n=n, seed=1, max_len=20, p_jump=0.0)
        run.run(80)
        batch = rb.sample(32)
        run.check_sample(batch)
        same = batch["obs"].untyped_storage().data_ptr() == batch["next_obs"].untyped_storage().data_ptr()
        assert same
        if shared:
            assert batch["obs"].untyped_storage().nbytes() == 32 * 5 * math.prod(FRAME)
        else:
            assert batch["obs"].untyped_storage().nbytes() == 2 * 32 * 4 * math.prod(FRAME)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    num_envs=st.integers(1, 4),
    k=st.integers(1, 4),
    n=st.integers(1, 3),
    capacity=st.integers(4, 60),
    max_len=st.integers(1, 12),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_random_streams(num_envs, k, n, capacity, max_len, prioritized, seed):
    """Any env count, stack depth, n, capacity and episode length: every sampled item is bit-exact
    and sampleable, the frames written follow the storage rule, and a large sample reaches every
    sampleable transition (at most 60 of them: a miss has probability < 60 * (1 - 1/60)**3000)."""
    capacity = max(capacity, n * num_envs)  # an n-step flush emits up to n transitions per env
    rb = make_buffer(prioritized, capacity, "cpu", k=k, seed=seed)
    run = Run(rb, num_envs, k, n, seed, max_len=max_len, p_jump=0.05)
    run.run(int(2.5 * capacity / num_envs) + 5, glitch=0.03, check_every=3, batch_size=16)
    assert np.array_equal(rb.frame_store.count.numpy(), run.model.count)
    if run.sampleable():
        assert set(run.check_sample(rb.sample(3000))) == run.sampleable()


def test_real_atari_stacks(device):
    """ale-py's AtariVectorEnv (Breakout: life losses and game overs within 400 random steps), 2 envs,
    through make_vector_env and TransitionRecorder; n = 1 into a prioritized buffer and n = 3 into
    a uniform one, capacity 300 (the ring wraps). Sampled stacks equal the recorded ones, and each
    step stores about one frame per env (the storage rule is checked exactly)."""
    pytest.importorskip("ale_py")
    env = make_vector_env("BreakoutNoFrameskip-v4", 2, seed=0)
    recorder = TransitionRecorder(2, clip_reward=True)
    buffers_ = {1: make_buffer(True, 300, device), 3: make_buffer(False, 300, device)}
    nsteps = {n: (NStepReturns(n, 0.99, 2), NStepReturns(n, 0.99, 2)) for n in buffers_}
    refs: dict[int, dict[int, TensorDict]] = {n: {} for n in buffers_}
    model = StorageModel(2, 4)
    obs, _ = env.reset(seed=0)
    ends = life_losses = 0
    for _ in range(400):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, info = env.step(action)
        td, _ = recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        model.step(td["obs"].numpy(), td["next_obs"].numpy())
        ends += int((terminated | truncated).sum())
        life_losses += int(info["life_loss"].sum())
        for n, rb in buffers_.items():
            on_positions, on_stacks = nsteps[n]
            ready, ready_ref = on_positions.push(rb.add_frames(td)), on_stacks.push(td)
            for i, idx in enumerate(rb.extend(ready).cpu().tolist()):
                refs[n][idx] = ready_ref[i].clone()
        obs = next_obs
    env.close()
    assert ends >= 1 and life_losses >= 4
    for n, rb in buffers_.items():
        assert np.array_equal(rb.frame_store.count.numpy(), model.count)
        assert model.count.sum() <= 800 + 2 * 4 + 4 * ends  # one frame per step, k per episode start
        batch = rb.sample(512)
        live = set(range(rb.written - rb.capacity, rb.written))
        for i, idx in enumerate(batch["index"].cpu().tolist()):
            assert idx in live
            for key in ("obs", "next_obs", "reward", "terminated", "discount"):
                assert torch.equal(batch[key][i].cpu(), refs[n][idx][key]), (n, key, idx)
        assert batch["obs"].shape == (512, 4, 84, 84) and batch["obs"].dtype == torch.uint8


# ---- sampling distributions ----------------------------------------------------------------------


def short_episode_run(prioritized: bool, device, seed: int = 0) -> Run:
    """A buffer of 60 transitions from 2 envs with episodes of 1-3 steps: many dropped transitions."""
    rb = make_buffer(prioritized, 60, device, seed=seed)
    run = Run(rb, num_envs=2, k=4, n=1, seed=seed, max_len=3, p_jump=0.05)
    run.run(200)
    dropped = set(run.live()) - run.sampleable()
    assert 5 <= len(dropped) <= 50, len(dropped)
    return run


def test_uniform_sampling_is_uniform_over_the_sampleable_transitions_chi_square(device, chi_square):
    """Seed 3, 100,000 draws; dropped transitions are never drawn, and the counts of the sampleable
    ones fit the uniform distribution (Pearson chi-square at significance 1e-3, tests/conftest.py)."""
    run = short_episode_run(False, device, seed=3)
    index = torch.cat([run.rb.sample(1000)["index"] for _ in range(100)]).cpu()
    sampleable = sorted(run.sampleable())
    counts = np.array([int((index == i).sum()) for i in sampleable])
    assert counts.sum() == index.numel()  # nothing else was drawn
    stat, critical = chi_square(counts, np.full(len(sampleable), 1.0 / len(sampleable)))
    assert stat < critical, (stat, critical)


def test_prioritized_sampling_is_proportional_over_the_sampleable_transitions(device, chi_square):
    """Random priorities set for every live index, dropped ones included (they must stay at 0).
    Seed 4, 100,000 draws; counts fit P(i) = (p_i + eps)^alpha / sum over the sampleable ones
    (Pearson chi-square at significance 1e-3); the weights are exact (to 1e-6) with the maximum
    over the sampleable transitions only, so some weight is exactly 1."""
    run = short_episode_run(True, device, seed=4)
    prb = run.rb
    live = run.live()
    rng = np.random.default_rng(4)
    priority = rng.exponential(size=len(live)) + 0.05
    prb.update_priority(torch.tensor(live, device=device), torch.tensor(priority, device=device))
    sampleable = sorted(run.sampleable())
    stored = {i: (p + prb.eps) ** prb.alpha for i, p in zip(live, priority, strict=True) if i in run.sampleable()}
    leaves = prb.tree.leaves.cpu().numpy()
    for i in live:
        assert leaves[i % prb.capacity] == (pytest.approx(stored[i], rel=1e-12) if i in stored else 0.0)
    assert prb.tree.minimum.item() == pytest.approx(min(stored.values()), rel=1e-12)

    batches = [prb.sample(1000) for _ in range(100)]
    index = torch.cat([b["index"] for b in batches]).cpu()
    counts = np.array([int((index == i).sum()) for i in sampleable])
    assert counts.sum() == index.numel()
    stat, critical = chi_square(counts, np.array([stored[i] for i in sampleable]))
    assert stat < critical, (stat, critical)

    smallest = min(stored.values())
    weight = torch.cat([b["weight"] for b in batches]).cpu().numpy()
    expected = np.array([(stored[i] / smallest) ** -prb.beta for i in index.tolist()])
    np.testing.assert_allclose(weight, expected, rtol=1e-6)
    run.check_sample(batches[0])


def test_a_transition_dropped_after_it_was_sampled_keeps_priority_zero(device):
    """Priorities that grow with the index, so the oldest transitions, which lose their frames first,
    hold the smallest: once they are dropped, their leaves must read 0 (out of the sums and the
    minimum), the minimum must come from the sampleable ones, and a later update must not bring them back."""
    run = short_episode_run(True, device, seed=5)
    prb = run.rb
    live = torch.tensor(run.live())
    prb.update_priority(live.to(device), (live - live[0] + 1).double().to(device))
    batch = prb.sample(200)
    run.run(6)  # more frames: some sampled transitions lose theirs
    index = batch["index"]
    gone = [i for i in index.cpu().tolist() if i >= prb.written - prb.capacity and i not in run.sampleable()]
    assert gone
    for _ in range(2):
        leaves = prb.tree.leaves.cpu().numpy()
        assert all(leaves[i % prb.capacity] == 0.0 for i in gone)
        sampleable = [i % prb.capacity for i in run.sampleable()]
        assert prb.tree.minimum.item() == leaves[sampleable].min() > 0
        prb.update_priority(index, torch.full((index.numel(),), 5.0, device=device))
    assert set(run.check_sample(prb.sample(2000))) == run.sampleable()


def test_a_transition_whose_frames_went_while_it_waited_for_its_n_step_window_is_never_sampled(device):
    """n = 20 with 1 env and capacity 30 (a ring of 47 frames), where most next_obs are not shifts
    (k = 4 frames a step): a window's first obs is overwritten before the window closes, so
    transitions arrive in extend already dropped."""
    for prioritized in (False, True):
        rb = make_buffer(prioritized, 30, device)
        run = Run(rb, num_envs=1, k=4, n=20, seed=2, max_len=40, p_jump=0.8)
        arrived_dropped = 0
        for _ in range(120):
            before = rb.written
            run.step()
            length = rb.frame_store.frames_per_env
            new = range(max(before, rb.written - rb.capacity), rb.written)
            arrived_dropped += sum(run.first[i][1] < run.model.count[0] - length for i in new)
            if run.sampleable():
                assert set(run.check_sample(rb.sample(200))) == run.sampleable()
        assert arrived_dropped > 5


def test_a_draw_that_lands_on_a_dropped_transition_is_redrawn(device, monkeypatch):
    """Rounding in the descent may land a draw on a zero leaf, and the clamp in sample on the last
    item even when it was dropped: forced here by a descent that always answers a dropped slot for
    the first few calls. Every returned draw is sampleable, with its exact weight."""
    run = short_episode_run(True, device, seed=6)
    prb = run.rb
    dropped = sorted(set(run.live()) - run.sampleable())
    real = prb.tree.find_prefix
    calls = []

    def find_prefix(mass, relative=False):
        calls.append(1)
        if len(calls) < 3:
            return torch.full_like(mass, dropped[0] % prb.capacity, dtype=torch.int64)
        return real(mass, relative)

    monkeypatch.setattr(prb.tree, "find_prefix", find_prefix)
    batch = prb.sample(64)
    run.check_sample(batch)
    assert len(calls) == 3
    monkeypatch.setattr(prb.tree, "find_prefix", lambda mass, relative=False: torch.full_like(
        mass, dropped[0] % prb.capacity, dtype=torch.int64))
    batch = prb.sample(64)  # the descent never helps: the exact fallback over the positive leaves
    run.check_sample(batch)


# ---- bad input, memory, checkpoints ----------------------------------------------------------------


def stacks_step(num_envs: int = 2, k: int = 4, value: int = 1) -> TensorDict:
    obs = torch.full((num_envs, k, *FRAME), value, dtype=torch.uint8)
    return TensorDict({"obs": obs, "action": torch.zeros(num_envs, dtype=torch.int64),
                       "reward": torch.zeros(num_envs), "next_obs": obs + 1,
                       "terminated": torch.zeros(num_envs, dtype=torch.bool),
                       "truncated": torch.zeros(num_envs, dtype=torch.bool)}, batch_size=[num_envs])


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_extend_with_stacks_in_frame_mode_raises_and_changes_nothing(device, snapshot, prioritized):
    rb = make_buffer(prioritized, 20, device)
    with pytest.raises(ValueError, match=r"add_frames.*got obs \(4, 2, 3\) torch.uint8"):
        rb.extend(stacks_step())
    rb.extend(rb.add_frames(stacks_step()))
    before = snapshot(rb)
    with pytest.raises(ValueError, match="add_frames"):
        rb.extend(stacks_step(value=7))
    with pytest.raises(ValueError, match="add_frames"):
        rb.extend(stacks_step().exclude("next_obs"))
    assert snapshot(rb) == before


def test_positions_that_are_not_ours_or_stored_twice_raise_and_change_nothing(device, snapshot):
    rb = make_buffer(False, 20, device)
    step = rb.add_frames(stacks_step())
    rb.extend(step)
    before = snapshot(rb)
    with pytest.raises(ValueError, match="already stored"):
        rb.extend(step)
    with pytest.raises(ValueError, match="already stored"):
        rb.extend(torch.cat([rb.add_frames(stacks_step(value=9))] * 2))
    after_frames = snapshot(rb)  # add_frames wrote frames; the refused extend nothing more
    assert after_frames != before
    for obs, next_obs in ((-1, 1), (0, 1000), (3, 1), (2, 5)):  # negative, unwritten, backwards, another env
        bad = step.clone()
        bad["obs"], bad["next_obs"] = torch.tensor([obs, obs]), torch.tensor([next_obs, next_obs])
        with pytest.raises(ValueError, match="never returned"):
            rb.extend(bad)
    assert snapshot(rb) == after_frames


def test_add_frames_checks_its_input(device, snapshot):
    rb = make_buffer(False, 20, device)
    with pytest.raises(ValueError, match=r"stacks \[E, 4, \.\.\.\]"):
        rb.add_frames(stacks_step(k=3))
    rb.add_frames(stacks_step())
    before = snapshot(rb)
    with pytest.raises(ValueError, match="one step of the same 2 envs"):
        rb.add_frames(stacks_step(num_envs=3))
    with pytest.raises(ValueError, match="missing"):
        rb.add_frames(stacks_step().exclude("obs"))
    assert snapshot(rb) == before


def test_add_frames_is_the_identity_without_frame_stack():
    rb = ReplayBuffer(10)
    step = stacks_step()
    assert rb.add_frames(step) is step
    with pytest.raises(ValueError, match="frame_stack"):
        ReplayBuffer(10, frame_stack=-1)


@pytest.mark.parametrize("frame_mode", [False, True], ids=["generic", "frames"])
def test_a_buffer_that_cannot_fit_is_refused_with_the_sizes(device, monkeypatch, snapshot, frame_mode):
    rb = make_buffer(False, 1000, device, k=4 if frame_mode else 0) if frame_mode else ReplayBuffer(1000, device)
    monkeypatch.setattr(buffers.frames, "available_memory", lambda device: (12_345, "a test"))
    before = snapshot(rb)
    step = stacks_step()
    write = (lambda: rb.add_frames(step)) if frame_mode else (lambda: rb.extend(step))
    with pytest.raises(MemoryError, match=r"needs [\d,]+ bytes .* only 12,345 bytes .* available \(a test\)"):
        write()
    assert snapshot(rb) == before
    monkeypatch.undo()
    write()  # fits on this machine
    # The numbers: frames of (1000 * 1.02 / 2 + 16) per env, 6 bytes each plus an 8-byte owner;
    # or 1000 items of two 24-byte stacks and 8 + 4 + 1 + 1 bytes of the other keys.
    length = math.ceil(1000 * 1.02 / 2) + 16
    needed = 2 * length * (6 + 8) + 1000 * (16 + 14) if frame_mode else 1000 * (2 * 24 + 14)
    monkeypatch.setattr(buffers.frames, "available_memory", lambda device: (needed - 1, "a test"))
    fresh = make_buffer(False, 1000, device) if frame_mode else ReplayBuffer(1000, device)
    with pytest.raises(MemoryError, match=f"needs {needed:,} bytes"):
        (fresh.add_frames if frame_mode else fresh.extend)(step)
    monkeypatch.setattr(buffers.frames, "available_memory", lambda device: (needed, "a test"))
    (fresh.add_frames if frame_mode else fresh.extend)(step)


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_check_memory_refuses_before_any_write_and_names_a_capacity_that_fits(device, monkeypatch, snapshot,
                                                                               num_seeds):
    """A frame buffer asked up front, from a step's obs stacks: refused as the first write would be (same bytes,
    2 envs a seed), nothing changed; the capacity it names fits the same memory, with 90% of it to spare."""
    rb = PrioritizedReplayBuffer(100_000, device=device, frame_stack=4, num_seeds=num_seeds)
    obs = stacks_step(num_envs=2 * num_seeds)["obs"].numpy()
    length = math.ceil(100_000 * 1.02 / 2) + 16
    needed = 2 * num_seeds * length * (6 + 8) + num_seeds * 100_000 * (16 + 64)
    monkeypatch.setattr(buffers.frames, "available_memory", lambda device: (needed - 1, "a test"))
    before = snapshot(rb)
    with pytest.raises(MemoryError, match=f"needs {needed:,} bytes .* a capacity of ([\\d,]+) transitions fits") as e:
        rb.check_memory(obs)
    assert snapshot(rb) == before and rb.frame_store.frames is None
    fits = e.value.fits
    assert fits % 10_000 == 0 and 0.8 * 100_000 <= fits < 100_000 and e.value.needed == needed
    PrioritizedReplayBuffer(fits, device=device, frame_stack=4, num_seeds=num_seeds).check_memory(obs)
    monkeypatch.setattr(buffers.frames, "available_memory", lambda device: (needed, "a test"))
    rb.check_memory(obs)
    ReplayBuffer(100_000, device=device).check_memory(obs)  # no frames: checked at its first write


def test_available_memory_reads_this_machine():
    available = buffers.frames.available_memory(torch.device("cpu"))
    assert available is not None and available[0] > 0


def test_a_million_atari_transitions_fit_in_7_3_gb_of_frames():
    """Sizing only (no memory is touched: a meta-device store): 1M transitions of 84x84 frames from
    1 or 8 envs take at most 7.3e9 bytes of frames, 1.02-1.03x one frame per transition."""
    for num_envs in (1, 8):
        store = FrameStore(4, 10**6, "meta")
        stack = torch.zeros(num_envs, 4, 84, 84, dtype=torch.uint8)
        store.add(TensorDict(obs=stack, next_obs=stack, batch_size=[num_envs]), first_live=0)
        nbytes = store.frames.numel() * store.frames.element_size()
        assert 7.056e9 * 1.02 <= nbytes <= 7.3e9, nbytes


def recorded_steps(num_envs: int, steps: int, seed: int, **env_kwargs) -> list[TensorDict]:
    env = ScriptedFrameEnv(num_envs, 4, seed, **env_kwargs)
    recorder = TransitionRecorder(num_envs)
    obs, out = env.reset(), []
    for _ in range(steps):
        action = env.rng.integers(0, 6, size=num_envs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        out.append(recorder.record(obs, action, reward, next_obs, terminated, truncated, info)[0])
        obs = next_obs
    return out


def test_state_dict_round_trip_through_a_file(device, tmp_path, snapshot):
    """Frames, owners, counters, positions, priorities and the generator come back exactly, from a
    file loaded with weights_only=True; both buffers then sample and store alike. The state holds
    the live frames (no copy); load copies them, unless copy=False, which adopts them."""
    steps = recorded_steps(3, 100, seed=7, max_len=4, p_jump=0.05)
    original = make_buffer(True, 50, device, seed=7)
    for td in steps[:60]:
        original.extend(original.add_frames(td))
    original.sample(8)
    state = original.state_dict()
    assert state["frames"]["frames"] is original.frame_store.frames  # a reference, not a copy
    assert state["storage"]["obs"] is original.storage["obs"]
    path = tmp_path / "buffer.pt"
    torch.save(state, path)

    copy = make_buffer(True, 50, device, seed=99)
    copy.load_state_dict(torch.load(path, weights_only=True))
    assert snapshot(copy) == snapshot(original)
    assert copy.frame_store.frames.data_ptr() != original.frame_store.frames.data_ptr()
    for _ in range(3):
        assert (copy.sample(16) == original.sample(16)).all()
    for td in steps[60:]:  # same writes, same future; and the copy shares nothing with the original
        for rb in (original, copy):
            batch = rb.sample(4)
            rb.update_priority(batch["index"], batch["reward"].abs())
            rb.extend(rb.add_frames(td))
        assert snapshot(copy) == snapshot(original)
    assert original.frame_store.may_hold_dropped(original.written - original.capacity)  # drops were restored too

    adopted = make_buffer(True, 50, device, seed=1)
    loaded = torch.load(path, weights_only=True, mmap=True)
    adopted.load_state_dict(loaded, copy=False)
    if device.type == "cpu":
        assert adopted.frame_store.frames.data_ptr() == loaded["frames"]["frames"].data_ptr()
        assert adopted.storage["obs"].data_ptr() == loaded["storage"]["obs"].data_ptr()
    fresh = make_buffer(True, 50, device, seed=1)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert snapshot(adopted) == snapshot(fresh)


def test_a_store_not_yet_wrapped_saves_only_the_frames_it_holds_and_comes_back_exactly(device, tmp_path, snapshot):
    """Before every env's ring has wrapped, the state's frames are each env's rows written so far, views of the
    store (no copy): the file holds those frames, not the capacity's, and the loaded buffer samples and stores
    as the original does; once every ring has wrapped, the two are the same to the byte."""
    steps = recorded_steps(3, 150, seed=5, max_len=6, p_jump=0.1)
    original = make_buffer(True, 400, device, seed=3)
    for td in steps[:30]:
        original.extend(original.add_frames(td))
    store = original.frame_store
    state = original.state_dict()
    written = [min(int(c), store.frames_per_env) for c in store.count]
    assert len(set(written)) > 1 and max(written) < store.frames_per_env  # resets: the envs' rings fill unevenly
    rows = state["frames"]["frames"]
    assert [len(r) for r in rows] == written
    for env, r in enumerate(rows):  # the store's own memory
        assert r.data_ptr() == store.frames[env * store.frames_per_env].data_ptr()
    path = tmp_path / "buffer.pt"
    torch.save(state, path)
    row_bytes = store.frames[0].numel()
    assert sum(written) < 0.6 * len(store.frames)
    assert sum(written) * row_bytes < path.stat().st_size < sum(written) * row_bytes + 100_000

    for mmap in (False, True):
        copy = make_buffer(True, 400, device, seed=99)
        copy.load_state_dict(torch.load(path, weights_only=True, mmap=mmap), copy=not mmap)
        for env, n in enumerate(written):
            span = slice(env * store.frames_per_env, env * store.frames_per_env + n)
            assert torch.equal(copy.frame_store.frames[span], store.frames[span])
        for _ in range(3):
            assert (copy.sample(16) == original.sample(16)).all()
        for td in steps[30:]:
            for rb in (original, copy):
                batch = rb.sample(4)
                rb.update_priority(batch["index"], batch["reward"].abs())
                rb.extend(rb.add_frames(td))
        assert bool((original.frame_store.count >= store.frames_per_env).all())
        assert snapshot(copy) == snapshot(original)
        assert original.state_dict()["frames"]["frames"] is original.frame_store.frames  # wrapped: the whole store
        original = make_buffer(True, 400, device, seed=3)  # again, for the mmap load
        for td in steps[:30]:
            original.extend(original.add_frames(td))
        store = original.frame_store


def test_a_state_whose_frames_do_not_match_its_counts_is_refused(device):
    rb = make_buffer(False, 200, device)
    for td in recorded_steps(3, 10, seed=1):
        rb.extend(rb.add_frames(td))
    state = rb.state_dict()
    state["frames"]["frames"] = [rows[:-1] for rows in state["frames"]["frames"]]
    with pytest.raises(ValueError, match="rows per env; its counts say"):
        make_buffer(False, 200, device).load_state_dict(state)


def test_loading_a_state_of_the_other_kind_raises(device):
    frames = make_buffer(False, 10, device)
    generic = ReplayBuffer(10, device=device)
    with pytest.raises(ValueError, match="state is for frame_stack=0, this buffer has frame_stack=4"):
        frames.load_state_dict(generic.state_dict())
    with pytest.raises(ValueError, match="state is for frame_stack=4, this buffer has frame_stack=0"):
        generic.load_state_dict(frames.state_dict())
    with pytest.raises(ValueError, match="state is for frame_stack=4, this buffer has frame_stack=2"):
        make_buffer(False, 10, device, k=2).load_state_dict(frames.state_dict())
