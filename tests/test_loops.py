"""The training loops of algos/*.py under test: each test runs `main` (or a small function that `main` calls)
on a probe environment, watches it through spies on module-level names, and compares what it saw with an
expectation computed independently (a hand-written schedule, multiples of a frequency counted one by one,
a probe env whose rewards and observations say where they come from, a loss worked out by hand).

tests/README.md ("Mutations", "algos") lists the changes to the loops that these tests were seen to catch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase

import harness.run
from buffers import PrioritizedReplayBuffer, ReplayBuffer
from envs import TransitionRecorder, env_seeds
from envs.make import _env_spec
from harness import crossed
from tests import probe_env
from tests.algo_utils import ROOT, load_algo, parse, run_dir_of, tiny_args

ALGOS = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn", "ddpg")}
DQNS = ["dqn", "per_dqn", "nstep_dqn"]
PROBE = "tests.probe_env:Probe-v0"  # obs (instance, episode, t), reward t, Discrete(2)
CONTINUOUS = "tests.probe_env:ContinuousProbe-v0"  # the same with Box actions x in [-2, 2], y in [0, 1]
LOW, HIGH = probe_env.ContinuousProbeEnv.action_space.low, probe_env.ContinuousProbeEnv.action_space.high


# ---- helpers --------------------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("main_in_tmp_path")  # see conftest.py


def args_for(name: str, **changes):
    """tiny_args on the probe env of the algorithm's action space (episodes of 1-8 steps: evaluations are quick)."""
    algo = ALGOS[name]
    return tiny_args(algo, **{"env": CONTINUOUS if name == "ddpg" else PROBE, "eval_episodes": 1, **changes})


def vector_steps(total: int, num_envs: int) -> list[tuple[int, int]]:
    """(previous, step) of every loop iteration: the step counter goes 0, E, 2E, ... until it reaches total."""
    return [(previous, previous + num_envs) for previous in range(0, total, num_envs)]


def multiples(every: int, low: int, high: int) -> int:
    """How many multiples of `every` lie in (low, high], counted one by one."""
    return sum(1 for m in range(low + 1, high + 1) if m % every == 0)


def spy_steps(monkeypatch) -> list[SimpleNamespace]:
    """Every env step the loop records: obs, action, raw reward and the transitions made of them.

    The loop calls TransitionRecorder.record once per iteration, before it advances the step counter:
    after the k-th call (counting from 1) the counter is k * num_envs.
    """
    steps = []
    record = TransitionRecorder.record

    def spy(self, obs, action, reward, next_obs, terminated, truncated, info):
        transitions, finished = record(self, obs, action, reward, next_obs, terminated, truncated, info)
        steps.append(SimpleNamespace(obs=np.array(obs), action=np.array(action), reward=np.array(reward),
                                     transitions=transitions.clone()))
        return transitions, finished

    monkeypatch.setattr(TransitionRecorder, "record", spy)
    return steps


