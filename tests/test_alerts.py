"""Health rules: one source, generated alert rules, and Prometheus agreeing with the health monitor.

1. The committed alert rules and docs/health.md are what telemetry/rules.py generates, and
   promtool accepts the rules.
2. Every rule reads catalogued series, names a component of the fixed vocabulary, and links to
   its section of the docs.
3. Conditions are judged on the update axis, holds count updates (hand-worked cases), and a rule
   on the run's rows alerts on the monitor's exported count.
4. On series recorded from real runs, `promtool test rules` expects exactly the alerts the health
   monitor's counts imply: tests/test_diagnosis.py replays every healthy and planted-bug run it makes.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from rlvitals.telemetry import rulegen
from rlvitals.telemetry.catalogue import BY_NAME
from rlvitals.telemetry.conditions import Delta, Increase
from rlvitals.telemetry.fleet_rules import GROUPS, PROCESSES, RECORDING
from rlvitals.telemetry.health import TEXT_KEYS, HealthMonitor, RowSeries, evaluate_rows
from rlvitals.telemetry.rules import BY_RULE, RULES, Live, S, thresholds
from rlvitals.telemetry.verdicts import COMPONENTS

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool is not on PATH (bash deploy/setup.sh --test installs it)")


def test_generated_files_are_current():
    assert rulegen.main(["--check"]) == 0, "run `python -m rlvitals.telemetry.rulegen`"


def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(rulegen.RULES_FILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    alerted = [r for r in RULES if not r.live_twin]   # a live fleet rule raises its twin's alert
    assert f"SUCCESS: {len(alerted) + len(RECORDING)} rules found" in result.stdout


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
    assert [a["alert"] for a in alerts] == [r.name for r in RULES if r.horizon == "fast" and r.name not in PROCESSES
                                            and not r.live_twin] \
        + [r.name for r in RULES if r.horizon == "slow"] + list(PROCESSES)
    for rule in RULES:   # a rule with a live twin: the run's verdict of the twin's alert, named by the row
        if rule.live_twin:
            twin = BY_RULE[rule.live_twin]
            assert rule.live_twin in PROCESSES and rule.names_key and rule.component == twin.component
        assert not rule.names_key or rule.names_key in TEXT_KEYS   # readers keep that text (clean_row)
    recorded = [r["record"] for g in generated["groups"] for r in g["rules"] if "record" in r]
    assert recorded == [name for g in GROUPS for name, _, group in RECORDING if group == g]
    for a in alerts:
        assert a["labels"]["component"] in COMPONENTS
        anchor = a["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor == a["alert"].lower() and f"### {a['alert']}" in docs


def test_series_lookup_reads_the_latest_value_at_or_before_an_update():
    series = RowSeries()
    for u, v in ((1, 1.0), (3, 3.0), (400, 5.0)):
        series.add({"updates": u, "kl": v})
    assert series.lookup("kl", 0) is None              # nothing yet
    assert series.lookup("kl", 2) == 1.0               # the latest value at or before the update
    assert series.lookup("kl", 3) == 3.0
    assert series.lookup("kl", 399) == 3.0             # a gauge keeps its last value, however long ago
    assert series.lookup("kl", 401) == 5.0
    assert not series.add({"updates": 2, "kl": 9.0})   # behind the last row (a resumed run's overlap): not placed
    assert not series.add({"wall_seconds": 1.0, "kl": 9.0})   # no update count: no place on the axis


def test_conditions_count_updates():
    series = RowSeries()
    for u, age, policy_age in ((0, 0, 0), (10, 40, 40), (20, 80, 40), (30, 120, 40)):
        series.add({"updates": u, "age": age, "policy_age": policy_age})
    frozen = (Delta(S("age"), 20) > 0) & Delta(S("policy_age"), 20).eq(0)
    assert frozen.text() == "(age - age[20 updates ago] > 0) and (policy_age - policy_age[20 updates ago] == 0)"
    assert frozen.value(series.lookup, 10) is None     # the window reaches before the run: undecided
    assert frozen.value(series.lookup, 30) == 80       # `and` keeps the left value: age rose by 80
    assert frozen.reach() == 20
    # A counter's increase counts from 0 before its first record: drops in a run's first updates count.
    series.add({"updates": 31, "dropped": 5.0})
    assert Increase(S("dropped"), 10).value(series.lookup, 31) == 5.0
    assert Delta(S("dropped"), 10).value(series.lookup, 31) is None
    ratio = S("kl") / S("clip_fraction")
    series.add({"updates": 32, "kl": 0.0, "clip_fraction": 0.0})
    assert str(ratio.value(series.lookup, 32)) == "nan"   # 0/0 is NaN, which no comparison keeps
    assert (ratio > 0).value(series.lookup, 32) is None


def test_rules_on_rows_alert_on_the_monitors_count_and_live_rules_on_promql():
    for rule in RULES:
        if rule.live_only:
            assert rule.promql() == rule.condition.query
        elif rule.alert_query:
            assert rule.promql().startswith("max by (run_id) (rlvitals_invariant_broken{")
        else:
            assert rule.promql() == f'max by (run_id) (rlvitals_rule_held_updates{{rule="{rule.name}"}}) >= {rule.hold}'
            assert rule.name in BY_NAME["rlvitals_rule_held_updates"].label_values["rule"]
    generated = {a["alert"]: a for g in yaml.safe_load(rulegen.RULES_FILE.read_text())["groups"] for a in g["rules"]
                 if "alert" in a}
    assert all("for" not in generated[r.name] for r in RULES if not r.live_only and not r.live_twin)


def test_thresholds_come_from_the_conditions():
    by_name = {r.name: r for r in RULES}
    assert ("clip_fraction", ">", 0.3) in thresholds(by_name["RLClipFractionHigh"])
    assert ("value_target_scale", ">", 2.0) in thresholds(by_name["RLValueTargetsOutOfScale"])
    assert thresholds(by_name["RLComponentDown"]) == []


def test_a_rule_fires_after_its_hold_in_updates_and_names_when_it_first_held():
    def rows(seconds_per_update: float, updates: int) -> list[dict]:
        return [{"wall_seconds": u * seconds_per_update, "updates": u,
                 "value_target_scale": 0.5 if u < 10 else 3.0} for u in range(updates)]

    (scale,) = [v for v in evaluate_rows(rows(1.0, 40)) if v.rule == "RLValueTargetsOutOfScale"]
    assert scale.component == "returns" and scale.first_update == 10 and scale.first_seconds == 10.0
    # Held 14 of the 15 updates needed: no verdict, however much time passed.
    assert not [v for v in evaluate_rows(rows(60.0, 25)) if v.rule == "RLValueTargetsOutOfScale"]
    # A machine 100 times faster: the same verdict at the same update.
    (fast,) = [v for v in evaluate_rows(rows(0.01, 40)) if v.rule == "RLValueTargetsOutOfScale"]
    assert fast.first_update == 10 and fast.first_seconds == 0.1


def test_means_use_the_last_updates():
    # mean of clip_fraction over 30 updates > 0.3: one spike is not enough, a sustained level is.
    fresh = {"staleness_batches": 0.0, "queue_capacity": 1.0,    # samples as fresh as local mode's,
             "entropy_bounded": 1.0}                              # of a discrete policy
    spike = [{"wall_seconds": float(u), "updates": u, "clip_fraction": 0.9 if u == 20 else 0.1, **fresh}
             for u in range(80)]
    assert not [v for v in evaluate_rows(spike) if v.rule == "RLClipFractionHigh"]
    level = [{"wall_seconds": float(u), "updates": u, "clip_fraction": 0.1 if u < 20 else 0.5, **fresh}
             for u in range(80)]
    (clip,) = [v for v in evaluate_rows(level) if v.rule == "RLClipFractionHigh"]
    # The mean over updates u-30..u (31 values) exceeds 0.3 once 16 of them read 0.5: from update 35.
    assert clip.first_update == 35
    stale = [{**row, "staleness_batches": 9.0} for row in level]   # staler than the queues explain
    assert not [v for v in evaluate_rows(stale) if v.rule == "RLClipFractionHigh"]
    gaussian = [{**row, "entropy_bounded": 0.0} for row in level]   # judged by its KL instead
    assert not [v for v in evaluate_rows(gaussian) if v.rule == "RLClipFractionHigh"]


def test_policy_steps_too_large_reads_what_most_updates_do_not_a_spike_or_two():
    # Pendulum at the classic settings: KL 1.6 and 5.9 at two updates, every other under 0.15 (a mean over 30
    # updates read 0.21 and warned); a learning rate far too high moves most updates by more than 0.2 nats.
    fresh = {"staleness_batches": 0.0}
    spikes = [{"wall_seconds": float(u), "updates": u, "kl": {111: 1.6, 136: 5.9}.get(u, 0.01), **fresh}
              for u in range(200)]
    assert not [v for v in evaluate_rows(spikes) if v.rule == "RLPolicyStepsTooLarge"]
    level = [{"wall_seconds": float(u), "updates": u, "kl": 0.01 if u < 40 else 0.5, **fresh} for u in range(120)]
    (steps,) = [v for v in evaluate_rows(level) if v.rule == "RLPolicyStepsTooLarge"]
    # The median of updates u-30..u (31 values) passes 0.2 once 16 of them read 0.5: from update 55.
    assert steps.first_update == 55


def test_monitor_reports_each_rule_once_as_it_fires_and_exports_its_count():
    seen, held = [], {}
    monitor = HealthMonitor(on_verdict=seen.append, on_held=held.update)
    for u in range(60):
        monitor({"wall_seconds": float(u), "updates": u, "kl": -0.5})
    assert [v.rule for v in seen] == ["RLKLNegative"]
    assert [v.rule for v in monitor.finish()] == ["RLKLNegative"]
    assert held["RLKLNegative"] == 59 and held["RLValueTargetsOutOfScale"] == -1
    monitor({"wall_seconds": 60.0, "updates": 60, "kl": 0.01})
    assert held["RLKLNegative"] == -1                  # the condition stopped holding: the alert resolves
