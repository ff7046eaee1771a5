"""Alert rules (deploy/prometheus/rules/): checked against the catalogue, then run by `promtool test rules`.

Every alert gets a synthetic broken run on which it must be quiet before its
`for:` has elapsed and firing after, with exactly the labels and annotations
it should carry; all alerts must stay quiet on a synthetic healthy run of six
hours. The broken runs are the healthy run with one or two series changed, so
an alert that also fires on healthy series fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from rlvitals.dashboards.promql import problems, selectors

REPO = Path(__file__).resolve().parent.parent
PROM_DIR = REPO / "deploy" / "prometheus"
RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))
SEVERITIES = ("critical", "warning", "info")
MINUTES = 360  # the synthetic runs last six hours, one sample a minute

BASE = {"job": "rlvitals", "instance": "127.0.0.1:9100", "component": "local", "run_id": "r1"}


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is not on PATH (Debian: apt-get install prometheus; `bash deploy/setup.sh --test`)")
    return binary


def rules() -> list[dict]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


ALERTS = {r["alert"]: r for r in rules() if "alert" in r}


def sel(name: str, **labels: str) -> str:
    body = ", ".join(f'{k}="{v}"' for k, v in {**BASE, **labels}.items())
    return f"{name}{{{body}}}"


def counter(*segments: tuple[int, float], start: float = 0.0) -> str:
    """Promtool values of a counter rising piecewise: (minutes, increase per minute) per segment."""
    parts, value, first = [], start, True
    for minutes, slope in segments:
        if first:
            parts.append(f"{value:g}+{slope:g}x{minutes}")
            value += slope * minutes
            first = False
        else:
            value += slope
            parts.append(f"{value:g}+{slope:g}x{minutes - 1}")
            value += slope * (minutes - 1)
    return " ".join(parts)


def flat(value: float, minutes: int = MINUTES) -> str:
    return f"{value:g}x{minutes}"


# A healthy six-hour run: entropy and residual variance fall then level out, KL small and steady,
# advantages mean-zero, targets in range, staleness steady, throughput steady, nothing dropped.
HEALTHY = {
    sel("up"): flat(1),
    sel("rlvitals_run_info", algorithm="ppo", env="CartPole-v1", mode="local", code_version="abc"): flat(1),
    sel("rlvitals_learner_steps_total"): counter((MINUTES, 32)),
    sel("rlvitals_learner_relative_entropy_ratio"): f"1-0.01x50 {flat(0.5, MINUTES - 51)}",
    sel("rlvitals_learner_kl_divergence_nats"): flat(0.01),
    sel("rlvitals_learner_residual_variance_ratio"): f"1-0.02x40 {flat(0.2, MINUTES - 41)}",
    sel("rlvitals_learner_advantage", stat="mean"): flat(0),
    sel("rlvitals_learner_advantage", stat="std"): flat(1),
    sel("rlvitals_learner_value_target", stat="min"): flat(-3),
    sel("rlvitals_learner_value_target", stat="max"): flat(5),
    sel("rlvitals_learner_sample_staleness_steps_sum"): counter((MINUTES, 64)),
    sel("rlvitals_learner_sample_staleness_steps_count"): counter((MINUTES, 128)),
    sel("rlvitals_queue_depth", queue="rollouts"): flat(1),
    sel("rlvitals_actor_env_steps_total"): counter((MINUTES, 6000)),
    sel("rlvitals_samples_dropped_total", reason="nonfinite"): flat(0),
    sel("rlvitals_samples_dropped_total", reason="stale"): flat(0),
    sel("rlvitals_actor_restarts_total"): flat(0),
    sel("rlvitals_gpu_memory_used_bytes", gpu="0"): flat(4e10),
    sel("rlvitals_gpu_memory_total_bytes", gpu="0"): flat(8e10),
}
HEALTHY_CHECKS = ("10m", "45m", "1h30m", "3h", "5h50m")


@dataclass
class Broken:
    """A healthy run with `series` replaced: `alert` is quiet at `quiet_at` and firing at `fires_at`."""
    alert: str
    series: dict[str, str]
    quiet_at: str
    fires_at: str
    labels: dict[str, str] = field(default_factory=lambda: dict(BASE))


BROKEN = [
    Broken("RLPolicyEntropyCollapsed", {sel("rlvitals_learner_relative_entropy_ratio"): f"1-0.05x19 {flat(0.01)}"},
           "30m", "40m"),
    Broken("RLPolicyEntropyStuckHigh", {sel("rlvitals_learner_relative_entropy_ratio"): flat(0.99)}, "25m", "35m"),
    Broken("RLKLNegative", {sel("rlvitals_learner_kl_divergence_nats"): f"0.01x30 {flat(-0.001)}"}, "30m", "35m"),
    Broken("RLKLGrowing", {sel("rlvitals_learner_kl_divergence_nats"): f"0.005+0.0005x{MINUTES}"}, "80m", "100m"),
    Broken("RLResidualVarianceStuckHigh", {sel("rlvitals_learner_residual_variance_ratio"): flat(0.98)}, "25m",
           "40m"),
    Broken("RLAdvantagesNotMeanZero", {sel("rlvitals_learner_advantage", stat="mean"): flat(0.8)}, "20m", "35m"),
    Broken("RLValueTargetsLarge", {sel("rlvitals_learner_value_target", stat="max"): flat(50)}, "20m", "35m"),
    Broken("RLValueTargetsExploding", {sel("rlvitals_learner_value_target", stat="max"): flat(5000)}, "3m", "10m"),
    # Mean staleness 0.5 for an hour, then tripling every half hour (2, 6, 18).
    Broken("RLStalenessRising", {sel("rlvitals_learner_sample_staleness_steps_sum"):
                                 counter((60, 64), (30, 256), (30, 768), (MINUTES - 120, 2304))}, "60m", "120m"),
    Broken("RLQueueOnlyGrowing", {sel("rlvitals_queue_depth", queue="rollouts"): f"0+0.1x{MINUTES}"}, "35m", "45m",
           {**BASE, "queue": "rollouts"}),
    # 100 env steps/s for two hours, then 50.
    Broken("RLThroughputDecaying", {sel("rlvitals_actor_env_steps_total"): counter((120, 6000), (MINUTES - 120, 3000))},
           "3h", "3h30m", {"run_id": "r1"}),
    Broken("RLNonFiniteSamplesDropped",
           {sel("rlvitals_samples_dropped_total", reason="nonfinite"): f"0x60 {flat(64, MINUTES - 61)}"}, "60m", "65m",
           {**BASE, "reason": "nonfinite"}),
    Broken("RLActorRestartingRepeatedly", {sel("rlvitals_actor_restarts_total"): f"0x60 1 2 3 {flat(3, MINUTES - 64)}"},
           "61m", "70m"),
    Broken("RLGPUMemoryNearLimit", {sel("rlvitals_gpu_memory_used_bytes", gpu="0"): flat(7.9e10)}, "3m", "10m",
           {**BASE, "gpu": "0"}),
    Broken("RLComponentDown", {sel("up"): f"1x60 {flat(0, MINUTES - 61)}"}, "62m", "70m"),
    Broken("RLLearnerStalled", {sel("rlvitals_learner_steps_total"): f"0+32x60 {flat(1920, MINUTES - 61)}"}, "72m",
           "80m"),
    Broken("RLActorStalled", {sel("rlvitals_actor_env_steps_total"): f"0+6000x60 {flat(360000, MINUTES - 61)}"},
           "72m", "80m"),
]

TEMPLATE = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def expand(text: str, labels: dict[str, str]) -> str:
    """The annotations' only template, {{ $labels.x }}, as Prometheus expands it."""
    return TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), text)


