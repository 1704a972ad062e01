"""TEMPORARY placeholder: the envs helper replaces this module."""


def env_state(env):
    raise NotImplementedError


def load_env_state(env, state):
    raise NotImplementedError
