"""The error every configuration check raises: one line for the user, naming the bad value and what is accepted.

A leaf module, so the checks that live beside the config (limits.py, env_kwargs.py, parts.py) can raise it
without importing config.py, which calls them.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is wrong; the message is one line for the user."""
