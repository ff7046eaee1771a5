"""Fleet rules: alerts that stay one per run however many processes a run has.

A run of 1,000 actors must not raise 1,000 alerts for one lost node, and one
actor that stalls, slows down, falls behind in weights or leaks memory must be
found and named even though run-level sums barely move. So:

- `RLComponentDown` counts the processes Prometheus cannot scrape per run and
  component: one alert, its value the count, the `processes` annotation naming
  a few of them (instance and node);
- the outlier rules compare each actor with its peers by robust statistics:
  the fleet median, and the fleet's spread as its interquartile range / 1.349
  (the standard deviation a normal fleet would have, unmoved by the outliers
  themselves while they are under a quarter of the fleet; unlike the median
  absolute deviation it needs no pass that joins every actor to its median).
  An actor is an outlier when it is more than `SIGMAS` spreads from the median
  *and* beyond a floor that says what matters on any env (half the median's
  speed, 20 s of the learner's progress, 16 MiB a minute), so a fleet with
  ordinary spread, however tight, raises nothing. Each rule is one
  alert per run whose value is the number of outliers; the `processes`
  annotation names the worst few with their node.

All of it is recording rules (`RECORDING`): each actor's speed and memory
growth, each run's median and spread of them and the bound an outlier passes,
then the verdicts (the few actors beyond a bound). The alerts and their
`processes` annotations only count and rank those few verdict series: at 5,000
actors, recomputing the per-actor comparisons in each alert and again in each
firing alert's annotation cost seconds per interval.

The rules live in three groups (`GROUPS`), by how fast what they record moves.
Every scrape interval: which processes are down, each actor's speed and the
verdicts on speed and weights. Every 15 s: the fleet's medians, spreads and
bounds, which move with the whole fleet, not with one actor. Every 30 s: memory
growth per minute and its verdict (a leak is judged over two minutes anyway).
At 5,000 actors one group holding everything took 1.3 s per 5 s evaluation;
split (and with the spread below), each group takes 0.4-0.7 s (medians) and
the fleet rules cost Prometheus half the work per scrape interval. A verdict compares with bounds at most 15 s old.

These are live-only rules: metrics.jsonl rows hold run-level values, not one
per actor. A Ray run's own verdicts name the actor all the same, from what
its driver receives: a slow or silent actor against its peers, with the bound
here (rlvitals/distributed/peers.py: RLActorSlowerThanPeers,
RLActorSilentAmongPeers); one acting with older weights than it was handed,
exactly (the weights_current_at_request invariant, rlvitals/evidence.py); one
whose memory grows per sample (memory_per_sample). A fleet-wide fault moves the
median with it and is no outlier: the run-level rules of telemetry/rules.py
report it once.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2 ** 20
SIGMAS = 3
"""How many robust standard deviations from the fleet median make an outlier."""
SLOW_FRACTION = 0.5
"""A slow actor is also under this share of the fleet's median speed (a floor that matters on any env)."""
NAMED = 5
"""How many affected processes an alert names (its value says how many there are)."""
ACTORS = 'component="actor"'
WINDOW = "30s"
"""Speed and stall window: six scrapes (5 s), many rollouts per actor, and short enough that a slowed or
stalled actor is named within 10 evaluation intervals."""
LAG_LEARNER_SECONDS = 20
"""An actor is behind in weights when it acts with a network this many seconds of learner progress older."""
MEMORY_FLOOR = 16 * MiB
"""Per minute: beyond the fleet's median minute growth, in each of the last two minutes, makes a leak."""
MEMORY_GROWS = 8 * MiB
"""Per minute: an actor that grew less did not grow (whatever its peers did, e.g. all freed memory)."""
FLEET_GROUP, STATISTICS_GROUP, MEMORY_GROUP = "rlvitals-fleet", "rlvitals-fleet-statistics", "rlvitals-fleet-memory"
GROUPS: dict[str, str | None] = {FLEET_GROUP: None, STATISTICS_GROUP: "15s", MEMORY_GROUP: "30s"}
"""Fleet rule groups and their evaluation intervals (None: the global one, the scrape interval)."""


