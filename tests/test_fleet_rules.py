"""Fleet rules (telemetry/fleet_rules.py) on recorded fleet series, through `promtool test rules`.

A run of 50 actors on 5 nodes (plus a learner) is written as the series Prometheus would hold,
scraped every 5 s: env-step counters that rise a rollout at a time at speeds spread +-30% over the
fleet, network ages a few seconds of learner progress behind, resident memory with a little noise.
Then one actor stalls, slows down, stops loading weights or leaks; or the whole fleet does; or a
node goes down. promtool evaluates the generated rule file (deploy/prometheus/rules/rlvitals.yml)
and must find exactly the alerts each case expects: the one actor named by instance and node within
10 evaluation intervals, nothing on a healthy fleet, and one alert per rule however many are affected.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from rlvitals.telemetry import rulegen
from rlvitals.telemetry.fleet_rules import FLEET, GROUPS, NAMED, MiB

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool is not on PATH (bash deploy/setup.sh --test installs it)")

RUN = "fleet"
STEP = 5                        # the committed prometheus.yml's scrape and evaluation interval
ACTORS, NODES = 50, 5
FAULT_AT = 300                  # seconds: the fleet has run 5 minutes (rate and growth windows are full)
END = 480
DETECT_WITHIN = 10 * STEP       # the target: named within 10 evaluation intervals
LEARNER_RATE = 4.0              # learner optimizer steps per second
FLEET_RULES = [s.name for s in FLEET]


def instance(i: int) -> str:
    return f"10.0.{i % NODES}.1:{9000 + i}"


def node(i: int) -> str:
    return f"10.0.{i % NODES}.1"


@dataclass
class Fleet:
    """Per-actor behaviour; `faults` change one actor (or all) from FAULT_AT on."""

    seed: int = 0
    speed_spread: float = 0.3
    stalled: set = field(default_factory=set)
    slowed: set = field(default_factory=set)
    lagging: set = field(default_factory=set)
    leaking: set = field(default_factory=set)
    stepped: set = field(default_factory=set)     # one large allocation at FAULT_AT, then flat: no leak
    down: set = field(default_factory=set)

    def series(self) -> list[dict]:
        rng = random.Random(self.seed)
        times = range(0, END + 1, STEP)
        out = []
        for i in range(ACTORS):
            labels = (f'run_id="{RUN}", component="actor", instance="{instance(i)}", node="{node(i)}", '
                      'job="rlvitals"')
            speed = 1000.0 * (1 + rng.uniform(-self.speed_spread, self.speed_spread))   # env steps/s
            rollout = 256 * rng.choice((1, 2))                # steps per rollout: the counter moves per rollout
            lag = rng.uniform(1.0, 5.0)                        # seconds of learner progress behind
            base_rss = 300 * MiB + rng.uniform(-20, 20) * MiB
            steps, ages, rss, up = [], [], [], []   # a target that fails a scrape: its series go stale
            done = 0.0
            for t in times:
                faulty = t > FAULT_AT
                gone = faulty and i in self.down
                # a tenth of its speed: with the fleet spread +-30%, well beyond 3 robust deviations whatever its
                # own speed was (a fifth would sit at the bound for the fastest actors)
                rate = speed * (0.1 if faulty and i in self.slowed else 1.0)
                if not (faulty and i in self.stalled):
                    done += rate * STEP
                steps.append("stale" if gone else str(int(done // rollout) * rollout))
                age_t = min(t, FAULT_AT) if i in self.lagging else t
                ages.append("stale" if gone else str(max(0, int(LEARNER_RATE * (age_t - lag)))))
                leak = 64 * MiB * (t - FAULT_AT) / 60 if faulty and i in self.leaking else 0
                leak += 48 * MiB if faulty and i in self.stepped else 0
                rss.append("stale" if gone else str(int(base_rss + leak + rng.uniform(-2, 2) * MiB)))
                up.append("0" if gone else "1")
            out += [{"series": f"rlvitals_actor_env_steps_total{{{labels}}}", "values": " ".join(steps)},
                    {"series": f"rlvitals_actor_network_age{{{labels}}}", "values": " ".join(ages)},
                    {"series": f"rlvitals_process_resident_memory_bytes{{{labels}}}", "values": " ".join(rss)},
                    {"series": f"up{{{labels}}}", "values": " ".join(up)}]
        learner = f'run_id="{RUN}", component="learner", instance="10.0.0.1:8999", node="10.0.0.1", job="rlvitals"'
        out += [{"series": f"rlvitals_learner_steps_total{{{learner}}}",
                 "values": " ".join(str(int(LEARNER_RATE * t)) for t in times)},
                {"series": f"up{{{learner}}}", "values": " ".join("1" for _ in times)}]
        return out


def annotations(rule: str, value: int, named: list[int], process: str = "actor") -> dict:
    """The alert's annotations: the generated ones filled in, `processes` naming `named` (down: counts by node)."""
    (generated,) = [r for g in yaml.safe_load(rulegen.RULES_FILE.read_text())["groups"] for r in g["rules"]
                    if r.get("alert") == rule]
    out = {k: v for k, v in generated["annotations"].items()}
    out["summary"] = (out["summary"].replace("{{ $value }}", str(value)).replace("{{ $labels.run_id }}", RUN)
                      .replace("{{ $labels.process }}", process))
    if rule == "RLComponentDown":
        per_node = {node(i): sum(node(j) == node(i) for j in named) for i in named}
        out["processes"] = "".join(f"{n} on node {name}; " for name, n in sorted(per_node.items()))
    else:
        out["processes"] = "".join(f"{instance(i)} on node {node(i)}; " for i in sorted(named, key=instance))
    return out


