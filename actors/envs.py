"""Build gymnasium vector envs the way the runner expects them (the contract: env_contract.py).

Atari ids are built by atari.py, which this module calls; atari.py reads only
the contract, so the two do not import each other.
"""

from __future__ import annotations

import difflib
import importlib
import inspect

import gymnasium as gym
import numpy as np

from .env_contract import AUTORESET_MODE, EnvError


def resolve_env_id(env_id: str) -> str:
    """Import the module of a `module:EnvId` id (it registers the env) and return `EnvId`."""
    from . import partial, probes  # noqa: F401  (register rlvitals/Probe*-v0 and the partially observable tasks)

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


def make_vector_env(env_id: str, num_envs: int, atari_options=None, env_kwargs=None,
                    witness_seed: int | None = None) -> gym.vector.VectorEnv:
    """A vector env of `num_envs` copies in NEXT_STEP autoreset mode.

    Uses the env's own vectorised implementation when it has one (CartPole's
    runs ~50x faster than a loop over copies), else a synchronous vector env;
    process-based vectorisation is the Ray mode's job, not this one's. ALE ids
    get the standard Atari preprocessing (see actors/atari.py; `atari_options`
    is an atari.AtariOptions). `env_kwargs` go to the env's constructor, as
    `gym.make(env_id, **env_kwargs)`, after check_env_kwargs. With `witness_seed`, the env is returned inside a
    `Witness` (actors/witness.py) put directly on what gymnasium returned: whatever rlvitals wraps around the
    env afterwards is above the witness, so a change it makes to rewards or observations is seen as a change.
    """
    from . import atari
    from .witness import Witness

    env_id = resolve_env_id(env_id)
    spec = gym.spec(env_id)
    env_kwargs = dict(env_kwargs or {})
    check_env_kwargs(env_id, spec, env_kwargs)
    if atari.is_atari(spec):
        env = atari.make_atari_vector_env(env_id, num_envs, atari_options, env_kwargs)
    elif spec.vector_entry_point is not None:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **env_kwargs)
    else:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                           vector_kwargs={"autoreset_mode": AUTORESET_MODE}, **env_kwargs)
    if witness_seed is not None:
        env = Witness(env, witness_seed)
    mode = env.metadata.get("autoreset_mode")
    if mode != AUTORESET_MODE:
        env.close()
        raise EnvError(f"env={env_id!r} autoresets in mode {mode!r}; rlvitals needs {AUTORESET_MODE.value}")
    check_spaces(env_id, env.single_observation_space, env.single_action_space)
    return env


SET_BY_RLVITALS = {"num_envs": "--num-envs", "vectorization_mode": "rlvitals", "vector_kwargs": "rlvitals",
                   "wrappers": "rlvitals", "autoreset_mode": "rlvitals (NEXT_STEP)"}
"""Arguments of gymnasium's make_vec that are not the env's to take: who sets each."""


def find_witness(env: gym.vector.VectorEnv):
    """The Witness in a stack of vector wrappers (make_vector_env's, under whatever was wrapped around it)."""
    from .witness import Witness

    while not isinstance(env, Witness):
        if not isinstance(env, gym.vector.VectorWrapper):
            raise EnvError("the env has no witness of its raw output; build it with make_vector_env(witness_seed=...)")
        env = env.env
    return env


def check_env_kwargs(env_id: str, spec, env_kwargs: dict) -> None:
    """EnvError naming the first key the env's constructor cannot take, and the names it takes.

    The constructor is the one make_vector_env calls: the vector entry point where the env has one,
    else the entry point (through gymnasium's make, which also takes max_episode_steps). One that takes
    **kwargs, or whose signature cannot be read, is left to refuse what it refuses when it is built.
    """
    from . import atari

    for key in env_kwargs:
        if key in SET_BY_RLVITALS:
            raise EnvError(f"env_kwargs={env_kwargs!r} is invalid: {key} is set by {SET_BY_RLVITALS[key]}, "
                           "not by the env's arguments")
    accepted = set(atari.ENV_KWARGS) if atari.is_atari(spec) else _constructor_arguments(spec)
    unknown = [key for key in env_kwargs if accepted is not None and key not in accepted]
    if unknown:
        why = (f"{unknown[0]!r} is fixed by the standard Atari preprocessing (frame skip 4, 4 stacked 84x84 frames)"
               if atari.is_atari(spec) else f"its constructor takes no argument {unknown[0]!r}")
        raise EnvError(f"env_kwargs={env_kwargs!r} is invalid for env {env_id!r}: {why}; "
                       f"accepted: {', '.join(sorted(accepted)) or 'none'}")


def _constructor_arguments(spec) -> set[str] | None:
    """Keyword argument names of the constructor make_vector_env calls; None when it takes any, or is unreadable."""
    from gymnasium.envs.registration import load_env_creator

    vector = spec.vector_entry_point is not None
    entry = spec.vector_entry_point if vector else spec.entry_point
    try:
        parameters = inspect.signature(load_env_creator(entry) if isinstance(entry, str) else entry).parameters
    except Exception:  # a missing dependency, a C extension: building the env says what is wrong
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    names = {name for name, p in parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    names -= set(SET_BY_RLVITALS)
    return names if vector else names | {"max_episode_steps"}  # gymnasium's make wraps a TimeLimit


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
