"""Atari semantics on Breakout's real emulator, what Pong never exercises: five lives, FIRE to launch the ball, a
4-action set. FIRE is pressed for the agent at the start of each game (ale-py's fire reset) and left to the agent
after a lost life (as in Dopamine and Machado et al. 2018); an evaluation that a never-firing policy stalls ends at
the episode cap and says so. A lost life ends the bootstrap, not the logged episode; an evaluation episode is a
whole game and its return the game's score; the video shows that whole game; the three DQN files' Atari presets
run Breakout."""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
import pytest

from envs import evaluate, make_vector_env
from tests.algo_utils import load_algo, parse

NOOP, FIRE = 0, 1
evaluate_module = importlib.import_module("envs.evaluate")  # envs.evaluate is also the function's name


def lives_of(actions, seed: int = 0, env_id: str = "BreakoutNoFrameskip-v4"):
    """Lives, rewards and game overs of one Breakout env (evaluation settings) playing `actions` from reset(seed)."""
    env = make_vector_env(env_id, 1, seed, training=False)
    _, info = env.reset(seed=np.array([seed]))
    lives, rewards, overs = [int(info["lives"][0])], [], []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(np.array([action]))
        lives.append(int(info["lives"][0]))
        rewards.append(float(reward[0]))
        overs.append(bool(terminated[0] or truncated[0]))
    env.close()
    return np.array(lives), np.array(rewards), np.array(overs)


def test_fire_launches_the_ball_at_each_game_start_and_after_a_lost_life_the_agent_must():
    """A policy that only plays NOOP: the reset's FIRE launches the ball, which the still paddle misses within 100
    steps (a life lost); then nothing launches it again: no life is lost in the next 2,000 steps. One FIRE there
    brings the ball back, and the still paddle loses the next life within 100 steps of it."""
    lives, _, overs = lives_of([NOOP] * 2100)
    first_loss = int(np.flatnonzero(np.diff(lives) < 0)[0]) + 1
    assert first_loss <= 100 and lives[first_loss] == 4 and not overs.any()
    assert (lives[first_loss:] == 4).all()  # stalled: the ball waits for FIRE
    lives, _, _ = lives_of([NOOP] * 2100 + [FIRE] + [NOOP] * 100)
    assert lives[-1] == 3


def test_a_new_game_after_a_game_over_starts_with_fire_pressed():
    """Random play until the first game over (autoreset in the same step), then NOOP only: the new game's ball is
    launched by the reset's FIRE, so the still paddle loses the new game's first life within 100 steps."""
    rng = np.random.default_rng(0)
    random_play = list(rng.integers(0, 4, 2_000))
    lives, _, overs = lives_of(random_play)
    over = int(np.flatnonzero(overs)[0])
    lives, _, overs = lives_of(random_play[:over + 1] + [NOOP] * 100)
    assert overs[over] and lives[over + 1] == 5  # the step that ended the game reports the new game's lives
    assert (lives[over + 2:] == 4).any()


def test_a_stalled_evaluation_ends_at_the_cap_and_says_so(monkeypatch):
    """A never-firing policy stalls every game after its first lost life: each evaluation episode ends at the
    episode cap (shortened here from 27,000 to 300 steps) and is counted as capped; a policy that fires has none."""
    monkeypatch.setattr(evaluate_module, "ATARI_MAX_EPISODE_STEPS", 300)
    capped: list[int] = []
    returns = evaluate("BreakoutNoFrameskip-v4", lambda obs: np.full(len(obs), NOOP), 3, seed=0, num_envs=2,
                       capped=capped)
    assert len(returns) == 3 and capped == [3]
    rng = np.random.default_rng(0)
    capped = []
    evaluate("BreakoutNoFrameskip-v4", lambda obs: rng.integers(0, 4, len(obs)), 2, seed=[0, 5], capped=capped)
    assert capped == [0, 0]


def test_a_game_stalled_to_the_default_cap_is_counted_though_ale_py_truncates_it():
    """At the default cap of 27,000 agent steps ale-py's own 108,000-frame limit ends the game on the same step
    (as truncated): the game still reached the cap without a game over and is counted as capped."""
    assert evaluate_module.ATARI_MAX_EPISODE_STEPS * 4 == 108_000
    capped: list[int] = []
    returns = evaluate("BreakoutNoFrameskip-v4", lambda obs: np.full(len(obs), NOOP), 1, seed=0, num_envs=1,
                       capped=capped)
    assert returns == [0.0] and capped == [1]


