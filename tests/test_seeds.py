"""Many seeds in one process (--num-seeds): a batched update of N seeds is N single-seed updates (per-seed clipping
included), a seed trains in a pack exactly as it trains alone (all four files, bit for bit on the CPU), each seed's
model.pt is the plain network's state_dict and the size of a lone run's, env seeds never overlap, and a pack resumes
bit for bit. The buffers' seed dimension is tested in test_seed_buffers.py, the stacked layers in test_harness.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict, from_module

from envs import env_seeds
from harness.optim import adam
from harness.seeds import stacked
from tests.algo_utils import load_algo, tiny_args
from tests.test_resume import assert_same, finished, outcome, start, wait_for

ALGOS = {name: load_algo(name) for name in ("dqn", "per_dqn", "nstep_dqn", "ddpg")}


def test_env_seeds_never_overlap_in_a_pack_and_one_env_is_seeded_as_before():
    assert env_seeds([7], 1) == [7] and env_seeds([1, 2, 3], 1) == [1, 2, 3]
    seeds = env_seeds(list(range(1, 21)), 8)
    assert len(set(seeds)) == len(seeds) == 160 and max(seeds) < 2**31
    assert env_seeds([1, 2], 4)[:4] == [1, 1 + 2**20, 1 + 2 * 2**20, 1 + 3 * 2**20]


def dqn_update(module, seeds: list[int], args):
    """The file's own networks, optimizer and update for `seeds` (one seed: the plain network), built as main
    builds them."""
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)
    network = partial(module.QNetwork, obs_space, action_space)
    q_network = stacked(network, seeds)
    target_params = from_module(q_network).data.clone()
    with torch.device("meta"):
        target_network = stacked(network, seeds)
    target_params.to_module(target_network)
    optimizer = adam(q_network.parameters(), len(seeds), lr=torch.tensor(args.learning_rate))
    update = module.make_update(q_network, target_network, optimizer, dataclasses.replace(args, num_seeds=len(seeds)))
    return q_network, update


@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_a_batched_update_is_each_seeds_own_update_with_per_seed_clipping(name):
    """Seeds 1, 2, 3 in one update equal three updates of the plain networks of seeds 1, 2 and 3 on the same batches,
    bit for bit (the batches from torch seed 0); seed 2's rewards are 1000x, so only its gradient is clipped: a norm
    over the stack would shrink the other seeds' steps too."""
    module = load_algo(name)
    args = tiny_args(module, loss="mse")  # the Huber loss would bound the gradient whatever the rewards
    generator = torch.Generator().manual_seed(0)
    batch = TensorDict(obs=torch.randn(3, 32, 4, generator=generator), action=torch.randint(3, (3, 32),
                       generator=generator), reward=torch.randn(3, 32, generator=generator),
                       next_obs=torch.randn(3, 32, 4, generator=generator), terminated=torch.rand(3, 32) < 0.1,
                       discount=torch.full((3, 32), 0.99), weight=torch.rand(3, 32, generator=generator),
                       batch_size=[3, 32])
    batch["reward"][1] *= 1000
    pack, update = dqn_update(module, [1, 2, 3], args)
    alone = [dqn_update(module, [seed], args) for seed in (1, 2, 3)]
    for _ in range(3):
        metrics = update(batch)
        lone = [step(batch[i]) for i, (_, step) in enumerate(alone)]
        assert metrics["grad_norm"][1] > 20 * args.max_grad_norm > 20 * metrics["grad_norm"][[0, 2]].max()
        for i in range(3):
            assert lone[i]["td_loss"].shape == () and torch.equal(metrics["td_loss"][i], lone[i]["td_loss"])
            assert torch.equal(metrics["grad_norm"][i], lone[i]["grad_norm"])
    for i, (network, _) in enumerate(alone):
        for (key, value), single in zip(pack.state_dict().items(), network.state_dict().values(), strict=True):
            assert torch.equal(value[i], single), (i, key)


pack_runs = pytest.mark.usefixtures("main_in_tmp_path")


@pack_runs
@pytest.mark.parametrize("name", list(ALGOS))
def test_a_seed_in_a_pack_trains_exactly_as_alone(name):
    """Seeds 1-3 packed (2 envs each): seed 2's model.pt, metrics (SPS aside) and evaluation returns equal those of
    seed 2 trained alone (the plain networks), bit for bit; seeds 1 and 3 follow other trajectories; each seed's
    model.pt loads into the file's plain network class and is the size of the lone run's, not the pack's."""
    module = load_algo(name)
    ddpg = name == "ddpg"
    common = dict(num_envs=2, total_timesteps=800 if ddpg else 1200, eval_frequency=400 if ddpg else 600,
                  n_step=3, save_model=True, **(dict(env="Pendulum-v1", learning_starts=300) if ddpg else {}))
    summaries = module.main(tiny_args(module, seed=1, num_seeds=3, run_name="pack", **common))
    module.main(tiny_args(module, seed=2, run_name="alone", **common))
    assert [s["seed"] for s in summaries] == [1, 2, 3] and [s["run_name"] for s in summaries] == \
        ["pack__1", "pack__2", "pack__3"]
    pack, alone = outcome(Path("runs/pack__2")), outcome(Path("runs/alone"))
    assert_same(pack, alone, episodes=2)
    others = [torch.load(f"runs/pack__{seed}/model.pt", weights_only=True) for seed in (1, 3)]
    key = ("actor", "net.0.weight") if ddpg else ("net.0.weight",)
    first = pack[0][key[0]][key[1]] if ddpg else pack[0][key[0]]
    assert all(not torch.equal(other[key[0]][key[1]] if ddpg else other[key[0]], first) for other in others)
    config = (Path("runs/pack__3") / "config.yaml").read_text()
    assert "seed: 3\n" in config and "run_name: pack__3\n" in config
    env = gym.make("Pendulum-v1" if ddpg else "CartPole-v1")
    if ddpg:
        for part, network in (("actor", module.Actor), ("qf", module.QNetwork)):
            network(env.observation_space, env.action_space).load_state_dict(pack[0][part])
    else:
        module.QNetwork(env.observation_space, env.action_space).load_state_dict(pack[0])
    sizes = [os.path.getsize(f"runs/{run}/model.pt") for run in ("pack__2", "alone")]
    assert abs(sizes[0] - sizes[1]) < 1000, sizes  # a view of the stack would save the whole pack: 3x


