"""The component from the invariants: which invariants broke on which probe, and the part that owns them.

Every probe run is a real run, so the run's invariant monitor judged each of its
updates (telemetry/invariants.py). A broken invariant is a property that no
correct system breaks on any env, so it names its component by construction; a
failing probe only says that *something* is wrong. The doctor therefore names
the component from the invariants whenever one broke, and falls back on the
probes' pass/fail pattern (patterns.py) only when every invariant held.

When several invariants broke, the one upstream in the data's path wins: data
the actor stores wrongly makes every downstream check disagree too (a shifted
reward changes the returns the learner computes from it, and so on), while a
wrong loss leaves the rollout intact. The order is the stages' of a learn step
(telemetry.invariants.STAGES), the same naming rule as the run's verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvitals.telemetry.invariants import BY_NAME, INVARIANTS, STAGE_RANK, Invariant
from rlvitals.telemetry.verdicts import Verdict

RULE_TO_INVARIANT = {inv.rule_name: inv.name for inv in INVARIANTS}


def broken_in(run_dir: Path) -> dict[str, int | None]:
    """Invariant -> the update it broke at, read from a finished run's verdicts.json ({} if none or unreadable)."""
    path = Path(run_dir) / "verdicts.json"
    try:
        entries = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        return {}
    found: dict[str, int | None] = {}
    for entry in entries if isinstance(entries, list) else []:
        name = RULE_TO_INVARIANT.get(entry.get("rule")) if isinstance(entry, dict) else None
        if name is not None:
            update = entry.get("first_update")
            found[name] = update if isinstance(update, int) and not isinstance(update, bool) else None
    return found


def _rank(inv: Invariant) -> tuple[int, int]:
    return STAGE_RANK[inv.name], INVARIANTS.index(inv)


def most_upstream(broken: dict[str, list[str]]) -> Invariant | None:
    """Of the invariants that broke (name -> probes it broke on), the one furthest upstream."""
    judged = [BY_NAME[name] for name in broken if name in BY_NAME]
    return min(judged, key=_rank) if judged else None


def describe(broken: dict[str, list[str]]) -> str:
    """`name (component) on P1, P3; ...` in upstream order."""
    order = sorted(broken, key=lambda name: _rank(BY_NAME[name]))
    return "; ".join(f"{name} ({BY_NAME[name].component}) on {', '.join(broken[name])}" for name in order)


def invariant_verdict(broken: dict[str, list[str]], where: str, seconds: float) -> Verdict | None:
    """The doctor's verdict from the invariants broken under one leg (None when every invariant held)."""
    culprit = most_upstream(broken)
    if culprit is None:
        return None
    return Verdict(f"doctor-invariant-{culprit.name.replace('_', '-')}", "critical", culprit.component,
                   round(seconds, 3), None,
                   f"invariants broken {where}: {describe(broken)}. The furthest upstream, {culprit.name}, "
                   f"belongs to the {culprit.component}: {culprit.check}")
