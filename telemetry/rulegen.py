"""Render the health rules (telemetry.rules) as Prometheus alert rules and as docs/health.md.

    python -m rlvitals.telemetry.rulegen            write both files
    python -m rlvitals.telemetry.rulegen --check    exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from .conditions import duration
from .fleet_rules import GROUP_OF, GROUPS, NAMES_WHAT, PROCESSES, RECORDING
from .rules import RULES, Rule, thresholds
from .verdicts import COMPONENTS

REPO = Path(__file__).resolve().parent.parent
RULES_FILE = REPO / "deploy" / "prometheus" / "rules" / "rlvitals.yml"
DOCS_FILE = REPO / "docs" / "health.md"
RUNBOOK_BASE = "docs/health.md"
"""Where runbook_url points: the rule's section of the rule reference (relative to the install)."""
DASHBOARD = {"policy": "rlvitals-learning", "value": "rlvitals-learning", "returns": "rlvitals-learning",
             "optimizer": "rlvitals-learning", "telemetry": "rlvitals-learning",
             "preprocessing": "rlvitals-learning", "actor": "rlvitals-systems", "env": "rlvitals-learning",
             "weight-sync": "rlvitals-systems", "memory": "rlvitals-systems", "throughput": "rlvitals-systems",
             "learner": "rlvitals-systems"}


def alert(rule: Rule) -> dict:
    out = {"alert": rule.name, "expr": rule.promql()}
    if rule.live_only and rule.hold:  # rules on the run's rows count their hold in updates, in the expression
        out["for"] = duration(rule.hold)
    out["labels"] = {"severity": rule.severity, "component": rule.component, "horizon": rule.horizon}
    out["annotations"] = {"summary": rule.summary, "description": rule.check,
                          "runbook_url": f"{RUNBOOK_BASE}#{rule.anchor}",
                          "dashboard": DASHBOARD[rule.component]}
    if rule.name in PROCESSES:  # a fleet rule: which processes its count is made of
        out["annotations"]["processes"] = PROCESSES[rule.name]
    return out


HEADER = """\
# GENERATED from telemetry/rules.py by `python -m rlvitals.telemetry.rulegen`: edit the rules there.
#
# Each alert carries the component it implicates (label `component`, one of the
# vocabulary in docs/health.md), its severity and horizon (fast: decided within
# tens of updates; slow: trends over thousands), and a runbook_url to the rule's
# section of docs/health.md. A rule on the run's statistics is judged by the run's
# own health monitor (telemetry/health.py) on every row, counted in learner updates,
# never seconds; the monitor exports how many updates each condition has held
# (rlvitals_rule_held_updates) and the alert fires when that reaches the rule's
# hold, so alerts and the run's verdicts.json agree on any machine. Live-only
# rules (scrape health, GPU memory, progress that stopped) are PromQL with a `for`.
# Fleet rules (telemetry/fleet_rules.py, groups rlvitals-fleet*: recording rules of
# per-actor rates and the fleet's median and spread, then the alerts) are one alert
# per run whose value counts the processes affected; their `processes` annotation
# names a few by instance and node. The fleet's statistics (every 15 s) and memory
# growth (every 30 s) have groups of their own: they move slowly and cost most.
"""


def render_rules() -> str:
    groups = []
    for horizon in ("fast", "slow"):
        rules = [alert(r) for r in RULES if r.horizon == horizon and r.name not in PROCESSES and not r.live_twin]
        groups.append({"name": f"rlvitals-{horizon}", "rules": rules})
    # Fleet rules: in each group its recording rules first, so each alert reads this evaluation's verdicts.
    for name, interval in GROUPS.items():
        recorded = [{"record": series, "expr": expr} for series, expr, group in RECORDING if group == name]
        alerts = [alert(r) for r in RULES if GROUP_OF.get(r.name) == name]
        groups.append({"name": name, **({"interval": interval} if interval else {}), "rules": recorded + alerts})
    body = yaml.safe_dump({"groups": groups}, sort_keys=False, width=110, allow_unicode=True)
    return HEADER + body


def _threshold_text(rule: Rule) -> str:
    found = thresholds(rule)
    return ", ".join(f"`{k} {op} {v:g}`" for k, op, v in found) or "none"


def _hold(rule: Rule) -> str:
    return f"{rule.hold} {rule.hold_unit}" if rule.hold != 1 else f"1 {rule.hold_unit[:-1]}"


