"""The live progress display of a training run, the same in local and Ray mode (both go through rlvitals/run.py).

On a terminal: one line redrawn in place (a carriage return) at most every `interval` seconds, never wider
than the terminal is at that moment. What does not fit is shortened, then dropped, least important first
(`NARROWING`), so the line never wraps into a new one on a redraw. No escape codes: the rest of a longer
previous line is overwritten with spaces, which any terminal shows alike (TERM=dumb and editors' shells too).

Anywhere else (a file, a pipe, `ray job logs`, a Jupyter notebook, whose output is not a terminal): whole
plain lines ending in a newline, every `plain_interval` seconds, no carriage returns and no escape codes.

Both end with the final line, drawn once when the run ends: the steps the run really took, the percentage
never above 100 (a run overshoots its budget by up to one batch) and the time it took instead of an eta.
The README's "The progress line" section explains every field.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field

FIELDS = ("percent", "bar", "steps", "speed", "return", "ent", "kl", "resvar", "age", "time")
"""The fields in the order they stand on the line."""

NARROWING = (("bar", 1), ("speed", 1), ("steps", 1), ("return", 1), ("age", 1), ("bar", 2), ("resvar", 1),
             ("kl", 1), ("ent", 1), ("speed", 2), ("steps", 2), ("time", 1), ("return", 2))
"""How a line that does not fit is made narrower, one step at a time until it fits: (field, the form it takes
next, an index into its forms; an empty form drops it). The percentage and the steps stay to the last."""

BAR_WIDTHS = (24, 10)
SPEED_WINDOW_SECONDS = 30.0
"""Steps per second (and the eta) are measured over the last half minute: start-up does not weigh on them."""
FALLBACK_COLUMNS = 80
"""Width when the terminal does not say (a pseudo-terminal nobody sized reports 0) and COLUMNS is unset."""


@dataclass
class Reading:
    """What the display shows after an update: the run's counters and the last batch's statistics."""

    env_steps: int
    elapsed: float
    """Training seconds so far (a resumed run's earlier seconds included)."""
    mean_return: float | None
    stats: dict = field(default_factory=dict)
    """The learner's statistics of the last batch ({} before the first, or for probe agents)."""
    age: int = 0


def _number(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _short(n: float) -> str:
    """3 significant digits with a k/M/G suffix: 25,734 -> 25.7k."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= limit:
            return f"{n / limit:.3g}{suffix}"
    return f"{n:.0f}"


def duration(seconds: float) -> str:
    """42s, 3m05s, 2h03m, 3d04h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def field_forms(reading: Reading, total: int, speed: float | None, final: bool) -> dict[str, tuple[str, ...]]:
    """Every field's forms, widest first: a field is shown in one of them, or dropped where the last is ''."""
    steps, stats = reading.env_steps, reading.stats
    fraction = min(1.0, steps / max(total, 1))
    percent = math.floor(fraction * 100)  # 99.7% reads 99%: 100% only once the budget is reached
    bars = tuple("[" + "#" * int(fraction * w) + "." * (w - int(fraction * w)) + "]" for w in BAR_WIDTHS)
    if steps >= total:  # the count reached, not `101,523/100,000`
        counts = (f"{steps:,} steps", f"{steps:,}", _short(steps))
    else:
        counts = (f"{steps:,}/{total:,} steps", f"{steps:,}/{total:,}", f"{_short(steps)}/{_short(total)}")
    if final:
        took = f"took {duration(reading.elapsed)}"
        time_forms = (took, "")
    else:
        left = max(0, total - steps) / speed if speed else None  # clamped: never a negative eta
        time_forms = (f"eta {duration(left) if left is not None else '-'}", "")
    ret = _number(reading.mean_return, ".1f")
    return {
        "percent": (f"{percent:3d}%",),
        "bar": (*bars, ""),
        "steps": counts,
        "speed": (f"{_number(speed, ',.0f')} steps/s", f"{_short(speed) if speed is not None else '-'}/s", ""),
        "return": (f"return {ret}", f"ret {ret}", ""),
        "ent": (f"ent {_number(stats.get('relative_entropy'), '.2f')}", ""),
        "kl": (f"kl {_number(stats.get('kl'), '.1e')}", ""),
        "resvar": (f"resvar {_number(stats.get('residual_variance'), '.2f')}", ""),
        "age": (f"age {reading.age}", ""),
        "time": time_forms,
    }


def fit(forms: dict[str, tuple[str, ...]], width: int | None, steps_taken: int = 0) -> tuple[str, int]:
    """The line narrowed by NARROWING until it is at most `width` wide (None: not at all), and how many of its
    steps that took. `steps_taken`: start with that many of them taken."""
    chosen = dict.fromkeys(forms, 0)
    for name, form in NARROWING[:steps_taken]:
        chosen[name] = form

    def line() -> str:
        return "  ".join(text for name in FIELDS if (text := forms[name][chosen[name]]))

    text = line()
    while width is not None and len(text) > width and steps_taken < len(NARROWING):
        name, form = NARROWING[steps_taken]
        chosen[name] = form
        steps_taken += 1
        text = line()
    return (text if width is None else text[:width]), steps_taken  # narrower than even the last forms: cut


def terminal_columns(stream) -> int:
    """The width of the terminal `stream` writes to, read now (the window may have been resized)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = FALLBACK_COLUMNS
    return max(1, columns)


_on_screen: list[ProgressLine] = []
"""The in-place line now on the terminal with no newline after it (one run per process: at most one)."""


def break_line() -> str:
    """What a message printed in the middle of a run starts with: a newline while an in-place line is unended,
    so the message does not run on from it (the next redraw starts on the line below the message)."""
    if not any(line.drawn for line in _on_screen):
        return ""
    for line in _on_screen:
        line.drawn = 0
    return "\n"


class ProgressLine:
    """The display of one run; see the module docstring.

    The run asks `due()` after every update (a clock read) and calls `update` when it says so;
    `finish` draws the final line whatever the end.
    """

    def __init__(self, total_steps: int, enabled: bool = True, stream=None, interval: float = 0.5,
                 plain_interval: float = 5.0):
        self.total = total_steps
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interval = interval
        self.plain_interval = max(interval, plain_interval)
        try:
            self.in_place = bool(self.stream.isatty())
        except (AttributeError, ValueError):  # a stream without isatty, or closed
            self.in_place = False
        self.last_draw = -math.inf
        self.last_plain = -math.inf
        self.drawn = 0
        """Characters of the line now on the terminal that no newline has ended (in place only)."""
        self.narrowed = (0, 0)
        """(terminal width, NARROWING steps the line took at that width)."""
        self.recent: deque[tuple[float, int]] = deque()
        """(elapsed, env steps) of recent readings: the speed over SPEED_WINDOW_SECONDS."""

    def due(self) -> bool:
        return self.enabled and time.perf_counter() - self.last_draw >= self.interval

    def speed(self, reading: Reading) -> float | None:
        """Env steps per second over the last SPEED_WINDOW_SECONDS (since the start, until that much has passed)."""
        self.recent.append((reading.elapsed, reading.env_steps))
        while len(self.recent) > 2 and reading.elapsed - self.recent[1][0] >= SPEED_WINDOW_SECONDS:
            self.recent.popleft()
        then, steps_then = self.recent[0]
        if reading.elapsed - then >= 1.0 and len(self.recent) > 1:
            return (reading.env_steps - steps_then) / (reading.elapsed - then)
        return reading.env_steps / reading.elapsed if reading.elapsed > 0 else None

    def update(self, reading: Reading) -> None:
        """Redraw in place on a terminal; elsewhere a plain line when `plain_interval` has passed since the last."""
        if not self.enabled:
            return
        now = self.last_draw = time.perf_counter()
        speed = self.speed(reading)
        if self.in_place:
            self._draw_in_place(field_forms(reading, self.total, speed, final=False))
        elif now - self.last_plain >= self.plain_interval:
            self.last_plain = now
            self._write(fit(field_forms(reading, self.total, speed, final=False), None)[0] + "\n")

    def finish(self, reading: Reading) -> None:
        """The final line, once, however the run ended; on a terminal it stays, ended by a newline."""
        if not self.enabled:
            return
        forms = field_forms(reading, self.total, self.speed(reading), final=True)
        if self.in_place:
            self._draw_in_place(forms)
            self.drawn = 0
            _on_screen[:] = []
            self._write("\n")
        else:
            self._write(fit(forms, None)[0] + "\n")

    def _draw_in_place(self, forms: dict[str, tuple[str, ...]]) -> None:
        # One column short of the width: some terminals wrap as soon as the last column is written.
        width = terminal_columns(self.stream) - 1
        # Fields stay dropped while the width stays: a field that comes and goes as numbers change length jitters.
        if width != self.narrowed[0]:
            self.narrowed = (width, 0)
        line, steps = fit(forms, width, self.narrowed[1])
        self.narrowed = (width, steps)
        # Blank what is left of a longer previous line, but never past the width: that would wrap too.
        self._write("\r" + line + " " * max(0, min(self.drawn, width) - len(line)))
        self.drawn = len(line)
        _on_screen[:] = [self]

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
