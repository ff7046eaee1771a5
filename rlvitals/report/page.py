"""The report page: one HTML file with plotly.js inline, so it opens anywhere with no network."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import plotly.offline

import rlvitals
from rlvitals.telemetry.bands import band_text
from rlvitals.telemetry.catalogue import BY_NAME

from .figures import PLOT_CONFIG, SEVERITY_COLOURS, health_timeline, panel_figure
from .rundata import Run
from .signals import (
    AXIS_KEYS,
    REFERENCE,
    Panel,
    anchor,
    bands_for,
    outside,
    panels_for,
    rule_doc,
    uncatalogued,
    verdict_metrics,
)
from .signals import Signal as _Signal
from .summary import final_return, speed, verdict_counts

CONFIG_NOISE = ("run_dir",)
"""Config fields that differ between any two runs and say nothing about them."""

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2731;background:#f5f7f9}
header{background:#263238;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#b0bec5;font-size:12px}
nav{padding:8px 24px;background:#fff;border-bottom:1px solid #dde3e8;font-size:13px;position:sticky;top:0;z-index:9}
nav a{margin-right:14px;color:#1565c0;text-decoration:none}
main{padding:12px 24px 40px}section{margin-bottom:26px}h2{font-size:17px;border-bottom:2px solid #cfd8dc;
padding-bottom:4px}h3{font-size:14px;margin:0 0 4px}
table{border-collapse:collapse;background:#fff;font-size:12px;margin:6px 0}
td,th{border:1px solid #dde3e8;padding:4px 8px;text-align:left;vertical-align:top}th{background:#eceff1}
tr.differs td{background:#fff8e1}td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
.card{background:#fff;border:1px solid #dde3e8;border-radius:6px;padding:10px 12px}
.card .links{font-size:11px;float:right}.card details{font-size:12px;color:#455a64;margin:2px 0 4px}
.card details p{white-space:pre-wrap;margin:4px 0}
.sev{font-weight:600;padding:1px 6px;border-radius:3px;color:#fff}
.note{font-size:12px;color:#6d4c41;margin:2px 0}.muted{color:#78909c;font-size:12px}
code{font-size:11px;background:#eceff1;padding:0 3px;border-radius:3px}
"""


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def fmt(x, spec: str = ",.4g") -> str:
    if x is None:
        return "–"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return esc(x)
    try:
        return format(x, spec)
    except (ValueError, OverflowError):  # a hand-edited file: 1.5 where a count belongs, a 400-digit integer
        return esc(x)


def doc_file(name: str) -> Path | None:
    """A page of the docs (shipped as the `rlvitals.docs` data package, or in the checkout)."""
    try:
        from importlib.resources import files

        found = files("rlvitals.docs") / name
        if found.is_file():
            return Path(str(found))
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    path = Path(rlvitals.__file__).resolve().parent.parent / "docs" / name
    return path if path.is_file() else None


def rule_link(rule: str) -> str:
    health, anchor_ = doc_file("health.md"), rule_doc(rule)
    if health is None or anchor_ is None:
        return f"<b>{esc(rule)}</b>"
    return f"<a href='{esc(health.as_uri())}#{esc(anchor_)}'><b>{esc(rule)}</b></a>"


def metric_link(name: str) -> str:
    return f'<a href="#{anchor(name)}"><code>{esc(name)}</code></a>'


def severity(sev: str) -> str:
    return f'<span class="sev" style="background:{SEVERITY_COLOURS.get(sev, "#546e7a")}">{esc(sev)}</span>'


