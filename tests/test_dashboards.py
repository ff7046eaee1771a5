"""Dashboards (dashboards/*.json) and Grafana provisioning (deploy/grafana/).

  1. the committed JSON is what the catalogue generates, and the generator refuses to leave a metric out
  2. structure: unique ids, no overlapping panels, datasource/run/node variables used everywhere, units and
     descriptions on every panel, counters only through rate/increase over $__rate_interval, every metric
     referenced is catalogued and every catalogued metric is on some panel
  3. provisioning files agree with the dashboards, Prometheus and the compose file
  4. live: two short real trainings (standard, debug) scraped by a real Prometheus started with
     `rlvitals stack up`; every query of every panel (and every variable) is evaluated over Prometheus's
     HTTP API and must return data at the level its metrics are exported at, and none below it
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from itertools import combinations
from pathlib import Path

import pytest
import yaml

from conftest import free_port, http_get
from rlvitals.dashboards import DASHBOARD_DIR, dashboard_files, generate, panels
from rlvitals.dashboards.promql import catalogue_metric, metric_names, problems, selectors
from rlvitals.telemetry.catalogue import BY_NAME, LEVELS, METRICS, Metric

REPO = Path(__file__).resolve().parent.parent
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"timeseries", "stat", "table", "heatmap", "barchart"}
ALLOWED_RANGES = {"$__rate_interval", "$__range"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


DASHBOARDS = {p.stem: load(p) for p in dashboard_files()}


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


def data_panels(dashboard: dict) -> list[dict]:
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in data_panels(dashboard) for t in p["targets"]]


def variable(dashboard: dict, name: str) -> dict:
    found = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    assert len(found) == 1, f"{dashboard['uid']}: no single ${name} variable"
    return found[0]


def variable_query(var: dict) -> str:
    query = var["query"]
    return query["query"] if isinstance(query, dict) else query


def variable_source(var: dict) -> tuple[str, str | None]:
    """(the PromQL a query variable reads, the label it lists or None for query_result's whole result lines)."""
    query = variable_query(var)
    if m := re.match(r"label_values\((.*),\s*(\w+)\)$", query):
        return m.group(1), m.group(2)
    m = re.match(r"query_result\((.*)\)$", query)
    assert m, f"${var['name']}: neither label_values(...) nor query_result(...): {query}"
    return m.group(1), None


def grafana_regex(pattern: str) -> re.Pattern:
    """A variable's regex as Grafana reads it (/body/flags, JavaScript syntax), as a Python pattern."""
    assert pattern.startswith("/"), pattern
    body, _, flags = pattern[1:].rpartition("/")
    body = re.sub(r"\(\?<(?=[A-Za-z])", "(?P<", body)  # named groups; lookbehinds (?<= (?<! stay
    return re.compile(body, re.IGNORECASE if "i" in flags else 0)


def query_result_lines(result: list[dict]) -> list[str]:
    """The lines Grafana's query_result() makes of an instant query's result: `name{k="v", ...} value ms`."""
    lines = []
    for r in result:
        labels = dict(r["metric"])
        name = labels.pop("__name__", "")
        pairs = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{pairs}}} {r['value'][1]} {int(float(r['value'][0]) * 1000)}")
    return lines


def variable_options(var: dict, texts: list[str]) -> list[tuple[str, str]]:
    """(value, text) of each option Grafana makes of `texts` with the variable's regex and its named groups."""
    if not var.get("regex"):
        return sorted({(t, t) for t in texts})
    options = set()
    for text in texts:
        m = grafana_regex(var["regex"]).search(text)
        if m:
            groups = m.groupdict()
            value, shown = groups.get("value"), groups.get("text")
            options.add((value or shown or m.group(1), shown or value or m.group(1)))
    return sorted(options)


