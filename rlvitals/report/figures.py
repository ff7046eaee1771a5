"""One plotly figure per report panel: every run's curves, the healthy bands, and where verdicts first held.

Figures are plotly.js figure specs (plain dicts of `data` and `layout`, the
JSON that `Plotly.newPlot` takes), built directly: plotly's Python object
layer validates every property on assignment, which costs seconds per page
and adds nothing that the browser test does not check.
"""

from __future__ import annotations

import math

from rlvitals.telemetry.bands import band_text

from .rundata import Run
from .signals import RUN_COUNTERS, Panel, bands_for, rule_severity, thresholds_for, verdict_metrics

RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22")
KEY_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SEVERITY_COLOURS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
BAND_FILL = ("rgba(46, 160, 67, 0.10)", "rgba(46, 160, 67, 0.16)")
UNIT_TITLES = {"bytes": "bytes", "s": "seconds", "percentunit": "ratio", "short": "", "none": "", "celsius": "°C",
               "watt": "W", "suffix:nats": "nats"}
AXIS_STYLE = {"gridcolor": "#eceff1", "linecolor": "#b0bec5", "showline": True, "ticks": "outside",
              "tickcolor": "#b0bec5", "automargin": True}
"""Axis look, given per figure instead of a plotly template (a template is copied into every figure)."""
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


LEGEND_MOST = 12
"""Legend entries a plot lists at most; beyond, the legend would crowd out the plot (Plotly's automargin keeps
redrawing): it lists one entry per run and the names are read from the hover instead."""


def scatter(xs: list, ys: list, line: dict, name: str, **extra) -> dict:
    """A line trace; markers too while there are few points (a one-row run still shows a dot)."""
    trace = {"type": "scatter", "x": xs, "y": ys, "mode": "lines+markers" if len(xs) < 40 else "lines",
             "line": line, "marker": {"size": 4, "color": line.get("color")}, "name": name}
    trace.update(extra)
    return trace


def _label(text: str, colour: str, **where) -> dict:
    return {"text": text, "showarrow": False, "font": {"size": 9, "color": colour}, **where}


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def rate(run: Run, key: str) -> tuple[list[float], list[float]]:
    """Per-second rate of a running total, between consecutive rows (the first row against the run's start)."""
    xs, ys, prev_v, prev_t = [], [], 0.0, 0.0
    for row in run.rows:
        v, t = row.get(key), row.get("wall_seconds")
        if not isinstance(v, (int, float)) or not isinstance(t, (int, float)):
            continue
        if t > prev_t:
            xs.append(row.get("env_steps", 0))
            ys.append((v - prev_v) / (t - prev_t))
        prev_v, prev_t = v, t
    return xs, ys


def rate_of_amounts(run: Run, key: str) -> tuple[list[float], list[float]]:
    """Per-second rate of a per-update amount: amount x updates since the previous row / seconds since it."""
    xs, ys, prev_u, prev_t = [], [], 0, 0.0
    for row in run.rows:
        v, t, u = row.get(key), row.get("wall_seconds"), row.get("updates")
        if not all(isinstance(x, (int, float)) for x in (v, t, u)):
            continue
        if t > prev_t and u > prev_u:
            xs.append(row.get("env_steps", 0))
            ys.append(v * (u - prev_u) / (t - prev_t))
        prev_u, prev_t = u, t
    return xs, ys


def _is_total(run: Run, key: str) -> bool:
    if key in RUN_COUNTERS:
        return True
    _, ys = run.series(key)
    return len(ys) >= 2 and ys[-1] > ys[0] and all(b >= a for a, b in zip(ys, ys[1:], strict=False))


def _curves(panel: Panel, run: Run):
    """(signal, legend suffix, xs, ys) of every signal of a panel that this run has."""
    for sig in panel.signals:
        suffix = "/s" if panel.view == "rate" else ""
        if panel.view == "rate":
            xs, ys = rate(run, sig.key) if _is_total(run, sig.key) else rate_of_amounts(run, sig.key)
        else:
            xs, ys = run.series(sig.key)
        if ys:
            yield sig, suffix, xs, ys


