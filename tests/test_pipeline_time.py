"""Pipeline time: each actor's phases add up to its wall time, and the learner never waits while a rollout is ready.

The actor side is checked on a real runner and on a real Ray run (summary.json's
per-actor seconds against the wall clock the actor kept); the learner side by the
invariant `learner_waits_while_ready` on a healthy Ray async run and on the planted
bug that breaks it (tests/planted_bugs.py; short enough for the suite, so it runs here with the Prometheus
parity check of tests/test_diagnosis.py rather than in its list). The runs end on their step budget or
a verdict, never after a sleep.
"""

from __future__ import annotations

import math
import time

import pytest
from diagnose import LOUD, diagnose
from planted_bugs import BY_BUG, RAY
from promparity import promtool_test

from rlvitals.actors.agents import RandomAgent
from rlvitals.actors.runner import EnvRunner
from rlvitals.distributed.accounting import PHASES, ActorCounters
from rlvitals.distributed.readiness import STATISTIC, ReadyWaits
from rlvitals.telemetry.catalogue import BY_NAME as METRICS
from rlvitals.telemetry.invariants import BY_NAME

SUM_TOLERANCE = 0.03
"""Phases (perf_counter sums) against the wall clock's seconds: both clocks count the same time."""


def assert_phases_add_up(counts: dict) -> None:
    seconds, wall = counts["seconds"], counts["wall"]
    assert set(seconds) == set(PHASES) and all(s >= 0 for s in seconds.values()), counts
    assert abs(sum(seconds.values()) - wall) <= SUM_TOLERANCE * wall + 1e-3, counts


def test_the_exported_phases_are_the_accounted_ones():
    assert METRICS["rlvitals_actor_phase_seconds_total"].label_values["phase"] == PHASES


def test_an_actors_phases_add_up_to_its_wall_time_rollout_by_rollout():
    """A real runner: each rollout's timings are its share of the actor's seconds, and they never overlap."""
    born = time.perf_counter()
    runner = EnvRunner("CartPole-v1", 2, 0)
    counters = ActorCounters(0, 1234, born)
    exported = dict.fromkeys(PHASES, 0.0)
    try:
        for _ in range(3):
            counters.task_started()
            rollout = runner.collect(RandomAgent(runner.action_space, 0), 16)
            counters.produced_one()
            counters.phases(rollout, 0.0)
            for phase in PHASES:
                exported[phase] += rollout.timings[phase]
            counters.deliver(rollout)
            assert_phases_add_up(rollout.actor_counters[0])
    finally:
        runner.close()
    final = counters.snapshot()
    assert_phases_add_up(final)
    assert final["seconds"]["other"] > 0, "start-up (the runner's envs) is in `other`"
    for phase in PHASES:   # what the telemetry exported is what was accounted, up to the last rollout
        assert exported[phase] <= final["seconds"][phase] + 1e-9
    assert math.isclose(exported["env_step"], final["seconds"]["env_step"])


def test_a_wait_is_judged_only_against_stamped_rollouts():
    # What counts as idle while work was ready is tests/test_ray_stages.py's; here: measured only with stamps.
    waits, t0 = ReadyWaits(), time.time() - 1.0
    waits.blocked(t0, t0 + 0.5)
    waits.arrived({}, fetch_started=t0 + 0.5)
    assert waits.take_statistic() == {}, "no completion stamp: not measured"
    waits.arrived({"finished_at": t0 + 0.6}, fetch_started=t0 + 0.7)
    assert waits.take_statistic() == {STATISTIC: 0.0}, "finished after the learner stopped waiting"
    assert waits.take_statistic() == {}, "measured once per stamped arrival, then nothing until the next"


HUNG_S = 300
"""Run seconds after which a run counts as hung (these take 30-60 s here, Ray's start-up included)."""


@pytest.mark.slow
def test_a_healthy_ray_async_run_keeps_the_learner_busy_and_accounts_every_actor_second(tmp_path):
    started = time.monotonic()
    found = diagnose(tmp_path / "run", budget_s=HUNG_S, stop_on_verdict=False, total_env_steps=100_000, **RAY)
    elapsed = time.monotonic() - started
    assert found.summary["env_steps"] >= 100_000, "hung"
    assert not [v for v in found.verdicts if v.severity in LOUD], found.verdicts
    measured = [row[STATISTIC] for row in found.rows if STATISTIC in row]
    assert measured, "no stamped rollout arrived: the invariant was never judged"
    assert found.rows[-1][BY_NAME["learner_waits_while_ready"].broken_key] == 0.0
    actors = found.summary["samples"]["actors"]["per_actor"]
    assert set(actors) == {"0", "1"}
    for counts in actors.values():
        assert_phases_add_up(counts)
        assert 0 < counts["wall"] < elapsed, counts
        assert counts["seconds"]["env_step"] > 0 and counts["seconds"]["work_wait"] > 0, counts


@pytest.mark.slow
def test_a_learner_that_waits_for_every_request_is_pinned_on_the_learner(tmp_path):
    bug = BY_BUG["ray_learner_waits_for_every_request"]
    found = diagnose(tmp_path / bug.name, bug=bug, budget_s=HUNG_S)
    first = found.first
    assert first is not None, f"no verdict in {HUNG_S} s: {found.verdicts}"
    assert (first.component, first.rule) == ("learner", "RLInvariantLearnerWaitsWhileReady"), first
    # The actors' own accounting still adds up under the fault.
    for counts in found.summary["samples"]["actors"]["per_actor"].values():
        assert_phases_add_up(counts)
    # A real Prometheus, evaluating the generated rules on the recorded series, fires the same alert.
    table = promtool_test(found.rows, tmp_path)
    assert any(fires for (rule, _), fires in table.items() if rule == first.rule), table
