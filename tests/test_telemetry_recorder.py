"""Telemetry's recorder and collectors: a fresh registry per test, hand-built inputs. (That the learner's
statistics have the right values is tested in test_diagnostics.py.)
"""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import torch
from prometheus_client import generate_latest
from telemetry_support import (
    CPU,
    fake_learner_stats,
    families,
    family_metric,
    installed_test_env,
    label_sets,
    layer_counts,
    make_rollout,
    metric_of,
    registry_for,
    sample_lines,
    sample_name,
    served_metrics,
    sourced,
)

from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.learner.invariants import KEYS as LEARNER_STATISTICS
from rlvitals.telemetry.catalogue import (
    BY_NAME,
    METRICS,
    STALENESS_BUCKETS,
    exposed_names,
)
from rlvitals.telemetry.interface import RecorderTelemetry
from rlvitals.telemetry.invariants import INVARIANTS
from rlvitals.telemetry.recorder import COMPONENTS, Recorder
from rlvitals.telemetry.rowkeys import OCCASIONAL_KEYS
from rlvitals.training import make_learner, make_network, seed_everything


@pytest.fixture(scope="session")
def test_env(tmp_path_factory):
    with installed_test_env(tmp_path_factory) as env:
        yield env


# ======================================================================
# Recorder and collectors
# ======================================================================
def test_record_learn_sets_every_learner_gauge_from_its_stats_key():
    recorder, registry = registry_for("standard")
    stats = fake_learner_stats()
    recorder.record_learn(stats)
    for m in sourced("learner", ("gauge",)):
        if m.name in ("rlvitals_learner_training_intensity", "rlvitals_learner_rollouts_alive",
                      "rlvitals_learner_staleness_batches", "rlvitals_learner_actor_weights_mismatch_ratio"):
            continue  # the recorder or the run's learn step adds these (Run.weights_mismatch: the actors' record)
        if m.level == "debug":
            continue  # not served at standard
        for labels, key in label_sets(m):
            assert registry.get_sample_value(m.name, labels) == pytest.approx(stats[key]), (m.name, labels)


def test_counters_accumulate():
    recorder, registry = registry_for("standard")
    first, second = fake_learner_stats(), fake_learner_stats(offset=10.0)
    recorder.record_learn(first)
    recorder.record_learn(second)
    for m in sourced("learner", ("counter",)):
        for labels, key in label_sets(m):
            if key in first:
                expected = first[key] + second[key]
                assert registry.get_sample_value(m.name, labels) == pytest.approx(expected), (m.name, labels)
    # Phases nobody reported exist from the start, at 0.
    assert registry.get_sample_value("rlvitals_learner_phase_seconds_total", {"phase": "publish"}) == 0.0
    recorder.record_phase("wait", 1.5)
    recorder.record_phase("wait", 0.25)
    assert registry.get_sample_value("rlvitals_learner_phase_seconds_total", {"phase": "wait"}) == 1.75
    # A batch skipped for non-finite values: its samples count as dropped, not learned.
    consumed = registry.get_sample_value("rlvitals_learner_samples_consumed_total")
    recorder.record_learn({**first, "nonfinite": 1.0, "nonfinite_samples": 64.0, "samples": 0.0,
                           "samples_learned": 0.0, "learner_steps": 0.0})
    assert registry.get_sample_value("rlvitals_samples_dropped_total", {"reason": "nonfinite"}) == 64.0
    assert registry.get_sample_value("rlvitals_learner_samples_consumed_total") == consumed
    assert registry.get_sample_value("rlvitals_samples_dropped_total", {"reason": "stale"}) == 0.0
    recorder.record_dropped("stale", 32)
    assert registry.get_sample_value("rlvitals_samples_dropped_total", {"reason": "stale"}) == 32.0
    recorder.record_publish(1000)
    recorder.record_publish(1000)
    assert registry.get_sample_value("rlvitals_weight_publishes_total") == 2.0
    assert registry.get_sample_value("rlvitals_weight_publish_bytes_total") == 2000.0


