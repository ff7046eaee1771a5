"""What the dashboards show at a glance, checked on the generated JSON models (no Grafana server can run here;
tests/test_dashboards.py evaluates every query against a real Prometheus scraping real runs):

  1. threshold steps are the health rules' values and the catalogue's stated bands, coloured by what holds there
  2. units: things per second, nats, ratios beyond 1 as plain numbers
  3. stat-labelled gauges: min to max shaded around the mean, std on a right-hand axis, one panel per run
  4. each panel links to its metrics' sections of docs/metrics.md, at an address the generator takes
  5. the run selector shows `run_name (env)` and selects the run id; run_info and discovery files carry run_name
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from test_dashboards import DASHBOARDS, data_panels, variable, variable_options, variable_source

from rlvitals.dashboards import REFERENCE_URL, generate, healthy, panels
from rlvitals.dashboards.promql import metric_names
from rlvitals.telemetry import reference
from rlvitals.telemetry.bands import catalogue_bands
from rlvitals.telemetry.catalogue import BY_NAME, METRICS, ROW_KEYS
from rlvitals.telemetry.rules import BY_RULE, RULES, Rule, S, thresholds

SEVERITY_ORDER = ("info", "warning", "critical")
COLOURS = {"info": "yellow", "warning": "orange", "critical": "red"}


def panel_metrics(panel: dict) -> set[str]:
    return set().union(*(metric_names(t["expr"]) for t in panel["targets"]))


def timeseries_showing(metric: str, dashboards: dict = DASHBOARDS) -> list[dict]:
    return [p for d in dashboards.values() for p in data_panels(d)
            if p["type"] == "timeseries" and metric in panel_metrics(p)]


def steps_of(panel: dict) -> list[dict]:
    return panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])


def log_axis(panel: dict) -> bool:
    return panel["fieldConfig"]["defaults"]["custom"].get("scaleDistribution", {}).get("type") == "log"


def colour_at(steps: list[dict], y: float) -> str:
    """The colour Grafana gives value y: that of the highest step at or below it (the base step below them all)."""
    colour = steps[0]["color"]
    for step in steps[1:]:
        if y >= step["value"]:
            colour = step["color"]
    return colour


def beyond(value: float, op: str) -> float:
    """A value just on the firing side of `signal OP value`."""
    eps = max(abs(value) * 1e-3, 1e-12)
    return value - eps if op in ("<", "<=") else value + eps


def rendered() -> dict:
    return {name.removesuffix(".json"): json.loads(text) for name, text in generate.render_all().items()}


# ======================================================================
# 1. Health rules' thresholds and the catalogue's healthy bands
# ======================================================================
def test_every_rule_threshold_is_a_step_on_each_panel_of_its_metric_coloured_by_its_severity():
    checked = set()
    for rule in RULES:
        for key, op, value in thresholds(rule):
            metric, labels = ROW_KEYS[key]
            if ("stat", "std") in labels:
                continue  # a band panel's std is on its own axis
            panels = timeseries_showing(metric.name)
            assert panels, f"{rule.name}: {metric.name} is on no time-series panel"
            for panel in panels:
                if log_axis(panel) and value <= 0:
                    continue
                steps = steps_of(panel)
                where = f"{rule.name} on {panel['title']!r}"
                assert value in [s["value"] for s in steps[1:]], f"{where}: no step at {value}: {steps}"
                colour = colour_at(steps, beyond(value, op))
                assert colour in [COLOURS[s] for s in SEVERITY_ORDER[SEVERITY_ORDER.index(rule.severity):]], \
                    f"{where}: {colour} beyond {op} {value}"
                assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "line+area"}
                assert rule.name in panel["description"], where
                checked.add(rule.name)
    assert len(checked) >= 15, sorted(checked)


def test_stated_healthy_bands_are_green_where_no_rule_fires():
    bands_drawn = 0
    for d in DASHBOARDS.values():
        for panel in data_panels(d):
            if panel["type"] != "timeseries":
                continue
            names = tuple(sorted(panel_metrics(panel)))
            bands = [b for n in names if "stat" not in BY_NAME[n].labels for b in catalogue_bands(BY_NAME[n].help)]
            rules = healthy.rule_thresholds(names)
            for lo, hi in bands:
                inside = [y for y in (lo, hi) if y is not None and not (log_axis(panel) and y <= 0)]
                for y in inside:
                    probe = y + 1e-6 if y == lo else y - 1e-6
                    if not any(t.fires(probe) for t in rules):
                        assert colour_at(steps_of(panel), probe) == "green", (panel["title"], (lo, hi), probe)
                        bands_drawn += 1
    assert bands_drawn >= 3


def test_no_threshold_number_is_typed_twice():
    """Every step sits on a rule's threshold or an edge the metric's help text states: nothing else."""
    shaded = 0
    for d in DASHBOARDS.values():
        for panel in data_panels(d):
            if panel["type"] != "timeseries" or not steps_of(panel):
                continue
            names = panel_metrics(panel)
            allowed = {value for rule in RULES for key, _, value in thresholds(rule) if ROW_KEYS[key][0].name in names}
            allowed |= {e for n in names for band in catalogue_bands(BY_NAME[n].help) for e in band if e is not None}
            values = {s["value"] for s in steps_of(panel)[1:]}
            assert values and values <= allowed, (panel["title"], values - allowed)
            assert steps_of(panel)[0]["value"] is None
            shaded += 1
    assert shaded >= 12


def test_a_changed_rule_or_help_text_moves_the_lines(monkeypatch):
    """The dashboards read the rules and the catalogue when generated: change either and the steps follow."""
    planted = Rule("RLPlantedForTheTest", S("clip_fraction") > 0.42, 0, "fast", "critical", "optimizer", "s", "c")
    monkeypatch.setattr(healthy, "RULES", RULES + (planted,))
    dead = "rlvitals_learner_layer_dead_ratio"
    monkeypatch.setitem(BY_NAME, dead, dataclasses.replace(BY_NAME[dead], help="Dead units. Healthy: below 0.25."))
    models = rendered()
    (clip,) = timeseries_showing("rlvitals_learner_clip_fraction_ratio", models)
    assert colour_at(steps_of(clip), 0.43) == "red" and "RLPlantedForTheTest" in clip["description"]
    assert colour_at(steps_of(clip), 0.35) == COLOURS[BY_RULE["RLClipFractionHigh"].severity]
    (layers,) = timeseries_showing(dead, models)
    assert [s["value"] for s in steps_of(layers)[1:]] == [0.25]
    assert colour_at(steps_of(layers), 0.2) == "green" and colour_at(steps_of(layers), 0.3) == "transparent"


@pytest.mark.parametrize("op, value, inside, outside", [(">", 2.0, 2.5, 1.5), ("<=", 0.0, -1.0, 0.5)])
def test_region_colours_follow_the_comparison(op, value, inside, outside):
    t = healthy.Threshold(value, op, "RLX", "warning")
    assert healthy.colour_at(inside, [t], []) == "orange"
    assert healthy.colour_at(outside, [t], []) == "transparent"
    assert healthy.colour_at(outside, [t], [(None, None)]) == "green"
    critical = healthy.Threshold(value, op, "RLY", "critical")
    assert healthy.colour_at(inside, [t, critical], []) == "red"


# ======================================================================
# 2. Units that read right
# ======================================================================
RATIOS_BEYOND_ONE = ("rlvitals_learner_residual_variance_ratio", "rlvitals_learner_value_target_scale_ratio",
                     "rlvitals_learner_gradient_mismatch_ratio", "rlvitals_learner_actor_weights_mismatch_ratio",
                     "rlvitals_learner_training_intensity")
"""Ratios a broken (or, for training intensity, a healthy) run drives above 1: percentunit would read 300%."""
PLAIN_NUMBERS = ("none", "short")


def test_ratios_that_can_exceed_one_are_plain_numbers():
    for name in RATIOS_BEYOND_ONE:
        for panel in timeseries_showing(name):
            assert panel["fieldConfig"]["defaults"]["unit"] in PLAIN_NUMBERS, (name, panel["title"])
    for d in DASHBOARDS.values():
        for panel in data_panels(d):
            if panel["fieldConfig"]["defaults"]["unit"] != "percentunit":
                continue
            for name in panel_metrics(panel):  # a fraction of 0 to 1: a catalogue fraction or a share of wall time
                m = BY_NAME[name]
                assert m.unit == "percentunit" or (m.unit == "s" and m.kind == "counter"), (panel["title"], name)
                assert name != "rlvitals_process_cpu_seconds_total", "a process's CPU can exceed one core"


def test_throughput_reads_things_per_second_and_kl_reads_nats():
    units = {}
    for d in DASHBOARDS.values():
        for panel in data_panels(d):
            unit = panel["fieldConfig"]["defaults"]["unit"]
            units[panel["title"]] = unit
            assert unit != "cps", f"{panel['title']}: c/s says nothing; name what is counted"
            counts = [n for n in panel_metrics(panel) if BY_NAME[n].kind == "counter"
                      and BY_NAME[n].unit in panels.COUNT_UNITS]
            if counts and "rate(" in panel["targets"][0]["expr"]:
                assert unit.startswith("count:") and unit.endswith("/s"), (panel["title"], unit)
    assert units["Env steps/s"] == units["Env steps/s across actors"] == "count:steps/s"
    assert units["Learner samples/s"] == "count:samples/s"
    assert units["KL(behaviour || learner)"] == "suffix:nats"
    assert units["Actor-learner log-prob discrepancy"] == "suffix:nats"
    assert units["Process CPU (cores busy)"] == "count:cores"


def test_a_rate_of_counts_must_say_what_it_counts():
    with pytest.raises(panels.CatalogueError, match="counts="):
        panels.rates("rlvitals_actor_env_steps_total")
    assert panels.rates("rlvitals_actor_env_steps_total", counts="steps").unit == "count:steps/s"
    assert panels.rates("rlvitals_weight_publish_bytes_total").unit == "Bps"


# ======================================================================
# 3. Stat-labelled gauges: a band per run, std on its own axis
# ======================================================================
def band_panels() -> list[dict]:
    return [p for d in DASHBOARDS.values() for p in data_panels(d) if p["type"] == "timeseries"
            and any(BY_NAME[n].labels == ("stat",) and set(BY_NAME[n].label_values["stat"]) >= {"min", "max", "std"}
                    for n in panel_metrics(p))]


def overrides_by_name(panel: dict) -> dict[str, dict]:
    out = {}
    for o in panel["fieldConfig"]["overrides"]:
        assert o["matcher"]["id"] == "byName", o
        out[o["matcher"]["options"]] = {p["id"]: p["value"] for p in o["properties"]}
    return out


def test_stat_gauges_shade_min_to_max_around_the_mean_with_std_on_the_right():
    found = band_panels()
    assert {n for p in found for n in panel_metrics(p)} >= {
        "rlvitals_learner_value", "rlvitals_learner_value_target", "rlvitals_learner_advantage",
        "rlvitals_learner_reward", "rlvitals_actor_episode_return", "rlvitals_actor_episode_length"}
    for panel in found:
        names = [t["legendFormat"] for t in panel["targets"]]
        assert names == ["min", "mean", "max", "std"], (panel["title"], names)
        for t in panel["targets"]:  # one series per run, so each name is one series in a one-run panel
            assert t["expr"].startswith(("min by (run_id)", "max by (run_id)", "avg by (run_id)")), t["expr"]
            assert f'stat="{t["legendFormat"]}"' in t["expr"]
        by_name = overrides_by_name(panel)
        assert by_name["max"]["custom.fillBelowTo"] == "min" and by_name["max"]["custom.fillOpacity"] > 0
        assert by_name["min"]["custom.fillOpacity"] == 0
        assert by_name["std"]["custom.axisPlacement"] == "right"
        assert all(by_name[s].get("custom.axisPlacement", "auto") != "right" for s in ("min", "mean", "max"))
        assert by_name["min"]["color"] == by_name["max"]["color"] == by_name["mean"]["color"] != by_name["std"]["color"]
        assert by_name["mean"]["custom.lineWidth"] > panel["fieldConfig"]["defaults"]["custom"]["lineWidth"]
        # Grafana fills between two named series of one panel: one panel per selected run.
        assert panel["repeat"] == "run" and panel["repeatDirection"] == "v", panel["title"]
        assert panel["title"].endswith("${run:text}")


def test_band_panels_repeat_over_a_multi_value_run_variable():
    for d in DASHBOARDS.values():
        (run,) = [v for v in d["templating"]["list"] if v["name"] == "run"]
        assert run["multi"] and run["includeAll"]
        repeated = [p for p in data_panels(d) if p.get("repeat")]
        assert all(p["repeat"] == "run" for p in repeated)
        assert not [p for p in data_panels(d) if "${run:text}" in p["title"] and not p.get("repeat")]


# ======================================================================
# 4. Each panel links to its metrics' sections of the reference
# ======================================================================
def github_anchor(heading: str) -> str:
    """The id GitHub (and most Markdown renderers) give a heading: lower case, punctuation but - and _ dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_each_panel_links_to_the_reference_section_of_each_of_its_metrics():
    anchors = {github_anchor(line[4:]) for line in reference.render().splitlines() if line.startswith("### ")}
    linked = set()
    for d in DASHBOARDS.values():
        (var,) = [v for v in d["templating"]["list"] if v["name"] == "reference"]
        assert var["type"] == "textbox" and var["hide"] == 2 and var["query"] == REFERENCE_URL
        assert var["current"]["value"] == REFERENCE_URL
        for panel in data_panels(d):
            names = sorted(panel_metrics(panel))
            links = panel.get("links", [])
            assert sorted(link["url"].removeprefix("${reference}#") for link in links) == names, panel["title"]
            for link in links:
                assert link["url"].startswith("${reference}#") and link["targetBlank"] is True
                anchor = link["url"].split("#", 1)[1]
                assert anchor in anchors, f"{panel['title']}: no section #{anchor} in docs/metrics.md"
                assert anchor in link["title"]
                linked.add(anchor)
    assert linked == {m.name for m in METRICS}


