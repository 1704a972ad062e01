"""Vector-env construction: gymnasium ids through `gym.make_vec`, Atari through ale-py's C++ vector env."""

from __future__ import annotations

import importlib
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

# The DQN-paper preprocessing (Mnih et al. 2015; Machado et al. 2018 for the episode cap).
# Rewards stay raw here: TransitionRecorder clips them for training, so episode statistics
# are always in game score.
ATARI_SETTINGS: dict[str, Any] = dict(
    autoreset_mode=AutoresetMode.SAME_STEP,
    noop_max=30,
    frameskip=4,
    maxpool=True,
    img_height=84,
    img_width=84,
    grayscale=True,
    stack_num=4,
    use_fire_reset=True,
    repeat_action_probability=0.0,  # overrides the sticky actions of ALE/...-v5 ids
    reward_clipping=False,
    episodic_life=False,  # a life loss must not restart the game, see LifeLossInfo
    life_loss_info=False,
    max_num_frames_per_episode=108_000,
)


def _env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry for `env_id` ("EnvId-v0" or "module:EnvId-v0"), or a ValueError."""
    try:
        import ale_py

        gym.register_envs(ale_py)
        have_ale = True
    except ImportError:
        have_ale = False
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        return gym.spec(name)
    except (gym.error.Error, ModuleNotFoundError) as e:
        looks_atari = name.startswith("ALE/") or "NoFrameskip" in name or "Deterministic" in name
        hint = " Atari ids need ale-py: install the `atari` extra." if looks_atari and not have_ale else ""
        raise ValueError(f"Environment id {env_id!r} is not registered ({e}).{hint}") from e


def is_atari(env_id: str) -> bool:
    """Whether `env_id` is an ale-py game, built with `AtariVectorEnv` and DQN preprocessing (False if unknown)."""
    try:
        return _env_spec(env_id).entry_point == "ale_py.env:AtariEnv"
    except ValueError:
        return False


class LifeLossInfo(VectorWrapper):
    """Adds info["life_loss"]: a life was lost this step but the game goes on.

    With `life_loss_info=False` ale-py only terminates at game over (when info["lives"] jumps
    back to the start value for the new game), so a lost life is seen as the lives count going
    down between two steps of the same game.
    """

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._lives = info["lives"].copy()
        return obs, info

    def step(self, actions: np.ndarray) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = info["lives"]
        # At a game over the new game's lives are already in `lives`; the mask keeps a game
        # over from ever counting as a life loss, whatever a ROM reports there.
        info["life_loss"] = (lives < self._lives) & ~(terminated | truncated)
        self._lives = lives.copy()
        return obs, reward, terminated, truncated, info


def make_vector_env(
    env_id: str, num_envs: int = 1, seed: int | None = None, *, training: bool = True, **env_kwargs: Any
) -> VectorEnv:
    """A vector env in SAME_STEP autoreset mode; `env_kwargs` go to the env constructor.

    SAME_STEP: when a sub-env's episode ends, `step` already returns its reset observation and
    the real final observation is in info["final_obs"] (gymnasium: object array plus a
    "_final_obs" mask; ale-py: dense array, valid in the rows where terminated | truncated).
    `TransitionRecorder` turns that into clean transitions.

    Atari ids ("PongNoFrameskip-v4", "ALE/Pong-v5") only pick the game; every setting comes from
    ATARI_SETTINGS (env_kwargs override them). With `training=True`, info["life_loss"] is added.

    Seeding: `seed` seeds the action spaces (so `action_space.sample()` is reproducible); the
    caller still calls `env.reset(seed=seed)`, which seeds sub-env i with `seed + i`.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    spec = _env_spec(env_id)
    if spec.entry_point == "ale_py.env:AtariEnv":
        from ale_py.vector_env import AtariVectorEnv

        threads = min(num_envs, os.cpu_count() or 1)
        settings = {**ATARI_SETTINGS, **env_kwargs}
        env: VectorEnv = AtariVectorEnv(spec.kwargs["game"], num_envs, num_threads=threads, **settings)
        if training:
            env = LifeLossInfo(env)
    else:
        env = gym.make_vec(
            spec,
            num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **env_kwargs,
        )
    env.action_space.seed(seed)
    env.single_action_space.seed(seed)
    return env