# ------------------------------------------------------------------ sections
def runs_section(runs: list[Run]) -> str:
    head = ["run", "status", "env", "algorithm", "policy", "mode", "seed", "env steps", "updates", "wall s",
            "steps/s", "return (last 100)", "verdicts"]
    rows = []
    for run in runs:
        c, s, last = run.config, run.summary or {}, run.rows[-1] if run.rows else {}
        counts = verdict_counts(run.verdicts)
        verdicts = "not evaluated" if counts is None else \
            ", ".join(f"{n} {sev}" for sev, n in counts.items() if n) or "none held"
        cause = run.cause
        status = esc(run.status) + (f"<div class='muted'>{esc(cause)}</div>" if cause else "")
        cells = [f"<b>{esc(run.name)}</b><div class='muted'>{esc(run.path)}</div>", status,
                 esc(c.get("env", "–")), esc(c.get("agent", "–")), esc(policy_kind(c)), esc(c.get("mode", "–")),
                 fmt(c.get("seed")),
                 fmt(s.get("env_steps", last.get("env_steps")), ",d") if (s or last) else "–",
                 fmt(s.get("updates", last.get("updates"))),
                 fmt(s.get("wall_seconds", last.get("wall_seconds")), ",.1f"),
                 fmt(speed(s, last), ",.0f"), fmt(final_return(s, last), ",.2f"), esc(verdicts)]
        rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
        for note in run.notes:
            rows.append(f"<tr><td></td><td colspan='{len(head) - 1}' class='note'>"
                        f"{esc(run.name)}: {esc(note)}</td></tr>")
    meta = []
    for run in runs:
        m = run.meta
        cv = m.get("code_version", {})
        meta.append(f"<tr><td>{esc(run.name)}</td><td>{esc(m.get('run_id', '–'))}</td>"
                    f"<td>{esc(m.get('started_at', '–'))}</td>"
                    f"<td><code>{esc(' '.join(m.get('command', [])))}</code></td>"
                    f"<td>{esc(cv.get('commit', '–'))[:12]}{' (dirty)' if cv.get('dirty') else ''}</td>"
                    f"<td>{esc(m.get('hostname', '–'))}</td></tr>")
    return (f"<section id='runs'><h2>Runs</h2><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>"
            f"{''.join(rows)}</table><table><tr><th>run</th><th>run id</th><th>started</th><th>command</th>"
            f"<th>code version</th><th>host</th></tr>{''.join(meta)}</table></section>")


def policy_kind(config: dict) -> str:
    """What kind of network the run trained: runs from before recurrent_size existed are feed-forward."""
    if not config:
        return "–"
    size = config.get("recurrent_size", 0)
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return f"LSTM {size}"
    return "feed-forward" if size in (0, None) else str(size)   # a hostile config.yaml's value, shown as it is


def band_checks(run: Run, panels: list[Panel]) -> list[str]:
    """Rows of the fallback table: where a run's curves leave the catalogue's healthy bands."""
    out = []
    for panel in panels:
        for sig in panel.signals:
            bands = bands_for(sig.key)
            xs, ys = run.series(sig.key)
            if not bands or not ys:
                continue
            bad = [(x, y) for x, y in zip(xs, ys, strict=True) if outside(y, bands)]
            verdict = f"{len(bad)} of {len(ys)} points outside, first at {fmt(bad[0][0], ',d')} env steps" if bad \
                else "inside"
            out.append(f"<tr><td>{esc(run.name)}</td>"
                       f"<td>{metric_link(sig.metric.name)} <code>{esc(sig.key)}</code></td>"
                       f"<td>{esc(band_text(bands[0]))}</td><td class='num'>{fmt(ys[-1])}</td>"
                       f"<td>{esc(verdict)}</td></tr>")
    return out


