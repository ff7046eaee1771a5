"""Panel factories: a dashboard panel from catalogue metrics and a view.

A panel names catalogue metrics and a view (rate of a counter, lines of a
gauge, min/mean/max band of a stat-labelled gauge, heatmap or quantiles of a
histogram, a single stat, a table, a bar chart), and everything else comes
from the catalogue entry: the title from the name, the description from the
help text (what healthy looks like), the unit from `unit`, the query from the
kind and labels, the verbosity level it needs.

Every query selects `run_id=~"$run", node=~"$node"` (both template variables
default to All, whose value `.*` also matches series without the label, such
as a local run's, which has no `node`), counters go through
`rate(...[$__rate_interval])`, and every panel reads the `$datasource` variable.
`Row` and `Dashboard` lay panels out; `content` says what is on each dashboard
and `grafana` turns a `Dashboard` into Grafana's JSON model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvitals.telemetry.catalogue import BY_NAME, LEVELS, Metric

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = 'run_id=~"$run", node=~"$node"'
RATE_WINDOW = "$__rate_interval"
# Unit of a counter's per-second rate, by the counter's catalogue unit: seconds per second is the
# fraction of wall time, bytes become bytes/s; counts become "<what they count>/s" (COUNT_UNITS).
RATE_UNITS = {"s": "percentunit", "bytes": "Bps"}
COUNT_UNITS = ("short", "none")
UNIT_SUFFIXES = ("_total", "_ratio", "_bytes", "_seconds", "_nats", "_celsius", "_watts", "_steps")
WORDS = {"cpu": "CPU", "gpu": "GPU", "kl": "KL", "rms": "RMS"}
ROLE_WORDS = ("learner", "actor")
"""Dropped from titles: the dashboards' rows say whose a metric is."""
ROW_HEIGHT = 8
STAT_HEIGHT = 4
GRID_WIDTH = 24


class CatalogueError(Exception):
    """The dashboards and the catalogue disagree."""


def metric(name: str) -> Metric:
    try:
        return BY_NAME[name]
    except KeyError:
        raise CatalogueError(f"{name} is not in the telemetry catalogue") from None


def series(name: str, **matchers: str) -> str:
    """`name{run_id=~"$run", node=~"$node", k="v"...}`."""
    extra = "".join(f', {k}="{v}"' for k, v in matchers.items())
    return f"{name}{{{SELECTOR}{extra}}}"


def component_series(name: str, components: str, **matchers: str) -> str:
    """`name{run_id=~"$run", node=~"$node", component=~"<components>", k=~"v"...}` (every matcher a regex)."""
    extra = "".join(f', {k}=~"{v}"' for k, v in matchers.items())
    return f'{name}{{{SELECTOR}, component=~"{components}"{extra}}}'


def title_of(m: Metric) -> str:
    """'rlvitals_learner_kl_divergence_nats' -> 'KL divergence'."""
    name = m.name.removeprefix("rlvitals_")
    for _ in range(2):  # '_seconds_total'
        for suffix in UNIT_SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
    words = [WORDS.get(w, w) for w in name.split("_")]
    if len(words) > 1 and words[0] in ROLE_WORDS:
        words = words[1:]
    text = " ".join(words)
    return text[0].upper() + text[1:]


def _legends(ms: list[Metric], legends: tuple[str, ...]) -> tuple[str, ...]:
    """Legend word per metric: none for a one-metric panel, else one given per metric."""
    if len(ms) == 1 and not legends:
        return ("",)
    if len(legends) != len(ms):
        raise CatalogueError(f"panel of {[m.name for m in ms]} needs one legend word per metric")
    return legends


def legend(labels: tuple[str, ...], suffix: str = "") -> str:
    return " ".join([f"{{{{{label}}}}}" for label in labels] + ([suffix] if suffix else []))


