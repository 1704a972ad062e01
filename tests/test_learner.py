"""The DQN files' learner step: one call per loop iteration (`make_learner`) that does the iteration's gradient steps,
each on a batch it samples itself (PER: writing the new priorities back), then the target moves that fell due. It
must leave everything as the separate calls the loop used to make, bit for bit; and with several Atari envs the loop
must keep one update per agent step and the target period in agent steps."""

from __future__ import annotations

import dataclasses
from functools import partial

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict, TensorDictBase, from_module

import harness.run
from buffers import PrioritizedReplayBuffer, ReplayBuffer
from harness import adam, stacked
from harness.graphs import LearnerGraphs
from tests.algo_utils import load_algo, parse, tiny_args

ALGOS = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn")}
pytestmark = pytest.mark.usefixtures("main_in_tmp_path")  # see conftest.py


def built(name: str, seeds: list[int], compile_update: bool, device: str = "cpu"):
    """What main builds for the learner (networks, target, Adam, a buffer of 200 random CartPole-shaped transitions
    per seed), from torch seed 0, so that two calls build equal states."""
    algo = ALGOS[name]
    args = tiny_args(algo, num_seeds=len(seeds), batch_size=16, tau=0.5, loss="mse")
    torch.manual_seed(0)
    network = partial(algo.QNetwork, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3))
    q_network = stacked(network, seeds).to(device)
    params = from_module(q_network).data
    target_params = params.clone()
    with torch.device("meta"):
        target_network = stacked(network, seeds)
    target_params.to_module(target_network)
    optimizer = adam(q_network.parameters(), len(seeds), lr=torch.tensor(1e-3, device=device),
                     capturable=device == "cuda")
    n = len(seeds)
    rb = PrioritizedReplayBuffer(1000, 0.6, 0.4, 1e-6, device, seed=3, num_seeds=n) if name == "per_dqn" else \
        ReplayBuffer(1000, device, seed=3, num_seeds=n)
    g = torch.Generator().manual_seed(1)
    shape = [n, 200] if n > 1 else [200]
    rb.extend(TensorDict(obs=torch.randn(*shape, 4, generator=g), action=torch.randint(3, shape, generator=g),
                         reward=torch.randn(shape, generator=g), next_obs=torch.randn(*shape, 4, generator=g),
                         terminated=torch.rand(shape, generator=g) < 0.1,
                         discount=torch.full(shape, 0.99), batch_size=shape).to(device))
    update = algo.make_update(q_network, target_network, optimizer, args)
    if compile_update:
        update = torch.compile(update, dynamic=False)
    return SimpleState(q_network, params, target_params, optimizer, rb, update, args)


@dataclasses.dataclass
class SimpleState:
    q_network: torch.nn.Module
    params: TensorDictBase
    target_params: TensorDictBase
    optimizer: torch.optim.Optimizer
    rb: ReplayBuffer
    update: object
    args: object


def separate_calls(state: SimpleState, steps: int, moves: int, prioritized: bool):
    """The loop's calls as they were before the learner step: sample, update, write priorities; then the moves."""
    metrics = None
    for _ in range(steps):
        batch = state.rb.sample(state.args.batch_size)
        metrics = state.update(batch)
        if prioritized:
            state.rb.update_priority(batch["index"], metrics["abs_td_error"])
    for _ in range(moves):
        state.target_params.lerp_(state.params, state.args.tau)
    return metrics


def everything(state: SimpleState) -> list[torch.Tensor]:
    """Every tensor the steps change: parameters, target, Adam's state, the buffer's priorities and generators."""
    tensors = [*state.params.values(True, True), *state.target_params.values(True, True)]
    for group in state.optimizer.state.values():
        tensors += [v for v in group.values() if isinstance(v, torch.Tensor)]
    tensors += [g.get_state() for g in state.rb.generators]
    if isinstance(state.rb, PrioritizedReplayBuffer):
        tensors += [state.rb.tree.leaves, *state.rb.tree.levels, state.rb.max_priority]
    return tensors


SCHEDULE = [(1, 0), (3, 0), (0, 1), (2, 1), (1, 2), (4, 0)]  # (gradient steps, target moves) of loop iterations