def input_series(overrides: dict[str, str]) -> list[dict]:
    return [{"series": s, "values": overrides.get(s, v)} for s, v in {**HEALTHY, **overrides}.items()]


def expected_alert(case: Broken) -> dict:
    rule = ALERTS[case.alert]
    labels = {**case.labels, **rule.get("labels", {})}
    return {"exp_labels": labels,
            "exp_annotations": {k: expand(v, labels) for k, v in rule.get("annotations", {}).items()}}


def promtool_tests() -> dict:
    tests = [{"name": "healthy run", "interval": "1m", "input_series": input_series({}),
              "alert_rule_test": [{"eval_time": t, "alertname": name, "exp_alerts": []}
                                  for t in HEALTHY_CHECKS for name in ALERTS]}]
    for case in BROKEN:
        tests.append({"name": f"{case.alert} on a broken run", "interval": "1m",
                      "input_series": input_series(case.series),
                      "alert_rule_test": [
                          {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
                          {"eval_time": case.fires_at, "alertname": case.alert, "exp_alerts": [expected_alert(case)]},
                      ]})
    return {"rule_files": [str(p) for p in RULE_FILES], "evaluation_interval": "1m", "tests": tests}


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- static checks
def test_prometheus_config_passes_promtool_and_loads_the_rules():
    config = PROM_DIR / "prometheus.yml"
    result = run_promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr
    parsed = yaml.safe_load(config.read_text())
    jobs = {job["job_name"]: job for job in parsed["scrape_configs"]}
    assert jobs["rlvitals"]["file_sd_configs"][0]["files"] == ["targets/*.json"]
    assert "/tmp/ray/prom_metrics_service_discovery.json" in jobs["ray"]["file_sd_configs"][0]["files"]


def test_rule_files_exist_and_promtool_checks_them():
    assert RULE_FILES, "no rule files under deploy/prometheus/rules/"
    result = run_promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_severity_summary_and_description():
    for name, rule in ALERTS.items():
        assert re.fullmatch(r"RL[A-Z][A-Za-z]+", name), name
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = rule.get("annotations", {})
        assert "{{ $labels.run_id }}" in annotations.get("summary", ""), f"{name}: the summary must name the run"
        description = annotations.get("description", "")
        assert len(description) > 120 and "Check" in description, f"{name}: the description must say what to check"
        for text in annotations.values():
            other = re.sub(TEMPLATE, "", text)
            assert "{{" not in other, f"{name}: only {{{{ $labels.x }}}} templates are allowed (the tests expand them)"


def test_every_metric_the_rules_read_is_in_the_catalogue():
    for name, rule in ALERTS.items():
        assert selectors(rule["expr"]), f"{name}: reads no series"
        assert problems(rule["expr"]) == [], f"{name}: {problems(rule['expr'])}"


def test_alerts_keep_the_run_label():
    """Dashboards count firing alerts per run: every alert's labels must keep run_id."""
    for case in BROKEN:
        assert "run_id" in case.labels, case.alert


def test_the_folklore_is_covered():
    wanted = {"RLPolicyEntropyCollapsed", "RLPolicyEntropyStuckHigh", "RLKLNegative", "RLKLGrowing",
              "RLResidualVarianceStuckHigh", "RLAdvantagesNotMeanZero", "RLValueTargetsLarge", "RLStalenessRising",
              "RLQueueOnlyGrowing", "RLThroughputDecaying", "RLNonFiniteSamplesDropped", "RLActorRestartingRepeatedly",
              "RLGPUMemoryNearLimit", "RLComponentDown"}
    assert wanted <= set(ALERTS)


def test_every_alert_has_a_broken_run():
    assert sorted(c.alert for c in BROKEN) == sorted(ALERTS), "each alert needs exactly one broken-run case"


# ---------------------------------------------------------------- promtool test rules
def test_promtool_unit_tests(tmp_path):
    spec = tmp_path / "rlvitals_rules_test.yml"
    spec.write_text(yaml.safe_dump(promtool_tests(), sort_keys=False, width=200))
    result = run_promtool("test", "rules", str(spec))
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout[-6000:]}{result.stderr[-3000:]}"


def test_promtool_unit_tests_can_fail(tmp_path):
    """The harness is not vacuous: a healthy run that expects an alert, and a wrong label, both fail."""
    spec = promtool_tests()
    healthy = spec["tests"][0]
    healthy["alert_rule_test"] = [{"eval_time": "3h", "alertname": "RLKLNegative",
                                   "exp_alerts": [expected_alert(Broken("RLKLNegative", {}, "", ""))]}]
    wrong = spec["tests"][1]
    wrong["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["severity"] = "bogus"
    spec["tests"] = [healthy, wrong]
    path = tmp_path / "failing_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=200))
    result = run_promtool("test", "rules", str(path))
    assert result.returncode != 0
    assert "RLKLNegative" in result.stdout + result.stderr
    assert BROKEN[0].alert in result.stdout + result.stderr