def test_nan_leaves_a_gauge_at_its_last_value():
    recorder, registry = registry_for("standard")
    nan = float("nan")
    recorder.record_learn({**fake_learner_stats(), "kl": 0.25, "terminal_correlation": nan})
    assert registry.get_sample_value("rlvitals_learner_kl_divergence_nats") == 0.25
    # Never defined: the family is declared, with no sample (never a fake 0).
    assert registry.get_sample_value("rlvitals_learner_terminal_correlation") is None
    assert "rlvitals_learner_terminal_correlation" in families(registry)
    recorder.record_learn({**fake_learner_stats(), "kl": nan, "terminal_correlation": 0.5})
    assert registry.get_sample_value("rlvitals_learner_kl_divergence_nats") == 0.25
    assert registry.get_sample_value("rlvitals_learner_terminal_correlation") == 0.5
    recorder.record_learn({**fake_learner_stats(), "kl": 0.125, "terminal_correlation": nan})
    assert registry.get_sample_value("rlvitals_learner_kl_divergence_nats") == 0.125
    assert registry.get_sample_value("rlvitals_learner_terminal_correlation") == 0.5


def test_staleness_histogram_counts_samples():
    recorder, registry = registry_for("standard")
    name = "rlvitals_learner_sample_staleness_steps"
    recorder.record_learn({**fake_learner_stats(), "staleness": 3.0, "samples": 64.0})
    recorder.record_learn({**fake_learner_stats(), "staleness": 0.0, "samples": 10.0})
    recorder.record_learn({**fake_learner_stats(), "staleness": 5000.0, "samples": 1.0})
    for bound in STALENESS_BUCKETS:
        expected = (10 if bound >= 0 else 0) + (64 if bound >= 3 else 0)
        assert registry.get_sample_value(f"{name}_bucket", {"le": repr(float(bound))}) == expected, bound
    assert registry.get_sample_value(f"{name}_bucket", {"le": "+Inf"}) == 75
    assert registry.get_sample_value(f"{name}_count") == 75
    assert registry.get_sample_value(f"{name}_sum") == 3 * 64 + 5000


def test_record_rollout_sets_actor_metrics():
    recorder, registry = registry_for("standard")
    recorder.record_rollout(make_rollout())
    get = registry.get_sample_value
    assert get("rlvitals_actor_env_steps_total") == 7
    assert get("rlvitals_actor_episodes_total") == 2
    stats = {"min": 1.0, "max": 3.0, "mean": 2.0, "std": 1.0}
    for stat, value in stats.items():
        assert get("rlvitals_actor_episode_return", {"stat": stat}) == value
    for stat, value in {"min": 10.0, "max": 20.0, "mean": 15.0, "std": 5.0}.items():
        assert get("rlvitals_actor_episode_length", {"stat": stat}) == value
    assert get("rlvitals_actor_solve_ratio") == 0.5
    assert get("rlvitals_actor_network_age") == 5
    assert get("rlvitals_actor_phase_seconds_total", {"phase": "env_step"}) == 0.25
    assert get("rlvitals_actor_phase_seconds_total", {"phase": "inference"}) == 0.5
    assert get("rlvitals_actor_phase_seconds_total", {"phase": "weight_wait"}) == 0.0
    # A second rollout: counters add up, the episode window covers both, no episodes keeps the stats.
    recorder.record_rollout(make_rollout(returns=(5.0, 7.0), lengths=(30, 40), successes=(1.0, 1.0),
                                         env_steps=9, age=6))
    recorder.record_rollout(make_rollout(returns=(), lengths=(), successes=(), env_steps=4, age=7))
    assert get("rlvitals_actor_env_steps_total") == 20
    assert get("rlvitals_actor_episodes_total") == 4
    assert get("rlvitals_actor_episode_return", {"stat": "mean"}) == 4.0
    assert get("rlvitals_actor_episode_return", {"stat": "std"}) == pytest.approx(np.std([1, 3, 5, 7]))
    assert get("rlvitals_actor_episode_length", {"stat": "max"}) == 40
    assert get("rlvitals_actor_solve_ratio") == 0.75
    assert get("rlvitals_actor_network_age") == 7
    assert get("rlvitals_actor_phase_seconds_total", {"phase": "env_step"}) == 0.75
    # Training intensity: samples learned per sample collected.
    recorder.record_learn({**fake_learner_stats(), "samples_learned": 80.0})
    assert get("rlvitals_learner_training_intensity") == 4.0