def structure_problems(dashboard: dict) -> list[str]:
    """Everything structurally wrong with one dashboard model (empty when it is sound)."""
    out = []
    uid = dashboard.get("uid", "?")
    panels = all_panels(dashboard)
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)) or None in ids:
        out.append(f"{uid}: panel ids not unique: {ids}")
    boxes = []
    for p in panels:
        g = p["gridPos"]
        if g["x"] < 0 or g["w"] < 1 or g["h"] < 1 or g["x"] + g["w"] > 24:
            out.append(f"{uid}: panel {p['title']!r} outside the 24-column grid: {g}")
        boxes.append((p["title"], g))
    for (a, ga), (b, gb) in combinations(boxes, 2):
        if ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"] and \
                ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]:
            out.append(f"{uid}: panels {a!r} and {b!r} overlap: {ga} {gb}")
    ds = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    if not ds or ds[0]["type"] != "datasource" or ds[0]["query"] != "prometheus":
        out.append(f"{uid}: no $datasource variable of Prometheus datasources")
    for name in ("run", "node"):
        if not any(v["name"] == name and v["type"] == "query" for v in dashboard["templating"]["list"]):
            out.append(f"{uid}: no ${name} query variable")
    for p in data_panels(dashboard):
        where = f"{uid}: panel {p['title']!r}"
        if p["type"] not in PANEL_TYPES:
            out.append(f"{where}: type {p['type']!r} not one of {sorted(PANEL_TYPES)}")
        if p.get("datasource") != DATASOURCE:
            out.append(f"{where}: datasource is not the $datasource variable")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            out.append(f"{where}: no unit")
        if "healthy" not in p.get("description", "").lower():
            out.append(f"{where}: the description does not say what healthy looks like")
        if not p.get("targets"):
            out.append(f"{where}: no query")
        ref_ids = [t.get("refId") for t in p.get("targets", [])]
        if len(ref_ids) != len(set(ref_ids)):
            out.append(f"{where}: duplicate refIds {ref_ids}")
        for t in p.get("targets", []):
            out.extend(f"{where}: {e}" for e in expr_problems(t["expr"]))
            if t.get("datasource") != DATASOURCE:
                out.append(f"{where}: a target's datasource is not the $datasource variable")
    return out


def expr_problems(expr: str) -> list[str]:
    out = [f"{e} in {expr!r}" for e in problems(expr)]
    for window in re.findall(r"\[([^\]]*)\]", expr):
        if window not in ALLOWED_RANGES:
            out.append(f"range [{window}] is not one of {sorted(ALLOWED_RANGES)}: {expr!r}")
    for name, matchers in selectors(expr):
        m = catalogue_metric(name)
        if m is None:
            if matchers.get("run_id") != ("=~", "$run"):
                out.append(f"{name} is not filtered by run_id=~\"$run\": {expr!r}")
            continue
        for label, value in (("run_id", "$run"), ("node", "$node")):
            if matchers.get(label) != ("=~", value):
                out.append(f"{name} is not filtered by {label}=~\"{value}\": {expr!r}")
        if m.kind == "counter":
            inside = re.findall(rf"(?:rate|increase)\(\s*{name}\{{[^}}]*\}}\[[^\]]*\](?:\s*@\s*end\(\))?\s*\)",
                                expr)
            if len(inside) != len(re.findall(rf"\b{name}\{{", expr)):
                out.append(f"counter {name} used outside rate()/increase(): {expr!r}")
    return out


# ======================================================================
# 1. Generated from the catalogue
# ======================================================================
def test_the_three_dashboards_exist():
    assert set(DASHBOARDS) == {"overview", "learning", "systems"}
    assert {d["uid"] for d in DASHBOARDS.values()} == {"rlvitals-overview", "rlvitals-learning", "rlvitals-systems"}


def test_committed_dashboards_are_what_the_catalogue_generates():
    stale = generate.stale_files()
    assert stale == [], f"out of date: {stale}; run `python -m rlvitals.dashboards.generate` and commit the result"


def test_check_mode_reports_stale_missing_and_extra_files(tmp_path, capsys):
    generate.write_all(tmp_path)
    assert generate.stale_files(tmp_path) == []
    (tmp_path / "overview.json").write_text((tmp_path / "overview.json").read_text().replace("Mean return", "Mean"))
    (tmp_path / "learning.json").unlink()
    (tmp_path / "old.json").write_text("{}")
    assert sorted(generate.stale_files(tmp_path)) == ["learning.json", "old.json", "overview.json"]
    assert generate.main(["--check"]) == 0  # the real folder is current
    assert "up to date" in capsys.readouterr().out


