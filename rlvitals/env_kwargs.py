"""`env_kwargs`: keyword arguments for the env's constructor, as a config field.

On the command line it is JSON or YAML text (`--env-kwargs '{"g": 9.81}'`), in a config file a
mapping. Either way it must be a mapping of argument names to plain values, so that it can be
written into config.yaml and the checkpoint, sent to Ray actors, and read back by `rlvitals eval`
and `rlvitals runs` as the same value. Which names the env takes is checked where the env is
built (rlvitals.actors.envs.check_env_kwargs), against its constructor.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from .config_error import ConfigError
from .config_yaml import AliasRefused, parse_yaml
from .limits import check_nesting

EXPECTED = ("expected a mapping of the env constructor's argument names to values, as JSON or YAML, "
            "e.g. '{\"g\": 9.81}'")
PLAIN = (str, int, float, bool, type(None))


def parse_env_kwargs(raw: Any) -> dict[str, Any]:
    """The mapping `raw` (a mapping, or its JSON or YAML text; empty or null: none) holds; ConfigError otherwise."""
    value = _parsed(raw) if isinstance(raw, str) else raw
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"env_kwargs={_short(raw)} is invalid: {EXPECTED}")
    check_nesting(f"env_kwargs={_short(raw)}", value)  # before anything walks it recursively
    for key, item in value.items():
        if not (isinstance(key, str) and key.isidentifier()):
            raise ConfigError(f"env_kwargs={raw!r} is invalid: {key!r} is not an argument name; {EXPECTED}")
        if not _plain(item):
            raise ConfigError(f"env_kwargs={raw!r} is invalid: the value of {key!r} is a {type(item).__name__}; "
                              "expected strings, numbers, true/false, null, and lists and mappings of them")
    steps = value.get("max_episode_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"env_kwargs={raw!r} is invalid: max_episode_steps={steps!r}; expected a whole number "
                          "of steps >= 1 (or none: the env's own time limit)")
    return dict(value)


def _short(raw: Any) -> str:
    """`raw` for an error line: a deeply nested value is cut, so the line stays a line."""
    text = repr(raw)
    return text if len(text) <= 200 else text[:200] + "..."


def _parsed(text: str) -> Any:
    if not text.strip():
        return None
    try:  # JSON first: YAML 1.1 reads 1e-3 as text, JSON as a number
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError:  # nested beyond Python's limit: the YAML loader below names the bound
        pass
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        why = f": {exc}" if isinstance(exc, AliasRefused) else ""
        raise ConfigError(f"env_kwargs={_short(text)} is not valid JSON or YAML{why}; {EXPECTED}") from None


def _plain(value: Any) -> bool:
    """Whether config.yaml, a weights-only checkpoint and Ray all carry `value` unchanged."""
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, PLAIN)
