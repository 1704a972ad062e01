"""Policy evaluation with an optional mp4 of the first episode."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .make import is_atari, make_vector_env
from .recorder import EpisodeStats

ATARI_FPS = 15  # 60 Hz emulator with frameskip 4
# 108,000 frames = 27,000 agent steps at frameskip 4: 30 minutes of play, the standard cap
# (Machado et al. 2018; Dopamine, Rainbow). Nature DQN evaluated 5-minute episodes (4,500 steps).
ATARI_MAX_EPISODE_STEPS = 27_000


def evaluate(
    env_id: str,
    policy: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    seed: int,
    *,
    num_envs: int = 1,
    max_episode_steps: int | None = None,
    video_dir: str | None = None,
    abort: Callable[[], bool] | None = None,
) -> list[float]:
    """Raw (unclipped) returns of `episodes` episodes of `policy` (batch of obs -> batch of actions).

    Sub-env i plays a fixed share of the episodes (the first ones it finishes), so the result
    does not favour short episodes as "whichever episodes end first" would; returns come in the
    order the episodes ended, which is deterministic for a given seed and policy (an
    epsilon-greedy policy must draw from its own seeded generator).

    `max_episode_steps` caps each episode at that many agent steps (default: 27,000 on Atari,
    ATARI_MAX_EPISODE_STEPS, the same as ale-py's own 108,000-frame limit, so a policy that never
    presses FIRE stalls one episode for at most that; otherwise only the env's own time limit).
    Pass less for quick periodic evaluations. A capped episode counts as truncated: its return
    so far is reported and that sub-env is reset.

    `abort`, if given, is asked before every step; when it returns True the evaluation stops by
    raising KeyboardInterrupt (its envs closed), so a long evaluation can be cut short.

    With `video_dir`, env 0's first episode is written to `video_dir/eval-episode-0.mp4`:
    `env.render()` frames for gymnasium envs (the terminal frame is missing: in SAME_STEP mode
    the env has reset before it can be rendered), and for Atari, which cannot render, the newest
    84x84 grayscale frame of each observation stack.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    atari = is_atari(env_id)
    if max_episode_steps is None and atari:
        max_episode_steps = ATARI_MAX_EPISODE_STEPS
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
    render_kwargs = {"render_mode": "rgb_array"} if video_dir is not None and not atari else {}
    env = make_vector_env(env_id, num_envs, seed, training=False, **render_kwargs)
    quota = np.array([episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)])
    stats = EpisodeStats(num_envs)
    returns: list[float] = []
    frames: list[np.ndarray] = []
    recording = video_dir is not None
    try:
        obs, _ = env.reset(seed=seed)
        if recording:
            frames.append(_frame(env, obs, atari))
        while quota.any():
            if abort is not None and abort():  # e.g. a signal arrived: the caller catches KeyboardInterrupt
                raise KeyboardInterrupt
            obs, reward, terminated, truncated, info = env.step(policy(obs))
            done = terminated | truncated
            capped = ~done & (stats.lengths + 1 >= (max_episode_steps or np.inf))
            if recording and (done[0] or capped[0]):
                recording = False
                if atari:  # the last frame of the episode; gymnasium envs cannot render it any more
                    frames.append(info["final_obs"][0, -1] if done[0] else obs[0, -1])
            elif recording:
                frames.append(_frame(env, obs, atari))
            for i, ret, _ in stats.update(reward, done | capped):
                if quota[i] > 0:
                    quota[i] -= 1
                    returns.append(ret)
            if capped.any() and quota.any():
                # sub-envs not in the mask go on: both vector envs report their current obs
                obs, _ = env.reset(options={"reset_mask": capped})
        fps = ATARI_FPS if atari else env.metadata.get("render_fps", 30)
    finally:
        env.close()
    if video_dir is not None:
        _write_mp4(os.path.join(video_dir, "eval-episode-0.mp4"), frames, fps)
    return returns


def _frame(env: Any, obs: np.ndarray, atari: bool) -> np.ndarray:
    if atari:
        return obs[0, -1]
    try:
        return env.render()[0]
    except Exception as e:  # MuJoCo raises several error types when it has no OpenGL context
        raise RuntimeError(
            f"rendering failed ({e}): classic control needs pygame (pip install -e \".[video]\"); "
            "headless MuJoCo needs an OpenGL backend: set MUJOCO_GL=egl (or MUJOCO_GL=osmesa)"
        ) from e


def _write_mp4(path: str, frames: list[np.ndarray], fps: float) -> None:
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (imageio needs it for mp4, but only says so when writing)
    except ImportError as e:
        raise ImportError(
            "Writing videos needs imageio and imageio-ffmpeg: install the `video` extra."
        ) from e
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # macro_block_size=2 pads odd sizes for yuv420p without resizing 84x84 Atari frames to 96x96
    imageio.mimwrite(path, frames, fps=fps, macro_block_size=2)


def check_video(env_id: str) -> None:
    """Raise, saying what to install or set, unless an evaluation video of `env_id` can be written."""
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError as e:
        raise ImportError('videos need imageio and imageio-ffmpeg: pip install -e ".[video]"') from e
    if is_atari(env_id):  # frames come from the observations
        return
    env = make_vector_env(env_id, 1, 0, training=False, render_mode="rgb_array")
    try:
        env.reset(seed=0)
        _frame(env, None, atari=False)
    finally:
        env.close()