def _name(run: Run, runs: list[Run], word: str) -> str:
    parts = ([run.name] if len(runs) > 1 else []) + ([word] if word else [])
    return " · ".join(parts) or run.name


def _band_traces(fig: dict, panel: Panel, run: Run, runs: list[Run], colour: str) -> list[float]:
    """min-max band and mean line on the left axis, std dotted on the right axis."""
    by_stat = {sig.labels[0]: (xs, ys) for sig, _, xs, ys in _curves(panel, run) if sig.labels}
    word = next((s.word for s in panel.signals if s.key.startswith("mean_return")), "")
    values: list[float] = []
    if "min" in by_stat and "max" in by_stat:
        (x0, lo), (x1, hi) = by_stat["min"], by_stat["max"]
        group = f"{run.name}-range"
        fig["data"].append(scatter(x0, lo, {"width": 0.5, "color": colour, "dash": "dash"}, _name(run, runs, "min"),
                                   legendgroup=group, showlegend=False, mode="lines"))
        fig["data"].append(scatter(x1, hi, {"width": 0.5, "color": colour, "dash": "dash"},
                                   _name(run, runs, "min–max"), fill="tonexty", fillcolor=_rgba(colour, 0.15),
                                   legendgroup=group, mode="lines"))
        values += lo + hi
    if "mean" in by_stat:
        xs, ys = by_stat["mean"]
        fig["data"].append(scatter(xs, ys, {"width": 2, "color": colour}, _name(run, runs, word or "mean")))
        values += ys
    if "std" in by_stat:
        xs, ys = by_stat["std"]
        fig["data"].append(scatter(xs, ys, {"width": 1, "color": colour, "dash": "dot"},
                                   _name(run, runs, "std (right axis)"), yaxis="y2", mode="lines"))
    return values


def _line_traces(fig: dict, panel: Panel, run: Run, runs: list[Run], colour: str | None) -> list[float]:
    values: list[float] = []
    for i, (sig, suffix, xs, ys) in enumerate(_curves(panel, run)):
        line = {"width": 1.5}
        if colour is None:  # one run: a colour per signal
            line["color"] = KEY_COLOURS[i % len(KEY_COLOURS)]
        else:
            line.update(color=colour, dash=DASHES[i % len(DASHES)])
        word = sig.word or panel.words.get(sig.metric.name) or \
            (sig.metric.name.removeprefix("rlvitals_") if len(panel.metrics) > 1 else "")
        word = (word + suffix) if word else ""
        fig["data"].append(scatter(xs, ys, line, _name(run, runs, word.strip())))
        values += ys
    return values


def _y_range(values: list[float], bands: list, log: bool) -> list[float] | None:
    """The data's range, widened to take in band edges that lie near it (far ones would flatten the curves)."""
    if log:  # the same on log10 of the values; plotly takes a log axis's range in decades
        logs = [math.log10(v) for v in values if v > 0 and math.isfinite(v)]
        edges = [tuple(math.log10(e) if e is not None and e > 0 else None for e in band) for band in bands]
        if not logs:
            return None
        lo, hi = min(logs), max(logs)
        view = _y_range(logs + [lo - 0.5, hi + 0.5], edges, False)
        return view
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or abs(hi) or 1.0
    view_lo, view_hi = lo - 0.08 * span, hi + 0.08 * span
    for band in bands:
        for edge in band:
            if edge is not None and lo - span <= edge <= hi + span:
                view_lo, view_hi = min(view_lo, edge - 0.04 * span), max(view_hi, edge + 0.04 * span)
    return [view_lo, view_hi]


GREEN = "#2e7d32"
LABEL_SPOTS = (("right", "top"), ("right", "bottom"), ("left", "top"), ("left", "bottom"))
"""Where threshold labels go, in turn, so labels of lines close together do not print over each other."""


