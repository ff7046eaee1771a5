"""The alert a user watches fires on the run's evidence: a planted bug's verdict reaches Prometheus.

A local run with a planted bug serves its metrics at `standard`; a real Prometheus scrapes it every
second and evaluates the generated rules (deploy/prometheus/rules/rlvitals.yml). The rules on the
run's statistics fire on the count of updates the run's own health monitor exports
(`rlvitals_rule_held_updates`), so the alert Prometheus raises must be the run's first verdict, with
the same component, and the count must be what the monitor counted. Waits are for events (a row, an
alert), bounded only to fail a hung test.
"""

from __future__ import annotations

import time

import pytest
from diagnose import LOUD, diagnose
from planted_bugs import BY_BUG
from rules_prometheus import RulesPrometheus

from rlvitals.telemetry.rules import BY_RULE

pytestmark = pytest.mark.timeout(300)


def test_a_planted_bug_raises_the_same_alert_in_prometheus_as_in_verdicts_json(tmp_path):
    bug = BY_BUG["value_loss_ascends"]   # a rule on the run's statistics (RLValueLossPushesAway), not an invariant
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    prom = RulesPrometheus(run_dir / "discovery")
    firing: dict[str, dict] = {}
    held: dict[str, float] = {}
    polled = [0.0]

    def alert_seen(rows, loud) -> bool:
        # Once a loud verdict is in, keep the run going (and serving) until Prometheus raises its alert.
        if not loud or time.monotonic() - polled[0] < 0.5:   # poll Prometheus twice a second, not every batch
            return False
        polled[0] = time.monotonic()
        for alert in prom.alerts():
            if alert["state"] == "firing":
                firing[alert["labels"]["alertname"]] = alert
        for sample in prom.query('max by (rule) (rlvitals_rule_held_updates) >= 0'):
            held[sample["metric"]["rule"]] = float(sample["value"][1])
        return any(v.rule in firing for v in loud)

    try:
        found = diagnose(run_dir, bug=bug, budget_s=240, stop_on_verdict=False, until=alert_seen,
                         verbosity="standard", serve_metrics=True)
    finally:
        prom.close()
    first = found.first
    assert first is not None and first.component == bug.component, found.verdicts
    loud = [v for v in found.verdicts if v.severity in LOUD]
    raised = [v for v in loud if v.rule in firing]
    assert raised, f"no verdict of {[v.rule for v in loud]} was raised by Prometheus (firing: {sorted(firing)})"
    for verdict in raised:
        labels = firing[verdict.rule]["labels"]
        assert (labels["component"], labels["severity"]) == (verdict.component, verdict.severity)
        rule = BY_RULE[verdict.rule]
        if not rule.alert_query:   # the alert read the monitor's count, which had reached the rule's hold
            assert held.get(verdict.rule, -1) >= rule.hold, (verdict.rule, held)
