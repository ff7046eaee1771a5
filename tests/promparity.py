"""Replay recorded rows through `promtool test rules` and expect exactly the offline evaluator's alerts.

The rows become promtool input series on the evaluator's grid (one sample per
evaluation step, `_` where the row key is absent); at a set of evaluation
times the expected firing alerts are the ones whose condition, evaluated
offline, has held continuously for the rule's hold time. promtool fails on any
difference in which alerts fire, their labels or their annotations.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import yaml

from rlvitals.telemetry.health import HealthMonitor, RowSeries
from rlvitals.telemetry.rulegen import RULES_FILE
from rlvitals.telemetry.rules import ROW_KEYS, RULES

RUN_ID = "replayed"


def firing_at(history: list[tuple[float, bool]], hold: float) -> dict[float, bool]:
    """Per evaluation time: does the alert fire (its condition held for `hold` seconds up to then)?"""
    out, since = {}, None
    for t, holds in history:
        since = (since if since is not None else t) if holds else None
        out[t] = since is not None and t - since >= hold - 1e-9
    return out


def _fmt(v: float | None) -> str:
    return "_" if v is None else repr(float(v)) if math.isfinite(v) else ("Inf" if v > 0 else "-Inf")


def promtool_test(rows: list[dict], workdir: Path, step: int = 1, checks: int = 12) -> dict:
    """Write and run a promtool rule test for `rows`; return the offline firing table it asserted."""
    monitor = HealthMonitor(step=step, run_id=RUN_ID)
    monitor.record_history()
    for row in rows:
        monitor(row)
    monitor.finish()
    series = RowSeries()
    for row in rows:
        series.add(row)
    times = [t for t, _ in next(iter(monitor.history.values()))]
    input_series = []
    for key in sorted(set().union(*(r.expr.keys() for r in RULES))):
        metric, labels = ROW_KEYS[key]
        values = [_fmt(series.lookup(key, t)) for t in times]
        if all(v == "_" for v in values):
            continue
        label_text = ",".join([f'{k}="{v}"' for k, v in labels] + [f'run_id="{RUN_ID}"', 'job="rlvitals"'])
        input_series.append({"series": f"{metric.name}{{{label_text}}}", "values": " ".join(values)})
    firing_by_rule = {r.name: firing_at(monitor.history[r.name], r.hold_seconds) for r in RULES if not r.live_only}
    picks = {times[min(len(times) - 1, round(i * (len(times) - 1) / max(1, checks - 1)))] for i in range(checks)}
    for firing in firing_by_rule.values():   # and every time an alert starts or stops firing, and just before
        states = list(firing.items())
        for (t0, a), (t1, b) in zip(states, states[1:], strict=False):
            if a != b:
                picks.update((t0, t1))
    picks = sorted(picks)
    table, tests = {}, []
    for rule in RULES:
        if rule.live_only:
            continue
        firing = firing_by_rule[rule.name]
        for t in picks:
            fires = firing[t]
            table[(rule.name, t)] = fires
            expected = []
            if fires:
                expected.append({
                    "exp_labels": {"run_id": RUN_ID, "severity": rule.severity, "component": rule.component,
                                   "horizon": rule.horizon},
                    "exp_annotations": {k: v.replace("{{ $labels.run_id }}", RUN_ID) for k, v in
                                        _annotations(rule.name).items()}})
            tests.append({"eval_time": f"{int(t)}s", "alertname": rule.name, "exp_alerts": expected})
    spec = {"rule_files": [str(RULES_FILE)], "evaluation_interval": f"{step}s",
            "tests": [{"interval": f"{step}s", "input_series": input_series, "alert_rule_test": tests}]}
    path = workdir / "replay_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1 << 20))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"Prometheus and the offline evaluator disagree:\n{result.stdout[-4000:]}" \
                                   f"{result.stderr[-4000:]}"
    return table


def _annotations(name: str) -> dict:
    for group in yaml.safe_load(Path(RULES_FILE).read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return rule["annotations"]
    raise KeyError(name)
