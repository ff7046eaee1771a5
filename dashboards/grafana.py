"""The Grafana dashboard JSON model of a `Dashboard` spec: panels placed on the grid, variables, annotations."""

from __future__ import annotations

from . import REFERENCE_URL
from .healthy import legend_text, threshold_steps
from .panels import DATASOURCE, DRILL_DOWN, GRID_WIDTH, Dashboard, Panel

SCHEMA_VERSION = 39
TAG = "rlvitals"
REFERENCE_VARIABLE = "reference"
"""Hidden dashboard variable holding the metric reference's address (REFERENCE_URL unless set otherwise)."""


# The run selector lists each run seen in the time range as "run_name (env)" and selects its run_id:
# PromQL writes the text into a label, Grafana's regex takes `value` and `text` from the result line
# (`{run_id="...", run_label="..."} 1 <time>`, labels in either order).
RUN_LABEL = "run_label"
RUN_QUERY = (f'query_result(max by (run_id, {RUN_LABEL}) (label_replace(label_join('
             f'last_over_time(rlvitals_run_info[$__range]), "{RUN_LABEL}", " (", "run_name", "env"), '
             f'"{RUN_LABEL}", "$1)", "{RUN_LABEL}", "(.+)")))')
RUN_REGEX = f'/^(?=.*\\brun_id="(?<value>[^"]+)")(?=.*\\b{RUN_LABEL}="(?<text>[^"]+)")/'


def _templating(reference_url: str) -> dict:
    def query_variable(name: str, label: str, query: str, regex: str = "") -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "definition": query,
                "query": {"query": query, "refId": f"{name}-variable"}, "refresh": 2, "sort": 1, "multi": True,
                "includeAll": True, "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "hide": 0, "regex": regex, "options": []}

    # Processes to draw on their own on the fleet panels: no "All" (a fleet of 1,000 is the min/median/max
    # lines), several may be picked; Grafana picks the first listed until someone chooses.
    drill_down = {**query_variable(DRILL_DOWN, "Process", f'label_values(rlvitals_process_resident_memory_bytes'
                                                          f'{{run_id=~"$run", node=~"$node"}}, {DRILL_DOWN})'),
                  "includeAll": False, "allValue": None, "current": {}}
    return {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "refresh": 1,
         "regex": "", "hide": 0, "includeAll": False, "multi": False, "current": {}, "options": []},
        query_variable("run", "Run", RUN_QUERY, RUN_REGEX),
        query_variable("node", "Node", 'label_values(rlvitals_process_resident_memory_bytes{run_id=~"$run"}, node)'),
        drill_down,
        {"name": REFERENCE_VARIABLE, "label": "Metric reference", "type": "textbox", "hide": 2,
         "description": "Address of docs/metrics.md; each panel's link adds #<metric name>", "query": reference_url,
         "current": {"selected": False, "text": reference_url, "value": reference_url},
         "options": [{"selected": True, "text": reference_url, "value": reference_url}]},
    ]}


def _annotations() -> dict:
    return {"list": [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"datasource": DATASOURCE, "enable": True, "expr": 'ALERTS{alertstate="firing", run_id=~"$run"}',
         "iconColor": "red", "name": "rlvitals alerts", "step": "1m", "titleFormat": "{{alertname}}",
         "tagKeys": "severity,run_id", "textFormat": "{{run_id}}", "useValueForTime": False},
    ]}


def _panel_json(panel: Panel, pid: int, pos: dict) -> dict:
    out = {"id": pid, "type": panel.kind, "title": panel.title, "description": panel.description(),
           "datasource": DATASOURCE, "gridPos": pos}
    if panel.per_run:  # copies stacked below each other keep the row's layout when one run is selected
        out.update(title=f"{panel.title}: ${{run:text}}", repeat="run", repeatDirection="v")
    defaults = {"unit": panel.unit, **panel.defaults}
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never",
                              "spanNulls": False, "axisCenteredZero": False, **panel.custom}
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "none"}}
    else:
        out["options"] = panel.options
    if panel.kind == "timeseries":
        _healthy_at_a_glance(panel, defaults, out)
    out["fieldConfig"] = {"defaults": defaults, "overrides": panel.overrides}
    out["targets"] = [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(panel.targets)]
    if panel.transformations:
        out["transformations"] = panel.transformations
    out["links"] = [{"title": f"{name} in the metric reference", "url": f"${{{REFERENCE_VARIABLE}}}#{name}",
                     "targetBlank": True} for name in panel.metrics]
    return out


def _healthy_at_a_glance(panel: Panel, defaults: dict, out: dict) -> None:
    """Shade the panel where health rules fire and where the catalogue says healthy, and say so in its description."""
    log_scale = panel.custom.get("scaleDistribution", {}).get("type") == "log"
    steps = threshold_steps(panel.metrics, log_scale)
    if not steps:
        return
    defaults["thresholds"] = {"mode": "absolute", "steps": steps}
    defaults["custom"]["thresholdsStyle"] = {"mode": "line+area"}
    out["description"] += "\n\n" + legend_text(panel.metrics)


def build(spec: Dashboard, reference_url: str = REFERENCE_URL) -> dict:
    """The Grafana dashboard JSON model of one dashboard spec; panel links point into `reference_url`."""
    panels, pid, y = [], 1, 0
    for row in spec.rows:
        panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        x, line = 0, 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line = 0, y + line, 0
            panels.append(_panel_json(panel, pid, {"h": panel.height, "w": panel.width, "x": x, "y": y}))
            pid, x, line = pid + 1, x + panel.width, max(line, panel.height)
        y += line
    others = [{"asDropdown": False, "includeVars": True, "keepTime": True, "tags": [TAG], "title": "rlvitals",
               "type": "dashboards", "icon": "external link"}]
    return {"id": None, "uid": spec.uid, "title": spec.title, "description": spec.description, "tags": [TAG],
            "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
            "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "timezone": "browser",
            "timepicker": {}, "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
            "templating": _templating(reference_url), "annotations": _annotations(), "links": others, "panels": panels}