def median(x: str) -> str:
    return f"quantile by (run_id) (0.5, {x})"


def below(x: str, bound: str) -> str:
    """Actors whose `x` is below a per-run `bound` (an actor's labels kept)."""
    return f"({x} < on (run_id) group_left () ({bound}))"


def above(x: str, bound: str) -> str:
    return f"({x} > on (run_id) group_left () ({bound}))"


def names(selection: str, worst: str, by: tuple[str, ...] = ("run_id",)) -> str:
    """The `processes` annotation: up to NAMED of `selection` in this alert's group, worst first by `worst`."""
    group = ", ".join(by)
    query = f"{worst} by ({group}) ({NAMED}, {selection})"
    same = " ".join(f"(eq .Labels.{label} $labels.{label})" for label in by)
    return ('{{ range query `' + query + '` | sortByLabel "instance" }}'
            f'{{{{ if and {same} }}}}{{{{ .Labels.instance }}}} on node {{{{ .Labels.node }}}}; '
            '{{ end }}{{ end }}')


def nodes(selection: str, by: tuple[str, ...]) -> str:
    """The `processes` annotation of a count that is often a whole node: how many on each of up to NAMED nodes."""
    group = ", ".join(by)
    query = f"topk by ({group}) ({NAMED}, count by ({group}, node) ({selection}))"
    same = " ".join(f"(eq .Labels.{label} $labels.{label})" for label in by)
    return ('{{ range query `' + query + '` | sortByLabel "node" }}'
            f'{{{{ if and {same} }}}}{{{{ .Value }}}} on node {{{{ .Labels.node }}}}; '
            '{{ end }}{{ end }}')


@dataclass(frozen=True)
class FleetSpec:
    """A fleet rule as data; telemetry.rules makes each a live-only `Rule` and appends it to RULES."""

    name: str
    query: str
    """PromQL: per run (and kind of process), the count of affected processes."""
    reads: tuple[str, ...]
    hold_seconds: int
    severity: str
    component: str
    summary: str
    check: str
    processes: str
    """Template of the `processes` annotation: which processes, by instance and node."""
    names_what: str = f"the {NAMED} worst of them (or all, if fewer), by instance and node, in instance order"
    """What the `processes` annotation says, for docs/health.md."""
    group: str = FLEET_GROUP
    """The rule group that evaluates it: the one that records the verdict it counts."""


def outliers(name: str, selection: str, worst: str, hold: int, component: str, summary: str, check: str,
             reads: tuple[str, ...], group: str = FLEET_GROUP) -> FleetSpec:
    return FleetSpec(name, f"count by (run_id) ({selection})", reads, hold, "warning", component, summary, check,
                     names(selection, worst), group=group)


ENV_STEPS = f"rlvitals_actor_env_steps_total{{{ACTORS}}}"
AGE = f"rlvitals_actor_network_age{{{ACTORS}}}"
RSS = f"rlvitals_process_resident_memory_bytes{{{ACTORS}}}"

# Recorded: which processes are down, each actor's quantities (`actor:`), each run's median and spread of
# them and the bound an outlier passes (`run:`, one series per run), then each verdict: the actors beyond a
# bound (`actor:...:<verdict>`, usually no series at all). The alerts and their `processes` annotations only
# count and rank those few series, so a fleet of N actors costs a handful of passes over N series per
# interval, whatever is firing.
RECORDING: list[tuple[str, str, str]] = []
"""(series name, PromQL, group), in evaluation order within each group."""


def record(name: str, expr: str, group: str = FLEET_GROUP) -> str:
    """A recording rule of a fleet group (evaluated before that group's alerts); its series name."""
    RECORDING.append((name, expr, group))
    return name


def fleet_stats(per_actor: str, what: str, group: str = STATISTICS_GROUP) -> tuple[str, str]:
    """Recorded (median, spread) across the actors of each run of the per-actor series `per_actor`."""
    mid = record(f"run:{what}:median", median(per_actor), group)
    return mid, record(f"run:{what}:spread", f"(quantile by (run_id) (0.75, {per_actor}) - "
                                             f"quantile by (run_id) (0.25, {per_actor})) / 1.349", group)


