"""Telemetry: the catalogue's rules, the recorder and collectors, the telemetry interface, and real
runs scraped over HTTP by us, by promtool and by a real Prometheus. (That the learner's statistics
have the right values is tested in test_diagnostics.py.)

Layout:
  1. catalogue rules                     (pure data)
  2. recorder + collectors               (fresh registry per test, hand-built inputs)
  3. the telemetry interface             (no-op, recorder-backed and served implementations)
  4. live runs scraped over HTTP         (`rlvitals train` subprocesses, promtool)
  5. a real Prometheus scrapes a run     (the `prometheus` fixture from conftest.py)
  6. series per process                  (against the budget documented in telemetry/reference.py)
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from itertools import product
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, http_get
from rlvitals.actors.rollout import EpisodeStats, Rollout
from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.learner.networks import ActorCritic
from rlvitals.telemetry import reference
from rlvitals.telemetry.catalogue import (
    BY_NAME,
    KINDS,
    LEVELS,
    METRICS,
    STALENESS_BUCKETS,
    Metric,
    exposed_names,
    metrics_at,
)
from rlvitals.telemetry.interface import NULL_TELEMETRY, NullTelemetry, RecorderTelemetry, Telemetry
from rlvitals.telemetry.process import ProcessTelemetry, build_registry, start_telemetry
from rlvitals.telemetry.recorder import COMPONENTS, Recorder, UnknownMetricError
from rlvitals.training import make_learner, make_network, seed_everything

CPU = torch.device("cpu")
LIVE_LEVELS = ("minimal", "standard", "debug")
LIVE_STEPS = 20_000

# A tiny env in which every statistic is defined: 3 to 5 steps per episode, a final reward that
# varies (with an observed sign and the last action), success reported in `info`. Written to a
# temporary module so `rlvitals train --env module:EnvId` can import it in a subprocess.
TEST_ENV_MODULE = "rlvitals_telemetry_test_env"
TEST_ENV_ID = "rlvitals_test/TerminalReward-v0"
TEST_ENV_SOURCE = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TerminalRewardEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._sign, self._length, self._t = 0.0, 3, 0

    def _obs(self):
        return np.array([self._sign, self._t / 8.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sign = float(self.np_random.uniform(-1.0, 1.0))
        self._length = int(self.np_random.integers(3, 6))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        terminated = self._t >= self._length
        reward, info = 0.0, {}
        if terminated:
            reward = self._sign + (0.5 if int(action) == 1 else -0.5)
            info["is_success"] = reward > 0
        return self._obs(), reward, terminated, False, info


if "{env_id}" not in gym.registry:
    gym.register("{env_id}", entry_point=TerminalRewardEnv, disable_env_checker=True)
'''.replace("{env_id}", TEST_ENV_ID)


@pytest.fixture(scope="session")
def test_env(tmp_path_factory):
    """(folder holding the env module, `module:EnvId` to train on); also importable in this process."""
    folder = tmp_path_factory.mktemp("envmodule")
    (folder / f"{TEST_ENV_MODULE}.py").write_text(TEST_ENV_SOURCE)
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(TEST_ENV_MODULE)
        yield folder, f"{TEST_ENV_MODULE}:{TEST_ENV_ID}"
    finally:
        sys.path.remove(str(folder))


# ---------------------------------------------------------------- helpers
def label_sets(metric: Metric):
    """(labels dict, stats key) for every closed label combination of a metric with a source."""
    if not metric.labels:
        return [({}, metric.source)]
    combos = product(*(metric.label_values[n] for n in metric.labels))
    return [(dict(zip(metric.labels, c, strict=True)), metric.source.format(**dict(zip(metric.labels, c, strict=True))))
            for c in combos]


def sourced(component: str, kinds=("gauge", "counter")) -> list[Metric]:
    return [m for m in METRICS if m.component == component and m.source and m.kind in kinds
            and all(label in m.label_values for label in m.labels)]


def fake_learner_stats(offset: float = 0.0) -> dict:
    """A stats dict like PPOLearner.learn's, with a distinct value for every catalogue source key."""
    stats = {}
    for m in sourced("learner"):
        for _, key in label_sets(m):
            stats[key] = offset + 0.5 + 0.25 * len(stats)
    stats.pop("training_intensity")  # the recorder computes it
    for key in ("time_wait", "time_publish"):  # reported with record_phase, not by learn()
        stats.pop(key)
    stats.update(staleness=3.0, samples=64.0, samples_learned=256.0, nonfinite=0.0, nonfinite_samples=0.0)
    return stats


