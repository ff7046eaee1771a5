"""What every env the runner steps must agree to, shared by the env builders (envs.py, atari.py).

The autoreset mode is always set explicitly to NEXT_STEP (gymnasium's default,
and the only mode of its numpy-vectorised CartPole and of many user envs) and
checked after construction, so a library default changing under us is an error
rather than a silent change of what `done` means.
"""

from __future__ import annotations

from gymnasium.vector import AutoresetMode

AUTORESET_MODE = AutoresetMode.NEXT_STEP


class EnvError(ValueError):
    """The environment id cannot be built; the message is one line for the user."""