def smaller(a: str, b: str) -> str:
    """Per run, the smaller of two one-series-per-run expressions."""
    return f"(({a}) < ({b}) or ({b}))"


DOWN = record("process:up:down",
              'label_replace(up{component=~"local|learner|actor|node"} == 0, "process", "$1", "component", "(.*)")')
# Only processes Prometheus reaches are judged on speed against their peers: a process that went down stops
# stepping, and that is RLComponentDown's. An instant reading (network age) of a process it fails to scrape
# goes stale at once; a rate over a window still sees the samples before the failure, so speed leaves the
# down ones out.
SPEED = record("actor:rlvitals_actor_env_steps:rate30s",
               f"rate({ENV_STEPS}[{WINDOW}]) unless on (run_id, instance) {DOWN}")
SPEED_MEDIAN, SPEED_SPREAD = fleet_stats(SPEED, "rlvitals_actor_env_steps:rate30s")
STEPS_SEEN_MEDIAN = record("run:rlvitals_actor_env_steps:changes30s:median",
                           median(f"changes({ENV_STEPS}[{WINDOW}])"), STATISTICS_GROUP)
AGE_MEDIAN, AGE_SPREAD = fleet_stats(AGE, "rlvitals_actor_network_age")
LEARNER_RATE = record("run:rlvitals_learner_steps:rate1m", "sum by (run_id) (rate(rlvitals_learner_steps_total[1m]))",
                      STATISTICS_GROUP)
# A process that went down is judged on the minute before it did (RLComponentDown names it as down).
GROWTH = record("actor:rlvitals_process_resident_memory_bytes:growth1m", f"delta({RSS}[1m])", MEMORY_GROUP)
GROWTH_MEDIAN, GROWTH_SPREAD = fleet_stats(GROWTH, "rlvitals_process_resident_memory_bytes:growth1m", MEMORY_GROUP)

# Bounds: an outlier is beyond both the robust one (SIGMAS spreads from the median) and the floor that says
# what matters on any env, i.e. beyond the farther of the two.
SLOW_BELOW = record("run:rlvitals_actor_env_steps:rate30s:slow_below",
                    smaller(f"{SPEED_MEDIAN} * {SLOW_FRACTION}", f"{SPEED_MEDIAN} - {SIGMAS} * {SPEED_SPREAD}"),
                    STATISTICS_GROUP)
LAG_BELOW = record("run:rlvitals_actor_network_age:lagging_below",
                   smaller(f"{AGE_MEDIAN} - {SIGMAS} * {AGE_SPREAD}",
                           f"{AGE_MEDIAN} - {LAG_LEARNER_SECONDS} * {LEARNER_RATE}")
                   + f" and on (run_id) ({LEARNER_RATE} > 0)", STATISTICS_GROUP)
GROWS_ABOVE = record("run:rlvitals_process_resident_memory_bytes:growth1m:leaking_above",
                     f"clamp_min({GROWTH_MEDIAN} + clamp_min({SIGMAS} * {GROWTH_SPREAD}, {MEMORY_FLOOR}), "
                     f"{MEMORY_GROWS})", MEMORY_GROUP)

# Verdicts, one series per outlier actor (value: the quantity it is judged on, so the worst rank first).
# An actor whose step count did not move for 30 s while the typical actor's moved at 3 scrapes or more:
# its peers finish rollouts every few seconds, so this one is stuck (a hung env, a lost request).
STALLED = record("actor:rlvitals_actor_env_steps:rate30s:stalled",
                 f"{SPEED} == 0 and on (run_id) ({STEPS_SEEN_MEDIAN} >= 3)")
# A stalled actor is the slowest of all, but it is RLActorStalled's: each alert names a different problem.
SLOW = record("actor:rlvitals_actor_env_steps:rate30s:slow",
              f"{below(SPEED, SLOW_BELOW)} unless on (run_id, instance) {STALLED}")
