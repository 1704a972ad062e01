"""Many seeds in one process (--num-seeds): the seed dimension of the buffers keeps each seed's replay its own, a
batched update of N seeds is N single-seed updates (per-seed clipping included), a seed trains in a pack exactly as
it trains alone, env seeds never overlap, and a pack resumes bit for bit."""

from __future__ import annotations

import json
import signal
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict, from_module

from buffers import NStepReturns, PrioritizedReplayBuffer, ReplayBuffer, SeedStack
from envs import env_seeds
from tests.algo_utils import load_algo, tiny_args
from tests.test_resume import assert_same, finished, outcome, start, wait_for

SEEDS = [3, 4, 3]  # two copies of seed 3: rows 0 and 2 must stay equal, row 1 its own


def steps(tags: list[int], count: int, envs: int = 2):
    """`count` vector-env steps [seeds, envs] whose obs say (tag of the seed, step, env)."""
    for t in range(count):
        obs = torch.tensor([[[tag, t, e] for e in range(envs)] for tag in tags], dtype=torch.float32)
        yield TensorDict(obs=obs, next_obs=obs + 1, action=torch.full((len(tags), envs), t % 2),
                         reward=obs[..., 1].clone(), terminated=obs[..., 1] % 7 == 6,
                         truncated=torch.zeros(len(tags), envs, dtype=torch.bool), batch_size=[len(tags), envs])


class DeepTree(PrioritizedReplayBuffer):
    tree_arity, tree_top = 2, 2  # 50 leaves in 5 levels: the descent goes through every level


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "deep"])
def test_each_row_of_a_seed_stack_is_that_seeds_buffer_alone(kind):
    """Seeds 3, 4, 3 with distinct data per row (tags 0, 1, 2): every call's row i equals buffer i used alone.
    PER: the seeds' sum trees are slices of one tree, sampled by one descent, with the same draws as alone."""
    def make(seed: int):
        return {"uniform": ReplayBuffer, "prioritized": PrioritizedReplayBuffer, "deep": DeepTree}[kind](50, seed=seed)

    stack, alone = SeedStack([make(seed) for seed in SEEDS]), [make(seed) for seed in SEEDS]
    assert (stack.tree is None) == (kind == "uniform")
    for t, step in enumerate(steps([0, 1, 2], 40)):  # wraps the ring of 50
        index = stack.extend(step.reshape(-1) if t % 2 else step)  # [N * E] as the vector env gives it, or [N, E]
        for i, buffer in enumerate(alone):
            assert torch.equal(index[i], buffer.extend(step[i]))
    assert len(stack) == 50
    for _ in range(3):
        batch = stack.sample(16)
        assert batch.batch_size == (3, 16)
        for i, buffer in enumerate(alone):
            lone = buffer.sample(16)
            assert all(torch.equal(batch[i][key], lone[key]) for key in lone.keys()), i  # noqa: SIM118
            assert (batch[i]["obs"][:, 0] == i).all()  # seeds never mix
        if kind == "prioritized":
            priority = torch.rand(3, 16, generator=torch.Generator().manual_seed(5)) * 10
            priority[2] = priority[0]  # the copies of seed 3 get the same priorities
            stack.update_priority(batch["index"], priority)
            for i, buffer in enumerate(alone):
                buffer.update_priority(batch["index"][i], priority[i])
    # the copies of seed 3 drew the same slots; seed 4 others
    assert torch.equal(batch["index"][0], batch["index"][2]) and not torch.equal(batch["index"][0], batch["index"][1])
    restored = SeedStack([make(0) for _ in SEEDS])
    restored.load_state_dict(stack.state_dict())
    again, expected = restored.sample(8), stack.sample(8)
    assert all(torch.equal(again[key], expected[key]) for key in expected.keys())  # noqa: SIM118


def test_nstep_windows_per_seed_and_ragged_extend():
    """n-step folding per seed: seed i's windows are NStepReturns on its row alone; extend takes the ragged list."""
    nstep, alone = SeedStack([NStepReturns(3, 0.9, 2) for _ in SEEDS]), [NStepReturns(3, 0.9, 2) for _ in SEEDS]
    rb = SeedStack([ReplayBuffer(100, seed=seed) for seed in SEEDS])
    for step in steps([0, 1, 2], 20):
        ready = nstep.push(step)
        for i, folder in enumerate(alone):
            lone = folder.push(step[i])
            assert all(torch.equal(ready[i][key], lone[key]) for key in lone.keys())  # noqa: SIM118
        rb.extend(ready)
    assert [len(part) for part in rb.parts] == [len(part) for part in rb.parts[:1]] * 3 and len(rb) > 0
    with pytest.raises(ValueError, match="one row per seed"):
        rb.extend(ready[:2])