def make_rollout(returns=(1.0, 3.0), lengths=(10, 20), successes=(1.0, 0.0), env_steps=7, age=5,
                 timings=None) -> Rollout:
    T, N = 4, 2
    return Rollout(
        obs=torch.zeros(T + 1, N, 1), actions=torch.zeros(T, N, dtype=torch.int64), rewards=torch.zeros(T, N),
        terminated=torch.zeros(T, N, dtype=torch.bool), truncated=torch.zeros(T, N, dtype=torch.bool),
        valid=torch.ones(T, N, dtype=torch.bool), behaviour_params=torch.zeros(T, N, 2),
        behaviour_logp=torch.zeros(T, N), policy_age=age,
        episodes=EpisodeStats(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64),
                              successes=np.asarray(successes, np.float64)),
        timings=timings if timings is not None else {"env_step": 0.25, "inference": 0.5},
        valid_count=env_steps)


def registry_for(level: str, component: str = "local"):
    recorder = Recorder(level, component)
    return recorder, build_registry(recorder)


def families(registry) -> dict:
    return {f.name: f for f in registry.collect()}


def family_metric(family_name: str) -> Metric:
    """The catalogue metric of a collected family (counter families drop _total, info families _info)."""
    for name in (family_name, family_name + "_total", family_name + "_info"):
        if name in BY_NAME:
            return BY_NAME[name]
    raise AssertionError(f"family {family_name} is not in the catalogue")


def served_metrics(registry) -> set[str]:
    return {family_metric(name).name for name in families(registry)}


def sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def sample_name(line: str) -> str:
    return re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)


EXPOSED = {name: m for m in METRICS for name in exposed_names(m)}


def metric_of(sample: str) -> Metric:
    assert sample in EXPOSED, f"sample {sample} belongs to no catalogue metric"
    return EXPOSED[sample]


def non_hardware_lines(text: str) -> list[str]:
    return [line for line in sample_lines(text) if not metric_of(sample_name(line)).hardware]


def layer_counts(net: torch.nn.Module) -> dict[str, int]:
    linear = sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) for m in net.modules())
    activation = sum(isinstance(m, (torch.nn.ReLU, torch.nn.Tanh)) for m in net.modules())
    return {"linear layer": linear, "activation layer": activation}


def expected_series(component: str, level: str, scale: dict[str, int]) -> int:
    """Non-hardware series of a process: fixed ones plus the per-layer/per-step ones for this run."""
    fixed, per = reference.process_series(component, level)
    return fixed + sum(n * scale[unit] for unit, n in per.items() if unit in scale)


# ======================================================================
# 1. Catalogue rules
# ======================================================================
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
LABEL = re.compile(r"^[a-z_][a-z0-9_]*$")
UNIT_SUFFIX = {"s": "_seconds", "bytes": "_bytes", "percentunit": "_ratio", "celsius": "_celsius",
               "watt": "_watts"}


def test_names_are_prefixed_unique_and_typed():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names)), "duplicate metric names"
    for m in METRICS:
        assert NAME.match(m.name), m.name
        assert m.name.startswith("rlvitals_"), m.name
        assert m.kind in KINDS, (m.name, m.kind)
        if m.kind == "counter":
            assert m.name.endswith("_total"), f"counter {m.name} must end with _total"
        else:
            assert not m.name.endswith("_total"), f"{m.kind} {m.name} must not end with _total"
        if m.kind == "info":
            assert m.name.endswith("_info"), m.name
    # Exposed sample names must not collide either (a histogram's _count with another metric).
    exposed = [n for m in METRICS for n in exposed_names(m)]
    assert len(exposed) == len(set(exposed))


def test_units_in_names_match_declared_units():
    for m in METRICS:
        base = m.name.removesuffix("_total")
        for unit, suffix in UNIT_SUFFIX.items():
            if m.unit == unit:
                assert base.endswith(suffix), f"{m.name} has unit {unit}: its name must end with {suffix}"
            else:
                assert not base.endswith(suffix), f"{m.name} ends with {suffix} but its unit is {m.unit}"
        assert m.unit in reference.UNIT_TEXT, f"{m.name}: unit {m.unit} is not documented"


