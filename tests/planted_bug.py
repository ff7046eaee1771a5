"""What a planted bug is (tests/planted_bugs.py has the library of them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest


@dataclass(frozen=True)
class PlantedBug:
    name: str
    component: str
    """The component a correct diagnosis names (telemetry.verdicts.COMPONENTS)."""
    channel: str
    """`run` or `doctor`: where it is expected to be caught."""
    apply: Callable[[pytest.MonkeyPatch], None]
    overrides: dict = field(default_factory=dict)
    """Config fields of the run (a user's settings that expose the bug)."""
    mode: str = "local"
    what: str = ""
    env: str = "CartPole-v1"
    in_actors: bool = False
    """Ray mode: the bug lives in the actors' processes (planted there through Ray's worker set-up hook)."""
    invariant: str = ""
    """The invariant the bug was designed to break (INVARIANT_BUGS), '' for the earlier ones."""
    doctor_rule: str = ""
    """The doctor rule expected where the doctor's tests pin it on a rule too."""
    budget_scale: float = 1.0
    """bench/diagnosis.py gives its run this many times the run channel's budget (a slow leak needs the samples)."""
    one_actor: bool = False
    """Ray mode: only the actor process that collects first carries the bug; the verdict must name it alone."""
