"""Health rules: one source, generated alert rules, and Prometheus agreeing with the offline evaluator.

1. The committed alert rules and docs/health.md are what telemetry/rules.py generates, and
   promtool accepts the rules.
2. Every rule reads catalogued series, names a component of the fixed vocabulary, and links to
   its section of the docs.
3. The expression language means the same thing in PromQL and offline (hand-worked cases).
4. On series recorded from real runs, `promtool test rules` expects exactly the alerts the offline
   evaluator computes: tests/test_diagnosis.py replays every healthy and planted-bug run it makes.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from rlvitals.telemetry import rulegen
from rlvitals.telemetry.catalogue import BY_NAME
from rlvitals.telemetry.fleet_rules import PROCESSES, RECORDING
from rlvitals.telemetry.health import HealthMonitor, RowSeries, evaluate_rows
from rlvitals.telemetry.promexpr import Delta, Series
from rlvitals.telemetry.rules import RULES, Live, S, thresholds
from rlvitals.telemetry.verdicts import COMPONENTS

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool is not on PATH (bash deploy/setup.sh --test installs it)")


def test_generated_files_are_current():
    assert rulegen.main(["--check"]) == 0, "run `python -m rlvitals.telemetry.rulegen`"


def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(rulegen.RULES_FILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULES) + len(RECORDING)} rules found" in result.stdout


def test_every_rule_is_well_formed():
    docs = rulegen.DOCS_FILE.read_text()
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert re.fullmatch(r"RL[A-Z][A-Za-z]+", rule.name)
        assert rule.component in COMPONENTS
        assert "{{ $labels.run_id }}" in rule.summary
        assert f"### {rule.name}" in docs
        if isinstance(rule.condition, Live):
            assert all(n == "up" or n in BY_NAME for n in rule.condition.reads), rule.name
    generated = yaml.safe_load(rulegen.RULES_FILE.read_text())
    alerts = [r for g in generated["groups"] for r in g["rules"] if "alert" in r]
    assert [a["alert"] for a in alerts] == [r.name for r in RULES if r.horizon == "fast" and r.name not in PROCESSES] \
        + [r.name for r in RULES if r.horizon == "slow"] + list(PROCESSES)
    recorded = [r["record"] for g in generated["groups"] for r in g["rules"] if "record" in r]
    assert recorded == [name for name, _ in RECORDING]
    for a in alerts:
        assert a["labels"]["component"] in COMPONENTS
        anchor = a["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor == a["alert"].lower() and f"### {a['alert']}" in docs


def test_series_lookup_follows_prometheus_semantics():
    series = RowSeries()
    for t, v in ((0.5, 1.0), (2.0, 3.0), (400.0, 5.0)):
        series.add({"wall_seconds": t, "kl": v})
    assert series.lookup("kl", 0.4) is None            # nothing yet
    assert series.lookup("kl", 1.9) == 1.0             # the latest sample at or before t
    assert series.lookup("kl", 2.0) == 3.0
    assert series.lookup("kl", 399.0) is None          # older than the 5-minute look-back
    assert series.lookup("kl", 401.0) == 5.0


def test_expressions_render_and_evaluate_alike():
    series = RowSeries()
    for t, age, policy_age in ((0, 0, 0), (10, 40, 40), (20, 80, 40), (30, 120, 40)):
        series.add({"wall_seconds": t, "age": age, "policy_age": policy_age})
    frozen = (Delta(S("age"), 20) > 0) & Delta(S("policy_age", agg="min"), 20).eq(0)
    assert frozen.promql() == (
        "(((max by (run_id) (rlvitals_learner_network_age)) - (max by (run_id) (rlvitals_learner_network_age "
        "offset 20s))) > (0)) and (((min by (run_id) (rlvitals_actor_network_age)) - (min by (run_id) "
        "(rlvitals_actor_network_age offset 20s))) == (0))")
    assert frozen.value(series.lookup, 10) is None     # the actors followed the learner
    assert frozen.value(series.lookup, 30) == 80       # `and` keeps the left value: age rose by 80
    ratio = S("kl") / S("clip_fraction")
    series.add({"wall_seconds": 31, "kl": 0.0, "clip_fraction": 0.0})
    assert str(ratio.value(series.lookup, 31)) == "nan"   # 0/0 as PromQL computes it: NaN, compares false
    assert (ratio > 0).value(series.lookup, 31) is None
    assert isinstance(S("rss_bytes"), Series) and S("env_steps").agg == "sum"


def test_thresholds_come_from_the_conditions():
    by_name = {r.name: r for r in RULES}
    assert ("clip_fraction", ">", 0.3) in thresholds(by_name["RLClipFractionHigh"])
    assert ("value_target_scale", ">", 2.0) in thresholds(by_name["RLValueTargetsOutOfScale"])
    assert thresholds(by_name["RLComponentDown"]) == []


def test_a_rule_fires_after_its_hold_and_names_when_it_first_held():
    rows = [{"wall_seconds": float(t), "updates": t, "value_target_scale": 0.5 if t < 10 else 3.0}
            for t in range(0, 40)]
    verdicts = evaluate_rows(rows)
    (scale,) = [v for v in verdicts if v.rule == "RLValueTargetsOutOfScale"]
    assert scale.component == "returns" and scale.first_seconds == 10.0 and scale.first_update == 10
    short = evaluate_rows(rows[:24])                   # held 13 s of the 15 s needed
    assert not [v for v in short if v.rule == "RLValueTargetsOutOfScale"]


def test_averages_over_time_use_the_samples_in_the_window():
    # avg_over_time(clip_fraction[30s]) > 0.3: one spike is not enough, a sustained level is.
    fresh = {"staleness_batches": 0.0, "queue_capacity": 1.0}   # samples as fresh as local mode's
    spike = [{"wall_seconds": float(t), "updates": t, "clip_fraction": 0.9 if t == 20 else 0.1, **fresh}
             for t in range(80)]
    assert not [v for v in evaluate_rows(spike) if v.rule == "RLClipFractionHigh"]
    level = [{"wall_seconds": float(t), "updates": t, "clip_fraction": 0.1 if t < 20 else 0.5, **fresh}
             for t in range(80)]
    (clip,) = [v for v in evaluate_rows(level) if v.rule == "RLClipFractionHigh"]
    # Mean over the 31 samples of [t-30, t] exceeds 0.3 once 16 of them read 0.5: from t = 35.
    assert clip.first_seconds == 35.0
    stale = [{**row, "staleness_batches": 9.0} for row in level]   # staler than the queues explain
    assert not [v for v in evaluate_rows(stale) if v.rule == "RLClipFractionHigh"]


def test_monitor_reports_each_rule_once_as_it_fires():
    seen = []
    monitor = HealthMonitor(on_verdict=seen.append)
    for t in range(60):
        monitor({"wall_seconds": float(t), "updates": t, "kl": -0.5})
    assert [v.rule for v in seen] == ["RLKLNegative"]
    assert [v.rule for v in monitor.finish()] == ["RLKLNegative"]
