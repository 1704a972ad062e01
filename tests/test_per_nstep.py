"""algos/per_dqn.py and algos/nstep_dqn.py: smoke runs, the PER weighting and write-back, n-step targets."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from buffers import NStepReturns, PrioritizedReplayBuffer
from tests.algo_utils import load_algo, run_dir_of, tiny_args

dqn = load_algo("dqn")
per_dqn = load_algo("per_dqn")
nstep_dqn = load_algo("nstep_dqn")


@pytest.mark.parametrize("algo", [per_dqn, nstep_dqn], ids=["per_dqn", "nstep_dqn"])
@pytest.mark.parametrize("env", ["CartPole-v1", pytest.param("PongNoFrameskip-v4", marks=pytest.mark.slow)])
def test_smoke_run_leaves_a_complete_run_directory(tmp_path, monkeypatch, algo, env):
    monkeypatch.chdir(tmp_path)
    pong = dict(total_timesteps=240, learning_starts=80, buffer_size=300, batch_size=8, train_frequency=1,
                eval_episodes=1) if env.startswith("Pong") else {}
    args = tiny_args(algo, env=env, n_step=3, num_envs=2, save_model=True, **pong)
    summary = algo.main(args)
    run = run_dir_of(tmp_path, args)
    assert {p.name for p in run.iterdir()} >= {"config.yaml", "metrics.jsonl", "summary.json", "model.pt"}
    # One gradient step per multiple of train_frequency after learning_starts; 2 envs reach learning_starts exactly.
    every, start = args.train_frequency, args.learning_starts
    assert summary["updates"] == sum(1 for step in range(start + 1, args.total_timesteps + 1) if step % every == 0)
    assert summary["eval_episodes"] == args.eval_episodes
    assert "losses/td_loss" in (run / "metrics.jsonl").read_text()


def cartpole_batch(n: int = 6, weight: torch.Tensor | None = None) -> TensorDict:
    gen = torch.Generator().manual_seed(0)
    batch = TensorDict(
        obs=torch.randn(n, 4, generator=gen), next_obs=torch.randn(n, 4, generator=gen),
        action=torch.randint(2, (n,), generator=gen), reward=torch.randn(n, generator=gen),
        terminated=torch.rand(n, generator=gen) < 0.3, batch_size=[n],
    )
    batch["discount"] = 0.99 * (~batch["terminated"]).float()
    batch["weight"] = torch.ones(n) if weight is None else weight
    return batch.unsqueeze(0)  # [seeds, batch]: one seed


def networks(module):
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    return module.QNetwork(env.observation_space, env.action_space), module.QNetwork(env.observation_space,
                                                                                    env.action_space)


@pytest.mark.parametrize("loss", ["mse", "huber"])
def test_per_loss_is_weighted_by_the_importance_weights(loss):
    q_net, target_net = networks(per_dqn)
    args = dataclasses.replace(per_dqn.Args(), loss=loss)
    weight = torch.tensor([1.0, 0.5, 0.0, 0.25, 1.0, 0.1])
    weighted, q, td_error = per_dqn.q_loss(q_net, target_net, cartpole_batch(weight=weight), args)
    plain, _, _ = per_dqn.q_loss(q_net, target_net, cartpole_batch(), args)
    (weighted,), (plain,), td_error = weighted, plain, td_error[0]  # the one seed's
    per_sample = td_error.pow(2) if loss == "mse" else torch.nn.functional.smooth_l1_loss(
        td_error, torch.zeros(6), reduction="none")
    assert torch.allclose(weighted, (weight * per_sample).mean())
    assert torch.allclose(plain, per_sample.mean()) and not torch.allclose(weighted, plain)

    # A zero weight removes a sample's gradient: changing its target changes nothing.
    batch = cartpole_batch(weight=weight)
    grads = []
    for reward in (0.0, 100.0):
        batch["reward"][0, 2] = reward
        q_net.zero_grad()
        per_dqn.q_loss(q_net, target_net, batch, args)[0].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in q_net.parameters()]))
    assert torch.allclose(grads[0], grads[1])


def test_per_writes_back_priorities_of_the_sampled_indices_and_anneals_beta_to_one(tmp_path, monkeypatch):
    calls = []

    class Spy(PrioritizedReplayBuffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            buffers.append(self)

        def sample(self, batch_size):
            batch = super().sample(batch_size)
            calls.append(("sample", batch["index"].clone()))
            return batch

        def update_priority(self, index, priority):
            calls.append(("update", index.clone(), priority.clone()))
            super().update_priority(index, priority)
            calls.append(("stored", self.tree.leaves[index % self.capacity].clone()))

    buffers: list[Spy] = []
    monkeypatch.setattr(per_dqn, "PrioritizedReplayBuffer", Spy)
    monkeypatch.chdir(tmp_path)
    args = tiny_args(per_dqn, total_timesteps=600, alpha=0.7, prio_eps=1e-3)
    summary = per_dqn.main(args)
    kinds = [c[0] for c in calls]
    assert kinds == ["sample", "update", "stored"] * summary["updates"] and summary["updates"] > 50
    for (_, sampled), (_, index, priority), (_, stored) in zip(calls[::3], calls[1::3], calls[2::3], strict=True):
        assert torch.equal(sampled, index)  # test_loops.py checks that the priorities are the batch's |TD errors|
        # Stored as (|p| + eps) ** alpha; duplicates in a batch keep their last value.
        last = {int(i): float(p) for i, p in zip(index, priority, strict=True)}
        expected = torch.tensor([(last[int(i)] + 1e-3) ** 0.7 for i in index], dtype=torch.float64)
        assert torch.allclose(stored, expected)
    assert buffers[-1].beta == 1.0
    logged = [(r["global_step"], r["charts/beta"]) for r in map(json.loads, (run_dir_of(tmp_path, args) /
                                                                             "metrics.jsonl").open())
              if "charts/beta" in r]
    assert len(logged) == summary["updates"] // 100  # logged every 100 updates
    for step, beta in logged:  # beta_start 0.4 at step 0 to 1 at total_timesteps 600, on a straight line
        assert beta == pytest.approx(0.4 + 0.6 * step / 600)


def test_nstep_with_n_1_gives_dqn_targets():
    net, _ = networks(dqn)
    gen = torch.Generator().manual_seed(1)
    step = TensorDict(
        obs=torch.randn(5, 4, generator=gen), action=torch.randint(2, (5,), generator=gen),
        reward=torch.randn(5, generator=gen), next_obs=torch.randn(5, 4, generator=gen),
        terminated=torch.tensor([False, True, False, False, True]),
        truncated=torch.tensor([False, False, True, False, False]), batch_size=[5],
    )
    folded, step = NStepReturns(1, 0.9, 5).push(step).unsqueeze(0), step.unsqueeze(0)  # [seeds, batch]
    with torch.no_grad():
        assert torch.allclose(nstep_dqn.td_target(net, folded), dqn.td_target(net, step, 0.9))
        assert torch.allclose(per_dqn.td_target(net, folded), dqn.td_target(net, step, 0.9))


def test_nstep_target_uses_the_stored_discount():
    net, _ = networks(nstep_dqn)
    batch = cartpole_batch()
    batch["discount"] = torch.tensor([[0.0, 0.5, 0.729, 1.0, 0.0, 0.81]])
    with torch.no_grad():
        best = net(batch["next_obs"]).max(dim=-1).values
        assert torch.allclose(nstep_dqn.td_target(net, batch), batch["reward"] + batch["discount"] * best)
