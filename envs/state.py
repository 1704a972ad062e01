"""Vector-env state for exact resume: `env_state` and `load_env_state`.

    state = env_state(env)                  # plain data: torch.save it, torch.load(..., weights_only=True)
    reset_obs = load_env_state(fresh, state)  # fresh: make_vector_env(same id, num_envs and kwargs)

Gymnasium vector envs (classic control, MuJoCo, any SyncVectorEnv of python envs) continue
exactly: stepping `fresh` with the same actions gives bit-identical obs, reward, terminated,
truncated and info["final_obs"] as the original from the snapshot on, across episode ends and
truncations, and `action_space.sample()` gives the same draws; `load_env_state` returns None
(continue from the obs you saved). The state is read layer by layer, from the outermost vector
wrapper down to each sub-env's own class (TimeLimit, OrderEnforcing, PassiveEnvChecker, ...,
CartPoleEnv), and for each layer holds:

- every instance attribute holding plain data: None, bool, int, float, str, numpy scalars and
  arrays (as tensors of the same dtype), and lists, tuples and str-keyed dicts of those. That
  covers TimeLimit's elapsed steps, the order and checker flags, SyncVectorEnv's current
  observations and autoreset flags, and the envs' own variables (CartPole's `state`, ...);
- numpy Generators (the envs' `np_random`) as their bit generator's state;
- MuJoCo's MjData as mj_getState(mjSTATE_INTEGRATION): time, qpos, qvel, act, warm-start
  accelerations, controls, applied forces, mocap, user data and plugin state, all that the next
  mj_step reads (derived quantities are recomputed by it);
- spaces (action and observation spaces of the vector env and of each layer) as the state of
  their generator, restored into the existing space objects.

Any other attribute (MjModel, renderers, EnvSpec, callables, enums) is taken to be constant for
the env's life and is not saved: an env that keeps changing state inside such an object would
not resume exactly. Nothing is pickled: the state is tensors, python scalars, str, None and
lists/tuples/dicts of those, each value tagged with its kind, e.g. ("ndarray", tensor).

Atari (ale-py's AtariVectorEnv, ale-py 0.12): the C++ vector env exposes no way to read or set
emulator state (the single-game ALEInterface has cloneState, the vector interface has nothing
but reset/send/recv), so an Atari run cannot resume exactly. The state then holds the id,
num_envs and the action spaces' generators; `load_env_state` restores those and resets every
sub-env with a seed derived from the saved state, and returns the reset observations. What
differs from the run left alone: the games in progress at the checkpoint are cut off (they end
without a final transition and are not logged: start a fresh TransitionRecorder), training
goes on from new games (new noop starts), and the emulators' sticky-action draws differ. What
is the same: a resumed run is deterministic, the same checkpoint always gives the same
continuation, and random exploration (`action_space.sample()`) continues its saved stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import SyncVectorEnv, VectorEnv, VectorWrapper

FORMAT = 1
_PLAIN = (type(None), bool, int, float, str)
_SKIP = object()  # an attribute taken to be constant: not saved

try:
    import mujoco
except ImportError:  # the mujoco extra is optional
    mujoco = None


def env_state(env: VectorEnv) -> dict[str, Any]:
    """The state of `env` (see the module docstring) as data `torch.load(weights_only=True)` reads.

    Reading the state changes nothing in `env`.
    """
    layers = _vector_layers(env)
    state: dict[str, Any] = _header(env)
    state["spaces"] = {name: _encode_attr(getattr(env, name)) for name in ("action_space", "single_action_space")}
    if _is_atari(layers[-1]):
        state["exact"] = False
        state["reset_seed"] = _reset_seed(env)
        return state
    state["exact"] = True
    state["layers"] = [_attributes(layer) for layer in layers]
    state["sub_envs"] = [[_attributes(layer) for layer in _sub_env_layers(sub)] for sub in _sub_envs(layers[-1])]
    return state


def load_env_state(env: VectorEnv, state: dict[str, Any]) -> np.ndarray | None:
    """Puts `state` (from `env_state`) into `env`, a fresh env made like the one it was taken from.

    Returns None when `env` now continues exactly where the saved env was (gymnasium envs:
    continue from the obs you saved), or the observations of the games it had to reset (Atari,
    see the module docstring). A state from another env id, num_envs, observation or action
    space, or wrapper stack is refused with a ValueError, and then nothing in `env` has changed:
    every value is checked and decoded before the first is set.
    """
    if not isinstance(state, dict):
        raise ValueError(f"An env state is a dict, not a {type(state).__name__}")
    expected = _header(env)
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(
                f"The saved env state does not fit this env: {key} is {state.get(key)!r} in the state "
                f"and {value!r} here."
            )
    layers = _vector_layers(env)
    apply = []
    for name, encoded in state["spaces"].items():
        apply += _restore_attr(env, name, encoded, name)
    if not state["exact"]:
        for step in apply:
            step()
        obs, _ = env.reset(seed=state["reset_seed"])
        return obs

    subs = _sub_envs(layers[-1])
    if len(state["layers"]) != len(layers) or len(state["sub_envs"]) != len(subs):
        raise ValueError("The saved env state does not fit this env: its layers differ.")
    for layer, saved in zip(layers, state["layers"], strict=True):
        apply += _restore_layer(layer, saved, type(layer).__name__)
    for i, (sub, saved_layers) in enumerate(zip(subs, state["sub_envs"], strict=True)):
        sub_layers = _sub_env_layers(sub)
        if len(saved_layers) != len(sub_layers):
            raise ValueError(f"The saved env state does not fit this env: sub-env {i} has other wrappers.")
        for layer, saved in zip(sub_layers, saved_layers, strict=True):
            apply += _restore_layer(layer, saved, f"sub-env {i} {type(layer).__name__}")
    for step in apply:
        step()
    return None


def _header(env: VectorEnv) -> dict[str, Any]:
    """What must match between a saved state and the env it is loaded into."""
    spec = env.unwrapped.spec
    return {
        "format": FORMAT,
        "env_id": None if spec is None else spec.id,
        "num_envs": env.num_envs,
        "observation_space": str(env.single_observation_space),
        "action_space": str(env.single_action_space),
        "vector_layers": [type(layer).__name__ for layer in _vector_layers(env)],
    }


def _vector_layers(env: VectorEnv) -> list[Any]:
    """The vector wrappers from the outermost in, then the vector env itself."""
    layers = [env]
    while isinstance(layers[-1], VectorWrapper):
        layers.append(layers[-1].env)
    if not (isinstance(layers[-1], SyncVectorEnv) or _is_atari(layers[-1]) or type(layers[-1]) is CartPoleVectorEnv):
        raise ValueError(
            "env_state supports gymnasium's SyncVectorEnv and CartPoleVectorEnv and ale-py's AtariVectorEnv, not "
            f"{type(layers[-1]).__name__}"
        )
    return layers


def _sub_envs(env: VectorEnv) -> list[gym.Env]:
    """A SyncVectorEnv's envs; none for an array env (CartPoleVectorEnv), whose state is all its own attributes."""
    return env.envs if isinstance(env, SyncVectorEnv) else []