def spy_networks(monkeypatch, algo, name: str = "QNetwork") -> list[torch.nn.Module]:
    """The instances of algo.<name> main creates, in order: the online network, then its target."""
    instances = []
    cls = getattr(algo, name)

    class Recorded(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            instances.append(self)

    monkeypatch.setattr(algo, name, Recorded)
    return instances


def spy_lerps(monkeypatch) -> list[tuple[TensorDictBase, TensorDictBase, float]]:
    """Every TensorDict lerp_ call (the soft/hard target update): (target, online, weight)."""
    calls = []
    lerp_ = TensorDictBase.lerp_

    def spy(self, end, weight):
        calls.append((self, end, weight))
        return lerp_(self, end, weight)

    monkeypatch.setattr(TensorDictBase, "lerp_", spy)
    return calls


def flat(network: torch.nn.Module) -> torch.Tensor:
    """A copy of all of a network's parameters as one vector."""
    return torch.cat([p.detach().flatten() for p in network.parameters()]).clone()


def pointers(params) -> set[int]:
    """The storage addresses of a network's parameters and buffers, or of a TensorDict's leaves."""
    tensors = [*params.parameters(), *params.buffers()] if isinstance(params, torch.nn.Module) else \
        params.values(True, True)
    return {t.data_ptr() for t in tensors}


def preferring(algo):
    """algo.QNetwork forced to prefer action t % 2 (t: the probe's step in the episode, obs[:, 2])."""

    class Prefers(algo.QNetwork):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return F.one_hot(obs[..., 2].long() % 2, 2).float()  # [batch, 2]

    return Prefers


def binomial_ok(count: int, p: np.ndarray, sigmas: float = 4.0) -> bool:
    """Whether `count` successes of independent Bernoulli(p_i) trials lie within `sigmas` sd of the mean."""
    mean, var = float(p.sum()), float((p * (1 - p)).sum())
    return abs(count - mean) <= sigmas * math.sqrt(var) + 1e-9


# ---- periodic events: crossed ----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(every=st.integers(0, 40), start=st.integers(0, 500), increments=st.lists(st.integers(1, 60), max_size=30))
def test_crossed_over_any_step_increments_counts_each_multiple_once(every, start, increments):
    """Summed over the loop's steps, crossed() fires once per multiple of `every` in the range (none for 0),
    whatever the increments (num_envs, resumed counters): a periodic event is never skipped nor doubled."""
    steps = np.cumsum([start, *increments]).tolist()
    fired = sum(crossed(every, a, b) for a, b in zip(steps[:-1], steps[1:], strict=True))
    assert fired == (multiples(every, steps[0], steps[-1]) if every else 0)


# ---- lambda_returns, the DDPG critic's target -----------------------------------------------------------


@st.composite
def slices(draw) -> tuple[torch.Tensor, ...]:
    """[B, L] slices of consecutive steps: rewards and target values in [-10, 10], discounts in [0, 1], episode
    ends anywhere."""
    batch, length = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def tensor(elements, dtype=torch.float32) -> torch.Tensor:
        values = draw(st.lists(elements, min_size=batch * length, max_size=batch * length))
        return torch.tensor(values, dtype=dtype).view(batch, length)

    floats = st.floats(-10, 10, width=32)
    return tensor(floats), tensor(st.floats(0, 1, width=32)), tensor(st.booleans(), torch.bool), tensor(floats)


@settings(max_examples=100, deadline=None)
@given(slices())
def test_lambda_returns_with_lambda_0_is_the_one_step_target(data):
    """lam = 0: every step's target is r + d V(next_obs) exactly, whatever the episode ends in the slice."""
    reward, discount, ended, next_value = data
    target = ALGOS["ddpg"].lambda_returns(reward, discount, ended, next_value, 0.0)
    assert torch.equal(target, reward + discount * next_value)


@settings(max_examples=100, deadline=None)
@given(slices())
def test_lambda_returns_with_lambda_1_sums_rewards_to_the_episode_or_slice_end(data):
    """lam = 1: the discounted sum of rewards from t to the first episode end (terminated or truncated) or the
    slice's last step, whichever comes first, plus the discounted target value after that step."""
    reward, discount, ended, next_value = data
    target = ALGOS["ddpg"].lambda_returns(reward, discount, ended, next_value, 1.0)
    batch, length = reward.shape
    for b in range(batch):
        for t in range(length):
            last = next((k for k in range(t, length) if ended[b, k]), length - 1)
            expected, scale = 0.0, 1.0
            for k in range(t, last + 1):
                expected += scale * float(reward[b, k])
                scale *= float(discount[b, k])
            expected += scale * float(next_value[b, last])
            assert math.isclose(target[b, t].item(), expected, rel_tol=1e-5, abs_tol=1e-4)


# ---- DQN: exploration ------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.0, 1.0])
def test_epsilon_greedy_acts_greedily_or_uniformly(monkeypatch, epsilon):
    """With a network that prefers action t % 2: epsilon 0 takes it at every step of every env; epsilon 1
    takes each action with probability 1/2 (seed 1, 4 sd binomial tolerance). Fails if the exploration
    mask is inverted, ignored, or the greedy action is taken over the wrong axis or from another env."""
    dqn = ALGOS["dqn"]
    monkeypatch.setattr(dqn, "QNetwork", preferring(dqn))
    steps = spy_steps(monkeypatch)
    dqn.main(args_for("dqn", num_envs=2, total_timesteps=800, learning_starts=800, start_e=epsilon, end_e=epsilon))
    preferred = np.concatenate([s.obs[:, 2] % 2 for s in steps])
    taken = np.concatenate([s.action for s in steps])
    assert len(taken) == 800
    if epsilon == 0.0:
        assert np.array_equal(taken, preferred)
    else:
        assert binomial_ok(int((taken == preferred).sum()), np.full(800, 0.5))


@pytest.mark.parametrize("name", DQNS)
def test_epsilon_falls_linearly_then_stays_at_end_e(monkeypatch, name):
    """Epsilon goes from 1 to 0.2 linearly over the first half of 1200 steps, then stays 0.2: in each quarter
    of the run the count of non-preferred actions (probability epsilon / 2 at each step's counter, 2 envs)
    is within 4 sd of the schedule's (seed 1). Fails if epsilon is held at start_e or end_e, decays over
    the wrong horizon, or is not what act() uses."""
    algo = ALGOS[name]
    monkeypatch.setattr(algo, "QNetwork", preferring(algo))
    steps = spy_steps(monkeypatch)
    algo.main(args_for(name, num_envs=2, total_timesteps=1200, learning_starts=1200, start_e=1.0, end_e=0.2,
                       exploration_fraction=0.5))

    def epsilon(step: int) -> float:  # the schedule, by hand
        return 1.0 - 0.8 * step / 600 if step < 600 else 0.2

    other = np.array([int((s.action != s.obs[:, 2] % 2).sum()) for s in steps])
    p = np.array([epsilon(previous) / 2 for previous, _ in vector_steps(1200, 2)])
    assert len(other) == len(p) == 600
    for quarter in np.split(np.arange(600), 4):  # 150 loop iterations of 2 envs each
        assert binomial_ok(int(other[quarter].sum()), np.repeat(p[quarter], 2)), quarter[0]


# ---- DQN: training rounds, target updates, loss, clipping ---------------------------------------------


@pytest.mark.parametrize("name", DQNS)
def test_training_rounds_with_several_envs(name):
    """gradient_steps per multiple of train_frequency the counter crosses once it is past learning_starts:
    with 3 envs and train_frequency 2 a step crosses one multiple or two. Fails for one round per loop
    iteration, rounds skipped or doubled, or learning from the wrong step."""
    summary = ALGOS[name].main(args_for(name, num_envs=3, train_frequency=2, gradient_steps=2,
                                        total_timesteps=300, learning_starts=100))
    expected = sum(2 * multiples(2, previous, step) for previous, step in vector_steps(300, 3) if step > 100)
    assert summary["updates"] == expected


@pytest.mark.parametrize("num_envs, frequency, tau", [(3, 5, 1.0), (3, 2, 0.5)], ids=["copy-3envs-every5",
                                                                                    "tau0.5-3envs-every2"])
@pytest.mark.parametrize("name", DQNS)
def test_target_network_moves_once_per_multiple_of_its_frequency(monkeypatch, name, num_envs, frequency, tau):
    """The targets come from the target network, which reads the online parameters as the updates left them:
    one lerp_(online, tau) per multiple of target_network_frequency the counter crosses once learning is on
    (3 envs: every 5 is not a multiple of the step; every 2 crosses two multiples at some steps), after that
    step's gradient steps. Fails if the target never moves, is the online network, moves at other steps,
    once per step instead of once per multiple, or by another amount than tau."""
    algo = ALGOS[name]
    nets = spy_networks(monkeypatch, algo)
    steps = spy_steps(monkeypatch)
    lerps = spy_lerps(monkeypatch)
    calls = []  # per td_target call: step counter, network given, its parameters, the online parameters
    td_target = algo.td_target

    def spy(network, *rest):
        calls.append((len(steps) * num_envs, network, flat(network), flat(nets[0])))
        return td_target(network, *rest)

    monkeypatch.setattr(algo, "td_target", spy)
    total, start = 240, 60
    summary = algo.main(args_for(name, num_envs=num_envs, total_timesteps=total, learning_starts=start,
                                 train_frequency=2, gradient_steps=1, target_network_frequency=frequency, tau=tau))
    assert len(nets) == 2

    # Replay the schedule: online parameters after k gradient steps are those seen at td_target call k.
    k, expected, updates = 0, calls[0][3], 0
    for previous, step in vector_steps(total, num_envs):
        if step <= start:
            continue
        for _ in range(multiples(2, previous, step)):
            at, network, target_params, _ = calls[k]
            assert at == step and network is nets[1], (k, at, step)
            torch.testing.assert_close(target_params, expected, rtol=1e-6, atol=1e-6, msg=f"call {k} at step {step}")
            k += 1
        for _ in range(multiples(frequency, previous, step)):
            online = calls[k][3] if k < len(calls) else flat(nets[0])
            expected, updates = torch.lerp(expected, online, tau), updates + 1
    assert k == len(calls) == summary["updates"]
    assert len(lerps) == updates and all(weight == tau for _, _, weight in lerps)
    torch.testing.assert_close(flat(nets[1]), expected, rtol=1e-6, atol=1e-6)
    assert any(not torch.equal(target, online) for _, _, target, online in calls)  # the check can tell them apart


class TableQ(torch.nn.Module):
    """Q-values looked up by the observation's first entry: Q(obs) = table[obs[0]]."""

    def __init__(self, table: list[list[float]]):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.table[obs[..., 0].long()]


@pytest.mark.parametrize("loss, expected", [("huber", (2.5 + 2.0 + 0.03125 + 0.125) / 4),
                                            ("mse", (9.0 + 6.25 + 0.0625 + 0.25) / 4)])
@pytest.mark.parametrize("name", DQNS)
def test_td_loss_by_hand(name, loss, expected):
    """A batch whose TD errors are 3, -2.5, -0.25 and 0.5 (two beyond the Huber loss's bend at 1):
    Huber gives |e| - 1/2 beyond 1 and e^2 / 2 within, MSE e^2, averaged. gamma = 0.5; the second
    transition terminated, so its large next-state value is not bootstrapped."""
    algo = ALGOS[name]
    online = TableQ([[6.0, -1.0], [0.0, -5.0], [0.25, 0.0], [-9.0, 0.3]])  # Q(obs_i, action_i) = 6, -5, .25, .3
    target = TableQ([[4.0, -1.0], [9.0, 9.0], [-3.0, 0.0], [1.0, 2.0]])  # max_a Q'(next_obs_i, a) = 4, (9), 0, 2
    terminated = torch.tensor([False, True, False, False])
    batch = TensorDict(obs=torch.arange(4.0).unsqueeze(1), next_obs=torch.arange(4.0).unsqueeze(1),
                       action=torch.tensor([0, 1, 0, 1]), reward=torch.tensor([1.0, -2.5, 0.5, -1.2]),
                       terminated=terminated, discount=torch.where(terminated, 0.0, 0.5), weight=torch.ones(4),
                       batch_size=[4])  # targets: 3, -2.5, 0.5, -0.2
    out = algo.q_loss(online, target, batch, dataclasses.replace(algo.Args(), loss=loss, gamma=0.5))
    assert out[0].shape == () and out[0].item() == pytest.approx(expected, rel=1e-6)
    assert torch.equal(out[1], torch.tensor([6.0, -5.0, 0.25, 0.3]))
    if name == "per_dqn":
        torch.testing.assert_close(out[2], torch.tensor([3.0, -2.5, -0.25, 0.5]))


@pytest.mark.parametrize("name", DQNS)
def test_gradients_are_clipped_before_each_optimizer_step(monkeypatch, name):
    """Every gradient step clips the gradient to max_grad_norm: the norm Adam sees is <= max_grad_norm at every
    step, though before the clip it was larger. Fails if the clip is removed, comes after the step, or is
    given another norm or other parameters."""
    clips, seen = [], []
    algo = ALGOS[name]
    clip_grad_norm_ = algo.clip_grad_norm
    step = torch.optim.Adam.step

    def clip_spy(parameters, max_norm, *args, **kwargs):
        total = clip_grad_norm_(parameters, max_norm, *args, **kwargs)
        clips.append((max_norm, float(total)))
        return total

    def step_spy(self, *args, **kwargs):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(algo, "clip_grad_norm", clip_spy)
    monkeypatch.setattr(torch.optim.Adam, "step", step_spy)
    summary = ALGOS[name].main(args_for(name, max_grad_norm=0.05, total_timesteps=200))
    assert len(clips) == len(seen) == summary["updates"] > 0
    assert all(max_norm == 0.05 for max_norm, _ in clips)
    assert sum(total > 0.05 for _, total in clips) > len(clips) // 2  # the clip had work to do
    assert max(seen) <= 0.05 * (1 + 1e-4)


# ---- DQN: Atari rewards ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DQNS)
def test_atari_rewards_are_clipped_for_training(monkeypatch, name):
    """On an Atari game that pays more than 1 (Space Invaders: 5 to 30 points an alien), the transitions the
    loop stores carry the reward's sign, not the score. Fails if the loop records Atari rewards unclipped."""
    algo = ALGOS[name]
    steps = spy_steps(monkeypatch)
    monkeypatch.setattr(harness.run, "evaluate", lambda *args, **kwargs: [[0.0]])  # not under test here
    algo.main(args_for(name, env="SpaceInvadersNoFrameskip-v4", num_envs=2, total_timesteps=300,
                       learning_starts=300, buffer_size=400, end_e=1.0))  # random play: it scores early
    raw = np.stack([s.reward for s in steps])
    stored = np.stack([s.transitions["reward"].numpy() for s in steps])
    assert raw.max() > 1
    assert np.array_equal(stored, np.sign(raw))


# ---- PER and n-step --------------------------------------------------------------------------------------


def test_per_writes_back_the_abs_td_errors_of_the_sampled_batch(monkeypatch):
    """After each gradient step the sampled indices get |Q(obs, action) - (reward + discount max_a Q'(next_obs,
    a))|, recomputed here from copies of the online and target parameters taken when the batch was sampled.
    Fails for random or stale priorities, priorities for other indices, or the online network as target."""
    per_dqn = ALGOS["per_dqn"]
    QNetwork = per_dqn.QNetwork
    nets = spy_networks(monkeypatch, per_dqn)
    records = []

    class Recorded(PrioritizedReplayBuffer):
        def sample(self, batch_size):
            batch = super().sample(batch_size)
            records.append(dict(batch=batch.clone(), online=flat(nets[0]), target=flat(nets[1])))
            return batch

        def update_priority(self, index, priority):
            records[-1].update(index=index.clone(), priority=priority.clone())
            super().update_priority(index, priority)

    monkeypatch.setattr(per_dqn, "PrioritizedReplayBuffer", Recorded)
    summary = per_dqn.main(args_for("per_dqn", n_step=3, gamma=0.9, total_timesteps=300,
                                    target_network_frequency=10))
    online, target = (QNetwork(probe_env.ProbeEnv.observation_space, probe_env.ProbeEnv.action_space)
                      for _ in range(2))
    assert len(records) == summary["updates"] > 0
    for record in records:
        batch = record["batch"]
        torch.nn.utils.vector_to_parameters(record["online"], online.parameters())
        torch.nn.utils.vector_to_parameters(record["target"], target.parameters())
        with torch.no_grad():
            q = online(batch["obs"])[torch.arange(len(batch)), batch["action"].long()]
            best = target(batch["next_obs"]).max(dim=1).values
        assert torch.equal(record["index"], batch["index"])
        torch.testing.assert_close(record["priority"], (q - batch["reward"] - batch["discount"] * best).abs(),
                                   rtol=1e-5, atol=1e-5)
    assert sum(not torch.equal(r["online"], r["target"]) for r in records) > len(records) // 2


def test_per_beta_anneals_linearly_to_one(monkeypatch):
    """Every batch is drawn with beta on the straight line from beta_start at step 0 to 1 at total_timesteps.
    Fails if beta stays at beta_start (until the end or throughout) or follows another schedule."""
    per_dqn = ALGOS["per_dqn"]
    steps = spy_steps(monkeypatch)
    betas = []
    sample = PrioritizedReplayBuffer.sample

    def spy(self, batch_size):
        betas.append((len(steps) * 2, self.beta))
        return sample(self, batch_size)

    monkeypatch.setattr(PrioritizedReplayBuffer, "sample", spy)
    per_dqn.main(args_for("per_dqn", num_envs=2, beta_start=0.2, total_timesteps=400))
    at, beta = np.array(betas).T
    assert at.min() <= 110 and at.max() == 400
    np.testing.assert_allclose(beta, np.interp(at, [0, 400], [0.2, 1.0]), rtol=1e-9)


@pytest.mark.parametrize("name", ["per_dqn", "nstep_dqn", "ddpg"])
def test_stored_transitions_fold_n_steps(monkeypatch, name):
    """--n-step 3 on the probe (reward t after step t): a stored transition from step t0 to t0 + m carries
    reward sum_{k<m} gamma^k (t0 + k + 1), discount 0 if it terminated else gamma^m, and m = 3 unless the
    episode ended first. Fails if the loop folds another n than --n-step (e.g. NStepReturns(1, ...))."""
    algo = ALGOS[name]
    stored = []
    cls = PrioritizedReplayBuffer if name == "per_dqn" else ReplayBuffer
    extend = cls.extend

    def spy(self, data):
        stored.append(data.clone())
        return extend(self, data)

    monkeypatch.setattr(cls, "extend", spy)
    algo.main(args_for(name, n_step=3, gamma=0.5, num_envs=2, total_timesteps=200, learning_starts=200))
    rows = torch.cat(stored)
    assert 200 - 2 * 2 <= len(rows) <= 200  # one per env step, but for the windows still open at the end
    obs, next_obs = rows["obs"].double(), rows["next_obs"].double()
    assert torch.equal(obs[:, :2], next_obs[:, :2])  # same env instance, same episode
    t0, m = obs[:, 2], next_obs[:, 2] - obs[:, 2]
    ended = rows["terminated"] | rows["truncated"]
    assert ((m >= 1) & (m <= 3)).all() and ((m == 3) | ended).all() and (m == 3).sum() > len(rows) / 3
    expected = sum(torch.where(m > k, 0.5**k * (t0 + k + 1), 0.0) for k in range(3))
    assert torch.equal(rows["reward"].double(), expected)
    assert torch.equal(rows["discount"].double(), torch.where(rows["terminated"], 0.0, 0.5**m))


# ---- evaluation ------------------------------------------------------------------------------------------


def spy_evaluations(monkeypatch, steps, num_envs) -> list[int]:
    """The step counter at every evaluation the run makes (envs.evaluate, called by harness/run.py; it runs)."""
    at = []
    evaluate = harness.run.evaluate

    def spy(*args, **kwargs):
        at.append(len(steps) * num_envs)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(harness.run, "evaluate", spy)
    return at


@pytest.mark.parametrize("total", [300, 330])
@pytest.mark.parametrize("name", list(ALGOS))
def test_evaluations_at_multiples_of_eval_frequency(monkeypatch, tmp_path, name, total):
    """An evaluation at each step that crosses a multiple of eval_frequency (3 envs, every 100: steps 102, 201,
    300), logged at that step, and the final one, which at step 300 is the periodic one (run and logged once);
    at 330 steps the final one comes after. Fails if periodic evaluation is skipped or mistimed, or the final one
    repeats the last periodic one."""
    algo = ALGOS[name]
    steps = spy_steps(monkeypatch)
    at = spy_evaluations(monkeypatch, steps, 3)
    args = args_for(name, num_envs=3, eval_frequency=100, total_timesteps=total)
    summary = algo.main(args)
    periodic = [step for previous, step in vector_steps(total, 3) if multiples(100, previous, step)]
    assert at == (periodic if total == 300 else [*periodic, total]) and summary["eval_episodes"] == 1
    logged = [r["global_step"] for r in map(json.loads, (run_dir_of(tmp_path, args) / "metrics.jsonl").open())
              if "eval/episodic_return" in r]
    assert logged == at


@pytest.mark.parametrize("name", list(ALGOS))
def test_an_evaluation_reaching_stop_return_ends_training(monkeypatch, name):
    """stop_return below any return: training ends at the first periodic evaluation (step 102 with 3 envs,
    every 100), which is then the final evaluation (run once). Fails if early stopping is ignored, or the final
    evaluation plays the same episodes again."""
    algo = ALGOS[name]
    steps = spy_steps(monkeypatch)
    at = spy_evaluations(monkeypatch, steps, 3)
    summary = algo.main(args_for(name, num_envs=3, eval_frequency=100, stop_return=-1e9, total_timesteps=300))
    assert summary["global_step"] == 102 and at == [102] and len(steps) == 34 and summary["eval_episodes"] == 1


@pytest.mark.parametrize("name", list(ALGOS))
def test_evaluation_envs_are_seeded_apart_from_training(monkeypatch, name):
    """Training resets its 3 envs with seeds 5, 5 + 2**20, 5 + 2**21 (envs.env_seeds); every evaluation env gets
    a seed outside them (and a seed, so evaluations repeat). Fails if evaluation plays the training seeds
    (seed=args.seed)."""
    resets = []
    reset = gym.vector.SyncVectorEnv.reset

    def spy(self, *, seed=None, options=None):
        if seed is not None:
            resets.append(set(range(seed, seed + self.num_envs)) if isinstance(seed, int) else set(seed))
        return reset(self, seed=seed, options=options)

    monkeypatch.setattr(gym.vector.SyncVectorEnv, "reset", spy)
    ALGOS[name].main(args_for(name, seed=5, num_envs=3, eval_frequency=100, total_timesteps=300))
    training, *evaluations = resets
    assert training == set(env_seeds([5], 3)) and len(evaluations) == 3  # 3 periodic, the one at 300 the final one
    assert all(not (seeds & training) for seeds in evaluations)


# ---- DDPG ------------------------------------------------------------------------------------------------


def test_ddpg_actor_steps_once_per_policy_frequency_critic_steps(monkeypatch):
    """With policy_frequency 3 the optimizer steps go critic, critic, critic, actor, ...: actor steps = critic
    steps // 3, each after the critic step that completes a multiple of 3. Fails if the actor steps at every
    critic step, never, or out of turn."""
    ddpg = ALGOS["ddpg"]
    actors = spy_networks(monkeypatch, ddpg, "Actor")
    order = []
    step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        params = {p.data_ptr() for group in self.param_groups for p in group["params"]}
        order.append("actor" if params == {p.data_ptr() for p in actors[0].parameters()} else "critic")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    summary = ddpg.main(args_for("ddpg", policy_frequency=3, total_timesteps=200, learning_starts=100))
    critic_steps = summary["updates"]
    assert critic_steps == 100 and order.count("actor") == critic_steps // 3
    expected = [kind for u in range(1, critic_steps + 1) for kind in (["critic", "actor"] if u % 3 == 0
                                                                       else ["critic"])]
    assert order == expected


def test_ddpg_targets_trail_the_networks_once_per_actor_step(monkeypatch):
    """Each actor step is followed by one lerp_(tau) of the target parameters (the tensors the target actor and
    critic read) toward the online ones. Fails if the target update is removed from main, moves other
    tensors, or uses another rate."""
    ddpg = ALGOS["ddpg"]
    actors = spy_networks(monkeypatch, ddpg, "Actor")
    critics = spy_networks(monkeypatch, ddpg, "QNetwork")
    lerps = []
    lerp_ = TensorDictBase.lerp_

    def spy(self, end, weight):
        before = torch.cat([flat(actors[1]), flat(critics[1])])
        result = lerp_(self, end, weight)
        lerps.append((pointers(self), pointers(end), weight, before,
                      torch.cat([flat(actors[0]), flat(critics[0])]), torch.cat([flat(actors[1]), flat(critics[1])])))
        return result

    monkeypatch.setattr(TensorDictBase, "lerp_", spy)
    summary = ddpg.main(args_for("ddpg", policy_frequency=2, tau=0.25, total_timesteps=160, learning_starts=100))
    assert len(lerps) == summary["updates"] // 2 == 30
    targets, online = pointers(actors[1]) | pointers(critics[1]), pointers(actors[0]) | pointers(critics[0])
    for target_ptrs, online_ptrs, weight, before, towards, after in lerps:
        assert target_ptrs == targets and online_ptrs == online and weight == 0.25
        torch.testing.assert_close(after, torch.lerp(before, towards, 0.25), rtol=1e-6, atol=1e-7)
        assert not torch.equal(after, before)


def ddpg_actions(monkeypatch, **changes) -> tuple[list[SimpleNamespace], list[np.ndarray], object]:
    """Run ddpg on the continuous probe; the env steps, and the actor's outputs where act() called it."""
    ddpg = ALGOS["ddpg"]
    actors = spy_networks(monkeypatch, ddpg, "Actor")
    outputs = []
    forward = ddpg.Actor.forward

    def spy(self, obs):
        out = forward(self, obs)
        if self is actors[0] and not torch.is_grad_enabled():  # act(): no grad; update_actor: grad
            outputs.append(out.numpy().copy())
        return out

    monkeypatch.setattr(ddpg.Actor, "forward", spy)
    steps = spy_steps(monkeypatch)
    args = args_for("ddpg", **changes)
    ddpg.main(args)
    return steps, outputs, args


def test_ddpg_acts_uniformly_at_random_before_learning_starts(monkeypatch, chi_square):
    """Before learning_starts every action is drawn uniformly from the box: 10 equal bins per dimension pass
    a chi-square test at significance 1e-3 (seed 1, 600 actions). Fails if the actor (plus noise) acts
    from the start or the random actions are not uniform over the bounds."""
    steps, outputs, _ = ddpg_actions(monkeypatch, num_envs=2, total_timesteps=600, learning_starts=600)
    actions = np.concatenate([s.action for s in steps])
    assert actions.shape == (600, 2)
    for dim in range(2):
        counts, _ = np.histogram(actions[:, dim], bins=10, range=(LOW[dim], HIGH[dim]))
        assert counts.sum() == 600
        stat, critical = chi_square(counts, np.ones(10))
        assert stat < critical, (dim, counts)


def test_ddpg_exploration_noise_has_the_configured_scale(monkeypatch):
    """After learning_starts an action is the actor's output plus Gaussian noise of std exploration_noise x half
    the action range (0.1 x 2 = 0.2 on Pendulum): where the actor's output is 4 sd or more inside the bounds
    (so clipping cannot shrink the spread; a small learning rate keeps most outputs there), the residuals'
    std is within 20% of 0.2 and their mean within 4 standard errors of 0 (seed 1, 317 residuals).
    Fails for zero noise, noise of another scale, or noise not added."""
    steps, outputs, _ = ddpg_actions(monkeypatch, env="Pendulum-v1", exploration_noise=0.1, total_timesteps=500,
                                     learning_starts=100, learning_rate=1e-5)  # the actor stays near its start
    acting = np.concatenate([s.action for s in steps[100:]])
    output = np.concatenate(outputs[: len(acting)])
    sigma = 0.1 * 2.0
    inside = (np.abs(output) < 2.0 - 4 * sigma).all(1)
    residual = (acting - output)[inside]
    assert len(residual) >= 250, len(residual)
    np.testing.assert_allclose(residual.std(0), sigma, rtol=0.2)
    assert (np.abs(residual.mean(0)) < 4 * sigma / np.sqrt(len(residual))).all()


def test_ddpg_noisy_actions_are_clipped_to_the_bounds(monkeypatch):
    """Noise 5x the half range pushes most actions past the box: they are clipped onto its faces, never
    outside. Fails if the noisy action is not clipped, or clipped to symmetric or wrong bounds."""
    steps, _, _ = ddpg_actions(monkeypatch, exploration_noise=5.0, total_timesteps=300, learning_starts=100)
    actions = np.concatenate([s.action for s in steps[100:]])
    assert ((actions >= LOW) & (actions <= HIGH)).all()
    assert ((actions == LOW) | (actions == HIGH)).mean(0).min() > 0.5


def test_ddpg_terminations_are_not_bootstrapped(monkeypatch):
    """One-step transitions store discount 0 exactly where the episode terminated and gamma elsewhere (also at
    truncations), and the critic's target for a terminated transition is its reward alone. Fails if the
    discount or the target ignores termination."""
    ddpg = ALGOS["ddpg"]
    stored, sampled, targets = [], [], []
    extend, sample, mse_loss = ReplayBuffer.extend, ReplayBuffer.sample, ddpg.F.mse_loss

    def extend_spy(self, data):
        stored.append(data.clone())
        return extend(self, data)

    def sample_spy(self, batch_size):
        sampled.append(batch := sample(self, batch_size))
        return batch

    def loss_spy(q, target, **kwargs):  # the critic's loss (the actor's is a mean, not an mse_loss)
        targets.append(target)
        return mse_loss(q, target, **kwargs)

    monkeypatch.setattr(ReplayBuffer, "extend", extend_spy)
    monkeypatch.setattr(ReplayBuffer, "sample", sample_spy)
    monkeypatch.setattr(ddpg.F, "mse_loss", loss_spy)
    ddpg.main(args_for("ddpg", gamma=0.5, total_timesteps=200, learning_starts=100))
    rows = torch.cat(stored)
    assert rows["terminated"].any() and rows["truncated"].any()
    assert torch.equal(rows["discount"], torch.where(rows["terminated"], 0.0, 0.5))
    assert len(sampled) == len(targets) == 100
    for batch, target in zip(sampled, targets, strict=True):
        terminated = batch["terminated"]
        assert torch.equal(target[terminated], batch["reward"][terminated])
        assert not torch.equal(target[~terminated], batch["reward"][~terminated])


# ---- Atari presets and the Pong configs -------------------------------------------------------------------


@pytest.mark.parametrize("name", DQNS)
def test_pong_config_is_the_atari_preset(capsys, name):
    """configs/<algo>/pong.yaml gives the same arguments as `--env PongNoFrameskip-v4` alone, which announces
    the preset in one line and sets each of its values. Fails if the config or the preset drifts, or the
    preset is not applied to Atari ids."""
    algo = ALGOS[name]
    from_config = parse(algo, ["--config", str(ROOT / "configs" / name / "pong.yaml")])
    assert capsys.readouterr().out == ""  # a config replaces the preset
    from_preset = parse(algo, ["--env", "PongNoFrameskip-v4"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "PongNoFrameskip-v4" in lines[0] and "Atari preset" in lines[0]
    assert {key: getattr(from_preset, key) for key in algo.ATARI_PRESET} == algo.ATARI_PRESET
    assert dataclasses.replace(from_config, config=None) == from_preset


@pytest.mark.parametrize("name", DQNS)
def test_flags_and_configs_override_the_atari_preset(tmp_path, capsys, name):
    """A flag changes its own value and keeps the rest of the preset, and the line announcing the preset says
    which flag changed what (the value taken, the preset's beside it); a --config file replaces the preset."""
    algo = ALGOS[name]
    preset = algo.ATARI_PRESET
    capsys.readouterr()
    args = parse(algo, ["--env", "PongNoFrameskip-v4", "--learning-rate", "0.5"])
    assert args.learning_rate == 0.5 and args.batch_size == preset["batch_size"] != algo.Args().batch_size
    line = capsys.readouterr().out.strip()
    assert line.endswith(f"; set by flags: learning_rate=0.5 (preset {preset['learning_rate']})"), line
    assert f"batch_size={preset['batch_size']}" in line and "learning_rate=" not in line.split(";")[0], line
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"env": "PongNoFrameskip-v4", "learning_rate": 0.25}))
    capsys.readouterr()
    args = parse(algo, ["--config", str(config)])
    assert args.learning_rate == 0.25 and args.batch_size == algo.Args().batch_size
    assert "preset" not in capsys.readouterr().out


