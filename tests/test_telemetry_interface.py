"""The telemetry interface: the no-op, recorder-backed and served implementations."""

from __future__ import annotations

import json
import time

import pytest
from telemetry_support import fake_learner_stats, make_rollout, registry_for

from conftest import http_get
from rlvitals.telemetry.interface import NULL_TELEMETRY, NullTelemetry, RecorderTelemetry, Telemetry
from rlvitals.telemetry.process import ProcessTelemetry, start_telemetry
from rlvitals.telemetry.recorder import Recorder, UnknownMetricError


# ======================================================================
# The telemetry interface
# ======================================================================
def test_every_implementation_offers_the_whole_interface():
    served = ProcessTelemetry.start("local", "minimal")
    try:
        for telemetry in (NullTelemetry(), RecorderTelemetry(Recorder("standard")), served):
            assert isinstance(telemetry, Telemetry), type(telemetry).__name__
    finally:
        served.stop()
    assert start_telemetry("local", "off") is NULL_TELEMETRY


def test_off_records_nothing_and_needs_no_checks():
    telemetry = start_telemetry("learner", "off")
    assert telemetry.url is None and not telemetry.wants_debug and not telemetry.wants_value_trace
    telemetry.record_rollout(make_rollout())
    telemetry.record_learn(fake_learner_stats())
    telemetry.record_queue(1, 2)
    telemetry.record_dropped("stale", 3)
    telemetry.record_publish(10)
    telemetry.record_restarts(1)
    with telemetry.phase("wait"):
        pass
    assert telemetry.state() == {}
    telemetry.load_state({"counters": [["rlvitals_learner_steps_total", [], 5.0]]})
    telemetry.stop()


def test_unknown_metric_names_and_label_values_fail_loudly():
    recorder = Recorder("debug")
    assert recorder.strict, "recorders are strict under pytest"
    with pytest.raises(UnknownMetricError, match="rlvitals_learner_stepz_total"):
        recorder._inc("rlvitals_learner_stepz_total", 1.0)
    with pytest.raises(UnknownMetricError, match="phase='wiat'"):
        recorder.record_phase("wiat", 1.0)
    with pytest.raises(UnknownMetricError, match="reason='old'"):
        RecorderTelemetry(recorder).record_dropped("old", 4)
    # A catalogued metric this level does not export is not an error: it is simply not kept.
    minimal, registry = registry_for("minimal")
    minimal.record_phase("wait", 1.0)
    assert registry.get_sample_value("rlvitals_learner_phase_seconds_total", {"phase": "wait"}) is None


def test_outside_tests_an_unknown_name_is_logged_once_and_dropped(caplog):
    recorder, registry = registry_for("standard")
    recorder.strict = False
    for _ in range(3):
        recorder.record_phase("wiat", 1.0)
        recorder.record_phase("wait", 1.0)
    warnings = [r for r in caplog.records if "wiat" in r.getMessage()]
    assert len(warnings) == 1
    assert registry.get_sample_value("rlvitals_learner_phase_seconds_total", {"phase": "wait"}) == 3.0
    assert registry.get_sample_value("rlvitals_learner_phase_seconds_total", {"phase": "wiat"}) is None


def test_phase_times_its_block_even_when_it_raises():
    recorder, registry = registry_for("standard")
    telemetry = RecorderTelemetry(recorder)
    with telemetry.phase("publish"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), telemetry.phase("publish"):
        time.sleep(0.02)
        raise RuntimeError("boom")
    assert registry.get_sample_value("rlvitals_learner_phase_seconds_total", {"phase": "publish"}) >= 0.04


def test_state_round_trips_counters_as_plain_data():
    recorder, _ = registry_for("standard", "learner")
    telemetry = RecorderTelemetry(recorder)
    telemetry.record_learn(fake_learner_stats())
    telemetry.record_dropped("stale", 32)
    telemetry.record_publish(1000)
    telemetry.record_restarts(2)
    state = json.loads(json.dumps(telemetry.state()))  # plain data: fits a weights_only checkpoint
    fresh, registry = registry_for("standard", "learner")
    RecorderTelemetry(fresh).load_state(state)
    get = registry.get_sample_value
    assert get("rlvitals_samples_dropped_total", {"reason": "stale"}) == 32
    assert get("rlvitals_actor_restarts_total") == 2
    assert get("rlvitals_weight_publish_bytes_total") == 1000
    assert get("rlvitals_learner_samples_learned_total") == fake_learner_stats()["samples_learned"]
    assert get("rlvitals_learner_kl_divergence_nats") is None, "gauges are measured afresh, not restored"
    assert (fresh.collected, fresh.learned) == (recorder.collected, recorder.learned)


def test_a_served_endpoint_answers_with_restored_counters_from_its_first_scrape():
    state = {"counters": [["rlvitals_learner_steps_total", [], 1234.0]], "collected": 10.0, "learned": 40.0}
    telemetry = ProcessTelemetry.start("local", "minimal", state=state)
    try:
        status, body = http_get(telemetry.url)
        assert status == 200 and b"rlvitals_learner_steps_total 1234.0" in body
    finally:
        telemetry.stop()