def _sub_env_layers(env: gym.Env) -> list[Any]:
    """A sub-env's wrappers from the outermost in, then the env itself."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _is_atari(env: VectorEnv) -> bool:
    return type(env).__name__ == "AtariVectorEnv"


def _reset_seed(env: VectorEnv) -> int:
    """A seed for the Atari reset on load: a function of the saved state, so resuming is deterministic.

    It hashes the action space's generator state (sha256, the same in every process); an unseeded
    space has none, and then the seed is random, as the run itself was.
    """
    rng = env.single_action_space._np_random
    if rng is None:
        return int(np.random.SeedSequence().generate_state(1)[0] >> 1)
    digest = hashlib.sha256(repr(rng.bit_generator.state).encode()).digest()
    # ALE takes int32 seeds and gives sub-env i the seed + i
    return int.from_bytes(digest[:4], "little") % (2**31 - 1 - env.num_envs)


def _attributes(layer: Any) -> dict[str, Any]:
    """Type name and the saved attributes of one layer; the links to inner layers are walked apart."""
    attrs = {}
    for name, value in vars(layer).items():
        if name in ("env", "envs"):
            continue
        encoded = _encode_attr(value)
        if encoded is not _SKIP:
            attrs[name] = encoded
    return {"type": type(layer).__name__, "attrs": attrs}


def _encode_attr(value: Any) -> Any:
    if isinstance(value, np.random.Generator):
        return ("generator", _encode(value.bit_generator.state))
    if type(value) is list and value and all(isinstance(item, np.random.Generator) for item in value):
        return ("generators", [_encode(item.bit_generator.state) for item in value])  # one per env
    if isinstance(value, gym.spaces.Space):
        return ("space", _space_state(value))
    if mujoco is not None and isinstance(value, mujoco.MjData):
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        physics = np.empty(mujoco.mj_stateSize(value.model, spec), dtype=np.float64)
        mujoco.mj_getState(value.model, value, physics, spec)
        return ("mjdata", torch.from_numpy(physics))
    return _encode(value)


def _encode(value: Any) -> Any:
    """Plain data as (kind, payload); _SKIP for anything else, or for a container holding it."""
    if type(value) in _PLAIN:
        return ("plain", value)
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
        kind = "ndarray" if isinstance(value, np.ndarray) else "scalar"
        # np.array: a 0-d array for a scalar, contiguous, owning its memory
        return (kind, torch.from_numpy(np.array(value, copy=True, order="C")))
    if type(value) in (list, tuple):
        items = [_encode(item) for item in value]
        return _SKIP if any(item is _SKIP for item in items) else (type(value).__name__, items)
    if type(value) is dict and all(type(key) is str for key in value):
        items = {key: _encode(item) for key, item in value.items()}
        return _SKIP if any(item is _SKIP for item in items.values()) else ("dict", items)
    return _SKIP


def _decode(encoded: Any, where: str) -> Any:
    """The value `_encode` read; a ValueError names `where` for anything malformed."""
    if not (isinstance(encoded, tuple) and len(encoded) == 2):
        raise ValueError(f"{where}: malformed saved value {encoded!r}")
    kind, payload = encoded
    if kind == "plain" and type(payload) in _PLAIN:
        return payload
    if kind in ("ndarray", "scalar") and isinstance(payload, torch.Tensor):
        array = payload.cpu().numpy().copy()
        return array if kind == "ndarray" else array[()]
    if kind in ("list", "tuple") and isinstance(payload, list):
        items = [_decode(item, f"{where}[{i}]") for i, item in enumerate(payload)]
        return items if kind == "list" else tuple(items)
    if kind == "dict" and isinstance(payload, dict):
        return {key: _decode(item, f"{where}[{key!r}]") for key, item in payload.items()}
    raise ValueError(f"{where}: malformed saved value of kind {kind!r}")


def _space_state(space: gym.spaces.Space) -> dict[str, Any]:
    rng = space._np_random
    subspaces = getattr(space, "spaces", ())  # Tuple, Dict, OneOf, ... carry their own generators
    if isinstance(subspaces, dict):
        subspaces = subspaces.values()
    return {
        "rng": None if rng is None else _encode(rng.bit_generator.state),
        "spaces": [_space_state(sub) for sub in subspaces],
    }


def _restore_layer(layer: Any, saved: dict[str, Any], where: str) -> list[Callable[[], None]]:
    if saved.get("type") != type(layer).__name__:
        raise ValueError(f"The saved env state does not fit this env: {where} was a {saved.get('type')}.")
    apply = []
    for name, encoded in saved["attrs"].items():
        apply += _restore_attr(layer, name, encoded, f"{where}.{name}")
    return apply


def _restore_attr(obj: Any, name: str, encoded: Any, where: str) -> list[Callable[[], None]]:
    """Checks and decodes one saved attribute; returns the steps that set it (run after every check)."""
    kind, payload = encoded if isinstance(encoded, tuple) and len(encoded) == 2 else (None, None)
    current = getattr(obj, name, None)
    if kind == "generators":
        if not (isinstance(current, list) and isinstance(payload, list) and len(current) == len(payload)):
            raise ValueError(f"The saved env state does not fit this env: {where} holds other generators.")
        restored = [_generator(item, f"{where}[{i}]") for i, item in enumerate(payload)]
        return [lambda: setattr(obj, name, restored)]
    if kind == "generator":
        restored = _generator(payload, where)
        if isinstance(current, np.random.Generator) and type(current.bit_generator) is type(restored.bit_generator):
            # in place: whoever shares this generator keeps sharing it
            return [lambda: setattr(current.bit_generator, "state", restored.bit_generator.state)]
        return [lambda: setattr(obj, name, restored)]
    if kind == "space":
        if not isinstance(current, gym.spaces.Space):
            raise ValueError(f"The saved env state does not fit this env: {where} is not a space here.")
        return _restore_space(current, payload, where)
    if kind == "mjdata":
        spec = mujoco.mjtState.mjSTATE_INTEGRATION if mujoco is not None else None
        if spec is None or not isinstance(current, mujoco.MjData) or not isinstance(payload, torch.Tensor):
            raise ValueError(f"The saved env state does not fit this env: {where} is not MuJoCo data here.")
        physics = payload.cpu().numpy().astype(np.float64)
        size = mujoco.mj_stateSize(current.model, spec)
        if physics.shape != (size,):
            raise ValueError(
                f"The saved env state does not fit this env: {where} holds {physics.size} numbers, not {size}."
            )
        return [lambda: mujoco.mj_setState(current.model, current, physics, spec)]
    value = _decode(encoded, where)
    return [lambda: setattr(obj, name, value)]


def _restore_space(space: gym.spaces.Space, saved: dict[str, Any], where: str) -> list[Callable[[], None]]:
    subspaces = getattr(space, "spaces", ())
    subspaces = list(subspaces.values() if isinstance(subspaces, dict) else subspaces)
    if len(subspaces) != len(saved["spaces"]):
        raise ValueError(f"The saved env state does not fit this env: {where} has other subspaces.")
    restored = None if saved["rng"] is None else _generator(saved["rng"], where)
    apply = [lambda: setattr(space, "_np_random", restored)]
    for i, (sub, sub_saved) in enumerate(zip(subspaces, saved["spaces"], strict=True)):
        apply += _restore_space(sub, sub_saved, f"{where}[{i}]")
    return apply


def _generator(encoded: Any, where: str) -> np.random.Generator:
    """A new numpy Generator in the saved state (its bit generator named in the state)."""
    state = _decode(encoded, where)
    name = state.get("bit_generator") if isinstance(state, dict) else None
    bit_generator = getattr(np.random, name, None) if isinstance(name, str) else None
    if not (isinstance(bit_generator, type) and issubclass(bit_generator, np.random.BitGenerator)):
        raise ValueError(f"{where}: unknown bit generator {name!r}")
    generator = np.random.Generator(bit_generator())
    try:
        generator.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: malformed generator state ({e})") from e
    return generator
