"""The invariants as data and their monitor: holds counted in updates, breaks latched, one source for
rules, series and docs; and a run reaches the same verdict after the same updates at any speed."""

from __future__ import annotations

import math

import pytest
from diagnose import diagnose
from planted_bugs import BY_BUG, INVARIANT_BUGS

from rlvitals.telemetry import invariant_reference
from rlvitals.telemetry.catalogue import BY_NAME as METRICS_BY_NAME
from rlvitals.telemetry.invariant_monitor import InvariantMonitor
from rlvitals.telemetry.invariants import BY_NAME, FAMILIES, INVARIANTS, Invariant
from rlvitals.telemetry.rules import BY_RULE
from rlvitals.telemetry.verdicts import COMPONENTS

TOY = Invariant("toy", "sampling", "actor", 1.0, 3, "s", "c", "d")


def test_docs_are_generated_from_the_invariants():
    assert invariant_reference.main(["--check"]) == 0, "run python -m rlvitals.telemetry.invariant_reference"
    page = invariant_reference.DEFAULT_OUTPUT.read_text()
    for inv in INVARIANTS:
        assert f"### {inv.name}" in page and inv.derivation in page


def test_every_invariant_has_its_rule_series_and_component():
    labels = METRICS_BY_NAME["rlvitals_invariant_broken"].label_values["invariant"]
    assert labels == METRICS_BY_NAME["rlvitals_invariant_statistic"].label_values["invariant"]
    assert set(labels) == set(BY_NAME)
    for inv in INVARIANTS:
        rule = BY_RULE[inv.rule_name]
        assert (rule.component, rule.severity, rule.hold) == (inv.component, inv.severity, 0)
        assert rule.expr.keys() == {inv.broken_key}
        assert inv.component in COMPONENTS and inv.family in FAMILIES


def test_the_hold_counts_measured_updates_and_a_break_is_latched():
    monitor = InvariantMonitor([TOY])
    flags = [monitor.observe({"inv_toy": v}, u)["inv_broken_toy"]
             for u, v in enumerate([2.0, 2.0, math.nan, 0.5, 2.0, 2.0, None, 2.0, 0.0, 0.0], start=1)]
    # 2, 2, (not measured), 0.5 resets, 2, 2, (absent), 2 -> the third measured update over the limit in a row;
    # from then on the flag holds the update at which it broke
    assert flags == [0, 0, 0, 0, 0, 0, 0, 8, 8, 8]
    assert monitor.broken_at == {"toy": 8}


def test_nothing_is_judged_before_after_updates():
    early = Invariant("early", "pipeline", "memory", 0.0, 1, "s", "c", "d", after_updates=5)
    monitor = InvariantMonitor([early])
    assert [monitor.observe({"inv_early": 1.0}, u)["inv_broken_early"] for u in range(1, 8)] == [0] * 5 + [6, 6]


def test_the_monitor_state_survives_a_resume():
    monitor = InvariantMonitor([TOY])
    for u in (1, 2):
        monitor.observe({"inv_toy": 5.0}, u)
    resumed = InvariantMonitor([TOY])
    resumed.load_state(monitor.state())
    assert resumed.observe({"inv_toy": 5.0}, 3)["inv_broken_toy"] == 3


def test_one_actor_breaking_a_batch_invariant_is_judged_on_its_own_batches():
    # Four actors deliver in turn; only actor "c" breaks it. Run-wide, its breaks are never in a row.
    monitor, run_wide = InvariantMonitor([TOY]), InvariantMonitor([TOY])
    broken = []
    for u in range(1, 13):
        producer = "abcd"[(u - 1) % 4]
        value = 5.0 if producer == "c" else 0.0
        broken.append(monitor.observe({"inv_toy": value}, u, [producer])["inv_broken_toy"])
        run_wide.observe({"inv_toy": value}, u)
    assert broken == [0] * 10 + [11, 11]      # c's third batch in a row (updates 3, 7, 11)
    assert monitor.streaks["toy"] == {"": 0, "a": 0, "b": 0, "c": 3, "d": 0} and not run_wide.broken_at
    # A batch that joins every actor's rollouts (synchronous mode) counts for each of them.
    joined = InvariantMonitor([TOY])
    assert [joined.observe({"inv_toy": 5.0}, u, ["a", "b"])["inv_broken_toy"] for u in (1, 2, 3)] == [0, 0, 3]
    # A fault in every actor breaks the run-wide streak as fast as in one process (not after 3 batches each).
    fleet = InvariantMonitor([TOY])
    assert [fleet.observe({"inv_toy": 5.0}, u, ["abcd"[u % 4]])["inv_broken_toy"] for u in (1, 2, 3)] == [0, 0, 3]


