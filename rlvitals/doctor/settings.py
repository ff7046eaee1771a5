"""Which of your settings: the reference leg passes, yours fails, so revert your settings until it passes.

The probes that failed with your settings are trained again with one of your
learning settings put back to its reference value, one setting at a time (or,
when more than `MAX_SINGLE` differ, one component's settings at a time). A
setting whose revert alone makes every one of them pass is the cause; its
component (ladder.LEARNING_SETTINGS) is the verdict's. Only when no revert
alone is enough does the pattern table choose among the components.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlvitals.telemetry.verdicts import Verdict

from .ladder import LEARNING_SETTINGS, REFERENCE, Leg, ProbeResult, probe_config, run_ladder
from .patterns import fallback_component, healthy, infer

MAX_SINGLE = 6
"""Up to this many differing settings are reverted one by one; beyond, one component's settings at a time."""


def show(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _reverts(diffs: dict) -> list[tuple[str, ...]]:
    if len(diffs) <= MAX_SINGLE:
        return [(name,) for name in diffs]
    groups: dict[str, list[str]] = {}
    for name in diffs:
        groups.setdefault(LEARNING_SETTINGS[name], []).append(name)
    return [tuple(names) for names in groups.values()]


def find_cause(leg: Leg, failing: list[ProbeResult], seed: int, parent: Path, say) -> tuple[tuple[str, ...], list[str]]:
    """(the settings whose revert alone fixes every failing probe, or (); lines saying what each revert did)."""
    diffs = leg.differences(REFERENCE)
    if len(diffs) <= 1:
        return tuple(diffs), []
    reference = probe_config(failing[0].probe.env_id, seed, "")
    probes = tuple(r.probe for r in failing)
    lines, fixes = [], []
    for names in _reverts(diffs):
        trial = Leg(f"{leg.name}-but-{'-'.join(names)}",
                    {**leg.settings, **{n: getattr(reference, n) for n in names}})
        results = run_ladder(seed, parent, trial, probes)
        fixed = healthy(results)
        shown = ", ".join(f"{n}={show(getattr(reference, n))}" for n in names)
        lines.append(f"{'fixes' if fixed else 'not enough'}: your settings with {shown} "
                     f"({', '.join(f'{r.probe.name} {r.mark()}' for r in results)})")
        say(f"  revert {shown}: {'clears every failing probe' if fixed else 'still failing'}")
        if fixed:
            fixes.append(names)
    # a single cause, or the smallest revert that is enough
    return (min(fixes, key=len) if fixes else ()), lines


def settings_verdict(results: list[ProbeResult], leg: Leg, seed: int, parent: Path, started: float,
                     say=lambda line: None) -> Verdict:
    """The verdict for 'passes with the reference settings, fails with yours'."""
    pattern, text = infer(results)
    diffs = leg.differences(REFERENCE)
    shown = "; ".join(f"{name}={show(mine)} (reference {show(ref)}: {LEARNING_SETTINGS[name]})"
                      for name, (mine, ref) in diffs.items()) or "none"
    failing = [r for r in results if not (r.passed or r.skipped)] or list(results)
    say(f"your settings fail where the reference ones pass: reverting each of your {len(diffs)} differing "
        f"settings on {', '.join(r.probe.name for r in failing)}")
    cause, evidence = find_cause(leg, failing, seed, parent, say)
    implied = pattern.component if pattern is not None else fallback_component(results)
    if cause:
        component = LEARNING_SETTINGS[cause[0]]
        because = (f"Reverting {', '.join(cause)} to the reference value alone clears "
                   f"{', '.join(r.probe.name for r in failing)}" if len(diffs) > 1 else
                   "It is the only learning setting that differs")
        suspects = list(cause)
    else:
        component = implied
        suspects = [n for n in diffs if LEARNING_SETTINGS[n] == implied] or list(diffs)
        because = "No single revert is enough; the pattern table names the component"
    why = f" The pattern reads: {pattern.reading}." if pattern is not None else ""
    tried = f" Reverts tried: {'; '.join(evidence)}." if evidence else ""
    return Verdict("doctor-your-settings", "warning", component, round(time.perf_counter() - started, 3), None,
                   f"every probe passes with the reference settings but not with yours; pattern with your "
                   f"settings: {text}.{why} Settings that differ: {shown}. {because}: suspect "
                   f"{', '.join(suspects)} ({component}).{tried}")