def target(expr: str, legend_format: str, **extra) -> dict:
    return {"datasource": DATASOURCE, "editorMode": "code", "expr": expr, "legendFormat": legend_format,
            "range": True, **extra}



# ------------------------------------------------------------------ panels
@dataclass
class Panel:
    title: str
    metrics: tuple[str, ...]
    targets: list[dict]
    unit: str
    shown: str
    kind: str = "timeseries"
    width: int = 8
    height: int = ROW_HEIGHT
    note: str = ""
    """What healthy looks like, where the catalogue help does not say it."""
    defaults: dict = field(default_factory=dict)
    custom: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    transformations: list = field(default_factory=list)
    per_run: bool = False
    """One panel per selected run (Grafana repeats it over $run), for views that cannot overlay runs."""

    def description(self) -> str:
        ms = [metric(n) for n in self.metrics]
        parts = [self.note] if self.note else []
        if len(ms) == 1:
            parts.append(ms[0].help)
        else:
            parts.extend(f"`{m.name}`: {m.help}" for m in ms)
        foot = f"Shown: {self.shown}"
        if ms:
            foot += f". Exported from verbosity `{max((m.level for m in ms), key=LEVELS.index)}` up"
        if any(m.hardware for m in ms):
            foot += "; only where a GPU is present"
        parts.append(foot + ".")
        text = "\n\n".join(parts)
        if "healthy" not in text.lower():
            raise CatalogueError(f"panel {self.title!r}: no text says what healthy looks like; give it a note")
        return text


def _one_unit(ms: list[Metric]) -> str:
    units = {m.unit for m in ms}
    if len(units) != 1:
        raise CatalogueError(f"one panel, several units: {[m.name for m in ms]} -> {sorted(units)}")
    return units.pop()


def per_second(counts: str) -> str:
    """Grafana's unit for a rate of things: 'steps' reads 12.3K steps/s (count: scales by thousands)."""
    return f"count:{counts}/s"


def rate_unit(ms: list[Metric], counts: str) -> str:
    unit = _one_unit(ms)
    if unit not in COUNT_UNITS:
        return RATE_UNITS[unit]
    if not counts:
        raise CatalogueError(f"rate of {[m.name for m in ms]}: say what they count (counts='steps') so the axis "
                             "reads steps/s, not c/s")
    return per_second(counts)


def rates(*names: str, by: tuple[str, ...] = (), per: tuple[str, ...] = ("run_id",), agg: str = "sum",
          title: str | None = None, stack: bool = False, legends: tuple[str, ...] = (), counts: str = "",
          unit: str | None = None, **kw) -> Panel:
    """Per-second rate of counters, aggregated per run (or per process) and `by` labels.

    `counts` names what counters of counts count (the unit reads `<counts>/s`); `unit` replaces the
    derived unit where the sum is no fraction of wall time (CPU seconds of a process: cores busy).
    """
    ms = [metric(n) for n in names]
    for m in ms:
        if m.kind != "counter":
            raise CatalogueError(f"{m.name} is a {m.kind}, not a counter")
    group = ", ".join(per + by)
    targets = [target(f"{agg} by ({group}) (rate({series(m.name)}[{RATE_WINDOW}]))", legend(per + by, word))
               for m, word in zip(ms, _legends(ms, legends), strict=True)]
    shown = f"per-second rate over $__rate_interval, {'summed' if agg == 'sum' else agg + ' over processes'} " \
            f"per {' and '.join(per + by)}"
    custom = {"stacking": {"group": "A", "mode": "normal"}, "fillOpacity": 20} if stack else {}
    return Panel(title or title_of(ms[0]), tuple(names), targets, unit or rate_unit(ms, counts), shown,
                 custom=custom, **kw)