def test_check_command_exits_1_when_stale(tmp_path, capsys):
    assert generate.main(["--dir", str(tmp_path)]) == 0
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "systems.json").write_text("{}\n")
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "systems.json" in capsys.readouterr().err


def test_a_metric_on_no_dashboard_is_an_error(monkeypatch):
    extra = Metric("rlvitals_learner_forgotten_total", "counter", "learner", "standard", "short", "Healthy: never.")
    monkeypatch.setattr(generate, "METRICS", generate.METRICS + (extra,))
    with pytest.raises(generate.CatalogueError, match="rlvitals_learner_forgotten_total"):
        generate.render_all()


def test_titles_units_and_help_come_from_the_catalogue():
    panel = panels.gauges("rlvitals_learner_kl_divergence_nats")
    m = BY_NAME["rlvitals_learner_kl_divergence_nats"]
    assert panel.title == "KL divergence" and panel.unit == m.unit and m.help in panel.description()
    rate = panels.rates("rlvitals_learner_phase_seconds_total", by=("phase",))
    assert rate.unit == "percentunit"  # seconds per second
    assert "rate(rlvitals_learner_phase_seconds_total{" in rate.targets[0]["expr"]
    assert panels.rates("rlvitals_weight_publish_bytes_total").unit == "Bps"
    with pytest.raises(panels.CatalogueError):
        panels.rates("rlvitals_queue_depth")  # a gauge has no rate
    with pytest.raises(panels.CatalogueError):
        panels.gauges("rlvitals_queue_depth", "rlvitals_process_resident_memory_bytes", legends=("a", "b"))


# ======================================================================
# 2. Structure
# ======================================================================
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_structure(name):
    assert structure_problems(DASHBOARDS[name]) == []


def test_structure_check_can_fail():
    broken = json.loads(json.dumps(DASHBOARDS["overview"]))
    panels = data_panels(broken)
    panels[1]["id"] = panels[0]["id"]
    panels[2]["gridPos"] = dict(panels[3]["gridPos"])
    panels[4]["fieldConfig"]["defaults"].pop("unit")
    panels[5]["targets"][0]["expr"] = "rate(rlvitals_not_a_metric_total[5m])"
    panels[6]["datasource"] = {"type": "prometheus", "uid": "fixed"}
    found = "\n".join(structure_problems(broken))
    for needle in ("not unique", "overlap", "no unit", "rlvitals_not_a_metric_total", "range [5m]",
                   "datasource is not"):
        assert needle in found, needle
    assert "outside rate()" in "\n".join(expr_problems('rlvitals_actor_env_steps_total{run_id=~"$run", node=~"$node"}'))
    assert "run_id" in "\n".join(expr_problems("rlvitals_queue_depth"))


def test_every_catalogued_metric_is_on_some_panel():
    shown = set()
    for d in DASHBOARDS.values():
        for _, expr in queries(d):
            shown |= metric_names(expr)
    assert sorted(m.name for m in METRICS if m.name not in shown) == []


def test_each_dashboard_shows_what_the_issue_asks_of_it():
    def names(uid):
        return set().union(*(metric_names(e) for _, e in queries(DASHBOARDS[uid])))

    overview = names("overview")
    assert {"rlvitals_actor_episode_return", "rlvitals_actor_episode_length", "rlvitals_actor_env_steps_total",
            "rlvitals_learner_samples_consumed_total", "rlvitals_learner_sample_staleness_steps",
            "rlvitals_queue_depth"} <= overview
    assert any("ALERTS{" in e for _, e in queries(DASHBOARDS["overview"]))
    learning = names("learning")
    assert {"rlvitals_learner_relative_entropy_ratio", "rlvitals_learner_kl_divergence_nats",
            "rlvitals_learner_residual_variance_ratio", "rlvitals_learner_terminal_correlation",
            "rlvitals_learner_penultimate_terminal_correlation", "rlvitals_learner_value",
            "rlvitals_learner_value_target", "rlvitals_learner_advantage", "rlvitals_learner_reward",
            "rlvitals_learner_value_target_distribution", "rlvitals_learner_advantage_distribution",
            "rlvitals_learner_update_step", "rlvitals_learner_gradient", "rlvitals_learner_gradient_noise_scale",
            "rlvitals_learner_loss"} <= learning
    systems = names("systems")
    assert {"rlvitals_learner_phase_seconds_total", "rlvitals_actor_phase_seconds_total",
            "rlvitals_process_resident_memory_bytes", "rlvitals_torch_memory_allocated_bytes",
            "rlvitals_gpu_memory_used_bytes", "rlvitals_gpu_utilization_ratio", "rlvitals_gpu_temperature_celsius",
            "rlvitals_gpu_power_watts", "rlvitals_actor_restarts_total", "rlvitals_samples_dropped_total"} <= systems
    heatmaps = [p for p in data_panels(DASHBOARDS["learning"]) if p["type"] == "heatmap"]
    assert {metric_names(p["targets"][0]["expr"]).pop() for p in heatmaps} >= {
        "rlvitals_learner_value_target_distribution", "rlvitals_learner_advantage_distribution"}


