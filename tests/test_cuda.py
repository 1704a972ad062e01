"""The algorithms on CUDA, eager and with --compile --cudagraphs: short runs that reach gradient steps and a
final evaluation. Skipped without a GPU (benchmarks/gpu.sh runs them on one)."""

from __future__ import annotations

import pytest
import torch

from tests.algo_utils import load_algo, tiny_args

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("flags", [{}, {"compile": True, "cudagraphs": True}, {"num_seeds": 3},
                                   {"num_seeds": 3, "compile": True, "cudagraphs": True}],
                         ids=["eager", "cudagraphs", "pack", "pack-cudagraphs"])
@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("per_dqn", "PongNoFrameskip-v4"),
                                       ("nstep_dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1")])
def test_runs_on_cuda(tmp_path, monkeypatch, algo, env, flags):
    monkeypatch.chdir(tmp_path)
    module = load_algo(algo)
    args = tiny_args(module, env=env, cuda=True, eval_episodes=1, train_frequency=1, **flags)
    summaries = module.main(args)
    for summary in summaries if isinstance(summaries, list) else [summaries]:
        assert summary["updates"] > 100 and summary["eval_episodes"] == 1 and not summary["interrupted"]
