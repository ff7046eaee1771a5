"""Ray mode's learner loop judged from the producers' completion stamps, and the actors' weight loads judged against
the versions published (issue 31, part 3).

The statistics are checked on hand-made evidence first (what counts as idle while work was ready, what counts as a
load out of order); then the planted faults (tests/planted_ray_stages.py) are named on their component by the first
loud verdict of real Ray runs, and healthy async runs stay quiet. Runs end on their step budget or a verdict.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import planted_bugs
import pytest
from diagnose import LOUD, diagnose
from planted_bugs import BY_BUG, RAY

from rlvitals.distributed.readiness import CLOCK_SKEW_S, STATISTIC, TRAVEL_SHARE, ReadyWaits, covered_length
from rlvitals.evidence import WeightLoads, WitnessedSteps
from rlvitals.telemetry.invariants import BY_NAME, STAGE_RANK

WAITS = BY_NAME["learner_waits_while_ready"]
LOADS = BY_NAME["weight_loads_per_published_version"]


# ---------------------------------------------------------------- idle while work was ready, from the stamps
def test_covered_length_counts_each_second_once():
    segments: list[list[float]] = []
    assert covered_length(segments, 1.0, 3.0) == 2.0
    assert covered_length(segments, 2.0, 4.0) == 1.0
    assert covered_length(segments, 0.0, 5.0) == 2.0
    assert covered_length(segments, 4.0, 3.0) == 0.0 and segments == [[0.0, 5.0]]


def test_blocked_after_a_stamp_is_idle_and_the_fetch_the_travel_and_earlier_work_are_not():
    waits, t0 = ReadyWaits(), time.time() - 10.0
    waits.blocked(t0, t0 + 4.0, fetched=(t0 + 3.0, t0 + 4.0))      # the last second fetched what it took
    waits.arrived({"finished_at": t0 + 1.0}, fetch_started=t0 + 3.0)   # ready from 1 on: idle 1 to 3
    waits.arrived({"finished_at": t0 + 0.5}, fetch_started=t0 + 6.0)   # kept waiting too: 0.5 to 1 is new
    waits.arrived({"finished_at": t0 + 5.0}, fetch_started=t0 + 6.0)   # finished after the block: nothing
    idle = 2.5 - 2 * CLOCK_SKEW_S + CLOCK_SKEW_S
    share = waits.take_statistic()[STATISTIC]
    assert share == pytest.approx(idle / 10.0, rel=1e-3)
    assert waits.take_statistic() == {}, "measured once per stamped arrival, then nothing until the next"
    # Its own work in the actor buys a rollout its travel back: ready only TRAVEL_SHARE of it later.
    waits.blocked(t0 + 10.0, t0 + 14.0)
    waits.arrived({"finished_at": t0 + 10.0, "env_step": 4.0, "inference": 4.0}, fetch_started=t0 + 14.0)
    assert waits._idle == pytest.approx(4.0 - CLOCK_SKEW_S - TRAVEL_SHARE * 8.0)


def test_unstamped_rollouts_and_prefetched_ones_leave_the_learner_blameless():
    waits, t0 = ReadyWaits(), time.time() - 1.0
    waits.blocked(t0, t0 + 0.5, fetched=(t0 - 0.2, t0 + 0.5))         # blocked on the fetch of what it took
    waits.arrived({}, fetch_started=t0 - 0.2)                          # local mode: no stamp, not measured
    assert waits.take_statistic() == {}
    waits.arrived({"finished_at": t0 - 0.3}, fetch_started=t0 + 0.5)   # ready, but the learner was fetching
    assert waits.take_statistic() == {STATISTIC: 0.0}
    waits.forget_before(t0 + 1.0)
    assert not waits.blocks


def test_the_invariants_sit_in_their_stages():
    assert WAITS.component == "learner" and LOADS.component == "weight-sync"
    assert STAGE_RANK[LOADS.name] == STAGE_RANK["weights_current_at_request"]
    assert LOADS.names_key == "weight_loads_per_published_version_named"


# ---------------------------------------------------------------- weight loads per published version
def counters(loads: int, versions: int, loaded=(), actor: int = 1, pid: int = 7) -> dict:
    return {"actor": actor, "pid": pid, "weight_loads": loads, "versions_loaded": versions, "loaded_versions": loaded}


def rollout(policy_age: int, *stamped: dict) -> SimpleNamespace:
    return SimpleNamespace(policy_age=policy_age, actor_counters=stamped)


def test_each_published_version_loaded_once_and_acted_with_is_quiet():
    loads = WeightLoads()
    for age in (0, 16, 32):
        loads.published(age)
    loads.arrived(rollout(0, counters(1, 1, (0,))))
    loads.arrived(rollout(0, counters(1, 1, ())))              # the same version handed again: not loaded again
    loads.arrived(rollout(32, counters(2, 2, (32,))))          # a version skipped is no fault
    assert loads.take_statistic() == {"inv_weight_loads_per_published_version": 0.0}


def test_a_version_loaded_again_or_never_published_names_the_actor_and_what_it_did():
    loads = WeightLoads()
    for age in (0, 16):
        loads.published(age)
    loads.arrived(rollout(0, counters(1, 1, (0,), actor=0, pid=5)))
    loads.arrived(rollout(0, counters(2, 1, (0,))))            # actor 1 loaded version 0 twice
    seen = loads.take_statistic()
    assert seen["inv_weight_loads_per_published_version"] == 1.0
    assert seen["weight_loads_per_published_version_named"].startswith(
        "actor 1 (pid 7): 1 of 1 rollouts over the limit (loaded a version again)")
    assert "the other 1 actor: 0 of 1" in seen["weight_loads_per_published_version_named"]
    loads.arrived(rollout(0, counters(2, 1, ())))              # cumulative counts: the old repeat is not new
    assert loads.take_statistic()["inv_weight_loads_per_published_version"] == 0.0
    loads.arrived(rollout(17, counters(3, 2, (17,))))          # loaded and acted with a version never published
    seen = loads.take_statistic()
    assert seen["inv_weight_loads_per_published_version"] == 2.0
    assert "acted with a version never published" in seen["weight_loads_per_published_version_named"]


# ---------------------------------------------------------------- the consumer's order is not the actor's fault
def witnessed(steps_total: int, delivered: int, steps: int = 8) -> SimpleNamespace:
    record = SimpleNamespace(steps=steps, steps_total=steps_total, origin=3)
    return SimpleNamespace(witness=(record,), actor_counters=({"delivered": delivered, "dropped_steps": 0},))


def test_rollouts_taken_out_of_the_order_their_actor_delivered_them_are_accounted_for():
    ledger = WitnessedSteps()
    ledger.arrived(witnessed(16, 2), "actor 0 (pid 1)")     # the learner took the second first
    ledger.arrived(witnessed(8, 1), "actor 0 (pid 1)")
    ledger.arrived(witnessed(24, 3), "actor 0 (pid 1)")
    assert ledger.take_statistic() == {"inv_env_steps_accounted": 0.0}
    ledger.arrived(witnessed(40, 4), "actor 0 (pid 1)")     # 8 steps taken that never arrived
    assert ledger.take_statistic()["inv_env_steps_accounted"] == 8.0


# ---------------------------------------------------------------- real Ray runs
HUNG_S = 300
"""Run seconds after which a run counts as hung (these take 20-40 s here, Ray's start-up included)."""

FAULTS = ["ray_loop_poll_says_nothing_is_ready", "ray_one_actor_of_four_reloads_its_weights_every_request",
          *(pytest.param(name, marks=pytest.mark.extended) for name in (
              "ray_loop_waits_for_every_rollout_in_flight_of_four_actors", "ray_actors_load_weights_one_version_ahead",
              "ray_learner_waits_for_every_request"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAULTS)
def test_a_fault_in_the_loop_or_the_weight_loads_is_named_on_its_owner(name, tmp_path):
    bug = BY_BUG[name]
    found = diagnose(tmp_path / name, bug=bug, budget_s=HUNG_S)
    first = found.first
    assert first is not None, f"{name}: no verdict; {found.verdicts}"
    assert (first.component, first.rule) == (bug.component, BY_NAME[bug.invariant].rule_name), first
    if bug.one_actor:   # the actor that claimed the bug, by its pid, and no other
        pid = Path(planted_bugs.claim_path).read_text()
        assert f"(pid {pid}): " in first.message and first.message.count("(pid ") == 1, first.message


HEALTHY = [pytest.param({"num_actors": 4, "actor_cpus": 0.25, "rollouts_in_flight": 2}, 200_000, id="4x2"),
           pytest.param({}, 150_000, id="2x2", marks=pytest.mark.extended)]


@pytest.mark.slow
@pytest.mark.parametrize("overrides,steps", HEALTHY)
def test_a_healthy_async_run_never_waits_while_work_is_ready_nor_loads_out_of_order(overrides, steps, tmp_path):
    found = diagnose(tmp_path / "run", budget_s=HUNG_S, stop_on_verdict=False, total_env_steps=steps,
                     **{**RAY, **overrides})
    assert found.summary["env_steps"] >= steps, "hung"
    assert not [v for v in found.verdicts if v.severity in LOUD], found.verdicts
    shares = [row[STATISTIC] for row in found.rows if STATISTIC in row]
    loads = [row[LOADS.statistic] for row in found.rows if LOADS.statistic in row]
    assert shares and loads, "the stamps and the load counts never arrived"
    assert max(loads) == 0.0
    assert found.rows[-1][WAITS.broken_key] == 0.0