def test_stat_gauges_are_bands_and_histograms_heatmaps_or_quantiles():
    for d in DASHBOARDS.values():
        for p in data_panels(d):
            for t in p["targets"]:
                for name in metric_names(t["expr"]):
                    m = BY_NAME[name]
                    if m.labels == ("stat",) and len(p["targets"]) > 1:
                        stats = {re.search(r'stat="(\w+)"', x["expr"]).group(1) for x in p["targets"]}
                        assert {"min", "mean", "max"} <= stats, p["title"]
                    if m.kind == "histogram":
                        assert "histogram_quantile" in t["expr"] or t.get("format") == "heatmap" or \
                            "_sum" in t["expr"], p["title"]


def test_variables_read_catalogue_metrics_and_include_all():
    for d in DASHBOARDS.values():
        for name in ("run", "node"):
            var = variable(d, name)
            assert var["includeAll"] and var["allValue"] == ".*" and var["datasource"] == DATASOURCE
            promql, _ = variable_source(var)
            assert problems(promql) == [], variable_query(var)
        assert d["links"] and d["links"][0]["tags"] == ["rlvitals"]


# ======================================================================
# 3. Provisioning
# ======================================================================
def provisioning(kind: str) -> dict:
    files = sorted((PROVISIONING / kind).glob("*.yml"))
    assert len(files) == 1, f"expected one provisioning file in {PROVISIONING / kind}"
    data = yaml.safe_load(files[0].read_text())
    assert data["apiVersion"] == 1
    return data