def _hline(y: float, colour: str, dash: str, text: str, spot: int, yref: str = "y") -> tuple[dict, dict]:
    xanchor, yanchor = LABEL_SPOTS[spot % len(LABEL_SPOTS)]
    shape = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": yref, "y0": y, "y1": y,
             "line": {"color": colour, "width": 1, "dash": dash}}
    return shape, _label(text, colour, xref="paper", x=1 if xanchor == "right" else 0, xanchor=xanchor,
                         yref=yref, y=y, yanchor="bottom" if yanchor == "top" else "top")


def _draw_bands(layout: dict, bands: list, view: list[float] | None) -> None:
    for i, (lo, hi) in enumerate(bands):
        label = f"healthy {band_text((lo, hi))}" if i == 0 else f"ideal {band_text((lo, hi))}"
        if lo is not None and hi is not None:
            layout["shapes"].append({"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": lo,
                                     "y1": hi, "fillcolor": BAND_FILL[min(i, 1)], "line": {"width": 0},
                                     "layer": "below"})
            top = hi if view is None else max(min(hi, view[1]), view[0])  # the label stays in sight
            layout["annotations"].append(_label(label, GREEN, xref="paper", x=0, xanchor="left", yref="y",
                                                y=top, yanchor="top"))
        else:
            shape, note = _hline(lo if lo is not None else hi, GREEN, "dash", label, 2 + i)
            layout["shapes"].append(shape)
            layout["annotations"].append(note)


def _draw_thresholds(layout: dict, lines: list, log: bool) -> None:
    for i, (key, (rule, op, value, sev, alone)) in enumerate(lines):
        if log and value <= 0:
            continue
        text = f"{rule} fires at {op} {value:g}" if alone else f"{rule}: {key} {op} {value:g} and more"
        yref = "y2" if key.endswith("_std") and layout.get("yaxis2") else "y"  # a band panel's std: right axis
        shape, note = _hline(value, SEVERITY_COLOURS.get(sev, "#555"), "longdash", text, i, yref)
        layout["shapes"].append(shape)
        layout["annotations"].append(note)


def _draw_verdicts(layout: dict, panel: Panel, runs: list[Run]) -> None:
    for run in runs:
        for v in run.verdicts or ():
            if not set(verdict_metrics(v)) & set(panel.metrics):
                continue
            x = run.env_steps_at(update=v.get("first_update"), seconds=v.get("first_seconds"))
            if x is None:
                continue
            colour = SEVERITY_COLOURS.get(v.get("severity"), "#555")
            layout["shapes"].append({"type": "line", "xref": "x", "x0": x, "x1": x, "yref": "paper", "y0": 0,
                                     "y1": 1, "line": {"color": colour, "width": 1.5, "dash": "dot"}})
            layout["annotations"].append(_label(f"{v.get('severity', '')}: {v.get('rule', '')}", colour, xref="x",
                                                x=x, xanchor="left", yref="paper", y=0, yanchor="bottom"))