def alert(rule: str, value: int, named: list[int], process: str = "actor") -> dict:
    spec = {s.name: s for s in FLEET}[rule]
    labels = {"run_id": RUN, "severity": spec.severity, "component": spec.component, "horizon": "fast"}
    if rule == "RLComponentDown":
        labels["process"] = process
    return {"exp_labels": labels, "exp_annotations": annotations(rule, value, named, process)}


def promtool(fleet: Fleet, expected: dict[int, dict[str, list[dict]]], tmp_path: Path) -> None:
    """Run promtool on `fleet`'s series; at each time, each fleet rule fires exactly the alerts given."""
    tests = [{"eval_time": f"{t}s", "alertname": name, "exp_alerts": by_rule.get(name, [])}
             for t, by_rule in expected.items() for name in FLEET_RULES]
    # promtool evaluates every group at its evaluation_interval, whatever the group's own interval; the order
    # is fixed as in the file, so a verdict reads the statistics of the previous evaluation, as it may live.
    spec = {"rule_files": [str(rulegen.RULES_FILE)], "evaluation_interval": f"{STEP}s",
            "group_eval_order": [g["name"] for g in yaml.safe_load(rulegen.RULES_FILE.read_text())["groups"]],
            "tests": [{"interval": f"{STEP}s", "input_series": fleet.series(), "alert_rule_test": tests}]}
    path = tmp_path / "fleet_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1 << 20))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


