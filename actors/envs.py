"""Build gymnasium vector envs the way the runner expects them.

The autoreset mode is always set explicitly to NEXT_STEP (gymnasium's
default, and the only mode of its numpy-vectorised CartPole and of many
user envs) and checked after construction, so a library default changing
under us is an error rather than a silent change of what `done` means.
"""

from __future__ import annotations

import difflib
import importlib

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

AUTORESET_MODE = AutoresetMode.NEXT_STEP


class EnvError(ValueError):
    """The environment id cannot be built; the message is one line for the user."""


def resolve_env_id(env_id: str) -> str:
    """Import the module of a `module:EnvId` id (it registers the env) and return `EnvId`."""
    from . import probes  # noqa: F401  (registers rlvitals/Probe*-v0)

    if ":" in env_id:
        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(f"env={env_id!r} is invalid: module {module!r} cannot be imported ({exc})") from None
        except SystemExit as exc:  # a module that exits on import would end rlvitals silently
            raise EnvError(f"env={env_id!r} is invalid: importing module {module!r} called sys.exit({exc.code!r}); "
                           "expected a module that registers the env") from None
        except Exception as exc:  # the user's module is broken: say how, in one line
            raise EnvError(f"env={env_id!r} is invalid: importing module {module!r} raised "
                           f"{type(exc).__name__}: {exc}; expected a module that registers the env") from None
        env_id = name
    if env_id not in gym.registry:
        from . import atari

        atari.register(env_id)  # ALE ids: ale-py registers them (one-line error when it is missing)
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3)
        hint = (f"; did you mean {', '.join(close)}?" if close
                else "; expected a registered gymnasium id or module:EnvId")
        raise EnvError(f"env={env_id!r} is not a registered gymnasium environment{hint}")
    return env_id


def make_vector_env(env_id: str, num_envs: int, atari_options=None) -> gym.vector.VectorEnv:
    """A vector env of `num_envs` copies in NEXT_STEP autoreset mode.

    Uses the env's own vectorised implementation when it has one (CartPole's
    runs ~50x faster than a loop over copies), else a synchronous vector env;
    process-based vectorisation is the Ray mode's job, not this one's. ALE ids
    get the standard Atari preprocessing (see actors/atari.py; `atari_options`
    is an atari.AtariOptions).
    """
    from . import atari

    env_id = resolve_env_id(env_id)
    spec = gym.spec(env_id)
    if atari.is_atari(spec):
        env = atari.make_atari_vector_env(env_id, num_envs, atari_options)
    elif spec.vector_entry_point is not None:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    else:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                           vector_kwargs={"autoreset_mode": AUTORESET_MODE})
    mode = env.metadata.get("autoreset_mode")
    if mode != AUTORESET_MODE:
        env.close()
        raise EnvError(f"env={env_id!r} autoresets in mode {mode!r}; rlvitals needs {AUTORESET_MODE.value}")
    check_spaces(env_id, env.single_observation_space, env.single_action_space)
    return env


def check_spaces(env_id: str, obs_space: gym.Space, action_space: gym.Space) -> None:
    if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise EnvError(f"env={env_id!r} has observation space {obs_space}; supported: Box, Discrete")
    if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise EnvError(f"env={env_id!r} has action space {action_space}; supported: Box, Discrete")
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1:
        raise EnvError(f"env={env_id!r} has action shape {action_space.shape}; supported: 1-D Box")


def env_seed(base_seed: int, actor_id: int) -> int:
    """Seed of an actor's first env; actors get disjoint seed ranges."""
    return int(base_seed) * 1_000_003 + int(actor_id) * 10_007


def is_image_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
