"""Telemetry's catalogue: its naming and labelling rules, and the series per process against the budget
documented in telemetry/reference.py (with the generated reference page kept current).
"""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest
from telemetry_support import (
    CPU,
    expected_series,
    installed_test_env,
    label_sets,
    layer_counts,
    make_rollout,
    non_hardware_lines,
    registry_for,
)

from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.costs import actor_cost_ratios
from rlvitals.telemetry import reference
from rlvitals.telemetry.catalogue import (
    KINDS,
    LEVELS,
    METRICS,
    exposed_names,
)
from rlvitals.telemetry.health import HealthMonitor
from rlvitals.telemetry.interface import RecorderTelemetry
from rlvitals.telemetry.invariant_monitor import InvariantMonitor
from rlvitals.telemetry.invariants import INVARIANTS
from rlvitals.telemetry.recorder import COMPONENTS
from rlvitals.training import make_learner, make_network, seed_everything


@pytest.fixture(scope="session")
def test_env(tmp_path_factory):
    with installed_test_env(tmp_path_factory) as env:
        yield env


# ======================================================================
# Catalogue rules
# ======================================================================
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
LABEL = re.compile(r"^[a-z_][a-z0-9_]*$")
UNIT_SUFFIX = {"s": "_seconds", "bytes": "_bytes", "percentunit": "_ratio", "celsius": "_celsius",
               "watt": "_watts", "suffix:nats": "_nats"}


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
            elif not (suffix == "_ratio" and m.unit == "none"):  # a ratio that can exceed 1: a plain number
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
# Series per process, against the documented budget
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
        # What the run's learn step adds to the learner's statistics (rlvitals.run.Run.learn_step; actors_slow: Ray).
        stats = {**learner.learn(rollout), "rollouts_alive": 1.0, "staleness_batches": 0.0, "actors_slow": 0.0,
                 "actors_silent": 0.0, **actor_cost_ratios(rollout),
                 "weights_mismatch": 0.0, **{inv.statistic: 0.0 for inv in INVARIANTS}}
        stats.update(InvariantMonitor().observe(stats, 1))
    finally:
        runner.close()
    scale = {**layer_counts(net), "rollout step": cfg.rollout_length}
    for recorder, registry, component in ((local_recorder, local_registry, "local"),
                                          (learner_recorder, learner_registry, "learner")):
        telemetry = RecorderTelemetry(recorder)
        recorder.set_info(run_id="abc", env=env_spec, algorithm="ppo", mode="local", code_version="x")
        telemetry.record_learn(stats)
        telemetry.record_queue(0, 1)
        HealthMonitor(on_held=telemetry.record_rule_held)({"updates": 1, **stats})   # what the run's rows add
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