class WithLayerNorm(nn.Module):
    """A researcher's Q-network for dqn.py: LayerNorm after each hidden layer (as in many recent off-policy papers)."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(int(np.prod(observation_space.shape)), 64), nn.LayerNorm(64), nn.ReLU(),
                                 nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, int(action_space.n)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


@pack_runs
def test_a_network_with_layer_norm_trains_each_seed_of_a_pack_as_alone(monkeypatch):
    """dqn.py with WithLayerNorm as its QNetwork: seed 2 of a pack of 3 ends with the model.pt, metrics and
    evaluation returns of seed 2 alone, bit for bit, and seeds 1 and 2 end with different LayerNorm weights. Fails
    if the LayerNorm is not stacked (every seed would train the first seed's)."""
    module = ALGOS["dqn"]
    monkeypatch.setattr(module, "QNetwork", WithLayerNorm)
    common = dict(num_envs=2, total_timesteps=1200, eval_frequency=600, save_model=True)
    module.main(tiny_args(module, seed=1, num_seeds=3, run_name="pack", **common))
    module.main(tiny_args(module, seed=2, run_name="alone", **common))
    pack, alone = outcome(Path("runs/pack__2")), outcome(Path("runs/alone"))
    assert_same(pack, alone, episodes=2)
    first = torch.load("runs/pack__1/model.pt", weights_only=True)
    assert not torch.equal(first["net.1.weight"], pack[0]["net.1.weight"])
    env = gym.make("CartPole-v1")
    WithLayerNorm(env.observation_space, env.action_space).load_state_dict(pack[0])


@pack_runs
@pytest.mark.parametrize("name", ["nstep_dqn", "per_dqn"])
def test_an_nstep_packs_seeds_start_learning_as_alone(name):
    """3-step returns, seeds 1-3 packed, learning from step 0 on batches of 22: seed 3 makes as many updates as
    alone and ends with the same model.pt. Fails if a pack waits for its slowest seed's n-step windows (the buffer's
    count is the smallest over the seeds: n-step DQN's seed 3 made 97 updates in the pack against 99 alone)."""
    module = ALGOS[name]
    common = dict(total_timesteps=120, learning_starts=0, train_frequency=1, batch_size=22, eval_episodes=1,
                  save_model=True, n_step=3)
    summaries = module.main(tiny_args(module, seed=1, num_seeds=3, run_name="pack", **common))
    summary = module.main(tiny_args(module, seed=3, run_name="alone", **common))
    assert summaries[2]["updates"] == summary["updates"] > 90
    assert_same(outcome(Path("runs/pack__3")), outcome(Path("runs/alone")), episodes=1)


@pack_runs
@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_a_packs_exploring_evaluation_is_each_seeds_own(name):
    """A pack of 3 evaluated with epsilon 0.5 (as Atari presets evaluate with epsilon > 0): each seed's evaluation
    returns equal those of the seed trained and evaluated alone. Fails if the seeds share one exploration generator
    (each seed in the pack would take the first seed's random actions)."""
    module = ALGOS[name]
    common = dict(eval_epsilon=0.5, eval_episodes=6, total_timesteps=300)
    summaries = module.main(tiny_args(module, seed=1, num_seeds=3, run_name="pack", **common))
    for seed, packed in zip((1, 2, 3), summaries, strict=True):
        alone = module.main(tiny_args(module, seed=seed, run_name=f"alone{seed}", **common))
        assert packed["eval_returns"] == alone["eval_returns"], seed


@pytest.mark.slow
def test_a_pack_killed_after_a_checkpoint_resumes_bit_for_bit(tmp_path):
    """dqn seeds 1-2 packed: SIGKILL after the first checkpoint, --resume of the first seed's directory; both seeds
    end as the pack left alone (model.pt, final evaluation, metrics without SPS)."""
    argv = ["--total-timesteps", "3000", "--learning-starts", "500", "--num-envs", "2", "--eval-frequency", "1000",
            "--eval-episodes", "3", "--checkpoint-frequency", "1000", "--no-cuda", "--num-seeds", "2"]
    alone, killed = (start(tmp_path, "dqn", *argv, "--run-name", name) for name in ("alone", "killed"))
    wait_for(lambda: (tmp_path / "runs" / "killed__1" / "checkpoint.pt").exists(), killed, "a checkpoint")
    killed.kill()
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    out = finished(start(tmp_path, "dqn", "--resume", str(Path("runs") / "killed__1")))
    assert "resuming runs/killed__1 (and 1 more seeds beside it)" in out
    finished(alone)
    for seed in (1, 2):
        assert_same(outcome(tmp_path / "runs" / f"alone__{seed}"), outcome(tmp_path / "runs" / f"killed__{seed}"))
    summary = json.loads((tmp_path / "runs" / "killed__2" / "summary.json").read_text())
    assert summary["seed"] == 2 and summary["num_seeds"] == 2 and np.isfinite(summary["eval_return_mean"])
