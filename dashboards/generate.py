"""Build the Grafana dashboards from the telemetry catalogue.

    python -m rlvitals.dashboards.generate            # (re)write dashboards/*.json
    python -m rlvitals.dashboards.generate --check    # exit 1 if a committed file is stale

The catalogue is the single source: a panel names catalogue metrics and a view
(rate of a counter, lines of a gauge, min/mean/max band of a stat-labelled
gauge, heatmap or quantiles of a histogram), and everything else comes from
the catalogue entry: the title from the name, the description from the help
text (what healthy looks like), the unit from `unit`, the query from the kind
and labels, the verbosity level it needs. A catalogue metric that is on no
dashboard is an error here, so a new metric cannot be forgotten.

Every query selects `run_id=~"$run", node=~"$node"` (both template variables
default to All, whose value `.*` also matches series without the label, such
as a local run's, which has no `node`), counters go through
`rate(...[$__rate_interval])`, and every panel reads the `$datasource` variable.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlvitals.telemetry.catalogue import BY_NAME, LEVELS, METRICS, Metric

OUT_DIR = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
TAG = "rlvitals"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SELECTOR = 'run_id=~"$run", node=~"$node"'
RATE_WINDOW = "$__rate_interval"
# Unit of a counter's per-second rate, by the counter's catalogue unit: counts become
# counts/s, seconds per second is the fraction of wall time, bytes become bytes/s.
RATE_UNITS = {"short": "cps", "none": "cps", "s": "percentunit", "bytes": "Bps"}
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


def _one_unit(ms: list[Metric], table: dict | None = None) -> str:
    units = {(table or {}).get(m.unit, m.unit) for m in ms}
    if len(units) != 1:
        raise CatalogueError(f"one panel, several units: {[m.name for m in ms]} -> {sorted(units)}")
    return units.pop()


def rates(*names: str, by: tuple[str, ...] = (), per: tuple[str, ...] = ("run_id",), agg: str = "sum",
          title: str | None = None, stack: bool = False, legends: tuple[str, ...] = (), **kw) -> Panel:
    """Per-second rate of counters, aggregated per run (or per process) and `by` labels."""
    ms = [metric(n) for n in names]
    for m in ms:
        if m.kind != "counter":
            raise CatalogueError(f"{m.name} is a {m.kind}, not a counter")
    group = ", ".join(per + by)
    targets = [target(f"{agg} by ({group}) (rate({series(m.name)}[{RATE_WINDOW}]))", legend(per + by, word))
               for m, word in zip(ms, _legends(ms, legends))]
    shown = f"per-second rate over $__rate_interval, {'summed' if agg == 'sum' else agg + ' over processes'} " \
            f"per {' and '.join(per + by)}"
    custom = {"stacking": {"group": "A", "mode": "normal"}, "fillOpacity": 20} if stack else {}
    return Panel(title or title_of(ms[0]), tuple(names), targets, _one_unit(ms, RATE_UNITS), shown,
                 custom=custom, **kw)


def gauges(*names: str, by: tuple[str, ...] = (), per: tuple[str, ...] = ("run_id",), agg: str = "max",
           title: str | None = None, log: bool = False, lo: float | None = None, hi: float | None = None,
           legends: tuple[str, ...] = (), **kw) -> Panel:
    """Gauges as lines, one per run (or per process) and `by` label value."""
    ms = [metric(n) for n in names]
    group = ", ".join(per + by)
    targets = [target(f"{agg} by ({group}) ({series(m.name)})", legend(per + by, word))
               for m, word in zip(ms, _legends(ms, legends))]
    defaults = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    custom = {"scaleDistribution": {"type": "log", "log": 10}} if log else {}
    shown = f"latest value per {' and '.join(per + by)}" + (" (log scale)" if log else "")
    return Panel(title or title_of(ms[0]), tuple(names), targets, _one_unit(ms), shown, defaults=defaults,
                 custom=custom, **kw)


STAT_AGG = {"min": "min", "mean": "avg", "max": "max", "std": "avg"}


def band(name: str, title: str | None = None, **kw) -> Panel:
    """A stat-labelled gauge (min, max, mean, std) as a band: dashed min and max around a solid mean."""
    m = metric(name)
    if m.labels != ("stat",):
        raise CatalogueError(f"{name} has no stat label")
    targets = [target(f"{STAT_AGG[s]} by (run_id) ({series(name, stat=s)})", legend(("run_id",), s))
               for s in ("min", "mean", "max", "std") if s in m.label_values["stat"]]
    dashed = {"custom.lineStyle": {"fill": "dash", "dash": [10, 10]}, "custom.fillOpacity": 0}
    overrides = [
        {"matcher": {"id": "byRegexp", "options": "/ (min|max)$/"},
         "properties": [{"id": k, "value": v} for k, v in dashed.items()]},
        {"matcher": {"id": "byRegexp", "options": "/ mean$/"}, "properties": [{"id": "custom.lineWidth", "value": 2}]},
        {"matcher": {"id": "byRegexp", "options": "/ std$/"},
         "properties": [{"id": "custom.lineStyle", "value": {"fill": "dot", "dash": [0, 10]}}]},
    ]
    shown = "min, mean and max as a band (dashed: min and max; solid: mean; dotted: std), per run"
    return Panel(title or title_of(m), (name,), targets, m.unit, shown, overrides=overrides, **kw)


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
    rate = lambda suffix: f"rate({series(name + suffix)}[{RATE_WINDOW}])"  # noqa: E731
    targets = [target(f"sum by (run_id) ({rate('_sum')}) / sum by (run_id) ({rate('_count')})",
                      legend(("run_id",), "mean"))]
    targets += [target(f"histogram_quantile({q}, sum by (run_id, le) ({rate('_bucket')}))",
                       legend(("run_id",), f"p{int(q * 100)}")) for q in (0.5, 0.9, 0.99)]
    shown = "mean and 50th/90th/99th percentiles of the samples that arrived in each $__rate_interval, per run"
    return Panel(title_of(m), (name,), targets, m.unit, shown, **kw)


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
    """An info metric as a table: one row per process, its identity labels as columns."""
    m = metric(name)
    hidden = {"Time": True, "Value": True, "__name__": True, "job": True, "exported_run_id": True}
    transformations = [{"id": "organize", "options": {"excludeByName": hidden, "indexByName": {}, "renameByName": {}}}]
    shown = "one row per process of the selected runs, from the process's identity labels"
    return Panel("Runs and processes", (name,), [target(series(name), "", format="table", instant=True, range=False)],
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


def alerts_firing() -> Panel:
    expr = 'sum(ALERTS{alertstate="firing", run_id=~"$run"}) or vector(0)'
    return stat("Alerts firing", expr, (), "none", "alerts of deploy/prometheus/rules firing now for the selected runs",
                red_at=1, note="Healthy: 0. Open Prometheus's Alerts page (or the annotations on these dashboards) "
                               "for the name and description of each; every rule says what to check.")


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


PROCESS = ("run_id", "component", "instance")
RETURN_NOTE = ("Healthy: rises, noisily, then levels off near the best return the env allows; a flat line from the "
               "start points at the learner, a drop after a rise at instability.")
LEARNER_TOTALS = "Learner steps and updates/s"


def overview() -> Dashboard:
    ret = "rlvitals_actor_episode_return"
    return Dashboard("rlvitals-overview", "rlvitals / Overview",
                     "Is the run learning and is data flowing: return, episode length, throughput, staleness, "
                     "queue depth, alerts.", [
        Row("At a glance", [
            stat("Mean return", f"avg by (run_id) ({series(ret, stat='mean')})", (ret,), metric(ret).unit,
                 "mean return of the last 100 episodes (mean over actors)", note=RETURN_NOTE),
            stat("Env steps/s", f"sum by (run_id) (rate({series('rlvitals_actor_env_steps_total')}[{RATE_WINDOW}]))",
                 ("rlvitals_actor_env_steps_total",), "cps", "agent steps per second, all actors"),
            stat("Learner samples/s",
                 f"sum by (run_id) (rate({series('rlvitals_learner_samples_consumed_total')}[{RATE_WINDOW}]))",
                 ("rlvitals_learner_samples_consumed_total",), "cps", "samples the learner consumed per second"),
            stat("Network age", f"max by (run_id) ({series('rlvitals_learner_network_age')})",
                 ("rlvitals_learner_network_age",), metric("rlvitals_learner_network_age").unit,
                 "learner optimizer steps so far",
                 note="Healthy: keeps rising while the run lives; frozen means the learner is stuck or starved."),
            stat("Actor restarts", f"sum by (run_id) (increase({series('rlvitals_actor_restarts_total')}[$__range]))",
                 ("rlvitals_actor_restarts_total",), "short", "restarts within the dashboard's time range", red_at=1),
            alerts_firing(),
            info_table("rlvitals_run_info",
                       note="Healthy: one `local` row for a local run; one `learner`, one `node` per machine and one "
                            "`actor` per actor for a Ray run. A missing row is a process Prometheus cannot see."),
        ]),
        Row("Learning", [
            band(ret, title="Episode return", note=RETURN_NOTE),
            band("rlvitals_actor_episode_length", title="Episode length",
                 note="Healthy: min and max apart in an env whose episodes should vary, the mean moving the way the "
                      "task rewards (longer for balancing tasks, shorter for reach-the-goal tasks)."),
            gauges("rlvitals_actor_solve_ratio", agg="avg", lo=0, hi=1, title="Solve ratio",
                   note="Healthy: rises toward 1 as the agent learns the task; flat at 0 with rising return means the "
                        "env's success criterion is not what the reward encourages."),
        ]),
        Row("Data flow", [
            rates("rlvitals_actor_env_steps_total", "rlvitals_learner_samples_consumed_total",
                  title="Env steps/s and learner samples/s", width=12, legends=("env steps", "learner samples")),
            quantiles("rlvitals_learner_sample_staleness_steps", width=12),
            gauges("rlvitals_queue_depth", "rlvitals_queue_capacity", by=("queue",), title="Queue depth", width=12,
                   legends=("depth", "capacity")),
            rates("rlvitals_samples_dropped_total", by=("reason",), title="Samples dropped/s", width=12),
        ]),
    ])


def learning() -> Dashboard:
    layer_note = ("Healthy: every layer in the same range and steady; one layer far from the others is where to look.")
    return Dashboard("rlvitals-learning", "rlvitals / Learning diagnostics",
                     "Where a learning bug lives: policy entropy and KL, the value function's fit, the distributions "
                     "it learns from, the updates it makes, and per-layer health (debug level).", [
        Row("Policy", [
            gauges("rlvitals_learner_relative_entropy_ratio", lo=0, hi=1, title="Relative policy entropy"),
            gauges("rlvitals_learner_kl_divergence_nats", title="KL(behaviour || learner)"),
            gauges("rlvitals_learner_clip_fraction_ratio", lo=0, hi=1, title="PPO clip fraction"),
        ]),
        Row("Value function", [
            gauges("rlvitals_learner_residual_variance_ratio", lo=0, title="Residual variance"),
            gauges("rlvitals_learner_terminal_correlation", "rlvitals_learner_penultimate_terminal_correlation",
                   lo=-1, hi=1, title="Terminal correlations", legends=("terminal", "penultimate")),
            band("rlvitals_learner_value", title="Value predictions"),
            band("rlvitals_learner_value_target", title="Value targets"),
            band("rlvitals_learner_advantage", title="Advantages"),
            band("rlvitals_learner_reward", title="Rewards",
                 note="Healthy: exactly the range the env is documented to give, the mean rising as the agent learns."),
        ]),
        Row("Distributions", [
            heatmap("rlvitals_learner_value_target_distribution", width=12,
                    note="Healthy: mass within [-10, 10] (ideally [-3, 3]), drifting slowly as returns improve."),
            heatmap("rlvitals_learner_advantage_distribution", width=12,
                    note="Healthy: centred on zero, roughly symmetric, within [-10, 10]; a shifted centre means the "
                         "advantage calculation is wrong."),
            heatmap("rlvitals_learner_sample_staleness_steps", width=12),
            trace("rlvitals_learner_value_trace", width=12),
        ]),
        Row("Updates", [
            gauges("rlvitals_learner_update_step", by=("stat",), log=True, title="Update step size"),
            gauges("rlvitals_learner_gradient", by=("stat",), log=True, title="Gradient statistics",
                   note="Healthy: norm and mean-square steady or slowly falling, no spikes of orders of magnitude; "
                        "abs-max well above the root of the mean-square."),
            gauges("rlvitals_learner_gradient_noise_scale", log=True,
                   note="Healthy: a long-run average of the same order as the batch size; far below it, smaller "
                        "batches would learn as well."),
            gauges("rlvitals_learner_loss", by=("part",), title="Losses"),
            gauges("rlvitals_learner_training_intensity"),
            rates("rlvitals_learner_samples_learned_total", title="Sample-gradient passes/s",
                  note="Healthy: steady at about epochs x learner samples/s."),
        ]),
        Row("Layers", [
            gauges("rlvitals_learner_layer_weight_rms", by=("layer",), width=12),
            gauges("rlvitals_learner_layer_gradient_rms", by=("layer",), log=True, width=12, note=layer_note),
            gauges("rlvitals_learner_layer_activation_std", by=("layer",), width=12, note=layer_note),
            gauges("rlvitals_learner_layer_dead_ratio", by=("layer",), lo=0, hi=1, width=12, title="Dead units"),
        ]),
    ])


def systems() -> Dashboard:
    phase_note = "Healthy: the shares stay steady over the run; compute phases dominate, waiting is a small share."
    gpu_note = "Healthy: steady, well inside the card's limits; compare GPUs of the same node."
    return Dashboard("rlvitals-systems", "rlvitals / Systems",
                     "Per-component throughput and phase timings, queues and transport, memory of every process, "
                     "torch and NVML memory, GPU vitals, restarts and dropped samples.", [
        Row("Throughput", [
            rates("rlvitals_actor_env_steps_total", per=PROCESS, title="Env steps/s per process"),
            rates("rlvitals_actor_episodes_total", per=PROCESS, title="Episodes/s per process",
                  note="Healthy: steady; a falling rate at steady env steps/s means episodes got longer."),
            rates("rlvitals_learner_samples_consumed_total", "rlvitals_learner_samples_learned_total",
                  title="Learner samples/s", legends=("consumed", "learned")),
            rates("rlvitals_learner_steps_total", "rlvitals_learner_updates_total", title=LEARNER_TOTALS,
                  legends=("optimizer steps", "updates"),
                  note="Healthy: both steady; steps/s = updates/s x epochs x minibatches."),
        ]),
        Row("Phase timings", [
            rates("rlvitals_learner_phase_seconds_total", by=("phase",), title="Learner time by phase", stack=True,
                  width=12, note=phase_note),
            rates("rlvitals_actor_phase_seconds_total", by=("phase",), agg="avg", title="Actor time by phase",
                  stack=True, width=12, note=phase_note),
        ]),
        Row("Queues and transport", [
            gauges("rlvitals_queue_depth", "rlvitals_queue_capacity", by=("queue",), title="Queue depth and capacity",
                   legends=("depth", "capacity")),
            rates("rlvitals_samples_dropped_total", by=("reason",), title="Samples dropped/s"),
            rates("rlvitals_actor_restarts_total", title="Actor restarts/s"),
            gauges("rlvitals_actor_weight_version", "rlvitals_learner_network_age", per=PROCESS,
                   title="Weight versions", legends=("acting with", "learner network"),
                   note="Healthy: every actor's line follows the learner's network age a few versions behind."),
            rates("rlvitals_weight_publishes_total", title="Weight publishes/s",
                  note="Healthy: steady, about one per learner update."),
            rates("rlvitals_weight_publish_bytes_total", title="Weight bytes published/s",
                  note="Healthy: publishes/s x model size, a small fraction of the network's bandwidth."),
        ]),
        Row("Memory and CPU", [
            gauges("rlvitals_process_resident_memory_bytes", per=PROCESS, width=12),
            rates("rlvitals_process_cpu_seconds_total", per=PROCESS, width=12, title="Process CPU (100% = one core)",
                  note="Healthy: actors near one core each, the learner busy; a process at 0 is stuck."),
            gauges("rlvitals_node_memory_used_bytes", "rlvitals_node_memory_total_bytes", per=("run_id", "instance"),
                   title="Machine memory", width=12, legends=("used", "total")),
            gauges("rlvitals_node_cpu_utilization_ratio", per=("run_id", "instance"), lo=0, hi=1, width=12,
                   title="Machine CPU utilisation",
                   note="Healthy: high while training (the cores are used) with throughput to match."),
        ]),
        Row("GPU", [
            gauges("rlvitals_torch_memory_allocated_bytes", "rlvitals_torch_memory_reserved_bytes",
                   "rlvitals_torch_memory_peak_allocated_bytes", "rlvitals_torch_memory_peak_reserved_bytes",
                   per=PROCESS, by=("device",), title="Torch CUDA memory", width=12,
                   legends=("allocated", "reserved", "peak allocated", "peak reserved"),
                   note="Healthy: allocated flat after warm-up, reserved not far above it, peaks well below the "
                        "GPU's memory."),
            gauges("rlvitals_gpu_memory_used_bytes", "rlvitals_gpu_memory_total_bytes", per=("run_id", "instance"),
                   by=("gpu",), title="GPU memory (NVML)", width=12, legends=("used", "total"),
                   note="Healthy: used flat after warm-up and well below total."),
            gauges("rlvitals_gpu_utilization_ratio", per=("run_id", "instance"), by=("gpu",), lo=0, hi=1,
                   title="GPU utilisation", note="Healthy: high and steady on the learner's GPU."),
            gauges("rlvitals_gpu_temperature_celsius", per=("run_id", "instance"), by=("gpu",), note=gpu_note),
            gauges("rlvitals_gpu_power_watts", per=("run_id", "instance"), by=("gpu",), note=gpu_note),
            gauges("rlvitals_gpu_fan_ratio", per=("run_id", "instance"), by=("gpu",), lo=0, hi=1, note=gpu_note),
        ]),
    ])


DASHBOARDS = {"overview": overview, "learning": learning, "systems": systems}


def _templating() -> dict:
    def query_variable(name: str, label: str, query: str) -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "definition": query,
                "query": {"query": query, "refId": f"{name}-variable"}, "refresh": 2, "sort": 1, "multi": True,
                "includeAll": True, "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "hide": 0, "regex": "", "options": []}

    return {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "refresh": 1,
         "regex": "", "hide": 0, "includeAll": False, "multi": False, "current": {}, "options": []},
        query_variable("run", "Run", "label_values(rlvitals_run_info, run_id)"),
        query_variable("node", "Node", 'label_values(rlvitals_process_resident_memory_bytes{run_id=~"$run"}, node)'),
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
    defaults = {"unit": panel.unit, **panel.defaults}
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never",
                              "spanNulls": False, "axisCenteredZero": False, **panel.custom}
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "none"}}
    else:
        out["options"] = panel.options
    out["fieldConfig"] = {"defaults": defaults, "overrides": panel.overrides}
    out["targets"] = [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(panel.targets)]
    if panel.transformations:
        out["transformations"] = panel.transformations
    return out


def build(spec: Dashboard) -> dict:
    """The Grafana dashboard JSON model of one dashboard spec."""
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
            "templating": _templating(), "annotations": _annotations(), "links": others, "panels": panels}


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard; raises CatalogueError if a catalogue metric is on none."""
    rendered, placed = {}, set()
    for name, make in DASHBOARDS.items():
        spec = make()
        for row in spec.rows:
            for panel in row.panels:
                placed.update(panel.metrics)
        rendered[f"{name}.json"] = json.dumps(build(spec), indent=2) + "\n"
    missing = [m.name for m in METRICS if m.name not in placed]
    if missing:
        raise CatalogueError(f"catalogue metrics on no dashboard: {', '.join(missing)}; add each to a panel in "
                             "dashboards/generate.py")
    return rendered


def stale_files(out_dir: Path = OUT_DIR) -> list[str]:
    """Dashboard files that differ from what the catalogue generates (or are missing, or are extra)."""
    rendered = render_all()
    stale = [name for name, text in rendered.items()
             if not (out_dir / name).is_file() or (out_dir / name).read_text() != text]
    stale += [p.name for p in sorted(out_dir.glob("*.json")) if p.name not in rendered]
    return stale


def write_all(out_dir: Path = OUT_DIR) -> list[Path]:
    rendered = render_all()
    for extra in out_dir.glob("*.json"):
        if extra.name not in rendered:
            extra.unlink()
    paths = []
    for name, text in rendered.items():
        path = out_dir / name
        path.write_text(text)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvitals.dashboards.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard file is out of date")
    parser.add_argument("--dir", type=Path, default=OUT_DIR, help=f"folder of the dashboard files (default {OUT_DIR})")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files(args.dir)
            if stale:
                print(f"dashboards out of date: {', '.join(stale)}; run `python -m rlvitals.dashboards.generate`",
                      file=sys.stderr)
                return 1
            print("dashboards are up to date")
            return 0
        for path in write_all(args.dir):
            print(f"wrote {path}")
    except CatalogueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