def verdicts_section(runs: list[Run], panels: list[Panel]) -> str:
    parts, missing = [], []
    rows = []
    for run in runs:
        if run.verdicts is None:
            missing.append(run.name)
            continue
        for v in sorted(run.verdicts, key=lambda v: (("critical", "warning", "info").index(v.get("severity"))
                                                     if v.get("severity") in SEVERITY_COLOURS else 3,
                                                     v.get("first_update") or 0)):
            links = " ".join(metric_link(n) for n in verdict_metrics(v)) or "–"
            when = []
            if v.get("first_update") is not None:
                when.append(f"update {v['first_update']}")
            if v.get("first_seconds") is not None:
                when.append(f"{v['first_seconds']:.1f} s")
            rows.append(f"<tr><td>{esc(run.name)}</td><td>{severity(v.get('severity', '?'))}</td>"
                        f"<td>{rule_link(v.get('rule', ''))}</td><td>{esc(v.get('component', ''))}</td>"
                        f"<td>{esc(', '.join(when) or '–')}</td><td>{esc(v.get('message', ''))}</td>"
                        f"<td>{links}</td></tr>")
    if rows:
        parts.append("<table><tr><th>run</th><th>severity</th><th>rule</th><th>component</th><th>first held</th>"
                     f"<th>message</th><th>metrics</th></tr>{''.join(rows)}</table>")
    elif len(missing) < len(runs):
        parts.append("<p>No health rule fired on the evaluated runs.</p>")
    if missing:
        parts.append(f"<p class='muted'>No verdicts for {esc(', '.join(missing))}: no <code>verdicts.json</code> "
                     "in the run directory yet (the offline health evaluator writes it). Until then, the table "
                     "below checks each curve against the healthy band its catalogue entry states.</p>")
        checks = [r for run in runs if run.name in missing for r in band_checks(run, panels)]
        if checks:
            parts.append("<table><tr><th>run</th><th>signal</th><th>healthy band</th><th>last value</th>"
                         f"<th>check</th></tr>{''.join(checks)}</table>")
    timeline = health_timeline(runs)
    if timeline is not None:
        parts.append("<h3>When each rule's condition held</h3><p class='muted'>Bars: evaluation times at which the "
                     "condition was true (a rule fires, and gives a verdict, once it has held for its hold time)."
                     "</p><div class='card'>" + _figure_html(timeline, "health-timeline",
                                                             timeline["layout"]["height"]) + "</div>")
    return f"<section id='verdicts'><h2>Health verdicts</h2>{''.join(parts)}</section>"


def config_section(runs: list[Run]) -> str:
    keys = sorted({k for r in runs for k in r.config})
    differs = [k for k in keys if k not in CONFIG_NOISE
               and len({json.dumps(r.config.get(k), sort_keys=True, default=str) for r in runs}) > 1]
    if not keys:
        return "<section id='config'><h2>Config</h2><p class='muted'>No config.yaml.</p></section>"
    order = differs + [k for k in keys if k not in differs]
    head = "".join(f"<th>{esc(r.name)}</th>" for r in runs)
    body = "".join(f"<tr class='{'differs' if k in differs else ''}'><td><code>{esc(k)}</code></td>"
                   + "".join(f"<td>{esc(r.config.get(k, '–'))}</td>" for r in runs) + "</tr>" for k in order)
    if len(runs) > 1:
        summary = ("<p><b>What differs:</b> " + (", ".join(f"<code>{esc(k)}</code>" for k in differs)
                   or "nothing but the run directory") + " (highlighted, listed first)</p>")
    else:
        summary = ""
    return f"<section id='config'><h2>Config</h2>{summary}<table><tr><th>field</th>{head}</tr>{body}</table></section>"


def reference_section(names: list[str], docs: Path | None) -> str:
    items = []
    for name in names:
        m = BY_NAME[name]
        full = f" · <a href='{esc(docs.as_uri())}#{anchor(name)}'>{esc(REFERENCE)}</a>" if docs else ""
        items.append(f"<div class='card' id='{anchor(name)}'><h3><code>{esc(name)}</code></h3>"
                     f"<div class='muted'>{esc(m.kind)}, {esc(m.component)}, unit {esc(m.unit)}, from verbosity "
                     f"{esc(m.level)}{full}</div><p>{esc(m.help)}</p></div>")
    return (f"<section id='reference'><h2>Metric reference</h2><p class='muted'>The catalogue entries of the signals "
            f"on this page (the same sections as <code>{REFERENCE}</code>).</p>"
            f"<div class='grid'>{''.join(items)}</div></section>")


SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                  0x2028: "\\u2028", 0x2029: "\\u2029"}
"""Characters that JSON may hold as they are but a script element may not: `<!--` and `<script` change how
the HTML parser reads the rest of the element, `</` ends it. In JSON they can only sit inside strings, where
the escape means the same character."""


