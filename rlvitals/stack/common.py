"""What every part of `rlvitals stack` shares: its error, its output, the state folder and the Grafana password."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

HOST = "127.0.0.1"
PASSWORD_ENV = ("RLVITALS_GRAFANA_PASSWORD", "GF_SECURITY_ADMIN_PASSWORD")


class StackError(Exception):
    """A one-line reason `stack` cannot do what was asked; `code` is the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def say(text: str) -> None:
    print(f"rlvitals: {text}", flush=True)


def default_state_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rlvitals" / "stack"


def state_flag(args: argparse.Namespace) -> str:
    """The `--state-dir` flag to repeat in a suggested command, or nothing for the default folder."""
    return "" if Path(args.state_dir).expanduser().resolve() == default_state_dir().resolve() \
        else f" --state-dir {args.state_dir}"


def grafana_password() -> tuple[str, bool]:
    """(password, generated?): from the environment, else a fresh random one."""
    for name in PASSWORD_ENV:
        if os.environ.get(name):
            return os.environ[name], False
    return secrets.token_urlsafe(18), True


def announce_password(password: str, generated: bool) -> str:
    if generated:
        return f"user admin, password {password} (generated; shown this once and stored nowhere)"
    return "user admin, password from $" + next(n for n in PASSWORD_ENV if os.environ.get(n))