def gauges(*names: str, by: tuple[str, ...] = (), per: tuple[str, ...] = ("run_id",), agg: str = "max",
           title: str | None = None, log: bool = False, lo: float | None = None, hi: float | None = None,
           legends: tuple[str, ...] = (), **kw) -> Panel:
    """Gauges as lines, one per run (or per process) and `by` label value."""
    ms = [metric(n) for n in names]
    group = ", ".join(per + by)
    targets = [target(f"{agg} by ({group}) ({series(m.name)})", legend(per + by, word))
               for m, word in zip(ms, _legends(ms, legends), strict=True)]
    defaults = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    custom = {"scaleDistribution": {"type": "log", "log": 10}} if log else {}
    shown = f"latest value per {' and '.join(per + by)}" + (" (log scale)" if log else "")
    return Panel(title or title_of(ms[0]), tuple(names), targets, _one_unit(ms), shown, defaults=defaults,
                 custom=custom, **kw)


STAT_AGG = {"min": "min", "mean": "avg", "max": "max", "std": "avg"}
BAND_COLOUR, STD_COLOUR = "blue", "purple"


def _override(series_name: str, **properties) -> dict:
    """Field overrides for the series whose display name (legend) is `series_name`; `a__b` is property `a.b`."""
    return {"matcher": {"id": "byName", "options": series_name},
            "properties": [{"id": k.replace("__", "."), "value": v} for k, v in properties.items()]}


def band(name: str, title: str | None = None, **kw) -> Panel:
    """A stat-labelled gauge of one run: min to max shaded, the mean a line, std on its own right-hand axis.

    Grafana fills between two series named in the panel (`fillBelowTo`), so each panel shows one run:
    it is repeated for every selected run, and its series are simply `min`, `mean`, `max`, `std`.
    """
    m = metric(name)
    if m.labels != ("stat",):
        raise CatalogueError(f"{name} has no stat label")
    stats = [s for s in ("min", "mean", "max", "std") if s in m.label_values["stat"]]
    targets = [target(f"{STAT_AGG[s]} by (run_id) ({series(name, stat=s)})", s) for s in stats]
    colour = {"mode": "fixed", "fixedColor": BAND_COLOUR}
    overrides = [
        _override("min", color=colour, custom__fillOpacity=0),
        _override("max", color=colour, custom__fillBelowTo="min", custom__fillOpacity=20),
        _override("mean", color=colour, custom__lineWidth=2),
        _override("std", color={"mode": "fixed", "fixedColor": STD_COLOUR}, custom__axisPlacement="right",
                  custom__axisLabel="std", custom__lineStyle={"fill": "dash", "dash": [10, 10]}),
    ]
    shown = ("min to max shaded, the mean as a line (left axis), std dashed on the right-hand axis; one panel per "
             "selected run")
    return Panel(title or title_of(m), (name,), targets, m.unit, shown, overrides=overrides, per_run=True, **kw)


def heatmap(name: str, **kw) -> Panel:
    """A histogram as a heatmap of the observations made in each interval."""
    m = metric(name)
    if m.kind != "histogram":
        raise CatalogueError(f"{name} is not a histogram")
    expr = f"sum by (le) (increase({series(name + '_bucket')}[{RATE_WINDOW}]))"
    options = {"calculate": False, "cellGap": 1, "yAxis": {"axisPlacement": "left", "unit": m.unit},
               "rowsFrame": {"layout": "auto"}, "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential",
                                                           "exponent": 0.5, "steps": 64, "fill": "dark-orange"},
               "tooltip": {"mode": "single", "yHistogram": True}, "legend": {"show": True},
               "filterValues": {"le": 1e-9}}
    shown = "observations per bucket in each $__rate_interval, summed over the selected runs (pick one run)"
    return Panel(title_of(m) + " (heatmap)", (name,), [target(expr, "{{le}}", format="heatmap")], m.unit, shown,
                 kind="heatmap", options=options, **kw)


