"""The env tried once before anything is written: built, reset, stepped, its observation checked.

A run's archive is created only after this passes, so an env that cannot be
built, whose reset raises or returns something other than (observation, info)
of its observation space's shape, or whose first step raises, is one line and
exit 2 with no run directory left behind.
"""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np

from rlvitals.actors.envs import EnvError, env_seed, make_vector_env


def atari_options(cfg, threads: int = 0):
    """The Atari preprocessing choices of a config (ignored by non-Atari envs); light, so the env can be
    tried before torch is imported."""
    from rlvitals.actors.atari import AtariOptions

    return AtariOptions(episodic_life=cfg.atari_episodic_life, reward_clipping=cfg.atari_reward_clipping,
                        num_threads=threads)


EXPECTED_RESET = "expected reset() to return (observation, info) with the observation space's shape"


def _raised(cfg, what: str, exc: BaseException, caught: list | None = None) -> EnvError:
    """One line; gymnasium's own warning about the same call, where it gave one, says more than the exception."""
    said = next((_plain(w.message) for w in caught or () if "reset" in str(w.message) or "step" in str(w.message)),
                "")
    given = f" with env_kwargs={cfg.env_kwargs!r}" if cfg.env_kwargs else ""  # they may be why
    return EnvError(f"env={cfg.env!r} is unusable{given}: {what} raised {type(exc).__name__}: {exc}"
                    + (f" (gymnasium: {said})" if said else ""))


def _plain(message) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(message)).removeprefix("WARN: ")
    return text.split(", where")[0]


def check_env_usable(cfg, atari_options=None):
    """(observation space, action space) of one env of `cfg`, after one reset and one step; EnvError otherwise.

    Gymnasium's warnings during the check are held back: the run that follows builds the env again.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        return _try_env(cfg, atari_options, caught)


def _try_env(cfg, atari_options, caught: list):
    try:
        env = make_vector_env(cfg.env, 1, atari_options, cfg.env_kwargs)
    except EnvError:
        raise
    except (Exception, SystemExit) as exc:  # the env's constructor is user code
        raise _raised(cfg, "building it", exc) from None
    try:
        obs_space, action_space = env.single_observation_space, env.single_action_space
        action = _first_action(cfg, action_space)
        try:
            reset = env.reset(seed=env_seed(cfg.seed, 0))
        except (Exception, SystemExit) as exc:
            raise _raised(cfg, "reset()", exc, caught) from None
        _check_reset(cfg, reset, obs_space)
        try:
            env.step(np.asarray([action]))
        except (Exception, SystemExit) as exc:
            raise _raised(cfg, f"its first step (action {np.asarray(action).tolist()})", exc, caught) from None
    finally:
        try:
            env.close()
        except Exception:  # closing a broken env must not hide why it is broken
            pass
    return obs_space, action_space


def _first_action(cfg, action_space):
    """The fixed probe agent's action where that is the agent (checked against the space), else a sample."""
    if cfg.agent != "fixed":
        return action_space.sample()
    if not isinstance(action_space, gym.spaces.Discrete):
        raise EnvError(f"agent='fixed' is invalid for env {cfg.env!r}: its action space is {action_space}; "
                       "expected an env with a Discrete action space")
    if not 0 <= cfg.fixed_action < int(action_space.n):
        raise EnvError(f"fixed_action={cfg.fixed_action} is invalid: expected 0 to {int(action_space.n) - 1} "
                       f"(env {cfg.env!r} has action space {action_space})")
    return int(action_space.start) + cfg.fixed_action   # an index, as the actors step the env with it


def _check_reset(cfg, reset, obs_space) -> None:
    if not (isinstance(reset, tuple) and len(reset) == 2):
        raise EnvError(f"env={cfg.env!r} is unusable: reset() returned {type(reset).__name__} "
                       f"{_short(reset)}; {EXPECTED_RESET}")
    obs = reset[0]
    shape = getattr(obs, "shape", None)
    if shape is None or tuple(shape[1:]) != tuple(obs_space.shape or ()):
        raise EnvError(f"env={cfg.env!r} is unusable: reset() returned an observation of shape {shape} "
                       f"({type(obs).__name__}) for observation space {obs_space}; {EXPECTED_RESET}")


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