def test_the_reference_address_is_a_generator_option(tmp_path, capsys):
    mirror = "https://docs.example.org/rlvitals/metrics.html"
    assert generate.main(["--dir", str(tmp_path), "--reference-url", mirror]) == 0
    assert generate.main(["--check", "--dir", str(tmp_path), "--reference-url", mirror]) == 0
    assert generate.main(["--check", "--dir", str(tmp_path)]) == 1, "files for another address must read as stale"
    for path in tmp_path.glob("*.json"):
        (var,) = [v for v in json.loads(path.read_text())["templating"]["list"] if v["name"] == "reference"]
        assert var["query"] == var["current"]["value"] == mirror
    assert REFERENCE_URL.startswith("https://") and REFERENCE_URL.endswith("/docs/metrics.md")


# ======================================================================
# 5. The run selector shows a run's name and env, and selects its id
# ======================================================================
def test_the_run_selector_takes_its_value_and_text_from_named_groups_in_either_label_order():
    for d in DASHBOARDS.values():
        var = variable(d, "run")
        promql, label = variable_source(var)
        assert label is None and "rlvitals_run_info" in promql and "$__range" in promql
        assert var["multi"] and var["includeAll"] and var["allValue"] == ".*" and var["sort"] == 1
        lines = ['{run_id="9f2c", run_label="cp0 (CartPole-v1)"} 1 1700000000000',
                 '{run_label="ant (mod:Ant-v5)", run_id="77ab"} 1 1700000000000',
                 '{exported_run_id="ffff", run_id="aa00", run_label="x (y)"} 1 1700000000000']
        assert variable_options(var, lines) == [("77ab", "ant (mod:Ant-v5)"), ("9f2c", "cp0 (CartPole-v1)"),
                                                ("aa00", "x (y)")]


def test_run_info_and_every_discovery_file_name_the_run(tmp_path):
    from rlvitals.archive import RunArchive
    from rlvitals.config import TrainConfig
    from rlvitals.run import run_info
    from rlvitals.telemetry.process import TARGET_IDENTITY, run_target_labels, write_target

    cfg = TrainConfig(env="CartPole-v1", run_dir=str(tmp_path / "cp0"), progress=False).validate()
    archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["rlvitals", "train"])
    try:
        info = run_info(cfg, archive)
    finally:
        archive.close()
    assert set(info) == set(BY_NAME["rlvitals_run_info"].labels), "run_info and the catalogue's labels differ"
    assert info["run_name"] == "cp0" and info["env"] == "CartPole-v1"
    assert set(TARGET_IDENTITY) <= set(info)
    target = write_target(str(tmp_path / "discovery"), "actor-0", "127.0.0.1:1", {"component": "actor",
                                                                                  **run_target_labels(info)})
    (entry,) = json.loads(target.read_text())
    assert entry["labels"] == {"component": "actor", "run_id": info["run_id"], "run_name": "cp0"}