def test_env_seeds_never_overlap_in_a_pack_and_one_env_is_seeded_as_before():
    assert env_seeds([7], 1) == [7] and env_seeds([1, 2, 3], 1) == [1, 2, 3]
    seeds = env_seeds(list(range(1, 21)), 8)
    assert len(set(seeds)) == len(seeds) == 160 and max(seeds) < 2**31
    assert env_seeds([1, 2], 4)[:4] == [1, 1 + 2**20, 1 + 2 * 2**20, 1 + 3 * 2**20]


def dqn_update(module, seeds: list[int], args):
    """The file's own networks, optimizer and update for `seeds`, built as main builds them."""
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)
    network = partial(module.QNetwork, obs_space, action_space)
    q_network = module.stacked(network, seeds)
    target_params = from_module(q_network).data.clone()
    with torch.device("meta"):
        target_network = module.stacked(network, seeds)
    target_params.to_module(target_network)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=torch.tensor(args.learning_rate), fused=True)
    return q_network, module.make_update(q_network, target_network, optimizer, args)


@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_a_batched_update_is_each_seeds_own_update_with_per_seed_clipping(name):
    """Seeds 1, 2, 3 in one update equal three single-seed updates of the same parameters and batches (seed 0 of
    torch for the batches, rtol 1e-5); seed 2's rewards are 1000x, so only its gradient is clipped: a norm over the
    stack would shrink the other seeds' steps too."""
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
        lone = [step(batch[i : i + 1]) for i, (_, step) in enumerate(alone)]
        assert metrics["grad_norm"][1] > 20 * args.max_grad_norm > 20 * metrics["grad_norm"][[0, 2]].max()
        for i in range(3):
            torch.testing.assert_close(metrics["td_loss"][i : i + 1], lone[i]["td_loss"], rtol=1e-5, atol=0)
    for i, (network, _) in enumerate(alone):
        for (key, value), single in zip(pack.state_dict().items(), network.state_dict().values(), strict=True):
            torch.testing.assert_close(value[i : i + 1], single, rtol=1e-5, atol=1e-7, msg=f"seed row {i}: {key}")


pack_runs = pytest.mark.usefixtures("main_in_tmp_path")


@pack_runs
@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_a_seed_in_a_pack_trains_exactly_as_alone(name):
    """Seeds 1-3 packed (2 envs each): seed 2's model.pt, metrics (SPS aside) and evaluation returns equal those of
    seed 2 trained alone, bit for bit (the logged gradient norm to 1e-6); seeds 1 and 3 follow other trajectories."""
    module = load_algo(name)
    common = dict(num_envs=2, total_timesteps=1200, eval_frequency=600, n_step=3, save_model=True)
    summaries = module.main(tiny_args(module, seed=1, num_seeds=3, run_name="pack", **common))
    module.main(tiny_args(module, seed=2, run_name="alone", **common))
    assert [s["seed"] for s in summaries] == [1, 2, 3] and [s["run_name"] for s in summaries] == \
        ["pack__1", "pack__2", "pack__3"]
    pack, alone = outcome(Path("runs/pack__2")), outcome(Path("runs/alone"))
    assert all(torch.equal(pack[0][k], alone[0][k]) for k in alone[0]) and pack[1] == alone[1]
    # the logged gradient norms may differ in the last bits (a norm over rows of 3 seeds or 1 is summed in other
    # orders); every other value is the same
    assert [json.loads(line) for line in pack[2]] == [pytest.approx(json.loads(line), rel=1e-6) for line in alone[2]]
    others = [outcome(Path(f"runs/pack__{seed}")) for seed in (1, 3)]
    assert all(not torch.equal(other[0]["net.0.weight"], pack[0]["net.0.weight"]) for other in others)
    config = (Path("runs/pack__3") / "config.yaml").read_text()
    assert "seed: 3\n" in config and "run_name: pack__3\n" in config


@pack_runs
def test_ddpg_pack_gives_each_seed_its_own_run():
    """DDPG seeds 1-2 packed: a directory each with its seed; seed 2's first 300 warm-up steps (uniform actions
    from its own generator) store the same data as seed 2 alone, and the seeds' final actors differ."""
    module = load_algo("ddpg")
    common = dict(env="Pendulum-v1", total_timesteps=400, learning_starts=300, eval_episodes=1)
    summaries = module.main(tiny_args(module, seed=1, num_seeds=2, run_name="pack", **common))
    summary = module.main(tiny_args(module, seed=2, run_name="alone", **common))
    assert [s["seed"] for s in summaries] == [1, 2]
    assert summaries[1]["eval_returns"] == pytest.approx(summary["eval_returns"], rel=1e-3)
    one, two = (torch.load(f"runs/pack__{seed}/model.pt", weights_only=True) for seed in (1, 2))
    assert not torch.equal(one["actor"]["net.0.weight"], two["actor"]["net.0.weight"])


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
