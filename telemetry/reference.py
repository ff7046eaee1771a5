"""Writes docs/metrics.md, the metric reference page, from the catalogue.

    python -m rlvitals.telemetry.reference            # regenerate docs/metrics.md
    python -m rlvitals.telemetry.reference --check    # exit 1 if docs/metrics.md is stale

Everything on the page is derived from `catalogue.METRICS` and the recorder's
component map, including the series counts per process, so the page cannot
drift from what the exporters serve. The documented per-process series budget
(ACTOR_SERIES, LEARNER_SERIES, LOCAL_SERIES, NODE_SERIES) is written out below
by hand on purpose: the tests check that the catalogue still produces these
numbers and that a real registry serves exactly that many series, so adding a
series to a process is a deliberate, reviewed change.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from math import prod
from pathlib import Path

from .catalogue import LEVELS, METRICS, Metric, exposed_names
from .recorder import COMPONENTS, Recorder
from .rowkeys import render_section as render_rows_section

DEFAULT_LEVEL = "standard"
"""The level a run uses when nothing sets one (TrainConfig.verbosity; checked by the tests)."""

DEFAULT_OUTPUT = Path(str(resources.files("rlvitals.docs"))) / "metrics.md"
"""docs/metrics.md, found through the import system (the data package `rlvitals.docs`), checkout or wheel alike."""

# Labels without a closed set of values in the catalogue, and why they stay bounded.
IDENTITY_LABELS = ("run_id", "run_name", "env", "algorithm", "mode", "code_version")
"""One value per process for its lifetime: they name the run, they never multiply series."""
HARDWARE_LABELS = {"device": "CUDA device", "gpu": "GPU"}
"""One value per device index: bounded by the hardware."""
DYNAMIC_LABELS = {"layer": "network layer", "step": "rollout step"}
"""One value per layer of the network or step of the rollout: fixed for a run, debug level only."""
FORBIDDEN_LABELS = ("actor", "actor_id", "episode", "episode_id")
"""Unbounded over a run (actors restart, episodes never end): never labels below debug."""

# What one value of an open label stands for, per metric (the learner's diagnostics
# give weight and gradient RMS per linear/conv layer, activation statistics per
# ReLU/tanh layer).
SCALES_WITH = {
    "rlvitals_learner_layer_weight_rms": "linear layer",
    "rlvitals_learner_layer_gradient_rms": "linear layer",
    "rlvitals_learner_layer_activation_std": "activation layer",
    "rlvitals_learner_layer_dead_ratio": "activation layer",
}
UNIT_OF_LABEL = {**HARDWARE_LABELS, **DYNAMIC_LABELS}
# Layers and rollout steps of the default run (CartPole-v1 with the config's default
# hidden_sizes and rollout_length); the tests check them against TrainConfig.
DEFAULT_RUN_SCALE = {"linear layer": 6, "activation layer": 4, "rollout step": 128}

# Documented series budget per process, without GPUs and without the debug-only
# per-layer and per-rollout-step series (see `process_series`). Every optional
# series is counted (solve ratio, terminal correlations), so a process serves at
# most this many; an actor or learner must stay within 30 at minimal.
ACTOR_SERIES = {"off": 0, "minimal": 13, "standard": 20, "debug": 20}
LEARNER_SERIES = {"off": 0, "minimal": 9, "standard": 253, "debug": 297}
LOCAL_SERIES = {"off": 0, "minimal": 22, "standard": 273, "debug": 317}
NODE_SERIES = {"off": 0, "minimal": 4, "standard": 6, "debug": 6}
DOCUMENTED_SERIES = {"actor": ACTOR_SERIES, "learner": LEARNER_SERIES, "local": LOCAL_SERIES, "node": NODE_SERIES}

PROCESSES = {
    "actor": "an actor process (Ray mode): steps envs and ships rollouts",
    "learner": "the learner process (Ray mode): trains and publishes weights",
    "local": "a local run (`--mode local`, the default): actor and learner in one process",
    "node": "the per-machine exporter (Ray mode): machine and GPU readings",
}

LEVEL_TEXT = {
    "off": "Nothing: no /metrics endpoint is opened and no discovery file is written. For benchmarks "
           "and runs where not even a scrape may cost anything.",
    "minimal": "Is the run alive and getting anywhere: learner steps and network age, samples consumed, "
               "actor throughput, episode returns and lengths, queue depth, dropped samples, actor "
               "restarts, process and machine memory. Cheap enough for every long run and every actor of a large "
               "cluster.",
    "standard": "Everything needed to localise a learning bug: relative entropy, KL, residual variance, "
                "terminal correlations, value/target/advantage/reward statistics, update step and gradient "
                "statistics, losses, staleness, time per phase, weight broadcasts, CPU use, torch and GPU "
                "memory, GPU vitals. The default.",
    "debug": "Adds the expensive, high-cardinality views: per-layer weight and gradient RMS, activation "
             "spread and dead units, the value/reward trace of one trajectory, and full histograms of value "
             "targets and advantages. For chasing a specific problem in a short run.",
}

UNIT_TEXT = {
    "s": "seconds", "bytes": "bytes", "percentunit": "ratio (0 to 1)", "short": "count",
    "none": "dimensionless (shown as the plain number)",
    "celsius": "degrees Celsius", "watt": "watts", "suffix:nats": "nats (natural-log units of information)",
}

COMPONENT_TEXT = {
    "run": ("Run", "Which run a process belongs to. Join on `run_id` to put the series of one run's "
                   "processes side by side."),
    "learner": ("Learner", "The learner's view of every batch it trains on. Gauges hold the value of the "
                           "last batch; a statistic that is undefined for a batch (a correlation without two "
                           "terminal steps, a variance of a constant) leaves the gauge at its last value, and "
                           "a gauge that was never defined has no sample at all."),
    "actor": ("Actors", "What the actors collect and how fast. Episode statistics cover the last 100 "
                        "episodes the process finished."),
    "queue": ("Queues and transport", "Between the actors and the learner: queued rollouts, dropped "
                                      "samples, weight broadcasts, actor restarts."),
    "process": ("Process", "Resources of each exporting process, read when it is scraped."),
    "node": ("Node", "Readings of the whole machine, read when scraped: what competes with the run for "
                     "memory and cores."),
    "gpu": ("GPU", "NVML readings per GPU, read when scraped. Processes on a machine without a GPU or "
                   "without NVML declare these families with no samples."),
}


# ------------------------------------------------------------------ counting
def closed_combinations(metric: Metric) -> int:
    """Series per value of the open labels: the product of the closed label sets."""
    return prod(len(metric.label_values[label]) for label in metric.labels if label in metric.label_values)


def fixed_series(metric: Metric) -> int:
    """Series the metric has in any process, before hardware and per-layer/per-step series."""
    if metric.kind == "info":
        return 1
    if metric.hardware or metric.only_in or any(label in DYNAMIC_LABELS for label in metric.labels):
        return 0
    if metric.kind == "histogram":
        # One sample per bucket plus +Inf, and _sum/_count where the exposition keeps them.
        return (len(metric.buckets) + 1 + len(exposed_names(metric)) - 1) * closed_combinations(metric)
    return closed_combinations(metric)


def variable_series(metric: Metric) -> tuple[str, int] | None:
    """(what the count scales with, e.g. "GPU", series per one of it), or None."""
    if metric.only_in:
        return metric.only_in, closed_combinations(metric)
    for label in metric.labels:
        if label in HARDWARE_LABELS or label in DYNAMIC_LABELS:
            return SCALES_WITH.get(metric.name, UNIT_OF_LABEL[label]), closed_combinations(metric)
    return None


def process_metrics(component: str, level: str) -> list[Metric]:
    """The metrics a process of this kind exports at this level (the recorder's own choice)."""
    return list(Recorder(level, component).metrics)


def process_series(component: str, level: str) -> tuple[int, dict[str, int]]:
    """(fixed series, {what it scales with: series per one of it}) of one process at one level."""
    fixed, per = 0, {}
    for metric in process_metrics(component, level):
        fixed += fixed_series(metric)
        variable = variable_series(metric)
        if variable:
            unit, count = variable
            per[unit] = per.get(unit, 0) + count
    return fixed, per


def default_run_series(component: str, level: str) -> int:
    """Series of one process of the default run on a machine without a GPU."""
    fixed, per = process_series(component, level)
    return fixed + sum(count * DEFAULT_RUN_SCALE.get(unit, 0) for unit, count in per.items())


# ------------------------------------------------------------------ rendering
def _levels_from(level: str) -> str:
    above = LEVELS[LEVELS.index(level):]
    return ", ".join(above)


def _processes_of(component: str) -> list[str]:
    return [p for p in COMPONENTS if component in COMPONENTS[p]]


def components() -> list[str]:
    """Every component of the catalogue, in catalogue order."""
    return list(dict.fromkeys(m.component for m in METRICS))


def _labels_text(metric: Metric) -> str:
    if not metric.labels:
        return "none"
    parts = []
    for label in metric.labels:
        if label in metric.label_values:
            values = ", ".join(f"`{v}`" for v in metric.label_values[label])
            parts.append(f"`{label}` ({values})")
        elif label in IDENTITY_LABELS:
            parts.append(f"`{label}` (this run's value)")
        elif label in HARDWARE_LABELS:
            parts.append(f"`{label}` (index of each {HARDWARE_LABELS[label]})")
        elif label in DYNAMIC_LABELS:
            parts.append(f"`{label}` (one per {DYNAMIC_LABELS[label]})")
        else:
            parts.append(f"`{label}`")
    return "; ".join(parts)


def _series_text(metric: Metric) -> str:
    fixed = fixed_series(metric)
    variable = variable_series(metric)
    if variable is None:
        return str(fixed)
    unit, count = variable
    return f"{count} per {unit}" if not fixed else f"{fixed} + {count} per {unit}"


def _series_table() -> list[str]:
    lines = ["| process | " + " | ".join(LEVELS) + " |", "|---|" + "---:|" * len(LEVELS)]
    for component in COMPONENTS:
        what = PROCESSES.get(component, f"a {component} process")
        cells = []
        for level in LEVELS:
            fixed, per = process_series(component, level)
            extra = [f"{count} per {unit}" for unit, count in sorted(per.items())]
            cells.append(str(fixed) + "".join(f" + {e}" for e in extra))
        lines.append(f"| {component}: {what} | " + " | ".join(cells) + " |")
    scale = ", ".join(f"{n} {unit}s" for unit, n in DEFAULT_RUN_SCALE.items())
    defaults = "; ".join(f"{component} {default_run_series(component, 'debug')}" for component in COMPONENTS)
    lines += ["", "Per CUDA device: only in processes that use CUDA (torch memory). Per GPU: NVML readings "
              "of every GPU of the machine. Per recurrent policy: only in runs with `recurrent_size` > 0. "
              "Per linear layer, activation layer and rollout step: debug only "
              f"(the default run, CartPole-v1 with its default `hidden_sizes` and `rollout_length`, has {scale}, "
              f"so at debug without a GPU: {defaults})."]
    return lines


def _metric_block(metric: Metric) -> list[str]:
    facts = [f"**Type:** {metric.kind}", f"**Level:** {metric.level} (exported at {_levels_from(metric.level)})",
             f"**Unit:** {UNIT_TEXT.get(metric.unit, metric.unit)} (`{metric.unit}`)"]
    lines = [f"### `{metric.name}`", "", " · ".join(facts), "",
             f"- **Labels:** {_labels_text(metric)}",
             f"- **Series:** {_series_text(metric)}"]
    if metric.kind == "histogram":
        bounds = ", ".join(f"{b:g}" for b in metric.buckets)
        lines.append(f"- **Buckets (`le`):** {bounds}, +Inf")
        samples = ", ".join(f"`{n}`" for n in exposed_names(metric))
        if len(exposed_names(metric)) == 1:
            samples += " only: with negative buckets the exposition carries no `_sum` or `_count`"
        lines.append(f"- **Samples:** {samples}")
    if metric.source and not metric.not_in_rows:
        lines.append(f"- **metrics.jsonl key:** `{metric.source}`")
    elif metric.source:
        lines.append(f"- **Not in metrics.jsonl:** {metric.not_in_rows}.")
    if metric.hardware:
        lines.append("- **Hardware:** only has samples where the hardware exists; the family is always declared.")
    lines += ["", metric.help, ""]
    return lines


def render() -> str:
    out = [
        "# Metric reference",
        "",
        "<!-- Generated from telemetry/catalogue.py by `python -m rlvitals.telemetry.reference`; "
        "do not edit by hand. -->",
        "",
        "Every metric rlvitals exports, what it measures and how to read it. Each process of a run serves "
        "its own metrics over HTTP at `/metrics` and writes a Prometheus `file_sd` target file into "
        "`<run_dir>/discovery/` while it runs (removed when it stops), so a Prometheus whose "
        "`file_sd_configs` watch that folder finds every process of the run.",
        "",
        "## Verbosity levels",
        "",
        "Each level exports everything of the level below it and more.",
        "",
        "| level | metrics | what you get |",
        "|---|---:|---|",
    ]
    for level in LEVELS:
        count = sum(1 for m in METRICS if m.at(level))
        name = f"`{level}`" + (" (default)" if level == DEFAULT_LEVEL else "")
        out.append(f"| {name} | {count} | {LEVEL_TEXT[level]} |")
    out += [
        "",
        "Set the level of a run in any of three ways; the first that is given wins:",
        "",
        "1. the command-line flag: `rlvitals train --verbosity debug ...`",
        "2. the YAML config file passed with `--config`: a line `verbosity: debug`",
        "3. the environment variable: `RLVITALS_VERBOSITY=debug rlvitals train ...`",
        "",
        f"With none of them a run uses `{DEFAULT_LEVEL}`. The training loop only writes plain numbers into "
        "a dict per batch; Prometheus objects are built when someone scrapes, in the HTTP server's "
        "thread. What a level costs is mostly series in Prometheus (below) and, at debug, the learner's "
        "per-layer statistics and histograms.",
        "",
        "### Series per process",
        "",
        "How many series one process exports at each level, counted from the catalogue (every optional "
        "series included, e.g. solve ratio and terminal correlations, which appear only where the env "
        "defines them):",
        "",
    ]
    out += _series_table()
    out += [
        "",
        "## Reading this page",
        "",
        "- **Type**: `counter` only rises (read it with `rate()`), `gauge` is the latest value, `histogram` "
        "has cumulative `_bucket` series (read with `histogram_quantile()`), `info` is a constant 1 whose "
        "labels carry the information.",
        "- **Level**: the lowest verbosity at which the metric is exported.",
        "- **Unit**: what the value is measured in, with the Grafana unit id the dashboards use.",
        "- **Labels**: every label with its allowed values. All labels are bounded: closed sets, the "
        "run's own identity, device indices, or (debug only) the network's layers and the rollout's steps. "
        "No metric is labelled by actor or episode.",
        "- **Series**: how many series the metric adds to one process that exports it.",
        "",
        *render_rows_section(),
        "## Index",
        "",
        "| metric | type | level | unit |",
        "|---|---|---|---|",
    ]
    for component in components():
        for m in (m for m in METRICS if m.component == component):
            out.append(f"| [`{m.name}`](#{m.name}) | {m.kind} | {m.level} | {m.unit} |")
    for component in components():
        title, text = COMPONENT_TEXT.get(component, (component.capitalize(), ""))
        members = [m for m in METRICS if m.component == component]
        processes = ", ".join(_processes_of(component))
        out += ["", f"## {title}", "", text, "", f"Exported by: {processes}.", ""]
        for metric in members:
            out += _metric_block(metric)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvitals.telemetry.reference",
                                     description="Write docs/metrics.md from the metric catalogue.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help=f"file to write (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    path = Path(args.output)
    text = render()
    if args.check:
        current = path.read_text() if path.is_file() else None
        if current != text:
            print(f"{path} is stale: run `python -m rlvitals.telemetry.reference` to regenerate it",
                  file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