def test_every_label_is_bounded():
    open_ok = set(reference.IDENTITY_LABELS) | set(reference.HARDWARE_LABELS) | set(reference.DYNAMIC_LABELS)
    for m in METRICS:
        assert len(set(m.labels)) == len(m.labels), m.name
        assert set(m.label_values) <= set(m.labels), f"{m.name}: label_values for labels it does not have"
        for label in m.labels:
            assert LABEL.match(label) and not label.startswith("__"), (m.name, label)
            assert label not in ("le", "quantile"), (m.name, label)
            if label in m.label_values:
                values = m.label_values[label]
                assert values and len(set(values)) == len(values), (m.name, label, values)
            else:
                # Only per-layer, per-step, run-identity and device-index labels may be open.
                assert label in open_ok, f"{m.name}: label {label!r} has no closed set of values"
                if label in reference.IDENTITY_LABELS:
                    assert m.kind == "info", f"{m.name}: run identity belongs on the info metric only"
                if label in reference.HARDWARE_LABELS:
                    assert m.hardware, f"{m.name}: device-index label on a non-hardware metric"
                if label in reference.DYNAMIC_LABELS:
                    assert m.level == "debug", f"{m.name}: per-layer/per-step label below debug"


def test_no_actor_or_episode_labels_below_debug():
    for m in METRICS:
        if m.level != "debug":
            assert not set(m.labels) & set(reference.FORBIDDEN_LABELS), m.name


def test_catalogue_entries_are_well_formed():
    for m in METRICS:
        assert m.level in LEVELS and m.level != "off", (m.name, m.level)
        assert m.component in reference.COMPONENT_TEXT, f"component {m.component} has no section text"
        assert any(m.component in comps for comps in COMPONENTS.values()), f"no process exports {m.name}"
        assert len(m.help) > 10 and m.help.endswith(".") and m.help == m.help.strip() and "\n" not in m.help, m.name
        if m.kind == "histogram":
            assert m.buckets and list(m.buckets) == sorted(set(m.buckets)), m.name
        else:
            assert m.buckets is None, m.name
        if m.hardware:
            assert m.component in ("process", "gpu"), m.name
        if m.source:
            for _, key in label_sets(m) if all(lb in m.label_values for lb in m.labels) else []:
                assert "{" not in key, (m.name, key)


# ======================================================================
# 2. Recorder and collectors
# ======================================================================
def test_record_learn_sets_every_learner_gauge_from_its_stats_key():
    recorder, registry = registry_for("standard")
    stats = fake_learner_stats()
    recorder.record_learn(stats)
    for m in sourced("learner", ("gauge",)):
        if m.name in ("rlvitals_learner_training_intensity", "rlvitals_learner_rollouts_alive",
                      "rlvitals_learner_staleness_batches"):
            continue  # the recorder or the run's learn step adds these to the learner's statistics
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
    assert get("rlvitals_actor_weight_version") == 5
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
    assert get("rlvitals_actor_weight_version") == 7
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
    for m in sourced("learner", ("gauge",)):
        if m.name in ("rlvitals_learner_training_intensity", "rlvitals_learner_rollouts_alive",
                      "rlvitals_learner_staleness_batches"):
            continue  # the recorder or the run's learn step adds these to the learner's statistics
        for _, key in label_sets(m):
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


# ======================================================================
# 3. The telemetry interface
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


# ======================================================================
# 4. Live runs scraped over HTTP
# ======================================================================
def rlvitals_command() -> list[str]:
    script = Path(sys.executable).with_name("rlvitals")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rlvitals.cli"]