def script_json(value) -> str:
    """`value` as JSON that can sit inside a <script> element whatever text it holds (run names, row keys)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":")).translate(SCRIPT_ESCAPES)


def _figure_html(fig: dict, div_id: str, height: int = 300) -> str:
    """A plot's div and the call that draws it (the JSON made safe to sit inside a script element)."""
    args = ", ".join(script_json(x) for x in (fig["data"], fig["layout"], PLOT_CONFIG))
    return (f'<div id="{div_id}" class="plot" style="height:{height}px"></div>'
            f'<script>Plotly.newPlot("{div_id}", {args});</script>')


def signals_sections(runs: list[Run], panels: list[Panel]) -> tuple[str, list[str], int]:
    """The plot sections, the group ids (for the contents), and the number of plots."""
    out, groups, count = [], [], 0
    by_group: dict[str, list[Panel]] = {}
    for panel in panels:
        by_group.setdefault(panel.group, []).append(panel)
    for group, members in by_group.items():
        cards = []
        for panel in members:
            fig = panel_figure(panel, runs)
            if fig is None:
                continue
            count += 1
            links = " ".join(f"<a href='#{anchor(n)}'>reference</a>" if len(panel.metrics) == 1
                             else f"<a href='#{anchor(n)}'>{esc(n.removeprefix('rlvitals_'))}</a>"
                             for n in panel.metrics)
            keys = ", ".join(f"<code>{esc(s.key)}</code>" for s in panel.signals)
            cards.append(f"<div class='card'><span class='links'>{links}</span><h3>{esc(panel.title)}</h3>"
                         f"<details><summary>healthy looks like… (keys {keys})</summary><p>{esc(panel.help)}</p>"
                         f"</details>{_figure_html(fig, f'plot-{count}')}</div>")
        if cards:
            gid = "g-" + "".join(c if c.isalnum() else "-" for c in group.lower())
            groups.append((gid, group))
            out.append(f"<section id='{gid}'><h2>{esc(group)}</h2><div class='grid'>{''.join(cards)}</div></section>")
    return "".join(out), groups, count


def other_panels(runs: list[Run]) -> list[Panel]:
    """A panel per numeric row key that is no catalogue signal, so nothing in metrics.jsonl is hidden."""
    keys = list(dict.fromkeys(k for r in runs for k in uncatalogued(r.numeric_keys())))
    placeholder = BY_NAME["rlvitals_run_info"]
    return [Panel("Other row keys (not in the catalogue)", key, "A metrics.jsonl key with no catalogue entry.",
                  (), [_Signal(key, placeholder, (), key)]) for key in keys if key not in AXIS_KEYS]


def render(runs: list[Run]) -> str:
    keys = list(dict.fromkeys(k for r in runs for k in r.numeric_keys()))
    panels = panels_for(keys)
    plots, groups, count = signals_sections(runs, panels + other_panels(runs))
    shown = list(dict.fromkeys(n for p in panels for n in p.metrics))
    shown += [n for r in runs for v in r.verdicts or () for n in verdict_metrics(v) if n not in shown]
    docs = doc_file("metrics.md")
    names = ", ".join(r.name for r in runs)
    if not count:
        plots = "<section><h2>Signals</h2><p class='muted'>No metrics rows to plot yet.</p></section>"
    nav = "".join(f"<a href='#{gid}'>{esc(g)}</a>" for gid, g in groups)
    title = f"rlvitals report: {names}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{CSS}</style>
<script>{plotly.offline.get_plotlyjs()}</script>
</head><body>
<header><h1>{esc(title)}</h1><p>{len(runs)} run(s) · {count} plots · written {esc(time.strftime('%Y-%m-%d %H:%M:%S'))}
 by rlvitals {esc(rlvitals.__version__)} · x axis: env steps · green: healthy band · dotted verticals: first time a
 verdict held</p></header>
<nav><a href="#runs">Runs</a><a href="#verdicts">Verdicts</a>{nav}<a href="#config">Config</a>
<a href="#reference">Metric reference</a></nav>
<main>{runs_section(runs)}{verdicts_section(runs, panels)}{plots}{config_section(runs)}
{reference_section(shown, docs)}</main>
</body></html>
"""