QUIET = {t: {} for t in (FAULT_AT, FAULT_AT + DETECT_WITHIN, END)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_fleet_with_ordinary_spread_raises_nothing(seed, tmp_path):
    promtool(Fleet(seed=seed), QUIET, tmp_path)


@pytest.mark.parametrize("fault,rule", [("stalled", "RLActorStalled"), ("slowed", "RLActorSlow"),
                                        ("lagging", "RLActorWeightsLagging")])
def test_one_faulty_actor_among_50_is_named_within_10_intervals(fault, rule, tmp_path):
    fleet = Fleet(**{fault: {17}})
    found = [alert(rule, 1, [17])]
    # a stalled actor is also the slowest, but only RLActorStalled names it: one problem, one alert
    promtool(fleet, {FAULT_AT: {}, FAULT_AT + DETECT_WITHIN: {rule: found}, END: {rule: found}}, tmp_path)


def test_a_leaking_actor_is_named_and_a_fleet_wide_leak_is_no_outlier(tmp_path):
    found = [alert("RLActorMemoryGrowing", 1, [3])]
    promtool(Fleet(leaking={3}), {FAULT_AT: {}, FAULT_AT + 120: {"RLActorMemoryGrowing": found},
                                  END: {"RLActorMemoryGrowing": found}}, tmp_path)
    promtool(Fleet(leaking=set(range(ACTORS))), QUIET, tmp_path)


def test_one_large_allocation_is_no_leak(tmp_path):
    """48 MiB at once grows one minute only; a leak grows in both of the last two minutes."""
    promtool(Fleet(stepped={3}), {t: {} for t in range(FAULT_AT, END + 1, 30)}, tmp_path)


def test_alerts_only_count_and_rank_recorded_verdicts():
    """The per-actor work is done once per interval by the recording rules; each alert and its `processes`
    annotation read one recorded verdict series (a few series), not the fleet's raw series again."""
    fleet = [r for g in yaml.safe_load(rulegen.RULES_FILE.read_text())["groups"] if g["name"] in GROUPS
             for r in g["rules"]]
    recorded = [r["record"] for r in fleet if "record" in r]
    alerts = [r for r in fleet if "alert" in r]
    assert [a["alert"] for a in alerts] == FLEET_RULES
    for a in alerts:
        (verdict,) = re.fullmatch(r"count by \([a-z_, ]+\) \(([a-z_:0-9]+)\)", a["expr"]).groups()
        assert verdict in recorded, a["alert"]
        (query,) = re.findall(r"query `([^`]*)`", a["annotations"]["processes"])
        assert set(re.findall(r"[a-z_]+:[a-z_:0-9]+", query)) == {verdict}, query
    raw = {"rlvitals_actor_env_steps_total": 2, "rlvitals_actor_network_age": 3,
           "rlvitals_process_resident_memory_bytes": 1, "up": 1}
    for metric, most in raw.items():
        readers = [r["record"] for r in fleet if re.search(rf"(?<![a-z_:]){metric}\b", r["expr"])]
        assert len(readers) <= most, (metric, readers)


def test_several_faulty_actors_are_one_alert_naming_each(tmp_path):
    slowed = {4, 9, 21, 33}             # up to NAMED are all named; more are counted, the slowest named
    assert len(slowed) <= NAMED
    promtool(Fleet(slowed=slowed), {END: {"RLActorSlow": [alert("RLActorSlow", len(slowed), sorted(slowed))]}},
             tmp_path)


def test_a_fleet_wide_fault_is_no_outlier(tmp_path):
    everyone = set(range(ACTORS))
    promtool(Fleet(stalled=everyone), QUIET, tmp_path)   # the run-level RLActorsStalled reports it
    promtool(Fleet(slowed=everyone), QUIET, tmp_path)
    promtool(Fleet(lagging=everyone), QUIET, tmp_path)


def test_a_lost_node_is_one_alert_counting_its_actors(tmp_path):
    lost = {i for i in range(ACTORS) if node(i) == node(2)}   # 10 actors
    down = [alert("RLComponentDown", len(lost), sorted(lost))]
    promtool(Fleet(down=lost), {FAULT_AT + 60: {}, END: {"RLComponentDown": down}}, tmp_path)
    everyone = set(range(ACTORS))   # 5 nodes of 10: each node named with its count
    all_down = [alert("RLComponentDown", ACTORS, sorted(everyone))]
    promtool(Fleet(down=everyone), {END: {"RLComponentDown": all_down}}, tmp_path)