class LiveRun:
    """`rlvitals train` in a subprocess with its /metrics on a free port; killed if a test fails."""

    def __init__(self, run_dir: Path, level: str, env: str, steps: int, pythonpath: Path | None = None):
        self.run_dir, self.level = run_dir, level
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.log_path = run_dir.with_name(run_dir.name + ".log")
        environ = {k: v for k, v in os.environ.items() if k != "RLVITALS_VERBOSITY"}
        if pythonpath is not None:
            environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), environ.get("PYTHONPATH")]))
        command = rlvitals_command() + [
            "train", "--env", env, "--total-env-steps", str(steps), "--verbosity", level,
            "--metrics-port", str(self.port), "--progress", "false", "--run-dir", str(run_dir), "--device", "cpu"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                            stdin=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.alive:
            self.process.kill()
            self.process.wait(timeout=30)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def scrape(self) -> str | None:
        status, body = http_get(self.url, timeout=5)
        return body.decode() if status == 200 else None

    def discovery_files(self) -> list[Path]:
        return sorted((self.run_dir / "discovery").glob("*.json"))

    def run_id(self) -> str:
        return json.loads((self.run_dir / "meta.json").read_text())["run_id"]

    def wait(self, timeout: float = 120) -> int:
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def parse(text: str) -> tuple[dict[str, str], list]:
    """(HELP text by metric name, samples) of an exposition."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, flags=re.M))
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return helps, samples


def check_with_promtool(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); the other checks passed")
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert result.returncode == 0, f"promtool check metrics failed:\n{result.stdout.decode()}{result.stderr.decode()}"


@pytest.mark.slow
@pytest.mark.parametrize("level", LIVE_LEVELS)
def test_live_run_exports_exactly_its_level(level, tmp_path, test_env):
    env_dir, env_spec = test_env
    expected = metrics_at(level)
    assert {m.name for m in expected} == {m.name for m in Recorder(level, "local").metrics}
    needs_samples = {m.name for m in expected if not m.hardware}
    seen_targets: list = []  # [(number of discovery files, content of the first)] while alive

    def ready(text: str) -> bool:
        _, samples = parse(text)
        names = {s.name for s in samples}
        steps = [s.value for s in samples if s.name == "rlvitals_learner_steps_total"]
        return bool(steps) and steps[0] > 0 and all(
            any(n in names for n in exposed_names(BY_NAME[name])) for name in needs_samples)

    with LiveRun(tmp_path / "run", level, env_spec, LIVE_STEPS, pythonpath=env_dir) as run:
        text, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline:
            alive = run.alive
            files = run.discovery_files() if alive and not seen_targets else []
            if files:
                try:
                    seen_targets.append((len(files), json.loads(files[0].read_text())))
                except (FileNotFoundError, json.JSONDecodeError):
                    pass
            got = run.scrape()
            if got is not None:
                text = got
                if ready(text) and seen_targets:
                    break
            if not alive:
                break
            time.sleep(0.03)
        assert text is not None, f"never scraped {run.url}; run output:\n{run.output()}"
        helps, samples = parse(text)
        names = {s.name for s in samples}
        missing = sorted(n for n in needs_samples if not any(e in names for e in exposed_names(BY_NAME[n])))
        assert ready(text), (f"the run ended or timed out before every {level} metric had a sample; "
                             f"missing: {missing}; output:\n{run.output()}")

        # Every metric at or below the level is declared, with the catalogue's help text ...
        for m in expected:
            assert helps.get(m.name) == m.help, f"{m.name}: HELP missing or different from the catalogue"
        # ... nothing above it is, and nothing outside the catalogue is served at all.
        for m in METRICS:
            if not m.at(level):
                assert m.name not in helps, f"{m.name} ({m.level}) served at {level}"
                assert not set(exposed_names(m)) & names, f"{m.name} ({m.level}) has samples at {level}"
        assert set(helps) <= {m.name for m in expected}
        for name in names:
            assert metric_of(name).name in helps, name
        for s in samples:
            assert not set(s.labels) & set(reference.FORBIDDEN_LABELS), s

        # Exactly the documented number of series (hardware ones aside).
        net = ActorCritic(*_spaces(env_spec))
        scale = {**layer_counts(net), "rollout step": TrainConfig().rollout_length}
        assert len(non_hardware_lines(text)) == expected_series("local", level, scale)

        # Values that must hold in any synchronous local run.
        run_id = run.run_id()
        info = [s for s in samples if s.name == "rlvitals_run_info"]
        assert len(info) == 1 and info[0].labels["run_id"] == run_id and info[0].labels["mode"] == "local"
        assert info[0].labels["env"] == env_spec
        values = {s.name: s.value for s in samples if not s.labels}
        assert values["rlvitals_learner_samples_consumed_total"] > 0
        assert values["rlvitals_actor_env_steps_total"] >= values["rlvitals_learner_samples_consumed_total"]
        if level != "minimal":
            staleness = {s.labels.get("le"): s.value for s in samples
                         if s.name == "rlvitals_learner_sample_staleness_steps_bucket"}
            assert staleness["0.0"] == staleness["+Inf"] == values["rlvitals_learner_sample_staleness_steps_count"] > 0
            assert values["rlvitals_learner_training_intensity"] == TrainConfig().update_epochs
            assert -1 <= values["rlvitals_learner_terminal_correlation"] <= 1

        check_with_promtool(text)

        # The discovery file existed while the run was alive and pointed at this port.
        assert seen_targets, "no discovery file while the run was alive"
        count, target = seen_targets[0]
        assert count == 1
        assert target == [{"targets": [f"127.0.0.1:{run.port}"],
                           "labels": {"component": "local", "run_id": run_id}}]

        rc = run.wait()
        assert rc == 0, run.output()
        assert run.discovery_files() == [], "discovery file left behind after the run ended"
        assert (run.run_dir / "summary.json").is_file()
        assert http_get(run.url, timeout=2)[0] == 0, "/metrics still answers after the run ended"


def _spaces(env_spec: str):
    from rlvitals.actors.envs import make_vector_env

    env = make_vector_env(env_spec, 1)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def _listening(pid: int) -> list:
    proc = psutil.Process(pid)
    connections = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections("inet")
    return [c for c in connections if c.status == psutil.CONN_LISTEN]


@pytest.mark.slow
def test_level_off_serves_nothing(tmp_path):
    with LiveRun(tmp_path / "run", "off", "CartPole-v1", LIVE_STEPS) as run:
        checked, deadline = 0, time.monotonic() + 120
        while run.alive and time.monotonic() < deadline:
            if (run.run_dir / "meta.json").is_file():  # the archive exists: training is under way
                try:
                    assert _listening(run.process.pid) == [], "a run at verbosity off listens on a socket"
                except psutil.NoSuchProcess:
                    break
                assert http_get(run.url, timeout=1)[0] == 0
                assert not (run.run_dir / "discovery").exists() or run.discovery_files() == []
                checked += 1
            time.sleep(0.05)
        rc = run.wait()
        assert rc == 0, run.output()
        assert checked > 0, "the run ended before it could be checked"
        assert not (run.run_dir / "discovery").exists() or run.discovery_files() == []
        assert (run.run_dir / "summary.json").is_file()


# ======================================================================
# 5. A real Prometheus scrapes a live run through its discovery file
# ======================================================================
@pytest.mark.slow
def test_prometheus_discovers_and_scrapes_a_live_run(prometheus, tmp_path):
    steps = 50_000_000  # far more than it will run: stopped with SIGTERM once Prometheus has it
    with LiveRun(tmp_path / "run", "minimal", "CartPole-v1", steps) as run:
        deadline = time.monotonic() + 90
        while run.alive and not run.discovery_files() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.alive and run.discovery_files(), f"no discovery file; output:\n{run.output()}"
        run_id = run.run_id()
        copy = prometheus.discovery_dir / f"run-{run_id}.json"
        shutil.copy(run.discovery_files()[0], copy)
        try:
            query = f'rlvitals_learner_steps_total{{run_id="{run_id}"}}'
            result, deadline = [], time.monotonic() + 60
            while time.monotonic() < deadline:
                assert run.alive, f"the run ended before Prometheus scraped it:\n{run.output()}"
                result = prometheus.query(query)
                if result and float(result[0]["value"][1]) > 0:
                    break
                time.sleep(0.25)
            assert result, (f"Prometheus returned nothing for {query}; targets: {prometheus.targets()}; "
                            f"log:\n{prometheus.log()}")
            assert float(result[0]["value"][1]) > 0
            labels = result[0]["metric"]
            assert labels["run_id"] == run_id
            assert labels["component"] == "local"
            assert labels["job"] == "rlvitals"
            assert labels["instance"] == f"127.0.0.1:{run.port}"
            info = prometheus.query(f'rlvitals_run_info{{run_id="{run_id}"}}')
            assert len(info) == 1 and info[0]["metric"]["env"] == "CartPole-v1"
            assert run.alive
        finally:
            copy.unlink(missing_ok=True)
        run.process.send_signal(signal.SIGTERM)  # stop gracefully: finish the update, write the archive
        assert run.wait(timeout=60) == 0, run.output()
        assert run.discovery_files() == []
        summary = json.loads((run.run_dir / "summary.json").read_text())
        assert 0 < summary["env_steps"] < steps


# ======================================================================
# 6. Series per process, against the documented budget
# ======================================================================
@pytest.mark.parametrize("level", LEVELS)
def test_actor_series_per_level(level):
    recorder, registry = registry_for(level, "actor")
    recorder.set_info(run_id="abc", env="CartPole-v1", algorithm="ppo", mode="ray", code_version="x")
    recorder.record_rollout(make_rollout())
    lines = non_hardware_lines(generate_latest(registry).decode())
    assert len(lines) == reference.ACTOR_SERIES[level], "\n".join(lines)
    assert reference.process_series("actor", level) == (reference.ACTOR_SERIES[level],
                                                        {} if level in ("off", "minimal") else {"CUDA device": 4})
    assert reference.ACTOR_SERIES["minimal"] <= 30


@pytest.mark.parametrize("level", LEVELS)
def test_learner_and_local_series_per_level(level, test_env):
    """A real batch through real recorders serves exactly the documented number of series."""
    _, env_spec = test_env
    cfg = TrainConfig(env=env_spec, progress=False).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    local_recorder, local_registry = registry_for(level, "local")
    local = RecorderTelemetry(local_recorder)
    learner_recorder, learner_registry = registry_for(level, "learner")
    learner = make_learner(cfg, net, CPU, local)
    try:
        rollout = runner.collect(net, cfg.rollout_length)
        local.record_rollout(rollout)
        # What the run's learn step adds to the learner's statistics (rlvitals.run.Run.learn_step).
        stats = {**learner.learn(rollout), "rollouts_alive": 1.0, "staleness_batches": 0.0}
    finally:
        runner.close()
    scale = {**layer_counts(net), "rollout step": cfg.rollout_length}
    for recorder, registry, component in ((local_recorder, local_registry, "local"),
                                          (learner_recorder, learner_registry, "learner")):
        telemetry = RecorderTelemetry(recorder)
        recorder.set_info(run_id="abc", env=env_spec, algorithm="ppo", mode="local", code_version="x")
        telemetry.record_learn(stats)
        telemetry.record_queue(0, 1)
        lines = non_hardware_lines(generate_latest(registry).decode())
        assert len(lines) == expected_series(component, level, scale), (component, level)
        assert reference.process_series(component, level)[0] == reference.DOCUMENTED_SERIES[component][level]
    assert reference.LEARNER_SERIES["minimal"] <= 30


def test_documented_series_match_the_catalogue():
    for component, documented in reference.DOCUMENTED_SERIES.items():
        assert set(documented) == set(LEVELS)
        for level in LEVELS:
            assert reference.process_series(component, level)[0] == documented[level], (component, level)


def test_reference_defaults_match_the_config():
    cfg = TrainConfig()
    assert reference.DEFAULT_LEVEL == cfg.verbosity
    runner = EnvRunner(cfg.env, 1, 0)
    try:
        net = make_network(cfg, runner.obs_space, runner.action_space)
    finally:
        runner.close()
    assert reference.DEFAULT_RUN_SCALE == {**layer_counts(net), "rollout step": cfg.rollout_length}


def test_documented_verbosity_precedence(tmp_path, monkeypatch):
    """Flag beats the config file, the config file beats RLVITALS_VERBOSITY, which beats the default."""
    from rlvitals.cli import build_parser, train_config_from_args

    def level(*argv: str) -> str:
        return train_config_from_args(build_parser().parse_args(["train", *argv])).verbosity

    config = tmp_path / "run.yaml"
    config.write_text("verbosity: minimal\n")
    monkeypatch.delenv("RLVITALS_VERBOSITY", raising=False)
    assert level() == reference.DEFAULT_LEVEL
    monkeypatch.setenv("RLVITALS_VERBOSITY", "debug")
    assert level() == "debug"
    assert level("--config", str(config)) == "minimal"
    assert level("--config", str(config), "--verbosity", "off") == "off"
    assert level("--verbosity", "standard") == "standard"


def test_reference_page_is_current(tmp_path, capsys):
    assert reference.main(["--check"]) == 0, "docs/metrics.md is stale: run python -m rlvitals.telemetry.reference"
    page = reference.render()
    for m in METRICS:
        assert f"### `{m.name}`" in page and m.help in page, m.name
    stale = tmp_path / "metrics.md"
    stale.write_text(page.replace("rlvitals_learner_kl_divergence_nats", "rlvitals_old_name"))
    assert reference.main(["--check", "--output", str(stale)]) == 1
    assert reference.main(["--check", "--output", str(tmp_path / "missing.md")]) == 1
    assert reference.main(["--output", str(stale)]) == 0
    assert reference.main(["--check", "--output", str(stale)]) == 0
    assert stale.read_text() == page
