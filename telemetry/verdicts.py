"""The shape of a verdict: what the health rules, the health monitor and the doctor report.

Scripts and CI read `verdicts.json` and `rlvitals doctor --json`, so this shape
and the component vocabulary are a stable interface: add fields, never rename.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# Where a fault lives. Every rule and every doctor finding names exactly one.
COMPONENTS: dict[str, str] = {
    "env": "the environment itself: observations, rewards, episode ends, seeding",
    "actor": "stepping envs, storing transitions and pairing observations, actions and rewards",
    "preprocessing": "observation transforms, which must be the same for actors and learner",
    "returns": "discounting, GAE, V-trace, bootstrapping and truncation handling",
    "value": "the value head, its loss and its gradient",
    "policy": "the policy loss, advantages as the policy sees them, the entropy bonus",
    "optimizer": "learning rate, optimizer state, gradient clipping, parameter updates",
    "learner": "the learner as a whole: its loop (taking finished batches as soon as they are ready), its "
               "replay of recurrent sequences, the cost of its minibatch steps",
    "weight-sync": "publishing the learner's weights to actors and staleness of samples",
    "memory": "memory that grows without bound",
    "throughput": "a stalled or starved part of the pipeline",
    "telemetry": "a diagnostic that is itself broken",
}
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Verdict:
    rule: str
    """Name of the health rule (or doctor check) that held."""
    severity: str
    """critical, warning or info."""
    component: str
    """One key of COMPONENTS."""
    first_seconds: float | None
    """Run seconds when the rule first held (None where time does not apply)."""
    first_update: int | None
    """Learner update when the rule first held (None where updates do not apply)."""
    message: str
    """What was seen and what to check, in one or two sentences."""

    def __post_init__(self):
        if self.component not in COMPONENTS:
            raise ValueError(f"component {self.component!r} is not one of {', '.join(COMPONENTS)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")

    def to_dict(self) -> dict:
        return asdict(self)


def write_verdicts(path: str | Path, verdicts: list[Verdict]) -> None:
    """verdicts.json: a JSON list of verdict objects, written atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:  # a full disk leaves no temporary; a link planted under its name is not followed
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as fh:
            fh.write(json.dumps([v.to_dict() for v in verdicts], indent=1) + "\n")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def print_verdict(verdict: Verdict, stream=None) -> None:
    """One line per verdict as it fires, on stderr (stdout is the run's JSON summary)."""
    when = f" at {verdict.first_seconds:.0f} s" if verdict.first_seconds is not None else ""
    print(f"\nrlvitals: {verdict.severity} [{verdict.component}] {verdict.rule}{when}: "
          f"{verdict.message.split('. ')[0]}", file=stream or sys.stderr, flush=True)


def read_verdicts(path: str | Path) -> list[Verdict]:
    return [Verdict(**d) for d in json.loads(Path(path).read_text())]