@pytest.mark.parametrize("seeds", [[1], [1, 2]], ids=["one-seed", "pack"])
@pytest.mark.parametrize("name", list(ALGOS))
def test_the_learner_step_equals_the_separate_calls_bit_for_bit(name, seeds):
    """make_learner's learn(steps, moves), over iterations with 0-4 gradient steps and 0-2 target moves (tau 0.5,
    so a move before a step, or one move too many, shows), leaves the parameters, target, Adam's state, priorities
    and generators bit for bit as the separate calls did, and returns the last step's metrics. Fails if the moves
    come before the steps, priorities are not written back, or the metrics are another step's."""
    learner, separate = built(name, seeds, False), built(name, seeds, False)
    learn = ALGOS[name].make_learner(learner.update, learner.rb, learner.params, learner.target_params, learner.args)
    for steps, moves in SCHEDULE:
        got = learn(steps, moves)
        expected = separate_calls(separate, steps, moves, name == "per_dqn")
        assert (got is None) == (expected is None)
        if expected is not None:
            assert all(torch.equal(a, b) for a, b in zip(got.values(), expected.values(), strict=True))
        assert all(torch.equal(a, b) for a, b in zip(everything(learner), everything(separate), strict=True))
    assert not torch.equal(learner.target_params["net", "0", "weight"], learner.params["net", "0", "weight"])


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [[1], [1, 2]], ids=["one-seed", "pack"])
def test_the_compiled_learner_step_equals_the_separate_compiled_calls(seeds):
    """As above for per_dqn with the update under torch.compile (--compile), one seed and a pack."""
    learner, separate = built("per_dqn", seeds, True), built("per_dqn", seeds, True)
    learn = ALGOS["per_dqn"].make_learner(learner.update, learner.rb, learner.params, learner.target_params,
                                          learner.args)
    for steps, moves in SCHEDULE:
        learn(steps, moves)
        separate_calls(separate, steps, moves, True)
        assert all(torch.equal(a, b) for a, b in zip(everything(learner), everything(separate), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["per_dqn", "dqn"])
def test_vector_atari_keeps_one_update_per_agent_step_and_the_target_period(monkeypatch, name):
    """The Atari preset (train_frequency 1) on Pong with 1 and with 8 envs, 480 agent steps, learning from step 160,
    the target every 64 agent steps: both make one update per agent step after learning starts (320) and move the
    target once per 64 agent steps (5 moves: steps 192 ... 448), so --num-envs N changes neither the replay ratio nor
    the target period. Fails if a loop iteration made one update for its N agent steps, or moved the target per
    iteration."""
    algo = ALGOS[name]
    monkeypatch.setattr(harness.run, "evaluate", lambda *args, **kwargs: [[0.0]])  # Pong games: not under test
    lerps = []
    lerp_ = TensorDictBase.lerp_
    monkeypatch.setattr(TensorDictBase, "lerp_", lambda self, end, weight: lerps.append(weight) or lerp_(self, end,
                                                                                                        weight))
    seen = {}
    for num_envs in (1, 8):
        lerps.clear()
        args = parse(algo, ["--env", "PongNoFrameskip-v4", "--num-envs", str(num_envs), "--total-timesteps", "480",
                            "--learning-starts", "160", "--target-network-frequency", "64", "--buffer-size", "1000",
                            "--batch-size", "4", "--no-cuda", "--eval-frequency", "0", "--checkpoint-frequency", "0",
                            "--threads", "1", "--run-name", f"pong{num_envs}", "--train-frequency", "1"])
        summary = algo.main(args)
        seen[num_envs] = (summary["global_step"], summary["updates"], len(lerps))
    assert seen[1] == seen[8] == (480, 320, 5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_graphed_learner_step_equals_the_eager_one_on_cuda():
    """per_dqn's learner as --cudagraphs replays it (LearnerGraphs: each (steps, moves) pair run eagerly twice, then
    captured with the buffer's generator and replayed) leaves everything as the eager learner on CUDA, bit for bit,
    over the schedule three times. Fails if a replay draws the same uniforms again (generator not registered), keeps
    a value the host saw at capture (the buffer's count, beta), or misses the priorities or the target moves."""
    graphed, eager = built("per_dqn", [1], False, "cuda"), built("per_dqn", [1], False, "cuda")
    make = ALGOS["per_dqn"].make_learner
    learn = LearnerGraphs(make(graphed.update, graphed.rb, graphed.params, graphed.target_params, graphed.args),
                          graphed.rb, warmup=2)
    learn_eagerly = make(eager.update, eager.rb, eager.params, eager.target_params, eager.args)
    g = torch.Generator()
    for i, (steps, moves) in enumerate(SCHEDULE * 3):
        for state in (graphed, eager):  # the buffer grows and beta moves between iterations, as in the loop
            g.manual_seed(5 + i)  # the same transitions for both
            state.rb.beta = 0.4 + 0.02 * i
            state.rb.extend(TensorDict(obs=torch.randn(4, 4, generator=g), action=torch.randint(3, (4,), generator=g),
                                       reward=torch.randn(4, generator=g), next_obs=torch.randn(4, 4, generator=g),
                                       terminated=torch.zeros(4, dtype=torch.bool), discount=torch.full((4,), 0.99),
                                       batch_size=[4]).to("cuda"))
        learn(steps, moves)
        learn_eagerly(steps, moves)
    torch.cuda.synchronize()
    assert len(learn.graphs) == len(set(SCHEDULE))
    assert all(torch.equal(a, b) for a, b in zip(everything(graphed), everything(eager), strict=True))