def panel_figure(panel: Panel, runs: list[Run]) -> dict | None:
    """The panel's figure spec ({data, layout}), or None when no run has any of its signals."""
    fig: dict = {"data": [], "layout": {}}
    values: list[float] = []
    for i, run in enumerate(runs):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        if panel.view == "band":
            values += _band_traces(fig, panel, run, runs, colour)
        else:
            values += _line_traces(fig, panel, run, runs, colour if len(runs) > 1 else None)
    if not fig["data"]:
        return None
    bands = list(dict.fromkeys(b for sig in panel.signals for b in bands_for(sig.key)))
    lines = list(dict.fromkeys((sig.key, t) for sig in panel.signals for t in thresholds_for(sig.key)))
    unit = UNIT_TITLES.get(panel.unit, panel.unit)
    if panel.view == "rate":
        unit = unit + "/s" if unit else "per second"
    yaxis = {"title": {"text": unit, "font": {"size": 11}}, "zeroline": False,
             "exponentformat": "SI" if panel.unit == "bytes" else "power", **AXIS_STYLE}
    if panel.log:
        yaxis["type"] = "log"
    y_range = _y_range(values, bands + [(t[2], None) for key, t in lines if not key.endswith("_std")], panel.log)
    if y_range is not None:
        yaxis["range"] = y_range
    named = [t for t in fig["data"] if t.get("showlegend", True)]
    if len(named) > LEGEND_MOST:   # too many to list: one entry per run, the names are in the hover
        owners: set[str] = set()
        for t in named:
            owner = t.get("name", "").split(" · ")[0] if len(runs) > 1 else ""
            t["showlegend"] = owner not in owners
            owners.add(owner)
        named = [t for t in fig["data"] if t.get("showlegend", True)]
    layout = {"height": 300, "margin": {"l": 55, "r": 20, "t": 10, "b": 40}, "paper_bgcolor": "white",
              "plot_bgcolor": "white", "hovermode": "x unified",
              "font": {"family": "system-ui, sans-serif", "size": 11},
              "xaxis": {"title": {"text": "env steps", "font": {"size": 11}}, "rangemode": "tozero", **AXIS_STYLE},
              "yaxis": yaxis, "showlegend": len(named) > 1 or len(runs) > 1, "shapes": [], "annotations": [],
              "legend": {"orientation": "h", "y": -0.22, "x": 0, "font": {"size": 10}}}
    if any(t.get("yaxis") == "y2" for t in fig["data"]):
        layout["yaxis2"] = {"overlaying": "y", "side": "right", "showgrid": False, "title": {"text": "std"},
                            "rangemode": "tozero", "zeroline": False}
        layout["margin"]["r"] = 50
    _draw_bands(layout, bands, y_range)
    _draw_thresholds(layout, lines, panel.log)
    _draw_verdicts(layout, panel, runs)
    fig["layout"] = layout
    return fig


def _held_spans(history: list[tuple[float, bool]]) -> list[tuple[float, float]]:
    spans, start, last = [], None, None
    for t, held in history:
        if held and start is None:
            start = t
        elif not held and start is not None:
            spans.append((start, t))
            start = None
        last = t
    if start is not None:
        spans.append((start, last))
    return spans


def health_timeline(runs: list[Run]) -> dict | None:
    """When each health rule's condition held, per run, on the env-steps axis; None when none ever held."""
    data, labels = [], []
    for run in runs:
        for rule, history in sorted((run.history or {}).items()):
            spans = _held_spans(history)
            if not spans:
                continue
            label = f"{run.name} · {rule}" if len(runs) > 1 else rule
            labels.append(label)
            ends = run.env_steps_at_seconds([t for span in spans for t in span])
            xs: list = []
            for x0, x1 in zip(ends[::2], ends[1::2], strict=True):  # (start, end) of each span
                xs += [x0, x1 if x1 > x0 else x0 + 1, None]
            colour = SEVERITY_COLOURS.get(rule_severity(rule), "#555")
            data.append({"type": "scatter", "x": xs, "y": [label if x is not None else None for x in xs],
                         "mode": "lines", "line": {"color": colour, "width": 10}, "name": label, "showlegend": False,
                         "hovertemplate": f"{rule}: condition held<extra>{run.name}</extra>"})
    if not data:
        return None
    layout = {"height": 60 + 28 * len(labels), "margin": {"l": 10, "r": 20, "t": 10, "b": 40},
              "paper_bgcolor": "white", "plot_bgcolor": "white",
              "font": {"family": "system-ui, sans-serif", "size": 11},
              "xaxis": {"title": {"text": "env steps", "font": {"size": 11}}, **AXIS_STYLE,
                        "range": [0, max((r.rows[-1].get("env_steps", 0) for r in runs if r.rows), default=1) or 1]},
              "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": labels[::-1], **AXIS_STYLE},
              "hovermode": "closest"}
    return {"data": data, "layout": layout}