def test_learner_process_training_intensity_counts_what_reaches_it():
    # A Ray learner never records rollouts: samples that reach it, learned or dropped, are its "collected".
    recorder, registry = registry_for("standard", "learner")
    recorder.record_learn({**fake_learner_stats(), "samples": 64.0, "samples_learned": 256.0})
    assert registry.get_sample_value("rlvitals_learner_training_intensity") == 4.0
    recorder.record_dropped("stale", 64.0)
    recorder.record_learn({**fake_learner_stats(), "samples": 64.0, "samples_learned": 256.0})
    assert registry.get_sample_value("rlvitals_learner_training_intensity") == 512.0 / 192.0
    recorder.record_learn({**fake_learner_stats(), "samples": 0.0, "samples_learned": 0.0, "nonfinite": 1.0,
                           "nonfinite_samples": 64.0})
    assert registry.get_sample_value("rlvitals_learner_training_intensity") == 512.0 / 256.0


def test_episode_window_keeps_the_last_100():
    recorder, registry = registry_for("minimal")
    recorder.record_rollout(make_rollout(returns=[0.0] * 150, lengths=[1] * 150, successes=[]))
    recorder.record_rollout(make_rollout(returns=[1.0] * 60, lengths=[2] * 60, successes=[]))
    assert registry.get_sample_value("rlvitals_actor_episode_return", {"stat": "mean"}) == 0.6
    assert registry.get_sample_value("rlvitals_actor_episodes_total") == 210


def test_minimal_level_has_no_learner_diagnostics():
    recorder, registry = registry_for("minimal")
    stats = {**fake_learner_stats(), "value_trace": [1.0, 2.0], "reward_trace": [0.0, 1.0]}
    recorder.record_learn(stats)
    recorder.record_rollout(make_rollout())
    present = served_metrics(registry)
    for m in METRICS:
        assert (m.name in present) == (m.level == "minimal"), m.name
    assert registry.get_sample_value("rlvitals_learner_steps_total") == stats["learner_steps"]
    assert registry.get_sample_value("rlvitals_learner_relative_entropy_ratio") is None
    assert registry.get_sample_value("rlvitals_actor_phase_seconds_total", {"phase": "env_step"}) is None


def test_standard_level_has_no_debug_views():
    recorder, registry = registry_for("standard")
    recorder.record_learn({**fake_learner_stats(), "value_trace": [1.0, 2.0], "reward_trace": [0.0, 1.0],
                           "layer_weight_rms/policy_out": 0.5})
    assert not recorder.wants_value_trace and not recorder.wants_debug
    assert registry.get_sample_value("rlvitals_learner_relative_entropy_ratio") is not None
    present = served_metrics(registry)
    for m in METRICS:
        assert (m.name in present) == (m.level != "debug"), m.name


def test_debug_level_has_value_trace_layers_and_distributions():
    recorder, registry = registry_for("debug")
    assert recorder.wants_value_trace and recorder.wants_debug
    bounds = BY_NAME["rlvitals_learner_value_target_distribution"].buckets
    counts = [0.0] * (len(bounds) + 1)
    counts[bounds.index(1.0)] = 5.0        # five targets in (0.3, 1]
    counts[-1] = 2.0                       # two above 1000
    recorder.record_learn({**fake_learner_stats(), "value_trace": [0.5, 0.75, 1.0], "reward_trace": [0, 0, 1.0],
                           "layer_weight_rms/policy_out": 0.5, "layer_gradient_rms/policy_out": 0.01,
                           "layer_activation_std/mlp.1": 0.3, "layer_dead_ratio/mlp.1": 0.0,
                           "target_hist": (counts, 2007.0), "advantage_hist": ([0.0] * len(counts), 0.0)})
    get = registry.get_sample_value
    assert get("rlvitals_learner_value_trace", {"series": "value", "step": "1"}) == 0.75
    assert get("rlvitals_learner_value_trace", {"series": "reward", "step": "2"}) == 1.0
    assert get("rlvitals_learner_value_trace", {"series": "value", "step": "3"}) is None
    assert get("rlvitals_learner_layer_weight_rms", {"layer": "policy_out"}) == 0.5
    assert get("rlvitals_learner_layer_gradient_rms", {"layer": "policy_out"}) == 0.01
    assert get("rlvitals_learner_layer_activation_std", {"layer": "mlp.1"}) == 0.3
    assert get("rlvitals_learner_layer_dead_ratio", {"layer": "mlp.1"}) == 0.0
    hist = "rlvitals_learner_value_target_distribution_bucket"
    assert get(hist, {"le": "0.3"}) == 0
    assert get(hist, {"le": "1.0"}) == 5
    assert get(hist, {"le": "1000.0"}) == 5
    assert get(hist, {"le": "+Inf"}) == 7