def quantiles(name: str, **kw) -> Panel:
    """A non-negative histogram as its mean and 50th/90th/99th percentiles per run."""
    m = metric(name)
    if m.kind != "histogram" or min(m.buckets) < 0:
        raise CatalogueError(f"{name}: quantiles need a histogram with _sum and _count")

    def rate(suffix: str) -> str:
        return f"rate({series(name + suffix)}[{RATE_WINDOW}])"

    targets = [target(f"sum by (run_id) ({rate('_sum')}) / sum by (run_id) ({rate('_count')})",
                      legend(("run_id",), "mean"))]
    targets += [target(f"histogram_quantile({q}, sum by (run_id, le) ({rate('_bucket')}))",
                       legend(("run_id",), f"p{int(q * 100)}")) for q in (0.5, 0.9, 0.99)]
    shown = "mean and 50th/90th/99th percentiles of the samples that arrived in each $__rate_interval, per run"
    return Panel(title_of(m), (name,), targets, m.unit, shown, **kw)


OWN = "learner|local"
"""Processes a run has one of: they keep their own lines on fleet panels."""
OUTLIERS = 3
"""Processes a fleet panel names: the few that rank worst over the shown time range."""
DRILL_DOWN = "instance"
"""The dashboard variable that picks processes (by instance) to draw on their own."""
RANK = {"topk": "highest", "bottomk": "lowest"}


def fleet(name: str, *, of: str = "actor", worst: str = "bottomk", own: bool = True, by: tuple[str, ...] = (),
          keep: tuple[str, ...] = (), also: tuple[str, ...] = (), also_legends: tuple[str, ...] = (),
          sidecars: bool = False,
          title: str | None = None, counts: str = "", unit: str | None = None, lo: float | None = None,
          hi: float | None = None, **kw) -> Panel:
    """A per-process metric of a fleet of any size, in about a dozen lines per run.

    The run's single processes (learner, local) keep their own lines; across the fleet (`of`: actors or
    node sidecars) the min, median and max (per `by` label); the OUTLIERS processes that rank `worst` over
    the shown range (a counter by its mean rate, a gauge by its latest value), by instance and node; and
    the processes picked in the $instance variable. `also` adds per-run lines of bounded metrics (the
    learner's own network age, a machine's total memory: max over processes), `sidecars` the max over node
    sidecars. `keep` labels (a machine's `gpu`) tell apart the series of one process: the distribution is
    over all of them.
    """
    m = metric(name)
    rate = m.kind == "counter"
    if m.kind not in ("counter", "gauge"):
        raise CatalogueError(f"{name} is a {m.kind}: a fleet panel needs a counter or a gauge")

    def value(selector: str) -> str:
        return f"rate({selector}[{RATE_WINDOW}])" if rate else selector

    group = ", ".join(("run_id",) + by)
    fleet_of = value(component_series(name, of))
    who = f"{of}s" if of != "node" else "nodes"
    targets = []
    if own:
        targets.append(target(f"max by (run_id, component{''.join(', ' + b for b in by + keep)}) "
                              f"({value(component_series(name, OWN))})", legend(("run_id", "component") + by + keep)))
    targets += [target(f"min by ({group}) ({fleet_of})", legend(("run_id",) + by, f"{who} min")),
                target(f"quantile by ({group}) (0.5, {fleet_of})", legend(("run_id",) + by, f"{who} median")),
                target(f"max by ({group}) ({fleet_of})", legend(("run_id",) + by, f"{who} max"))]
    ranked = (f"rate({component_series(name, of)}[$__range] @ end())" if rate
              else f"last_over_time({component_series(name, of)}[$__range] @ end())")
    match = ", ".join(("run_id", "instance") + by + keep)
    targets.append(target(f"{fleet_of} and on ({match}) {worst} by (run_id) ({OUTLIERS}, {ranked})",
                          legend(("instance",) + by + keep, "on {{node}}")))
    targets.append(target(value(component_series(name, of, **{DRILL_DOWN: f"${DRILL_DOWN}"})),
                          legend(("instance",) + by + keep, "on {{node}} (picked)")))
    if sidecars:
        targets.append(target(f"max by ({group}) ({value(component_series(name, 'node'))})",
                              legend(("run_id",) + by, "node sidecars max")))
    for other, word in zip(also, also_legends, strict=True):
        targets.append(target(f"max by ({group}) ({value(series(other))})", legend(("run_id",) + by, word)))
    ms = [m] + [metric(n) for n in also]
    if unit is None:
        unit = rate_unit(ms, counts) if rate else _one_unit(ms)
    what = "per-second rate over $__rate_interval" if rate else "latest value"
    shown = (f"{what}: {'the learner (or local process) on its own line; ' if own else ''}across the {who} of each "
             f"run min, median and max; the {OUTLIERS} {who} with the {RANK[worst]} "
             f"{'mean rate' if rate else 'latest value'} over the shown range by name (instance and node); "
             f"the processes picked in the Process variable (${DRILL_DOWN})")
    defaults = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    return Panel(title or title_of(m), (name,) + also, targets, unit, shown, defaults=defaults, **kw)