def render_docs() -> str:
    out = ["# Health rules", "",
           "GENERATED from `telemetry/rules.py` by `python -m rlvitals.telemetry.rulegen`.", "",
           "Every rule says what must hold in a correct run. The same rules become the Prometheus alerts "
           "(`deploy/prometheus/rules/rlvitals.yml`), the threshold lines on the dashboards and in "
           "`rlvitals report`, and the verdicts a run writes to `verdicts.json`.", "",
           "**Evidence, not seconds.** A rule on the run's statistics is judged by the run's own health monitor "
           "(`telemetry/health.py`) on every row the run records, at the learner update the row records: its hold "
           "and its windows count updates, never wall-clock seconds, so the same run reaches the same verdict at "
           "the same update on a fast and a slow machine. The monitor exports how many updates each condition has "
           "held (`rlvitals_rule_held_updates{rule}`, -1 while it does not hold); the rule's Prometheus alert fires "
           "when that count reaches the hold, so the alerts a user watches and `verdicts.json` agree. Replaying a "
           "run's `metrics.jsonl` (`rlvitals report`, `rlvitals doctor`) finds the same verdicts. Only live-only "
           "rules count seconds: their evidence is a scrape's health, GPU memory, or progress that stopped, which "
           "no row records.", "",
           "- **fast** rules decide within tens of updates, for states that are never healthy after the first "
           "updates; **slow** rules read trends over thousands of updates.",
           "- **hold**: how many updates the condition must hold at every row before the rule fires (live-only "
           "rules: seconds, Prometheus `for`).",
           "- **after**: the rule applies only after that many learner updates (start-up transients).",
           "- Row keys are the keys of `metrics.jsonl` (the catalogue's `source`, docs/metrics.md); value-like "
           "thresholds are scale-free: they compare with the reward scale and the horizon 1/(1-gamma).",
           "- **live only**: reads series the run does not record (scrape health, GPU); Prometheus only.",
           "- **fleet rules** (`telemetry/fleet_rules.py`) compare each actor with its peers: the fleet's median and "
           "its spread (the interquartile range / 1.349), with a floor on the spread so a fleet of ordinary "
           "spread never alerts. Each is one alert per run (and kind of process) whose value counts the processes "
           "affected; its `processes` annotation names a few by instance and node. They are live only: a run's "
           "rows hold run-level values, not one per actor. A Ray run's own verdict (`verdicts.json`) names a "
           "slow actor all the same: its driver compares the actors from the counters on their rollouts "
           "(RLActorSlowerThanPeers, RLActorSlow's twin).", "",
           "## Verdicts", "",
           "`verdicts.json` in the run directory and `rlvitals doctor --json` print a JSON list of objects "
           "with these fields (a stable interface; fields are only ever added):", "",
           "| field | meaning |", "|---|---|",
           "| `rule` | the rule's name (a section below, or a doctor check) |",
           "| `severity` | `critical`, `warning` or `info` |",
           "| `component` | one of the components below |",
           "| `first_update` | learner update at which the condition first held (the start of the streak that fired; "
           "an invariant's: the update at which it broke) |",
           "| `first_seconds` | run seconds at that update's row |",
           "| `message` | what was seen and what to check |", "",
           "## Components", "", "| component | what it covers |", "|---|---|"]
    out += [f"| `{name}` | {text} |" for name, text in COMPONENTS.items()]
    out += ["", "## Fleet recording rules", "",
            "The fleet rules compare each actor with these (`actor:` one series per actor, `run:` one per run), "
            "recorded in three groups by how fast they move: "
            + "; ".join(f"`{g}` every {i or 'scrape interval (5 s)'}" for g, i in GROUPS.items())
            + ". A verdict compares an actor's latest figure with its fleet's statistics of at most one "
            "statistics interval ago.", "", "| series | group | PromQL |", "|---|---|---|"]
    out += [f"| `{name}` | `{group}` | `{expr}` |" for name, expr, group in RECORDING]
    out += ["", "## Rules", "", "| rule | horizon | severity | component | hold |", "|---|---|---|---|---|"]
    out += [f"| [{r.name}](#{r.anchor}) | {r.horizon} | {r.severity} | {r.component} | {_hold(r)} |"
            for r in RULES]
    for r in RULES:
        summary = r.summary.replace(" in run {{ $labels.run_id }}", "").replace("{{ $labels.component }}", "")
        summary = summary.replace("{{ $value }}", "N").replace(" {{ $labels.process }}", "").replace(
            " of run {{ $labels.run_id }}", "")
        out += ["", f"### {r.name}", "", f"{summary}.", "",
                f"- component: `{r.component}`; severity: {r.severity}; horizon: {r.horizon}; "
                f"hold: {_hold(r)}" + (f"; after {r.after_updates} updates" if r.after_updates else ""),
                f"- reads: {', '.join(f'`{k}`' for k in sorted(r.condition.keys())) or 'live series only'}"
                + (" (live only)" if r.live_only else ""),
                f"- thresholds drawn: {_threshold_text(r)}"]
        if not r.live_only:
            out += [f"- condition: `{r.expr.text()}`"]
        if r.live_twin:
            out += [f"- no alert of its own: Prometheus raises it as [{r.live_twin}](#{r.live_twin.lower()}), by "
                    "instance and node; this rule is the run's verdict (`verdicts.json`), which names the processes "
                    f"from the row's `{r.names_key}`"]
        else:
            out += [f"- alert PromQL: `{r.promql()}`"]
        if r.names_key and not r.live_twin:
            out += [f"- the verdict names the processes from the row's `{r.names_key}`"]
        if r.name in PROCESSES:
            out += [f"- its value counts the processes affected; its `processes` annotation says {NAMES_WHAT[r.name]}"]
        out += ["", r.check]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvitals.telemetry.rulegen",
                                     description="Write the alert rules and docs/health.md from telemetry/rules.py.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from what would be written")
    args = parser.parse_args(argv)
    stale = []
    for path, text in ((RULES_FILE, render_rules()), (DOCS_FILE, render_docs())):
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is stale: run `python -m rlvitals.telemetry.rulegen`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