def test_components_filter_metrics():
    recorder, registry = registry_for("debug", "actor")
    recorder.record_learn({**fake_learner_stats(), "value_trace": [1.0]})
    recorder.record_rollout(make_rollout())
    names = served_metrics(registry)
    assert names == {m.name for m in METRICS if m.component in COMPONENTS["actor"]}
    assert registry.get_sample_value("rlvitals_actor_env_steps_total") == 7


def test_hardware_families_exist_without_samples_when_there_is_no_gpu(monkeypatch):
    fake_nvml = types.ModuleType("pynvml")

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    fake_nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recorder, registry = registry_for("standard")
    present = families(registry)
    for m in METRICS:
        if m.hardware:
            assert m.name in present, f"{m.name} must be declared even without hardware"
            assert present[m.name].samples == [], m.name
    text = generate_latest(registry).decode()
    for m in METRICS:
        if m.hardware:
            assert f"# HELP {m.name} " in text
    assert registry.get_sample_value("rlvitals_process_resident_memory_bytes") > 0


def test_system_collector_on_this_machine():
    """Whatever this machine has (GPU or not), a scrape works and hardware samples carry an index."""
    recorder, registry = registry_for("standard")
    for family in registry.collect():
        metric = family_metric(family.name)
        for sample in family.samples:
            assert math.isfinite(sample.value), sample
            if metric.hardware:
                index = sample.labels[metric.labels[0]]
                assert index.isdigit(), sample
    assert registry.get_sample_value("rlvitals_process_cpu_seconds_total") > 0


def test_exposed_names_match_the_exposition():
    recorder, registry = registry_for("debug")
    recorder.record_learn(fake_learner_stats())
    text = generate_latest(registry).decode()
    names = {sample_name(line) for line in sample_lines(text)}
    for name in names:
        metric_of(name)  # every served sample belongs to a catalogue metric
    for m in METRICS:
        if m.kind == "histogram":
            assert set(exposed_names(m)) <= names, m.name


def test_learner_stats_provide_every_catalogue_source(test_env):
    _, env_spec = test_env
    cfg = TrainConfig(env=env_spec, progress=False).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    telemetry = RecorderTelemetry(Recorder("debug", "local"))
    learner = make_learner(cfg, net, CPU, telemetry)
    try:
        stats = learner.learn(runner.collect(net, cfg.rollout_length))
    finally:
        runner.close()
    learners = {inv.statistic for inv in INVARIANTS} & set(LEARNER_STATISTICS)
    for m in sourced("learner", ("gauge",)):
        if m.name in ("rlvitals_learner_training_intensity", "rlvitals_learner_rollouts_alive",
                      "rlvitals_learner_staleness_batches", "rlvitals_learner_actor_weights_mismatch_ratio",
                      "rlvitals_learner_actors_slow", "rlvitals_learner_actors_silent",
                      "rlvitals_learner_actor_inference_cost_ratio", "rlvitals_learner_actor_env_step_cost_ratio",
                      "rlvitals_invariant_broken", "rlvitals_rule_held_updates"):
            continue  # the recorder, the run's learn step or its health monitor adds these
        if m.only_in:
            continue  # a feed-forward learner has none (tests/test_recurrent.py checks a recurrent one's)
        for _, key in label_sets(m):
            if m.name == "rlvitals_invariant_statistic" and (key not in learners or key in OCCASIONAL_KEYS):
                # the witness's and the run's own statistics (actors/witness.py, rlvitals/evidence.py), and the
                # learner's that need a setting this run leaves off (reward and observation normalisation)
                continue
            assert key in stats, f"{m.name} reads stats[{key!r}], which PPOLearner.learn does not provide"
            assert math.isfinite(stats[key]), (key, stats[key])  # every statistic is defined on this env
    for key in ("learner_steps", "updates", "samples", "samples_learned", "time_transfer",
                "time_forward_backward", "time_optimizer", "staleness"):
        assert key in stats
    assert len(stats["value_trace"]) == len(stats["reward_trace"]) == cfg.rollout_length
    scale = layer_counts(net)
    assert sum(k.startswith("layer_weight_rms/") for k in stats) == scale["linear layer"]
    assert sum(k.startswith("layer_gradient_rms/") for k in stats) == scale["linear layer"]
    assert sum(k.startswith("layer_activation_std/") for k in stats) == scale["activation layer"]
    assert sum(k.startswith("layer_dead_ratio/") for k in stats) == scale["activation layer"]
    counts, _ = stats["target_hist"]
    assert sum(counts) == stats["samples"]