def test_a_preset_too_large_for_the_memory_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch):
    """On a machine with too little memory for the preset's replay, the run stops before writing a run directory,
    saying in one line what the buffer needs and which --buffer-size fits; that size then starts."""
    import buffers.frames

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(buffers.frames, "available_memory", lambda device: (2**29, "a test"))
    monkeypatch.setattr(evaluate_module, "ATARI_MAX_EPISODE_STEPS", 50)  # the final evaluation: a short one
    per_dqn = load_algo("per_dqn")
    args = parse(per_dqn, ["--env", "BreakoutNoFrameskip-v4", "--threads", "1", "--total-timesteps", "80",
                           "--learning-starts", "40", "--no-save-model", "--eval-episodes", "1"])
    with pytest.raises(SystemExit) as refused:
        per_dqn.main(args)
    line = str(refused.value.code)
    length = math.ceil(args.buffer_size * 1.02 / 8) + 16  # frames per env: the store's sizing (buffers/frames.py)
    needed = (8 * length * (84 * 84 + 8) + args.buffer_size * (16 + 64)) / 2**30
    assert line.startswith(f"error: a replay buffer of {args.buffer_size:,} transitions of BreakoutNoFrameskip-v4 "
                           f"needs {needed:.2f} GiB of memory and 0.50 GiB are available (a test): pass --buffer-size")
    assert not (tmp_path / "runs").exists()
    fits = int(line.split("--buffer-size ")[1].split()[0])
    summary = per_dqn.main(parse(per_dqn, ["--env", "BreakoutNoFrameskip-v4", "--threads", "1", "--total-timesteps",
                                           "80", "--learning-starts", "40", "--no-save-model", "--eval-episodes",
                                           "1", "--buffer-size", str(fits)]))
    assert summary["global_step"] == 80 and fits < args.buffer_size


def test_an_evaluation_episode_is_a_whole_game_and_its_video_shows_it(tmp_path):
    """Random play evaluated for one episode with a video: replayed action by action in a fresh env of the same
    seed, the episode is one whole game (five lives, four lost before the game over, which is its last step), its
    return is the sum of the game's raw rewards (not clipped), and the video has one frame per step plus the first."""
    imageio = pytest.importorskip("imageio.v2")
    rng, actions = np.random.default_rng(5), []  # a game that scores

    def policy(obs):
        actions.append(int(rng.integers(0, 4)))
        return np.array(actions[-1:])

    returns = evaluate("BreakoutNoFrameskip-v4", policy, 1, seed=7, video_dir=str(tmp_path))
    lives, rewards, overs = lives_of(actions, seed=7)
    assert lives[0] == 5 and int((np.diff(lives[:-1]) < 0).sum()) == 4  # the last step reports the new game's
    assert overs[-1] and not overs[:-1].any()
    assert returns == [rewards.sum()] and rewards.sum() > 0
    frames = imageio.mimread(tmp_path / "eval-episode-0.mp4", memtest=False)
    assert len(frames) == len(actions) + 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dqn", "per_dqn", "nstep_dqn"])
def test_the_atari_presets_train_breakout(tmp_path, monkeypatch, capsys, name):
    """`--env BreakoutNoFrameskip-v4` takes each file's Atari preset (announced), on Breakout's 4 actions with 8
    envs; a short run makes gradient steps, logs training returns of whole games (longer than one life), and ends
    with an evaluation whose episodes the cap ends (50 steps here: no game of five lives is that short), which the
    run says in one printed line, in metrics.jsonl and in summary.json."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(evaluate_module, "ATARI_MAX_EPISODE_STEPS", 50)
    algo = load_algo(name)
    args = parse(algo, ["--env", "BreakoutNoFrameskip-v4", "--total-timesteps", "3200", "--learning-starts", "2800",
                        "--buffer-size", "4000", "--eval-episodes", "2", "--eval-frequency", "0",
                        "--checkpoint-frequency", "0", "--threads", "1", "--no-cuda", "--run-name", "b"])
    assert args.num_envs == 8 and args.train_frequency in (1, 2, 4)
    summary = algo.main(args)
    assert summary["updates"] > 0 and summary["eval_episodes"] == 2 and summary["eval_capped"] == 2
    out = capsys.readouterr().out
    assert "BreakoutNoFrameskip-v4 is an Atari game: using the Atari preset" in out
    assert "2 of 2 episodes ended at the episode cap" in out
    records = [json.loads(line) for line in (tmp_path / "runs" / "b" / "metrics.jsonl").read_text().splitlines()]
    games = [r for r in records if "charts/episodic_return" in r]
    assert games and all(r["charts/episodic_length"] > 100 for r in games)  # five lives of random play
    assert any("losses/td_loss" in r for r in records)
    assert [r["eval/capped_episodes"] for r in records if "eval/capped_episodes" in r] == [2]
