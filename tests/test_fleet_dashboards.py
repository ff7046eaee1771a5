"""Every dashboard query against a real Prometheus scraping a simulated fleet of 100 actors.

bench/fleet.py serves 100 actors, 5 node sidecars and a learner (what each serves is generated from
the metric catalogue) from one loopback server process, each on its own port; the session's Prometheus
scrapes them every second. Each panel query, as Grafana sends it for the run, must return at most ~20 series per panel,
and every query of the fleet's actors and node sidecars (which a local run has none of, so the live
test in test_dashboards.py cannot check them) must have data.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from test_dashboards import fleet_only, level_of

from conftest import free_port, http_get, prometheus_watching
from rlvitals.telemetry.catalogue import LEVELS

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import fleet as sim  # noqa: E402  (bench/fleet.py)

ACTORS = 100
MAX_SERIES_PER_PANEL = 20
READY_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def fleet_prometheus(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    discovery = root / "discovery"
    discovery.mkdir()
    port = free_port()
    server, ports = sim.start_fleet(ACTORS, port, root, 600)
    try:
        assert http_get(f"http://127.0.0.1:{ports['/learner']}/metrics", timeout=5)[0] == 200
        fleet = sim.Fleet(ACTORS)
        groups = sim.targets(fleet, ports)
        (discovery / "fleet.json").write_text(json.dumps(groups))
        with prometheus_watching(discovery) as prom:
            deadline = time.monotonic() + READY_TIMEOUT
            while True:   # every actor's rate over 5 s defined, and 20 scrapes of history for the rankings
                rates = prom.query('count(rate(rlvitals_actor_env_steps_total{component="actor"}[5s]) > 0)')
                history = prom.query('min(count_over_time(up{component="actor"}[30s]))')
                if rates and int(rates[0]["value"][1]) == ACTORS and history and float(history[0]["value"][1]) >= 20:
                    break
                assert time.monotonic() < deadline, f"the fleet is not scraped: {prom.log()}"
                time.sleep(1)
            yield prom, groups
    finally:
        server.terminate()
        server.wait(timeout=30)


def queries(groups: list[dict]) -> list[dict]:
    actor = next(g["labels"]["instance"] for g in groups if g["labels"]["component"] == "actor")
    node = next(g["labels"]["instance"] for g in groups if g["labels"]["component"] == "node")
    out = sim.dashboard_queries(f"{actor}|{node}", 30)
    for q in out:
        q["expr"] = q["expr"].replace("[20s]", "[5s]")   # $__rate_interval at a 1 s scrape
    return out


def test_every_panel_stays_within_its_series_bound_and_fleet_queries_have_data(fleet_prometheus):
    prom, groups = fleet_prometheus
    per_panel: dict[str, int] = {}
    empty = []
    for q in queries(groups):
        result = prom.query(q["expr"])
        key = f"{q['dashboard']} / {q['panel']}"
        per_panel[key] = per_panel.get(key, 0) + len(result)
        level, hardware = level_of(q["expr"])
        if fleet_only(q["expr"]) and not hardware and LEVELS.index(level) <= LEVELS.index(sim.LEVEL) and not result:
            empty.append(f"{key} [{q['legend']}]: {q['expr']}")
    assert empty == [], "fleet queries without data:\n" + "\n".join(empty)
    over = {k: n for k, n in per_panel.items() if n > MAX_SERIES_PER_PANEL}
    assert over == {}, f"panels over {MAX_SERIES_PER_PANEL} series with {ACTORS} actors: {over}"
    assert per_panel["systems / Env steps/s across actors"] >= 5   # min, median, max, 3 slowest, the picked one


def test_the_slowest_actors_are_the_ones_named(fleet_prometheus):
    prom, groups = fleet_prometheus
    (named,) = [q for q in queries(groups) if q["panel"] == "Env steps/s across actors" and "bottomk" in q["expr"]]
    result = prom.query(named["expr"])
    speeds = {f"/actor/{i}": p.speed for i, p in enumerate(sim.Fleet(ACTORS).processes.values())
              if p.component == "actor"}
    instance_of = sim.targets_by_path(sim.Fleet(ACTORS))
    # Counters move a rollout (512 steps) at a time, and rate() extrapolates over scrapes that jitter: a 30 s
    # rate is within ~10% of the true speed. So each of the named three runs at most 10% faster than the
    # third slowest actor truly does (speeds spread +-30% around 1000 steps/s).
    speed_of = {instance_of[p]: speed for p, speed in speeds.items()}
    bound = 1.1 * sorted(speeds.values())[2]
    assert len(result) == 3, result
    assert all(speed_of[r["metric"]["instance"]] <= bound for r in result), \
        ([(r["metric"]["instance"], speed_of[r["metric"]["instance"]]) for r in result], bound)
    assert all(r["metric"]["node"] for r in result)
