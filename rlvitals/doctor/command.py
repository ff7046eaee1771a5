"""The `rlvitals doctor` command: its inputs checked before anything runs, then the doctor, then the exit code.

Exit codes: 0 healthy, 1 findings, 2 bad input (one line naming the value and what is accepted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import ConfigError


def request_from_args(args: argparse.Namespace):
    """A DoctorRequest from the parsed flags; ConfigError (or EnvError) for any bad input, nothing written."""
    import gymnasium as gym

    from rlvitals.actors.envs import check_env_kwargs, resolve_env_id

    from ..config import build_config
    from ..env_kwargs import parse_env_kwargs
    from .main import DoctorRequest
    from .steplimit import DEFAULT_STEP_TIMEOUT

    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed} is invalid: expected an integer >= 0")
    if args.max_episode_steps is not None:
        if args.env is None:
            raise ConfigError(f"--max-episode-steps={args.max_episode_steps} is invalid without --env: it bounds the "
                              "episodes of the env being checked")
        if args.max_episode_steps <= 0:
            raise ConfigError(f"--max-episode-steps={args.max_episode_steps} is invalid: expected an integer > 0")
    if args.step_timeout is not None:
        _check_step_timeout(args)
    if args.keep is not None:
        from ..validate import check_dir_creatable

        check_dir_creatable("--keep", args.keep)
    if args.env_kwargs is not None and args.env is None:
        raise ConfigError(f"--env-kwargs={args.env_kwargs!r} is invalid without --env: it configures the env "
                          "being checked (the ladder's probes take none)")
    recurrent_size = getattr(args, "recurrent_size", None)
    if recurrent_size is not None and recurrent_size < 0:
        raise ConfigError(f"--recurrent-size={recurrent_size} is invalid: expected an integer >= 0 "
                          "(0: no memory probe)")
    env_kwargs = parse_env_kwargs(args.env_kwargs) if args.env_kwargs is not None else None
    config = build_config(args.config, {}) if args.config else None
    if recurrent_size is None:   # the user's config's policy, when it is recurrent
        recurrent_size = config.recurrent_size if config is not None else 0
    if env_kwargs is None:   # the user's config, when it trains the env being checked
        env_kwargs = dict(config.env_kwargs) if config is not None and config.env == args.env else {}
    env = resolve_env_id(args.env) if args.env is not None else None
    if env is not None:   # names the constructor cannot take are bad input, not a finding about the env
        check_env_kwargs(env, gym.spec(env), env_kwargs)
    return DoctorRequest(seed=args.seed, keep=args.keep, config=config, ray=args.ray, env=env, env_kwargs=env_kwargs,
                         max_episode_steps=args.max_episode_steps,
                         step_timeout=args.step_timeout if args.step_timeout is not None else DEFAULT_STEP_TIMEOUT,
                         ladder=env is None or config is not None, recurrent_size=recurrent_size)


def _check_step_timeout(args: argparse.Namespace) -> None:
    from ..limits import DURATION_MAX_SECONDS

    if args.env is None:
        raise ConfigError(f"--step-timeout={args.step_timeout:g} is invalid without --env: it bounds the steps of "
                          "the env being checked")
    if not 0 < args.step_timeout <= DURATION_MAX_SECONDS:  # NaN fails this too
        raise ConfigError(f"--step-timeout={args.step_timeout:g} is invalid: expected seconds > 0, at most "
                          f"{DURATION_MAX_SECONDS} (30 days)")


def run_command(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    from .main import run_doctor, verdicts_json

    if request.keep is not None:
        Path(request.keep).mkdir(parents=True, exist_ok=True)
    verdicts = run_doctor(request, stream=sys.stdout, quiet=args.json)
    if args.json:
        print(verdicts_json(verdicts))
    return 1 if verdicts else 0