def test_run_wide_invariants_are_never_judged_per_producer():
    run_wide = Invariant("toy_pipeline", "pipeline", "memory", 1.0, 2, "s", "c", "d")
    streams = BY_NAME["streams_independent"]
    assert not run_wide.per_batch and not streams.per_batch and TOY.per_batch
    monitor = InvariantMonitor([run_wide])
    assert [monitor.observe({"inv_toy_pipeline": 5.0}, u, ["abcd"[u]])["inv_broken_toy_pipeline"]
            for u in (1, 2)] == [0, 2]


def test_every_invariant_bug_names_its_invariants_component():
    for bug in INVARIANT_BUGS:
        assert bug.invariant in BY_NAME, bug.name
        assert BY_NAME[bug.invariant].component == bug.component, bug.name
    assert sum(b.mode == "ray" for b in INVARIANT_BUGS) >= 4
    assert sum(b.env == "Pendulum-v1" for b in INVARIANT_BUGS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["truncation_stored_as_termination", "rollouts_kept_forever"])
def test_a_planted_bug_is_named_after_the_same_updates_at_full_and_half_speed(name, tmp_path):
    """Evidence, not seconds: the same verdict at the same update whatever the machine's speed.

    Truncation stored as termination is judged on the updates in which an episode ended, which the seeds fix.
    The retained rollouts are counted as Python frees them, and a rollout in a reference cycle waits for the
    garbage collector, whose moments depend on timing: that count can differ by a rollout or two, so its
    update may move by as much as the slack the invariant allows (telemetry/invariants.py), never by seconds.
    """
    from rlvitals.evidence import ROLLOUT_SLACK

    bug = BY_BUG[name]
    runs = {}
    for speed, factor in (("full", 1.0), ("half", 2.0)):
        found = diagnose(tmp_path / speed, bug=bug, budget_s=600, slowdown=factor, num_envs=4, rollout_length=64,
                         env_kwargs={"max_episode_steps": 40})
        runs[speed] = [(v.rule, v.component, v.first_update) for v in found.verdicts if v.severity != "info"]
    (rule, component, update), (rule_half, component_half, update_half) = runs["full"][0], runs["half"][0]
    invariant = BY_NAME[bug.invariant or "rollouts_retained"]   # the leak is last round's bug, named by this one
    assert (rule, component) == (rule_half, component_half) == (invariant.rule_name, bug.component)
    if name == "truncation_stored_as_termination":
        assert runs["full"] == runs["half"]
    else:
        assert abs(update - update_half) <= ROLLOUT_SLACK
        assert update >= BY_NAME["rollouts_retained"].hold_updates   # the hold, counted in updates


def test_rollouts_alive_before_a_run_are_not_the_runs(tmp_path):
    """Rollouts a caller (or an earlier run in the same process) still holds do not count as this run's: a run
    started beside 64 of them reads only its own, and rollouts_retained holds."""
    from rlvitals.actors.agents import RandomAgent
    from rlvitals.actors.runner import EnvRunner

    runner = EnvRunner("CartPole-v1", 2, 0)
    try:
        agent = RandomAgent(runner.action_space, 0)
        held = [runner.collect(agent, 4) for _ in range(64)]
    finally:
        runner.close()
    # 23 updates: past rollouts_retained's hold of 16, so a count of the held rollouts would break it
    found = diagnose(tmp_path / "run", stop_on_verdict=False, total_env_steps=6_000, num_envs=4, rollout_length=64)
    assert len(held) == 64
    alive = [r["rollouts_alive"] for r in found.rows if "rollouts_alive" in r]
    assert alive and max(alive) <= 8, alive
    assert "rollouts_retained" not in found.summary["judgement"]["invariants_broken"]
