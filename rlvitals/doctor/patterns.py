"""The pattern table: which pass/fail patterns over the whole probe ladder implicate which component.

Rows are tried in order and the first whose every cell matches names the
component. A cell names a probe (`P3`: all its checks), one of its checks
(`P4.pi`: the policy check, `P1.V`: the value check), or `C`: the learner's
log-probability of every behaviour action equals the actor's (local mode,
staleness 0: the same weights saw the same observation, so they must). `passes` must all pass,
`fails` must all fail, and at least one of `any_fail` must fail. A probe that
was not run (not decisive under a leg's settings), or a C the learner did not
record, matches a pass cell and never a FAIL cell.

Why the rows read as they do (see actors/probes.py):
- P1 (one step, constant observation, reward 1) is a supervised regression:
  immune to observation, pairing and return bugs. Only the value loss and the
  optimizer can fail it. P4 is the same for the policy, P8 for a policy that
  must not move at all (its advantages are pure noise).
- P3, P5 draw a fresh observation every step; P6 holds it for the episode. A
  learner that pairs actions with the next step's observation fails P3 and P5
  but passes P6; one that sees transformed observations fails P6 too.
- P2 needs discounting and termination, P7 bootstrapping at a time limit,
  P9 discounting with no episode boundary at all; their observations carry no
  or a fixed meaning, so one-step probes that read observations (P3, P6) pass
  when only returns are wrong. P1 fails but P9 passes when targets leak across
  an episode's end; both fail when the optimizer is wrong.
This module is the one source of docs/doctor.md's table (`render_table`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvitals.actors.probes import PROBES
from rlvitals.telemetry.verdicts import COMPONENTS

from .ladder import ProbeResult


@dataclass(frozen=True)
class Pattern:
    rule: str
    """Verdict rule name (doctor-...)."""
    component: str
    passes: tuple[str, ...] = ()
    fails: tuple[str, ...] = ()
    any_fail: tuple[str, ...] = ()
    frozen: bool | None = None
    """Whether the value must never have moved from its initial weights (None: either)."""
    summary: str = ""
    """The pattern in a few words (the table's last column)."""
    reading: str = ""
    """What the pattern means (the verdict's message)."""
    check: str = ""
    """What to look at in the code."""

    def __post_init__(self):
        if self.component not in COMPONENTS:
            raise ValueError(f"pattern {self.rule}: component {self.component!r} is not in COMPONENTS")

    def matches(self, results: dict[str, ProbeResult]) -> bool:
        def status(cell: str) -> bool | None:
            if cell == "C":
                return consistent(list(results.values()))
            probe, _, check = cell.partition(".")
            result = results.get(probe)
            if result is None or result.skipped:
                return None
            if not check:
                return result.passed
            return result.checks.get(check)

        if any(status(c) is False for c in self.passes):
            return False
        if any(status(c) is not False for c in self.fails):
            return False
        if self.any_fail and not any(status(c) is False for c in self.any_fail):
            return False
        if self.frozen is not None and value_frozen(results) != self.frozen:
            return False
        return True


CONSISTENCY_TOLERANCE = 1e-3
"""Nats by which the learner's log-probability of a behaviour action may differ from the actor's at staleness 0
(the health rules' tolerance, telemetry/rules.py)."""


def consistent(results: list[ProbeResult]) -> bool | None:
    """C: the learner's log-probabilities of the behaviour actions equal the actor's on every probe that
    recorded them (None: none did)."""
    seen = [r.discrepancy for r in results if r.discrepancy is not None and not r.skipped]
    return None if not seen else max(seen) <= CONSISTENCY_TOLERANCE


def value_frozen(results: dict[str, ProbeResult]) -> bool:
    """The value never moved from its initial weights on any probe that checks it."""
    judged = [r for r in results.values() if not r.skipped and "V" in r.checks]
    return bool(judged) and all(r.frozen for r in judged)


PATTERNS: tuple[Pattern, ...] = (
    Pattern("doctor-observations-paired-wrong", "actor", passes=("P6",), fails=("C",),
            summary="learner and actor disagree on the actions' log-probabilities; P6 (held observation) passes",
            reading="with the very weights that acted, the learner's log-probability of each behaviour action "
                    "differs from the actor's, so the learner reads other observations than the actor did, and "
                    "P6, whose observation is the same on every step of an episode, is still learned: each action is "
                    "stored with another step's observation",
            check="where the runner stores observations: each action must be stored with the observation it was "
                  "chosen from, not the one the step returned"),
    Pattern("doctor-learner-sees-other-observations", "preprocessing", fails=("C",),
            summary="learner and actor disagree on the actions' log-probabilities; P6 fails too",
            reading="with the very weights that acted, the learner's log-probability of each behaviour action "
                    "differs from the actor's, and no pairing explains it (P6 fails as well): the learner sees "
                    "observations transformed differently from what the actor saw",
            check="observation transforms (scaling, normalisation, dtype): the same on the actor side, in the "
                  "learner and at evaluation"),
    Pattern("doctor-value-gets-no-gradient", "value", passes=("P4.pi",), fails=("P1",), frozen=True,
            summary="the value never moves; the policy learns",
            reading="the value never moved from its initial weights on any probe while the policy learned",
            check="that the value loss reaches the value head: not detached, not weighted 0, the value "
                  "parameters in the optimizer"),
    Pattern("doctor-rewards-lost", "actor", fails=("P1.r",), frozen=False,
            summary="P1's value stays 0: no reward reaches the learner with its step",
            reading="P1 pays +1 on every step, yet its value stayed at 0, the value of no reward at all, while "
                    "values moved on other probes: the rewards never reached the learner with their step (each "
                    "one-step episode's reward stored with the reset step that follows it, whose reward is 0)",
            check="where the runner stores rewards: reward[t] must be the reward of the action taken at step t"),
    Pattern("doctor-optimizer", "optimizer", fails=("P1", "P9"),
            summary="both a one-step target (P1) and a boundary-free value (P9) are missed",
            reading="a supervised target (P1: one step, reward 1, constant observation) and a value learned with no "
                    "episode boundary at all (P9: reward 1-gamma forever, constant observation) are both missed "
                    "though gradients reach the value; no observation, pairing or boundary bug reaches both, so "
                    "what they share is the optimizer",
            check="the learning rate and its schedule, the optimizer's state (kept across steps), gradient "
                  "clipping; if every policy probe passes, also the value loss's sign and scale"),
    Pattern("doctor-episode-boundary", "returns", passes=("P9",), fails=("P1",),
            summary="one-step episodes wrong, a value with no episode end (P9) right",
            reading="the value of a one-step episode (P1) is wrong while the same learner learns a value with no "
                    "episode boundary (P9): the targets leak across the episode's end",
            check="that the GAE/V-trace recursion is cut where an episode ends (done) and at reset steps, and "
                  "that terminated steps do not bootstrap"),
    Pattern("doctor-optimizer-shared", "optimizer", fails=("P9",), any_fail=("P4.pi", "P5.pi", "P8"),
            summary="a boundary-free value (P9) and a one-step policy both fail",
            reading="a one-action value learned with no episode boundary (P9) and a one-step policy (P4, P5 or "
                    "P8) both fail: no return, observation or policy-loss bug reaches both, the optimizer does "
                    "(a decaying learning rate can still settle the one-step value P1)",
            check="the learning rate and its schedule, epochs and minibatches per batch, the optimizer's state, "
                  "gradient clipping"),
    Pattern("doctor-truncation", "returns", passes=("P1", "P2", "P9"), fails=("P7",),
            summary="only the time limit fails: truncation is not bootstrapped",
            reading="episodes cut by a time limit are not bootstrapped (P7) while terminating ones are right (P2)",
            check="that truncated steps bootstrap from the final observation's value and only terminated "
                  "steps zero it"),
    Pattern("doctor-discounting", "returns", passes=("P1", "P3", "P6"), any_fail=("P2", "P7", "P9"),
            summary="multi-step values wrong, one-step observation probes right",
            reading="multi-step values are wrong (P2: discounting to a terminal reward, P7: a time limit, P9: an "
                    "endless stream) while one-step probes that read observations pass",
            check="the discount factor in the targets and advantages (GAE/V-trace), and the terminal masks"),
    Pattern("doctor-preprocessing", "preprocessing", passes=("P1", "P4"), fails=("P6",),
            summary="observation probes fail, P6 (held observation) too",
            reading="only probes whose observations matter fail, P6 among them, whose observation is held for the "
                    "whole episode so that step pairing cannot matter: the learner and the actors (or evaluation) "
                    "see different observations",
            check="observation transforms (scaling, normalisation, stacking): the same on the actor side, in the "
                  "learner and at evaluation"),
    Pattern("doctor-pairing", "actor", passes=("P1", "P4", "P6"), any_fail=("P2", "P3", "P5"),
            summary="observation probes fail, P6 (held observation) passes",
            reading="probes whose observation changes every step fail while P6, whose observation is held for "
                    "the episode, passes: observations are paired with the wrong step",
            check="where the runner stores observations: each action must be stored with the observation it was "
                  "chosen from, not the one the step returned"),
    Pattern("doctor-policy", "policy", passes=("P1", "P3", "P6"), any_fail=("P4", "P5", "P8"),
            summary="values right, the policy wrong or moved by noise alone",
            reading="values are learned but the policy is wrong: it misses the best action (P4, P5) or moves where "
                    "no action is better (P8)",
            check="the policy loss and the advantages it sees (sign, normalisation, shape), and the entropy "
                  "bonus's sign"),
)
PATTERNS_BY_RULE = {p.rule: p for p in PATTERNS}
FALLBACK_RULE = "doctor-probes-fail"


def infer(results: list[ProbeResult]) -> tuple[Pattern | None, str]:
    """(matching row, or None when no row matches; the pattern as text) for one leg's results."""
    by_name = {r.probe.name: r for r in results}
    text = pattern_text(results)
    if healthy(results):
        return None, text
    for pattern in PATTERNS:
        if pattern.matches(by_name):
            return pattern, text
    return None, text


def healthy(results: list[ProbeResult]) -> bool:
    """Every probe that ran passed, broke no invariant, and the learner agreed with the actor (or did not say)."""
    return (all(r.passed or r.skipped for r in results) and consistent(results) is not False
            and not any(r.invariants for r in results))


def fallback_component(results: list[ProbeResult]) -> str:
    """For a pattern no row matches: the component the first failing probe implicates on its own."""
    first = next((r for r in results if not (r.passed or r.skipped)), None)
    return "preprocessing" if first is None else SINGLE_FAILURE[first.probe.name]


SINGLE_FAILURE = {"P1": "value", "P2": "returns", "P3": "actor", "P4": "policy", "P5": "actor", "P6": "preprocessing",
                  "P7": "returns", "P8": "policy", "P9": "returns"}
"""The component a probe's failure implicates when it is the only one failing."""


def pattern_text(results: list[ProbeResult]) -> str:
    probes = ", ".join(f"{r.probe.name} {r.mark()}" for r in results)
    c = consistent(results)
    worst = max((r.discrepancy for r in results if r.discrepancy is not None), default=None)
    return probes + (", C n/a" if c is None else ", C pass" if c else f", C FAIL({worst:.3g} nats)")


def render_table() -> str:
    """The pattern table as markdown (docs/doctor.md embeds it)."""
    names = [p.name for p in PROBES] + ["C"]
    head = "| # | " + " | ".join(names) + " | value frozen | component | the pattern in words |"
    lines = [head, "|" + "---|" * (len(names) + 4)]
    for i, pattern in enumerate(PATTERNS, 1):
        cells = []
        for name in names:
            marks = []
            for kind, group in (("pass", pattern.passes), ("FAIL", pattern.fails), ("FAIL?", pattern.any_fail)):
                for cell in group:
                    probe, _, check = cell.partition(".")
                    if probe == name:
                        marks.append(f"{check} {kind}" if check else kind)
            cells.append(", ".join(marks))
        frozen = {None: "", True: "yes", False: "no"}[pattern.frozen]
        lines.append(f"| {i} | " + " | ".join(cells) + f" | {frozen} | `{pattern.component}` | {pattern.summary} |")
    return "\n".join(lines)
