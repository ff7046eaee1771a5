"""The exporter re-derived (telemetry/exported.py): the learner gauges a scrape reads against the values computed."""

from __future__ import annotations

import math

import pytest
from diagnose import diagnose
from planted_telemetry import TELEMETRY_BUGS

from rlvitals.telemetry.exported import EPISODE_WINDOW, LEARNER_GAUGES, ExportCheck, export_gap
from rlvitals.telemetry.interface import NULL_TELEMETRY, RecorderTelemetry
from rlvitals.telemetry.recorder import Recorder

KL = "rlvitals_learner_kl_divergence_nats"
CLIP = "rlvitals_learner_clip_fraction_ratio"


def test_hand_worked_gaps():
    stats = {"kl": 0.25, "clip_fraction": 0.5}
    exported = {KL: {(): 0.25}, CLIP: {(): 0.5}}
    assert export_gap(stats, exported) == 0.0
    assert export_gap(stats, {KL: {(): 0.25 / math.log(2)}, CLIP: {(): 0.5}}) == 0.5   # one of two differs
    assert export_gap(stats, {KL: {}, CLIP: {(): 0.5}}) == 0.5   # a series missing from the scrape differs
    assert export_gap({"kl": math.nan, "clip_fraction": 0.5}, exported) == 0.0   # NaN leaves the gauge: skipped
    assert math.isnan(export_gap({}, exported))   # nothing to compare
    assert math.isnan(export_gap(stats, None))    # nothing exported (verbosity off)
    assert math.isnan(export_gap(stats, {}))      # neither family exported at this level


def test_every_source_of_a_learner_gauge_is_read_back_through_the_collector_as_set():
    telemetry = RecorderTelemetry(Recorder("debug", "local"))
    stats = {key: float(i) + 0.5 for i, (_, pairs) in enumerate(LEARNER_GAUGES) for _, key in pairs}
    telemetry.record_learn(stats)
    exported = telemetry.exported()
    assert export_gap(stats, exported) == 0.0
    compared = sum(1 for name, pairs in LEARNER_GAUGES if name in exported for labels, _ in pairs)
    assert compared > 100   # the debug level's learner gauges, every label value
    assert NULL_TELEMETRY.exported() is None


def test_the_statistic_is_judged_on_the_next_update_once():
    check = ExportCheck()
    assert check.take_statistic() == {}
    check.after_record({"kl": 0.25}, {KL: {(): 0.5}})
    assert check.take_statistic() == {"inv_exported_as_computed": 1.0}
    assert check.take_statistic() == {}


def test_the_actor_gauges_are_read_back_against_the_rollouts_and_a_window_of_their_own():
    from rlvitals.actors.agents import RandomAgent
    from rlvitals.actors.runner import EnvRunner

    telemetry = RecorderTelemetry(Recorder("standard", "local"))
    runner = EnvRunner("CartPole-v1", 8, seed=0)
    agent = RandomAgent(runner.action_space, 0)
    check = ExportCheck()
    episodes = 0
    while episodes <= EPISODE_WINDOW:   # past the window: the oldest episodes must have left both
        rollout = runner.collect(agent, 64)
        episodes += len(rollout.episodes.returns)
        telemetry.record_rollout(rollout)
        check.after_rollout(rollout, telemetry.exported())
        assert check.take_statistic() == {"inv_exported_as_computed": 0.0}
    exported = telemetry.exported()
    assert set(exported["rlvitals_actor_episode_return"]) == {("min",), ("max",), ("mean",), ("std",)}
    exported["rlvitals_actor_network_age"] = {(): float(rollout.policy_age) + 1}   # one of 9 gauges, 2 counters
    assert check.window.gap(rollout, exported) == pytest.approx(1 / 11)
    check.after_rollout(rollout, None)   # not read this time: the window still takes the rollout
    assert check.take_statistic() == {}
    runner.close()


def test_counters_rise_between_reads_by_what_the_run_gave_them():
    telemetry = RecorderTelemetry(Recorder("standard", "local"))
    check = ExportCheck()
    update = {"learner_steps": 16.0, "updates": 1.0, "samples": 1024.0, "samples_learned": 4096.0}
    for reads in range(3):
        for _ in range(4):   # updates between two reads
            telemetry.record_learn(update)
            check.count(update)
        check.after_record(update, telemetry.exported())
        # The first read sets the counters' base: only the gauges are compared (none here: NaN).
        expected = math.nan if reads == 0 else 0.0
        assert math.isnan(check.pending) if reads == 0 else check.pending == expected
    telemetry.record_learn(update)
    check.count({**update, "samples": 1000.0})   # the counter was given 24 more than the run computed
    check.after_record(update, telemetry.exported())
    assert check.pending == pytest.approx(1 / 4)   # one of the four learner counters differs


@pytest.mark.parametrize("bug", TELEMETRY_BUGS, ids=lambda b: b.name)
def test_an_exporter_that_changes_what_a_scrape_reads_is_named_telemetry(bug, tmp_path):
    found = diagnose(tmp_path / bug.name, env=bug.env, bug=bug, budget_s=300)
    assert found.first is not None, found.verdicts
    assert (found.first.rule, found.first.component) == ("RLInvariantExportedAsComputed", "telemetry"), found.verdicts
    assert found.first.first_update <= 10   # a Ray actor's gauge shows its fault once its weights change
