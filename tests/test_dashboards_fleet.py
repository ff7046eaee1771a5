"""Dashboards at fleet scale: every panel draws a bounded number of lines per run, whatever the fleet size.

A run of 1,000 actors has 1,000 series of every per-process metric. A query may read them only
  - aggregated over processes (`sum`/`min`/`max`/`quantile`/... by labels that are not per process),
  - limited to a few named ones (`topk`/`bottomk` of at most MAX_NAMED, or `X and on (...) bottomk(...)`),
  - filtered by the drill-down variable (`instance=~"$instance"`), or
  - filtered to the processes a run has one of (`component=~"learner|local"`).
The PromQL shape is checked here; bench/fleet.py and tests/test_fleet_dashboards.py count the series
each query returns from a real Prometheus scraping a simulated fleet.
"""

from __future__ import annotations

import re

import pytest
from test_dashboards import DASHBOARDS, data_panels, variable

from rlvitals.dashboards.panels import DRILL_DOWN, OWN
from rlvitals.dashboards.promql import catalogue_metric

PER_PROCESS_LABELS = {"instance", "node", "actor", "pid"}
"""Labels with one value per process (or per machine): grouping by them keeps the fleet's size."""
MAX_NAMED = 10
MAX_SERIES_PER_RUN = 20
AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|quantile|stddev|stdvar|group)"
                         r"\s*(?:(by|without)\s*\(([^)]*)\))?\s*$")
LIMIT = re.compile(r"\b(topk|bottomk)\s*(?:by\s*\([^)]*\))?\s*$")
LIMITED_BY_AND = re.compile(r"\band\s+on\s*\(\)\s*(topk|bottomk)\b")
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def per_process(name: str) -> bool:
    """Series every process exports (actors, node sidecars, processes), as against the learner's own."""
    m = catalogue_metric(name)
    return name == "up" or (m is not None and m.component not in ("learner", "queue"))


