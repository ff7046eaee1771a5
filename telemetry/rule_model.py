"""What a health rule is: its fields, its threshold line, and the live-only condition (telemetry/rules.py holds
the rules themselves)."""

from __future__ import annotations

from dataclasses import dataclass

from .conditions import Bin, Expr, Mean, Median, Series
from .invariants import STAGES

HORIZONS = ("fast", "slow")
HELD_METRIC = "rlvitals_rule_held_updates"
"""Gauge the run's health monitor exports per rule: updates its condition has held (-1: it does not hold)."""
INVARIANT_BROKEN_METRIC = "rlvitals_invariant_broken"
"""Gauge of each invariant's broken flag (telemetry.catalogue): its rule's alert reads it directly."""
HELD_KEY = "held_{rule}"
"""Its source pattern (the monitor's output, not a row key)."""
EXTRA_ROW_KEYS = ("wall_seconds",)
"""Row keys a rule may read besides the catalogue's sources: the row's clock (throughput per second)."""


def S(key: str) -> Series:
    """The value recorded under row key `key` (the catalogue checks that every rule's keys exist)."""
    return Series(key)


@dataclass(frozen=True, eq=False)
class Live(Expr):
    """A PromQL condition on series that rows do not record (scrape health, GPU, progress stopping): live only."""

    query: str
    reads: tuple[str, ...]
    """Metric names it reads (checked against the catalogue)."""

    def value(self, lookup, u):
        return None

    def keys(self):
        return set()

    def text(self) -> str:
        return self.query


HEURISTIC_RANK = len(STAGES)
"""A rule that is no invariant ranks after every stage: exact evidence first."""


@dataclass(frozen=True, eq=False)
class Rule:
    name: str
    """Alert name (CamelCase, `RL` prefix); also the anchor of its section in docs/health.md."""
    condition: Expr
    """What is wrong when it holds. Comparisons of one series with a number become threshold lines."""
    hold: int
    """How long the condition must hold before the rule fires: learner updates for a rule on the run's rows,
    seconds (Prometheus `for`) for a live-only rule."""
    horizon: str
    severity: str
    component: str
    summary: str
    """One line: what was seen (may use {{ $labels.run_id }})."""
    check: str
    """What it means and what to check, in a few sentences."""
    after_updates: int = 0
    """The rule only applies once the learner has done this many updates (start-up transients)."""
    update_key: str = ""
    """Row key that holds the update at which the condition first held (an invariant's `inv_broken_*`); empty:
    the verdict's update is the one at which the condition's streak began."""
    alert_query: str = ""
    """The alert's PromQL where the run exports the evidence's verdict itself (an invariant's broken flag, latched
    by its monitor); empty: the health monitor's count of updates held."""
    value_key: str = ""
    """Row key whose value the verdict's message quotes (an invariant's statistic, with `value_limit`); empty: the
    condition's own value."""
    value_limit: float | None = None
    names_key: str = ""
    """Row key of a text naming the processes the evidence comes from (Ray actors); the verdict quotes it."""
    rank: int = HEURISTIC_RANK
    """Order among verdicts of the same update: an invariant's stage (telemetry.invariants.STAGES, upstream
    first), and every other rule after the invariants."""
    live_twin: str = ""
    """A live fleet rule that raises this condition's alert in Prometheus, naming instance and node; this rule is
    the run's own verdict of it (verdicts.json, the offline evaluator) and raises no second alert."""

    @property
    def live_only(self) -> bool:
        return not self.condition.keys()

    @property
    def hold_unit(self) -> str:
        return "seconds" if self.live_only else "updates"

    @property
    def expr(self) -> Expr:
        """The full condition, with the warm-up gate."""
        if not self.after_updates:
            return self.condition
        return Bin("and", self.condition, S("updates") >= self.after_updates)

    def promql(self) -> str:
        """The alert's PromQL: a live-only rule's own query; otherwise the monitor's count of updates held."""
        if self.live_only:
            return self.condition.text()
        return self.alert_query or f'max by (run_id) ({HELD_METRIC}{{rule="{self.name}"}}) >= {self.hold}'

    @property
    def anchor(self) -> str:
        return self.name.lower()


def thresholds(rule: Rule) -> list[tuple[str, str, float]]:
    """The threshold line of a rule: its leading `series OP number` ([(row key, comparison, value)]).

    A condition reads `signal OP threshold & context...`: the first comparison is the signal
    that leaves its healthy range; what follows (`advantage_std > 0`, fresh samples) only says
    when that matters, and draws no line.
    """
    from .conditions import Num

    e = rule.condition
    while isinstance(e, Bin) and e.op == "and":
        e = e.left
    if not isinstance(e, Bin) or e.op not in (">", ">=", "<", "<=") or not isinstance(e.right, Num):
        return []
    left = e.left.series if isinstance(e.left, (Mean, Median)) else e.left
    if not isinstance(left, Series) or left.offset:
        return []
    return [(left.key, e.op, e.right.x)]
