"""Vector-env construction: gymnasium ids through `gym.make_vec`, Atari through ale-py's C++ vector env."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from .cartpole import CartPoleArray

CARTPOLE_ARRAY = "gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv"  # the entry point CartPoleArray wraps
# From this many envs CartPole steps as one numpy array: a step costs about 40 us at 1 to 10 envs, 63 us at 32,
# where a SyncVectorEnv of CartPoleEnv costs 14, 21, 38, 88 and 263 us at 1, 2, 4, 10 and 32 (one thread). Both
# play the same episodes, bit for bit (tests/test_envs.py), so a pack's seed still equals the seed alone.
ARRAY_FROM = 4

# The DQN-paper preprocessing (Mnih et al. 2015), applied to every Atari id. Rewards stay raw
# here: TransitionRecorder clips them for training, so episode statistics are always in game score.
# What varies between ids (sticky actions, action set, episode cap) comes from the id's registry
# entry, see `atari_settings`.
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
    reward_clipping=False,
    episodic_life=False,  # a life loss must not restart the game, see LifeLossInfo
    life_loss_info=False,
)

# Registry kwargs of ale-py ids that AtariVectorEnv takes under the same name.
_ATARI_SPEC_KEYS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")



@contextmanager
def extra_named(env_id: str) -> Iterator[None]:
    """Building `env_id`'s env: gymnasium's DependencyNotInstalled for a Box2D or MuJoCo id as one ImportError that
    names this project's extra (gymnasium's own hint names its extras, not ours); any other error as it is."""
    try:
        yield
    except gym.error.DependencyNotInstalled as e:
        entry = str(_env_spec(env_id).entry_point)
        extra = next((name for name in ("box2d", "mujoco") if f"envs.{name}" in entry), None)
        if extra is None:
            raise
        what = {"box2d": "Box2D", "mujoco": "MuJoCo"}[extra]
        raise ImportError(f'{env_id} needs {what}, which is not installed: pip install -e ".[{extra}]" (or pip '
                          f"install {extra})") from e

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


def atari_settings(env_id: str, **env_kwargs: Any) -> dict[str, Any]:
    """The keyword arguments `make_vector_env` gives AtariVectorEnv for an ale-py id.

    ATARI_SETTINGS (the DQN preprocessing), then what the id's registry entry sets, then
    `env_kwargs`. So "PongNoFrameskip-v4" plays without sticky actions as in the DQN papers, and
    "ALE/Pong-v5" keeps its sticky actions (repeat_action_probability=0.25, Machado et al. 2018).
    Both skip 4 frames per agent step: v5's own frame skip is 4, and NoFrameskip ids (skip 1)
    get the preprocessing's 4. Ids with a random frame skip ("Pong-v4": 2 to 4 frames) and any
    registry setting AtariVectorEnv cannot apply are refused with a ValueError.
    """
    spec = _env_spec(env_id)
    if spec.entry_point != "ale_py.env:AtariEnv":
        raise ValueError(f"{env_id!r} is not an Atari id")
    settings = dict(ATARI_SETTINGS)
    for key, value in spec.kwargs.items():
        if key in _ATARI_SPEC_KEYS:
            settings[key] = value
        elif key == "frameskip" and isinstance(value, int):
            if value > 1:
                settings["frameskip"] = value
        elif key == "frameskip":
            raise ValueError(
                f"{env_id!r} skips a random number of frames {value}, which ale-py's vector env cannot do: "
                f"use {spec.name}NoFrameskip-v4 (DQN settings) or ALE/{spec.name}-v5 (sticky actions)."
            )
        elif key != "game" and value is not None and not (key == "obs_type" and value == "rgb"):
            raise ValueError(f"{env_id!r} sets {key}={value!r}, which ale-py's vector env cannot apply.")
    return {**settings, **env_kwargs}


class LifeLossInfo(VectorWrapper):
    """Adds info["life_loss"]: a life was lost this step but the game goes on.

    With `life_loss_info=False` ale-py only terminates at game over (when info["lives"] jumps
    back to the start value for the new game), so a lost life is seen as the lives count going
    down between two steps of the same game. Where an episode ends (terminated or truncated)
    the step already reports the new game's lives, so life_loss is False there; the first step
    of a new game compares against that game's starting lives.

    It keeps no state for `env_state`: an Atari game cannot be restored, and after the reset
    that `load_env_state` makes, the lives come from the new games.
    """

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(kwargs.get("seed"), list):  # a seed per env (env_seeds): ale-py takes them as an array
            kwargs["seed"] = np.array(kwargs["seed"])
        obs, info = self.env.reset(**kwargs)
        # a partial reset (options={"reset_mask": ...}) reports the others' current lives too
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


def _channels_first(env: gym.Env) -> gym.Env:
    """`env` with (H, W, C) image observations transposed to (C, H, W); other envs unchanged.

    An image is a uint8 Box of rank 3; it is channels-last when its last axis has at most 4
    entries (gray, RGB, RGBA or a short frame stack) and its first axis more.
    """
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3):
        return env
    if not (space.shape[2] <= 4 < space.shape[0]):
        return env
    chw = gym.spaces.Box(space.low.transpose(2, 0, 1), space.high.transpose(2, 0, 1), dtype=np.uint8)
    return gym.wrappers.TransformObservation(env, lambda obs: np.ascontiguousarray(obs.transpose(2, 0, 1)), chw)


def env_seeds(seeds: list[int], num_envs: int) -> list[int]:
    """The reset seeds of the envs of a pack of runs, seed by seed, `num_envs` each (env j of seed s at row
    i * num_envs + j): env 0 gets s, env j > 0 gets s + j * 2**20. So a run of one env is seeded as it always was,
    and no two envs of a pack of fewer than 2**20 consecutive seeds share a seed (s + j would: seeds 1 and 2 with
    4 envs each would share three); every seed stays below 2**31, the int32 that ALE takes, for s < 2**20."""
    return [seed + env * 2**20 for seed in seeds for env in range(num_envs)]


def make_vector_env(
    env_id: str, num_envs: int = 1, seed: int | None = None, *, training: bool = True, array: bool | None = None,
    **env_kwargs: Any
) -> VectorEnv:
    """A vector env in SAME_STEP autoreset mode; `env_kwargs` go to the env constructor.

    SAME_STEP: when a sub-env's episode ends, `step` already returns its reset observation and
    the real final observation is in info["final_obs"] (gymnasium: object array plus a
    "_final_obs" mask; ale-py: dense array, valid in the rows where terminated | truncated).
    `TransitionRecorder` turns that into clean transitions.

    CartPole ids with ARRAY_FROM envs or more (or `array=True`) step all envs in one numpy call (CartPoleVectorEnv,
    made SAME_STEP with a generator per env by envs.cartpole.CartPoleArray: the same episodes, bit for bit, as a
    SyncVectorEnv of CartPoleEnv); other gymnasium ids, and CartPole with fewer envs, are a SyncVectorEnv of their
    envs.

    Atari ids ("PongNoFrameskip-v4", "ALE/Pong-v5") get the DQN preprocessing and their own
    registry settings, see `atari_settings` (env_kwargs override both). With `training=True`,
    info["life_loss"] is added.

    Image observations laid out (H, W, C) (a uint8 Box such as CarRacing's (96, 96, 3)) are
    transposed to (C, H, W), the layout of Atari stacks and of torch's Conv2d, in every
    observation including info["final_obs"]; the observation spaces say the new shape.

    Seeding: `seed` seeds the action spaces (so `action_space.sample()` is reproducible); the
    caller still calls `env.reset(seed=seed)`, which seeds sub-env i with `seed + i`, or
    `env.reset(seed=env_seeds(seeds, num_envs))` for training envs (see `env_seeds`).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    spec = _env_spec(env_id)
    if spec.entry_point == "ale_py.env:AtariEnv":
        from ale_py.vector_env import AtariVectorEnv

        threads = min(num_envs, os.cpu_count() or 1)
        settings = atari_settings(env_id, **env_kwargs)
        env: VectorEnv = AtariVectorEnv(spec.kwargs["game"], num_envs, num_threads=threads, **settings)
        env.spec = spec  # AtariVectorEnv keeps none; envs.state checks a saved state against it
        if training:
            env = LifeLossInfo(env)
    elif spec.vector_entry_point == CARTPOLE_ARRAY and (num_envs >= ARRAY_FROM if array is None else array):
        env = CartPoleArray(gym.make_vec(spec, num_envs, vectorization_mode="vector_entry_point", **env_kwargs))
    else:
        with extra_named(env_id):
            env = gym.make_vec(
                spec,
                num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                wrappers=[_channels_first],
                **env_kwargs,
            )
    env.action_space.seed(seed)
    env.single_action_space.seed(seed)
    return env