def enclosing(expr: str, pos: int) -> list[int]:
    """Positions of the open parentheses around `pos`, innermost first (quoted strings skipped)."""
    stack, quoted = [], False
    for i, ch in enumerate(expr[:pos]):
        if ch == '"' and (i == 0 or expr[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch == "(":
            stack.append(i)
        elif not quoted and ch == ")":
            stack.pop()
    return stack[::-1]


def closing(expr: str, start: int) -> int:
    depth = 0
    for i in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    return len(expr)


def level_text(text: str) -> str:
    """`text` with everything inside its nested parentheses removed: what sits at its own level."""
    out, depth = [], 0
    for ch in text:
        if ch == ")":
            depth -= 1
        if depth == 0:
            out.append(ch)
        if ch == "(":
            depth += 1
    return "".join(out)


def bounded(expr: str, start: int, matchers: dict[str, tuple[str, str]]) -> bool:
    """Is the per-process selector at `start` reduced to a number of series that does not grow with the fleet?"""
    if matchers.get("instance") == ("=~", f"${DRILL_DOWN}"):
        return True
    op, value = matchers.get("component", ("", ""))
    if op in ("=", "=~") and set(value.split("|")) <= set(OWN.split("|")):
        return True
    groups = enclosing(expr, start) + [-1]   # -1: the whole expression
    for open_at in groups:
        inner = expr[open_at + 1: closing(expr, open_at)] if open_at >= 0 else expr
        if LIMITED_BY_AND.search(level_text(inner)):
            return True
        if open_at < 0:
            break
        before = expr[:open_at]
        if LIMIT.search(before):
            k = re.match(r"\s*(\d+)\s*,", inner)
            return bool(k) and int(k.group(1)) <= MAX_NAMED
        if m := AGGREGATION.search(before):
            how, labels = m.group(2), {x.strip() for x in (m.group(3) or "").split(",") if x.strip()}
            if how != "without" and not labels & PER_PROCESS_LABELS:
                return True
    return False


def unbounded_selectors(expr: str) -> list[str]:
    out = []
    for m in SELECTOR.finditer(expr):
        name = m.group(1)
        if not per_process(name):
            continue
        matchers = {label: (op, value) for label, op, value in MATCHER.findall(m.group(2))}
        if not bounded(expr, m.start(), matchers):
            out.append(f"{name}{{{m.group(2)}}}")
    return out


def all_targets():
    return [(name, p["title"], t) for name, d in DASHBOARDS.items() for p in data_panels(d) for t in p["targets"]]


def test_every_query_reads_per_process_series_only_aggregated_limited_or_picked():
    problems = [f"{d} / {title}: {sel} in {t['expr']}" for d, title, t in all_targets()
                for sel in unbounded_selectors(t["expr"])]
    assert problems == [], "\n".join(problems)


def test_every_panel_names_few_processes_per_run():
    """Lines per run: each target is one line per run (and bounded label), or its topk/bottomk's k."""
    for name, d in DASHBOARDS.items():
        for p in data_panels(d):
            lines = 0
            for t in p["targets"]:
                k = re.search(r"\b(?:topk|bottomk)\b[^(]*\(\s*(\d+)\s*,", t["expr"])
                lines += int(k.group(1)) if k else 1
            assert lines <= MAX_SERIES_PER_RUN, f"{name} / {p['title']}: {lines} lines per run"


@pytest.mark.parametrize("expr", [
    'rate(rlvitals_actor_env_steps_total{run_id=~"$run", node=~"$node"}[$__rate_interval])',
    'max by (run_id, instance) (rlvitals_process_resident_memory_bytes{run_id=~"$run", node=~"$node"})',
    'topk(50, rlvitals_process_resident_memory_bytes{run_id=~"$run", node=~"$node"})',
    'sum without (job) (rlvitals_process_resident_memory_bytes{run_id=~"$run", node=~"$node"})',
    'rlvitals_actor_network_age{run_id=~"$run", node=~"$node", component=~"actor|learner"}',
    'max by (run_id) (rlvitals_learner_network_age{run_id=~"$run"}) - rlvitals_actor_network_age{run_id=~"$run"}',
])
def test_the_series_bound_check_can_fail(expr):
    assert unbounded_selectors(expr)


@pytest.mark.parametrize("expr", [
    'quantile by (run_id) (0.5, rate(rlvitals_actor_env_steps_total{run_id=~"$run"}[$__rate_interval]))',
    'rate(rlvitals_actor_env_steps_total{component=~"actor"}[$__rate_interval]) and on (run_id, instance) '
    'bottomk by (run_id) (3, rate(rlvitals_actor_env_steps_total{component=~"actor"}[$__range] @ end()))',
    'rlvitals_process_resident_memory_bytes{component=~"actor", instance=~"$instance"}',
    'max by (run_id, component) (rlvitals_process_resident_memory_bytes{component=~"learner|local"})',
    'max by (run_id) (rlvitals_learner_network_age{run_id=~"$run"})',
])
def test_the_series_bound_check_passes_fleet_shapes(expr):
    assert unbounded_selectors(expr) == []


def test_fleet_panels_show_distribution_outliers_and_drill_down():
    systems = {p["title"]: p for p in data_panels(DASHBOARDS["systems"])}
    for title in ("Env steps/s across actors", "Episodes/s across actors", "Network age: actors and learner",
                  "Process resident memory", "Process CPU (cores busy)", "Machine memory", "Machine CPU utilisation"):
        exprs = [t["expr"] for t in systems[title]["targets"]]
        legends = [t["legendFormat"] for t in systems[title]["targets"]]
        assert any(e.startswith("min by (run_id") for e in exprs), title
        assert any(e.startswith("quantile by (run_id") and "(0.5," in e for e in exprs), title
        assert any(e.startswith("max by (run_id") for e in exprs), title
        named = [lg for e, lg in zip(exprs, legends, strict=True) if re.search(r"\b(topk|bottomk)\b", e)]
        assert named and all("{{instance}}" in lg and "{{node}}" in lg for lg in named), title
        assert any(f'instance=~"${DRILL_DOWN}"' in e for e in exprs), title
    learner = [t["expr"] for t in systems["Network age: actors and learner"]["targets"]
               if "rlvitals_learner_network_age" in t["expr"]]
    assert learner, "the learner keeps its own line"
    for d in DASHBOARDS.values():
        var = variable(d, DRILL_DOWN)
        assert var["type"] == "query" and var["multi"] and not var["includeAll"]
        assert f"{DRILL_DOWN})" in var["query"]["query"]