LAGGING = record("actor:rlvitals_actor_network_age:lagging", below(AGE, LAG_BELOW))
# A leak grows in both of the last two minutes (a single large allocation grows one minute only).
GROWING = record("actor:rlvitals_process_resident_memory_bytes:growth1m:above_peers", above(GROWTH, GROWS_ABOVE),
                 MEMORY_GROUP)
LEAKING = record("actor:rlvitals_process_resident_memory_bytes:growth1m:leaking",
                 f"{GROWING} and {GROWING} offset 1m", MEMORY_GROUP)

FLEET: tuple[FleetSpec, ...] = (
    FleetSpec("RLComponentDown", f"count by (run_id, process) ({DOWN})", ("up",), 120, "critical", "throughput",
              "{{ $value }} {{ $labels.process }} process(es) of run {{ $labels.run_id }} are down",
              "Prometheus cannot scrape processes that announced themselves: they crashed, hang, or their node is "
              "gone. Discovery files of processes that ended are removed, so a down target is a live problem. One "
              "alert per run and kind of process; its value is how many are down, the `processes` annotation says "
              "how many on which nodes (all of one node: the node is gone).",
              processes=nodes(DOWN, ("run_id", "process")),
              names_what=f"how many are down on each of up to {NAMED} nodes"),
    outliers("RLActorStalled", STALLED, "bottomk", 5, "throughput",
             "{{ $value }} actor(s) stopped stepping while their peers run in run {{ $labels.run_id }}",
             "These actors took no env step for 30 s while the typical actor of the run finished rollouts at "
             "least every 10 s: they are stuck (an env step that hangs, a request lost, an actor waiting on "
             "something only it needs). Read the named actors' logs (ray logs) and their node's load.",
             ("rlvitals_actor_env_steps_total", "up")),
    outliers("RLActorSlow", SLOW, "bottomk", 10, "throughput",
             "{{ $value }} actor(s) step far slower than their peers in run {{ $labels.run_id }}",
             f"These actors' env steps per second over the last 30 s are under half the fleet's median and "
             f"more than {SIGMAS} robust standard deviations (the interquartile range / 1.349) below it: "
             "their node is overloaded (other jobs, throttled CPUs), their envs got slower (longer episodes, a "
             "slow backend), or they wait on something their peers do not.",
             ("rlvitals_actor_env_steps_total",)),
    outliers("RLActorWeightsLagging", LAGGING, "bottomk", 10, "weight-sync",
             "{{ $value }} actor(s) act with much older weights than their peers in run {{ $labels.run_id }}",
             f"These actors' network age is behind the fleet's median by more than {LAG_LEARNER_SECONDS} s of the "
             f"learner's progress and by more than {SIGMAS} robust standard deviations: they do not receive or "
             "load new weights (a failed fetch, a stuck rollout, a node far from the object store), and the "
             "learner learns from their stale samples.",
             ("rlvitals_actor_network_age", "rlvitals_learner_steps_total")),
    outliers("RLActorMemoryGrowing", LEAKING, "topk", 30, "memory",
             "{{ $value }} actor(s) grow in memory unlike their peers in run {{ $labels.run_id }}",
             f"These actors' resident memory grew, in each of the last two minutes, by more than "
             f"{MEMORY_FLOOR // MiB} MiB beyond the fleet's median growth of that minute (and beyond {SIGMAS} "
             "robust standard deviations of it): a leak that only some actors hit (an env that keeps state per "
             "episode, a cache keyed by something that grows).",
             ("rlvitals_process_resident_memory_bytes",), MEMORY_GROUP),
)

PROCESSES: dict[str, str] = {spec.name: spec.processes for spec in FLEET}
GROUP_OF: dict[str, str] = {spec.name: spec.group for spec in FLEET}
"""Rule name -> the fleet group that evaluates its alert."""
"""Rule name -> its `processes` annotation (telemetry.rulegen adds it to the alert)."""
NAMES_WHAT: dict[str, str] = {spec.name: spec.names_what for spec in FLEET}

