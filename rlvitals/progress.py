"""A one-line live display of a training run for the terminal."""

from __future__ import annotations

import math
import sys
import time


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


class ProgressLine:
    """Redraws one status line in place on a terminal; prints a plain line now and then otherwise.

    The run asks `due()` after every learner update (a clock read) and calls
    `update` when it says so: at most once per `interval` seconds, and on a
    stream that is not a terminal a plain line every 5 s.
    """

    def __init__(self, total_steps: int, enabled: bool = True, stream=None, interval: float = 0.5):
        self.total = total_steps
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interval = interval
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.last_draw = -1e9
        self.last_plain = 0.0

    def due(self) -> bool:
        return self.enabled and time.perf_counter() - self.last_draw >= self.interval

    def update(self, env_steps: int, steps_per_s: float, mean_return: float | None, diag: dict,
               age: int = 0) -> None:
        """Draw the line: steps, throughput, mean return, a few learner statistics from `diag`, network age."""
        if not self.enabled:
            return
        now = self.last_draw = time.perf_counter()
        frac = min(1.0, env_steps / self.total)
        width = 24
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        eta = (self.total - env_steps) / steps_per_s if steps_per_s > 0 else float("nan")
        line = (f"[{bar}] {frac:4.0%} {env_steps:,}/{self.total:,} steps  {steps_per_s:,.0f} steps/s  "
                f"return {_fmt(mean_return, '.1f')}  ent {_fmt(diag.get('relative_entropy'), '.2f')}  "
                f"kl {_fmt(diag.get('kl'), '.1e')}  resvar {_fmt(diag.get('residual_variance'), '.2f')}  "
                f"age {age}  eta {_fmt(eta, '.0f')}s")
        if self.tty:
            self.stream.write("\r" + line[: 200] + "\x1b[K")
            self.stream.flush()
        elif now - self.last_plain >= 5.0:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last_plain = now

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