def test_datasource_provisioning_matches_prometheus():
    (ds,) = provisioning("datasources")["datasources"]
    prom = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert ds["type"] == "prometheus" and ds["access"] == "proxy" and ds["isDefault"] is True
    assert ds["url"] == "http://127.0.0.1:9090"
    assert ds["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]


def test_dashboard_provider_reads_the_folder_compose_mounts_the_dashboards_at():
    (provider,) = provisioning("dashboards")["providers"]
    assert provider["type"] == "file" and provider["folder"]
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["../dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert (REPO / "deploy" / ".." / "dashboards").resolve() == DASHBOARD_DIR  # compose paths are relative to deploy/
    password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GF_SECURITY_ADMIN_PASSWORD:?"), "compose must refuse to start without a password"
    for service in compose["services"].values():
        assert service["network_mode"] == "host"
    assert "127.0.0.1" in " ".join(compose["services"]["prometheus"]["command"])
    assert grafana["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"


def test_rendered_provisioning_points_at_this_checkout(tmp_path):
    from rlvitals.stack import render_provisioning

    out = render_provisioning(tmp_path / "prov", "http://127.0.0.1:19090", "1s", str(DASHBOARD_DIR))
    (ds,) = yaml.safe_load(next((out / "datasources").glob("*.yml")).read_text())["datasources"]
    assert ds["url"] == "http://127.0.0.1:19090" and ds["jsonData"]["timeInterval"] == "1s"
    (provider,) = yaml.safe_load(next((out / "dashboards").glob("*.yml")).read_text())["providers"]
    assert Path(provider["options"]["path"]) == DASHBOARD_DIR
    assert {p.name for p in Path(provider["options"]["path"]).glob("*.json")} == {"overview.json", "learning.json",
                                                                                   "systems.json"}


# ======================================================================
# 4. Every query against a real Prometheus scraping real runs
# ======================================================================
LIVE_ENV_MODULE = "rlvitals_dashboards_test_env"
LIVE_ENV_ID = "rlvitals_dash/HintedCoin-v0"
LIVE_ENV_SOURCE = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class HintedCoin(gym.Env):
    """2-4 steps; the observation hints at a coin; the final reward depends on the guess and varies."""

    def __init__(self):
        self.observation_space = spaces.Box(-2.0, 2.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._coin, self._steps, self._left = 1.0, 2, 2

    def _obs(self):
        hint = self._coin + float(self.np_random.normal(0.0, 0.5))
        return np.array([np.clip(hint, -2, 2), self._left / 4.0, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._coin = 1.0 if self.np_random.random() < 0.5 else -1.0
        self._left = int(self.np_random.integers(2, 5))
        return self._obs(), {}

    def step(self, action):
        self._left -= 1
        if self._left > 0:
            return self._obs(), 0.0, False, False, {}
        guess = 1.0 if int(action) == 1 else -1.0
        reward = guess * self._coin * float(self.np_random.uniform(0.5, 1.5))
        return self._obs(), reward, True, False, {"is_success": reward > 0}


if "ENV_ID" not in gym.registry:
    gym.register("ENV_ID", entry_point=HintedCoin, disable_env_checker=True)
'''.replace("ENV_ID", LIVE_ENV_ID)
LIVE_LEVELS = ("standard", "debug")
SCRAPE = "1s"
SUBSTITUTIONS = {"$__rate_interval": "5s", "$__range": "5m", "$node": ".*", "$instance": ".*"}
READY_TIMEOUT = 150.0


def rlvitals_command() -> list[str]:
    script = Path(sys.executable).with_name("rlvitals")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rlvitals.cli"]


def instantiate(expr: str, run_id: str) -> str:
    """The query as Grafana sends it with $run = one run and the other variables at their defaults."""
    for name, value in SUBSTITUTIONS.items():
        expr = expr.replace(name, value)
    return expr.replace("$run", run_id)


def evaluate(prom_url: str, promql: str) -> list[dict]:
    url = f"{prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    status, body = http_get(url, timeout=10)
    assert status == 200, f"Prometheus rejected {promql!r}: HTTP {status} {body[:300]!r}"
    payload = json.loads(body)
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def level_of(expr: str) -> tuple[str, bool]:
    """(lowest verbosity at which every metric of the query is exported, any of them hardware-only)."""
    ms = [BY_NAME[n] for n in metric_names(expr)]
    if not ms:
        return "minimal", False
    return max((m.level for m in ms), key=LEVELS.index), any(m.hardware or m.only_in for m in ms)


def fleet_only(expr: str) -> bool:
    """A query of a fleet's actors or node sidecars (component="actor"/"node" only): a local run has none.

    tests/test_fleet_dashboards.py gives these data with a simulated fleet."""
    components = [m.get("component") for _, m in selectors(expr) if catalogue_metric(_) is not None]
    return bool(components) and all(c is not None and c[0] == "=~" and set(c[1].split("|")) <= {"actor", "node"}
                                    for c in components)


def all_exprs() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) of every panel query."""
    return [(name, title, expr) for name, d in DASHBOARDS.items() for title, expr in queries(d)]


def annotation_exprs() -> list[str]:
    """Annotation queries (firing alerts): valid, but empty on a healthy run."""
    return [a["expr"] for d in DASHBOARDS.values() for a in d["annotations"]["list"] if "expr" in a]


class LiveStack:
    """`rlvitals stack up` watching two real training runs; everything stopped at the end."""

    def __init__(self, root: Path, env_dir: Path, env_spec: str):
        self.root = root
        self.state_dir = root / "stack"
        self.runs = {level: root / f"run-{level}" for level in LIVE_LEVELS}
        self.environ = {k: v for k, v in os.environ.items() if k != "RLVITALS_VERBOSITY"}
        self.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(env_dir), os.environ.get("PYTHONPATH")]))
        self.environ.pop("RLVITALS_GRAFANA_PASSWORD", None)
        self.port = free_port()
        self.prom_url = f"http://127.0.0.1:{self.port}"
        self.env_spec = env_spec
        self.procs: dict[str, subprocess.Popen] = {}

    def stack(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(rlvitals_command() + ["stack", *args, "--state-dir", str(self.state_dir)],
                              capture_output=True, text=True, timeout=180, env=self.environ)

    def start(self) -> None:
        up = self.stack("up", "--prometheus-port", str(self.port), "--grafana-port", str(free_port()),
                        "--scrape-interval", SCRAPE, *[f"--run-dir={d}" for d in self.runs.values()])
        assert up.returncode == 0, f"rlvitals stack up failed:\n{up.stdout}\n{up.stderr}"
        for level, run_dir in self.runs.items():
            command = rlvitals_command() + [
                "train", "--env", self.env_spec, "--total-env-steps", "1000000000", "--verbosity", level,
                "--num-envs", "8", "--rollout-length", "16", "--metrics-port", "0", "--progress", "false",
                "--device", "cpu", "--run-dir", str(run_dir)]
            with open(self.root / f"run-{level}.log", "wb") as log:
                self.procs[level] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environ,
                                                     stdin=subprocess.DEVNULL)

    def run_id(self, level: str) -> str:
        deadline = time.monotonic() + 90
        meta = self.runs[level] / "meta.json"
        while not meta.is_file():
            assert time.monotonic() < deadline and self.procs[level].poll() is None, self.output(level)
            time.sleep(0.2)
        return json.loads(meta.read_text())["run_id"]

    def output(self, level: str) -> str:
        return (self.root / f"run-{level}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> dict[str, int]:
        codes = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # finish the update, write the archive
        for level, proc in self.procs.items():
            try:
                codes[level] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[level] = proc.wait(timeout=30)
        self.stack("down")
        return codes


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(LiveStack, {level: run_id}, {(level, expr): result}) once every query that should have data has it."""
    if shutil.which("prometheus") is None:
        pytest.skip("the `prometheus` binary is not on PATH (Debian: apt-get install prometheus)")
    root = tmp_path_factory.mktemp("dashlive")
    env_dir = root / "envmodule"
    env_dir.mkdir()
    (env_dir / f"{LIVE_ENV_MODULE}.py").write_text(LIVE_ENV_SOURCE)
    stack = LiveStack(root, env_dir, f"{LIVE_ENV_MODULE}:{LIVE_ENV_ID}")
    try:
        stack.start()
        run_ids = {level: stack.run_id(level) for level in LIVE_LEVELS}
        wanted = [(level, expr) for _, _, expr in all_exprs() for level in LIVE_LEVELS
                  if not level_of(expr)[1] and not fleet_only(expr)
                  and LEVELS.index(level) >= LEVELS.index(level_of(expr)[0])]
        wanted = list(dict.fromkeys(wanted))
        results: dict = {}
        had_data: set = set()  # (level, expr) that returned data at some point while the runs were alive
        deadline = time.monotonic() + READY_TIMEOUT
        pending = list(wanted)
        while pending and time.monotonic() < deadline:
            for level in LIVE_LEVELS:
                assert stack.procs[level].poll() is None, f"the {level} run ended early:\n{stack.output(level)}"
            for level, expr in pending:
                if has_data(evaluate(stack.prom_url, instantiate(expr, run_ids[level]))):
                    had_data.add((level, expr))
            pending = [p for p in pending if p not in had_data]
            if pending:
                time.sleep(1.0)
        ready_after = time.monotonic() - (deadline - READY_TIMEOUT)
        # One more pass over everything while both runs are still alive.
        for expr in [e for _, _, e in all_exprs()] + annotation_exprs():
            for level in LIVE_LEVELS:
                results[(level, expr)] = evaluate(stack.prom_url, instantiate(expr, run_ids[level]))
        variables = {}
        for name, d in DASHBOARDS.items():
            for var_name in ("run", "node"):
                var = variable(d, var_name)
                promql, label = variable_source(var)
                promql = instantiate(promql, ".*")
                if label is None:
                    texts = query_result_lines(evaluate(stack.prom_url, promql))
                else:
                    status, body = http_get(f"{stack.prom_url}/api/v1/series?" +
                                            urllib.parse.urlencode({"match[]": promql}), timeout=10)
                    assert status == 200, body[:300]
                    texts = sorted({s.get(label) for s in json.loads(body)["data"]} - {None})
                variables[(name, var_name)] = variable_options(var, texts)
        codes = stack.stop()
        print(f"every query had data {ready_after:.1f} s after the runs started")
        yield {"stack": stack, "run_ids": run_ids, "results": results, "had_data": had_data, "variables": variables,
               "codes": codes}
    finally:
        for proc in stack.procs.values():
            if proc.poll() is None:
                proc.kill()
        if (stack.state_dir / "state.json").exists():
            stack.stack("down")


@pytest.mark.slow
def test_every_panel_query_has_data_at_its_level(live):
    missing = []
    for dashboard, title, expr in all_exprs():
        level, hardware = level_of(expr)
        for run_level in LIVE_LEVELS:
            if hardware or fleet_only(expr) or LEVELS.index(run_level) < LEVELS.index(level):
                continue
            if (run_level, expr) not in live["had_data"]:
                missing.append(f"{dashboard} / {title} at {run_level}: {expr}")
    assert missing == [], "queries without data:\n" + "\n".join(missing)


@pytest.mark.slow
def test_debug_panels_are_empty_for_a_standard_run(live):
    """The levels are real: debug-only queries have nothing for the standard run."""
    debug_only = [(d, t, e) for d, t, e in all_exprs() if level_of(e)[0] == "debug"]
    assert len(debug_only) >= 6
    for dashboard, title, expr in debug_only:
        assert live["results"][("standard", expr)] == [], f"{dashboard} / {title} has data at standard: {expr}"


@pytest.mark.slow
def test_hardware_and_annotation_queries_are_valid_and_only_they_are_exempt(live):
    hardware = [e for _, _, e in all_exprs() if level_of(e)[1]]
    assert hardware, "the GPU panels query nothing"
    for expr in hardware:
        assert all(BY_NAME[n].hardware or BY_NAME[n].only_in for n in metric_names(expr)), \
            f"a metric every run has in a query exempt as GPU-only or policy-only: {expr}"
    for expr in hardware + annotation_exprs():
        for level in LIVE_LEVELS:
            assert (level, expr) in live["results"]  # evaluated, and Prometheus accepted it
    for expr in annotation_exprs():
        assert live["results"][("debug", expr)] == [], "an alert fired on a healthy run"


@pytest.mark.slow
def test_the_run_selector_shows_each_runs_name_and_env_and_selects_its_id(live):
    for name in DASHBOARDS:
        runs = live["variables"][(name, "run")]
        for level, run_id in live["run_ids"].items():
            assert (run_id, f"run-{level} ({live['stack'].env_spec})") in runs, runs
        assert len({value for value, _ in runs}) == len(runs), f"a run listed twice: {runs}"


@pytest.mark.slow
def test_runs_stopped_cleanly_and_the_stack_went_down(live):
    assert live["codes"] == {level: 0 for level in LIVE_LEVELS}
    assert not (live["stack"].state_dir / "state.json").exists()
    assert http_get(f"{live['stack'].prom_url}/-/ready", timeout=2)[0] == 0


@pytest.mark.slow
def test_a_band_panel_gets_one_series_per_query_for_one_run(live):
    """Band panels fill from `max` down to `min` by series name: with one run each name must be one series."""
    bands = [(name, p) for name, d in DASHBOARDS.items() for p in data_panels(d) if p.get("repeat") == "run"]
    assert len(bands) >= 6
    for dashboard, panel in bands:
        for t in panel["targets"]:
            level, _ = level_of(t["expr"])
            for run_level in LIVE_LEVELS:
                if LEVELS.index(run_level) >= LEVELS.index(level):
                    result = live["results"][(run_level, t["expr"])]
                    assert len(result) == 1, f"{dashboard} / {panel['title']} {t['legendFormat']}: {result}"
