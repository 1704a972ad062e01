"""Policy evaluation with an optional mp4 of the first episode."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from .make import _env_spec, atari_settings, extra_named, is_atari, make_vector_env
from .recorder import EpisodeStats

ATARI_FPS = 15  # 60 Hz emulator with frameskip 4
# 108,000 frames = 27,000 agent steps at frameskip 4: 30 minutes of play, the standard cap
# (Machado et al. 2018; Dopamine, Rainbow). Nature DQN evaluated 5-minute episodes (4,500 steps).
ATARI_MAX_EPISODE_STEPS = 27_000


def evaluate(
    env_id: str,
    policy: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    seed: int | Sequence[int],
    *,
    num_envs: int = 1,
    max_episode_steps: int | None = None,
    video_dir: str | Sequence[str | None] | None = None,
    abort: Callable[[], bool] | None = None,
    capped: list[int] | None = None,
) -> list[float] | list[list[float]]:
    """Raw (unclipped) returns of `episodes` episodes of `policy` (batch of obs -> batch of actions).

    `seed` an int: one evaluation, its `num_envs` envs seeded seed, seed + 1, ... (as
    `env.reset(seed=seed)` seeds them); returns its returns. `seed` a list: one evaluation per
    seed, all in one vector env stepped together (G groups of `num_envs` envs, group g in rows
    g * num_envs ... and seeded seeds[g], seeds[g] + 1, ...), so a pack of networks is evaluated
    with one policy call per step; returns each group's returns, each the same as that group's
    evaluation alone (the envs are independent; the policy must act on each group's rows as it
    would alone, e.g. draw its exploration from the group's own generator).

    Sub-env i plays a fixed share of its group's episodes (the first ones it finishes), so the
    result does not favour short episodes as "whichever episodes end first" would; returns come in
    the order the episodes ended, which is deterministic for a given seed and policy (an
    epsilon-greedy policy must draw from its own seeded generator).

    `max_episode_steps` caps each episode at that many agent steps (default: 27,000 on Atari,
    ATARI_MAX_EPISODE_STEPS, the same as ale-py's own 108,000-frame limit, so a policy that never
    presses FIRE stalls one episode for at most that; otherwise only the env's own time limit).
    Pass less for quick periodic evaluations. A capped episode counts as truncated: its return
    so far is reported and that sub-env is reset. Given a list `capped`, it gets, per group (one
    int for an int `seed`), how many of the group's reported episodes reached the cap without
    ending (terminating), whether this function or the env's own time limit cut them: a policy
    that stalls a game is then seen, not only timed.

    `abort`, if given, is asked before every step; when it returns True the evaluation stops by
    raising KeyboardInterrupt (its envs closed), so a long evaluation can be cut short.

    With `video_dir` (one per group for a list of seeds; None skips a group), the group's env 0's
    first episode is written to `video_dir/eval-episode-0.mp4`, from the first observation to the
    terminal one. Its frames come from a mirror of that env (see `Mirror`): an env of the same id,
    settings and seed that takes its actions, so it plays the same episode, and shows it as a person
    would see it: `render()` frames for gymnasium envs (the terminal frame included, which the
    vector env, having reset, can no longer render), and for Atari the game's own colour screen
    (210x160 RGB, the max of the last two frames of each skip), not the 84x84 grayscale stacks the
    policy sees.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    grouped = not isinstance(seed, int | np.integer)
    seeds = [int(s) for s in seed] if grouped else [int(seed)]
    video_dirs = list(video_dir) if grouped and video_dir is not None else [video_dir] * len(seeds)
    atari = is_atari(env_id)
    if max_episode_steps is None and atari:
        max_episode_steps = ATARI_MAX_EPISODE_STEPS
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
    env = make_vector_env(env_id, len(seeds) * num_envs, seeds[0], training=False)
    share = [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]
    quota = np.array(share * len(seeds))
    stats = EpisodeStats(len(quota))
    returns: list[list[float]] = [[] for _ in seeds]
    stalled = [0] * len(seeds)
    mirrors = {g * num_envs: Mirror(env_id, s) for g, (s, d) in enumerate(zip(seeds, video_dirs, strict=True))
               if d is not None}
    try:
        env_seeds = [s + j for s in seeds for j in range(num_envs)]
        obs, _ = env.reset(seed=np.array(env_seeds) if atari else env_seeds)
        while quota.any():
            if abort is not None and abort():  # e.g. a signal arrived: the caller catches KeyboardInterrupt
                raise KeyboardInterrupt
            action = policy(obs)
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated | truncated
            # A game that reaches the cap without a game over is capped, whoever ends it: on Atari the
            # default cap and ale-py's own 108,000-frame limit fall on the same step, which the env
            # reports as truncated; only the episodes the env did not end are reset here.
            reached = stats.lengths + 1 >= (max_episode_steps or np.inf)
            at_cap = ~done & reached
            capped_now = ~terminated & reached
            for i, mirror in mirrors.items():
                if mirror.recording:
                    mirror.step(action[i], float(reward[i]), bool(done[i] or at_cap[i]))
            for i, ret, _ in stats.update(reward, done | at_cap):
                if quota[i] > 0:
                    quota[i] -= 1
                    returns[i // num_envs].append(ret)
                    stalled[i // num_envs] += bool(capped_now[i])
            if at_cap.any() and quota.any():
                # sub-envs not in the mask go on: both vector envs report their current obs
                obs, _ = env.reset(options={"reset_mask": at_cap})
    finally:
        env.close()
        for mirror in mirrors.values():
            mirror.close()
    if capped is not None:
        capped.extend(stalled)
    for i, mirror in mirrors.items():
        _write_mp4(os.path.join(video_dirs[i // num_envs], "eval-episode-0.mp4"), mirror.frames, mirror.fps)
    return returns if grouped else returns[0]


class Mirror:
    """A single env that replays env 0's actions of an evaluation to film its first episode.

    Same id, settings and seed as sub-env 0 of `make_vector_env(env_id, n, seed)` after
    `reset(seed=seed)` (gymnasium seeds sub-env i with seed + i; ale-py's vector env seeds the same
    way), so the same actions give the same episode: its `render()` frames (gymnasium) or its colour
    screen (Atari: the same AtariVectorEnv settings, in RGB at the emulator's 210x160 and one frame a
    step). The terminal frame is rendered before any reset. If the mirror's rewards ever differ from
    env 0's, it stops with a warning: the video would not be the episode whose return is reported.
    """

    def __init__(self, env_id: str, seed: int):
        self.atari, self.frames, self.recording, self.reward = is_atari(env_id), [], True, 0.0
        if self.atari:
            from ale_py.vector_env import AtariVectorEnv

            settings = atari_settings(env_id, grayscale=False, img_height=210, img_width=160, stack_num=1)
            self.env = AtariVectorEnv(_env_spec(env_id).kwargs["game"], 1, num_threads=1, **settings)
            self.fps = ATARI_FPS
            obs, _ = self.env.reset(seed=seed)
            self.frames.append(obs[0, -1])
        else:
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rgb_array frames need no display (headless)
            with extra_named(env_id):
                self.env = gym.make(_env_spec(env_id), render_mode="rgb_array")
            self.fps = self.env.metadata.get("render_fps", 30)
            self.env.reset(seed=seed)
            self.frames.append(self.render())

    def step(self, action: Any, reward: float, ended: bool) -> None:
        """Take env 0's `action` (which gave it `reward`; `ended`: its episode ended or was capped)."""
        if self.atari:
            obs, mirrored, terminated, truncated, info = self.env.step(np.asarray([action]))
            done = bool(terminated[0] or truncated[0])
            self.frames.append(info["final_obs"][0, -1] if done else obs[0, -1])  # the colour screen
            mirrored = float(mirrored[0])
        else:
            _, mirrored, terminated, truncated, _ = self.env.step(action)
            self.frames.append(self.render())  # before any reset: the terminal frame is in the video
        if mirrored != reward:
            warnings.warn(f"the video's episode left the evaluated one after {len(self.frames) - 1} steps "
                          f"(reward {mirrored} against {reward}); it stops there", stacklevel=2)
            ended = True
        self.recording = not ended

    def render(self) -> np.ndarray:
        try:
            return self.env.render()
        except Exception as e:  # MuJoCo raises several error types when it has no OpenGL context
            raise RuntimeError(
                f"rendering failed ({e}): classic control needs pygame (pip install -e \".[video]\"); "
                "headless MuJoCo needs an OpenGL backend: set MUJOCO_GL=egl (or MUJOCO_GL=osmesa)"
            ) from e

    def close(self) -> None:
        self.env.close()


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
    if is_atari(env_id):  # frames come from the emulator's screen
        return
    Mirror(env_id, 0).close()  # renders its first frame
