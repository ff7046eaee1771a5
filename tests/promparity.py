"""Replay recorded rows through `promtool test rules` and expect exactly the health monitor's alerts.

The health monitor judges the rows in updates and exports, per rule, how many
updates its condition has held (`rlvitals_rule_held_updates`); invariants
export their broken flag. Here both become promtool input series on a 1 s grid
(each grid time holds the latest row's values, as a scrape would), and at a
set of evaluation times the expected firing alerts are the ones whose count
reached the rule's hold (or whose invariant is broken). promtool fails on any
difference in which alerts fire, their labels or their annotations.
"""

from __future__ import annotations

import bisect
import math
import subprocess
from pathlib import Path

import yaml

from rlvitals.telemetry.health import TIME_KEY, HealthMonitor
from rlvitals.telemetry.rulegen import RULES_FILE
from rlvitals.telemetry.rules import HELD_METRIC, INVARIANT_BROKEN_METRIC, RULES

RUN_ID = "replayed"


def _fmt(v: float | None) -> str:
    return "_" if v is None else repr(float(v)) if math.isfinite(v) else ("Inf" if v > 0 else "-Inf")


def exported(rows: list[dict]) -> tuple[list[float], dict[str, list[float | None]]]:
    """(row times, per rule the value its alert reads after each row): the held count, or the broken flag."""
    latest: dict[str, int] = {}
    monitor = HealthMonitor(run_id=RUN_ID, on_held=latest.update)
    times, values = [], {r.name: [] for r in RULES if not r.live_only}
    for row in rows:
        monitor(row)
        t = row.get(TIME_KEY)
        if not isinstance(t, (int, float)) or (times and t < times[-1]):
            continue
        times.append(float(t))
        for rule in RULES:
            if rule.live_only:
                continue
            value = row.get(rule.update_key) if rule.alert_query else latest.get(rule.name)
            values[rule.name].append(None if value is None else float(value))
    return times, values


def promtool_test(rows: list[dict], workdir: Path, checks: int = 12) -> dict:
    """Write and run a promtool rule test for `rows`; return the firing table it asserted."""
    times, values = exported(rows)
    grid = list(range(0, int(times[-1]) + 2)) if times else [0]

    def at(series: list[float | None], t: float) -> float | None:
        i = bisect.bisect_right(times, t) - 1
        return series[i] if i >= 0 else None

    input_series, firing_by_rule = [], {}
    for rule in RULES:
        if rule.live_only:
            continue
        sampled = [at(values[rule.name], t) for t in grid]
        if rule.alert_query:
            labels = f'invariant="{rule.update_key.removeprefix("inv_broken_")}"'
            name, fires = INVARIANT_BROKEN_METRIC, [v is not None and v > 0 for v in sampled]
        else:
            labels = f'rule="{rule.name}"'
            name, fires = HELD_METRIC, [v is not None and v >= rule.hold for v in sampled]
        firing_by_rule[rule.name] = dict(zip(grid, fires, strict=True))
        if any(v is not None for v in sampled):
            input_series.append({"series": f'{name}{{{labels},run_id="{RUN_ID}",job="rlvitals"}}',
                                 "values": " ".join(_fmt(v) for v in sampled)})
    picks = {grid[min(len(grid) - 1, round(i * (len(grid) - 1) / max(1, checks - 1)))] for i in range(checks)}
    for firing in firing_by_rule.values():   # and every time an alert starts or stops firing, and just before
        states = list(firing.items())
        for (t0, a), (t1, b) in zip(states, states[1:], strict=False):
            if a != b:
                picks.update((t0, t1))
    table, tests = {}, []
    for rule in RULES:
        if rule.live_only:
            continue
        for t in sorted(picks):
            fires = firing_by_rule[rule.name][t]
            table[(rule.name, t)] = fires
            expected = []
            if fires:
                expected.append({
                    "exp_labels": {"run_id": RUN_ID, "severity": rule.severity, "component": rule.component,
                                   "horizon": rule.horizon},
                    "exp_annotations": {k: v.replace("{{ $labels.run_id }}", RUN_ID) for k, v in
                                        _annotations(rule.name).items()}})
            tests.append({"eval_time": f"{int(t)}s", "alertname": rule.name, "exp_alerts": expected})
    spec = {"rule_files": [str(RULES_FILE)], "evaluation_interval": "1s",
            "tests": [{"interval": "1s", "input_series": input_series, "alert_rule_test": tests}]}
    path = workdir / "replay_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1 << 20))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"Prometheus and the health monitor disagree:\n{result.stdout[-4000:]}" \
                                   f"{result.stderr[-4000:]}"
    return table


def _annotations(name: str) -> dict:
    for group in yaml.safe_load(Path(RULES_FILE).read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return rule["annotations"]
    raise KeyError(name)