def stat(title: str, expr: str, names: tuple[str, ...], unit: str, shown: str, red_at: float | None = None,
         **kw) -> Panel:
    """A single number: the latest value of one query."""
    steps = [{"color": "green", "value": None}]
    if red_at is not None:
        steps.append({"color": "red", "value": red_at})
    defaults = {"color": {"mode": "thresholds"}, "thresholds": {"mode": "absolute", "steps": steps}}
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value",
               "graphMode": "area", "justifyMode": "auto", "orientation": "auto", "textMode": "auto"}
    return Panel(title, names, [target(expr, legend(("run_id",)))], unit, shown, kind="stat", width=4,
                 height=STAT_HEIGHT, defaults=defaults, options=options, **kw)


def info_table(name: str, **kw) -> Panel:
    """An info metric as a table: one row per run and kind of process, with how many processes there are."""
    m = metric(name)
    identity = [label for label in m.labels if label != "run_name"] + ["run_name", "component"]
    expr = f"count by ({', '.join(identity)}) ({series(name)})"
    transformations = [{"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": {},
                                                      "renameByName": {"Value": "processes"}}}]
    shown = ("one row per selected run and kind of process (local, learner, actor, node), from the processes' "
             "identity labels, with how many processes of that kind answer")
    return Panel("Runs and processes", (name,), [target(expr, "", format="table", instant=True, range=False)],
                 m.unit, shown, kind="table", width=GRID_WIDTH, height=5, transformations=transformations,
                 options={"showHeader": True, "cellHeight": "sm"}, **kw)


def trace(name: str, **kw) -> Panel:
    """The debug value trace: value and reward along one trajectory, by rollout step (pick one run)."""
    m = metric(name)
    transformations = [
        {"id": "groupingToMatrix", "options": {"columnField": "series", "rowField": "step", "valueField": "Value"}},
        {"id": "organize", "options": {"renameByName": {"step\\series": "step"}}},
        {"id": "convertFieldType", "options": {"conversions": [{"targetField": "step", "destinationType": "number"}]}},
        {"id": "sortBy", "options": {"sort": [{"field": "step"}]}},
        {"id": "convertFieldType", "options": {"conversions": [{"targetField": "step", "destinationType": "string"}]}},
    ]
    options = {"xField": "step", "orientation": "vertical", "showValue": "never", "groupWidth": 0.8, "barWidth": 0.9,
               "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
               "tooltip": {"mode": "multi", "sort": "none"}, "xTickLabelSpacing": 100}
    shown = "latest trace, value and reward side by side at each rollout step (pick one run)"
    expr = f"max by (series, step) ({series(name)})"
    return Panel(title_of(m), (name,), [target(expr, "{{series}}", format="table", instant=True, range=False)],
                 m.unit, shown, kind="barchart", transformations=transformations, options=options, **kw)


# ------------------------------------------------------------------ layout
@dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[Row]
