"""Environment construction for the algorithm files: vector envs, clean transitions, evaluation.

A collection step in an algorithm file::

    env = make_vector_env("PongNoFrameskip-v4", num_envs=8, seed=1)
    obs, _ = env.reset(seed=1)
    rec = TransitionRecorder(env.num_envs, clip_reward=is_atari("PongNoFrameskip-v4"))
    next_obs, reward, terminated, truncated, info = env.step(action)
    td, finished = rec.record(obs, action, reward, next_obs, terminated, truncated, info)
    rb.extend(td); obs = next_obs

Exact resume: `env_state(env)` / `load_env_state(env, state)` (see envs/state.py),
`TransitionRecorder.state_dict()` / `load_state_dict()`.
"""

from .evaluate import check_video, evaluate
from .make import env_seeds, is_atari, make_vector_env
from .normalize import RunningMeanStd
from .recorder import TransitionRecorder
from .state import env_state, load_env_state

__all__ = ["RunningMeanStd", "TransitionRecorder", "check_video", "env_seeds", "env_state", "evaluate", "is_atari",
           "load_env_state", "make_vector_env"]