@pytest.mark.parametrize("name, config", [(name, "cartpole") for name in DQNS] + [("ddpg", "pendulum")])
def test_the_defaults_are_the_learning_tested_config(name, config):
    """`python algos/<algo>.py` with no flags runs its CartPole (DDPG: Pendulum) config, the one the learning
    tests and benchmarks/results.md measure. Fails if a default drifts from the config."""
    algo = ALGOS[name]
    defaults = parse(algo, [])
    from_config = parse(algo, ["--config", str(ROOT / "configs" / name / f"{config}.yaml")])
    assert dataclasses.replace(from_config, config=None) == defaults


@pytest.mark.parametrize("path", sorted(Path(ROOT, "configs").glob("*/*.yaml")),
                         ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_config_parses_to_its_values_and_says_where_they_come_from(path):
    """Each configs/<algo>/<env>.yaml is its folder's algorithm's, names a registered env, and every value reaches
    the parsed arguments; its header comment says which seeds chose its settings (or that none did)."""
    values = yaml.safe_load(path.read_text())
    assert values.pop("algo") == path.parent.name
    args = parse(ALGOS[path.parent.name], ["--config", str(path)])
    assert {key: getattr(args, key) for key in values} == values
    assert _env_spec(args.env).id == args.env  # registered (ale-py's ids too)
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert "seed" in header, "the header says which seeds chose the settings"


def test_every_pong_config_is_checked():
    assert sorted(p.parent.name for p in Path(ROOT, "configs").glob("*/pong.yaml")) == sorted(DQNS)


@pytest.mark.parametrize("name", DQNS)
def test_anneal_lr_decays_the_learning_rate_to_zero_along_its_shape(monkeypatch, name):
    """With --anneal-lr every optimizer step at environment step s uses lr * (1 - s / total_timesteps), or with
    --lr-decay cosine lr * (1 + cos(pi * s / total_timesteps)) / 2; without it, lr throughout. One update per step
    here, so the k-th step's lr is known by counting."""
    seen = []
    real_step = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        seen.append(float(self.param_groups[0]["lr"]))
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    shapes = {"linear": lambda s: 1 - s / 300, "cosine": lambda s: (1 + np.cos(np.pi * s / 300)) / 2, None: lambda s: 1}
    for decay in shapes:
        seen.clear()
        summary = ALGOS[name].main(args_for(name, anneal_lr=decay is not None, lr_decay=decay or "linear",
                                            learning_rate=1e-3, total_timesteps=300, learning_starts=100,
                                            train_frequency=1, gradient_steps=1, run_name=f"lr-{decay}"))
        steps = range(101, 301)
        assert summary["updates"] == len(seen) == len(steps)
        expected = [1e-3 * shapes[decay](s) for s in steps]
        np.testing.assert_allclose(seen, expected, rtol=1e-6, atol=1e-9)
