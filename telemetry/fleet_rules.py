"""Fleet rules: alerts that stay one per run however many processes a run has.

A run of 1,000 actors must not raise 1,000 alerts for one lost node, and one
actor that stalls, slows down, falls behind in weights or leaks memory must be
found and named even though run-level sums barely move. So:

- `RLComponentDown` counts the processes Prometheus cannot scrape per run and
  component: one alert, its value the count, the `processes` annotation naming
  a few of them (instance and node);
- the outlier rules compare each actor with its peers by robust statistics:
  the fleet median, and the fleet's spread as 1.4826 x the median absolute
  deviation (the standard deviation a normal fleet would have, unmoved by the
  outliers themselves). An actor is an outlier when it is more than `SIGMAS`
  spreads from the median *and* beyond a floor that says what matters on any
  env (half the median's speed, 20 s of the learner's progress, 32 MiB), so a
  fleet with ordinary spread, however tight, raises nothing. Each rule is one
  alert per run whose value is the number of outliers; the `processes`
  annotation names the worst few with their node.

These are live-only rules: metrics.jsonl rows hold run-level values, not one
per actor, so the offline evaluator (and verdicts.json) cannot name an actor;
Prometheus can. A fleet-wide fault moves the median with it and is no outlier:
the run-level rules of telemetry/rules.py report it once.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2 ** 20
SIGMAS = 3
"""How many robust standard deviations from the fleet median make an outlier."""
NAMED = 5
"""How many affected processes an alert names (its value says how many there are)."""
ACTORS = 'component="actor"'
WINDOW = "30s"
"""Speed and stall window: six scrapes (5 s), many rollouts per actor, and short enough that a slowed or
stalled actor is named within 10 evaluation intervals."""
LAG_LEARNER_SECONDS = 20
"""An actor is behind in weights when it acts with a network this many seconds of learner progress older."""
MEMORY_FLOOR = 32 * MiB


def median(x: str) -> str:
    return f"quantile by (run_id) (0.5, {x})"


def spread(x: str) -> str:
    """1.4826 x the fleet's median absolute deviation from its median (per run)."""
    return f"(1.4826 * quantile by (run_id) (0.5, abs({x} - on (run_id) group_left () {median(x)})))"


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
    """A fleet rule as data; `fleet_rules()` makes it a `Rule` (rules.py appends them to RULES)."""

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


def outliers(name: str, selection: str, worst: str, hold: int, component: str, summary: str, check: str,
             reads: tuple[str, ...]) -> FleetSpec:
    return FleetSpec(name, f"count by (run_id) ({selection})", reads, hold, "warning", component, summary, check,
                     names(selection, worst))


ENV_STEPS = f"rlvitals_actor_env_steps_total{{{ACTORS}}}"
SPEED = f"rate({ENV_STEPS}[{WINDOW}])"
STEPS_SEEN = f"changes({ENV_STEPS}[{WINDOW}])"
AGE = f"rlvitals_actor_network_age{{{ACTORS}}}"
LEARNER_RATE = "sum by (run_id) (rate(rlvitals_learner_steps_total[1m]))"
RSS = f"rlvitals_process_resident_memory_bytes{{{ACTORS}}}"
GROWTH = f"({RSS} - {RSS} offset 2m)"
SCRAPED = f'on (run_id, instance) (up{{{ACTORS}}} == 1)'

# An actor whose step count did not move for 30 s while the typical actor's moved at 3 scrapes or more:
# its peers finish rollouts every few seconds, so this one is stuck (a hung env, a lost request).
STALLED = f"(({STEPS_SEEN} == 0) and on (run_id) ({median(STEPS_SEEN)} >= 3) and {SCRAPED})"
SLOW = f"({below(SPEED, median(SPEED) + ' * 0.5')} and {below(SPEED, f'{median(SPEED)} - {SIGMAS} * {spread(SPEED)}')})"
LAGGING = (f"({below(AGE, f'{median(AGE)} - {SIGMAS} * {spread(AGE)}')} "
           f"and {below(AGE, f'{median(AGE)} - {LAG_LEARNER_SECONDS} * {LEARNER_RATE}')} "
           f"and on (run_id) ({LEARNER_RATE} > 0))")
LEAKING = (f"({above(GROWTH, f'{median(GROWTH)} + {SIGMAS} * {spread(GROWTH)}')} "
           f"and {above(GROWTH, f'{median(GROWTH)} + {MEMORY_FLOOR}')} "
           f"and ({RSS} - {RSS} offset 1m) > {8 * MiB} and ({RSS} offset 1m - {RSS} offset 2m) > {8 * MiB})")

DOWN = 'label_replace(up{component=~"local|learner|actor|node"} == 0, "process", "$1", "component", "(.*)")'

FLEET: tuple[FleetSpec, ...] = (
    FleetSpec("RLComponentDown", f"count by (run_id, process) ({DOWN})", ("up",), 120, "critical", "throughput",
              "{{ $value }} {{ $labels.process }} process(es) of run {{ $labels.run_id }} are down",
              "Prometheus cannot scrape processes that announced themselves: they crashed, hang, or their node is "
              "gone. Discovery files of processes that ended are removed, so a down target is a live problem. One "
              "alert per run and kind of process; its value is how many are down, the `processes` annotation says "
              "how many on which nodes (all of one node: the node is gone).",
              processes=nodes(DOWN, ("run_id", "process")),
              names_what=f"how many are down on each of up to {NAMED} nodes"),
    outliers("RLActorStalled", STALLED, "bottomk", 10, "throughput",
             "{{ $value }} actor(s) stopped stepping while their peers run in run {{ $labels.run_id }}",
             "These actors took no env step for 30 s while the typical actor of the run finished rollouts at "
             "least every 10 s: they are stuck (an env step that hangs, a request lost, an actor waiting on "
             "something only it needs). Read the named actors' logs (ray logs) and their node's load.",
             ("rlvitals_actor_env_steps_total", "up")),
    outliers("RLActorSlow", SLOW, "bottomk", 10, "throughput",
             "{{ $value }} actor(s) step far slower than their peers in run {{ $labels.run_id }}",
             f"These actors' env steps per second over the last 30 s are under half the fleet's median and "
             f"more than {SIGMAS} robust standard deviations (1.4826 x the median absolute deviation) below it: "
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
             f"These actors' resident memory grew by more than 32 MiB beyond the fleet's median growth in 2 minutes "
             f"(and beyond {SIGMAS} robust standard deviations of it), in both minutes: a leak that only some "
             "actors hit (an env that keeps state per episode, a cache keyed by something that grows).",
             ("rlvitals_process_resident_memory_bytes",)),
)

PROCESSES: dict[str, str] = {spec.name: spec.processes for spec in FLEET}
"""Rule name -> its `processes` annotation (telemetry.rulegen adds it to the alert)."""
NAMES_WHAT: dict[str, str] = {spec.name: spec.names_what for spec in FLEET}


def fleet_rules() -> tuple:
    """The fleet rules as `Rule`s (live only); called by telemetry.rules once `Rule` and `Live` exist."""
    from .rules import Live, Rule

    return tuple(Rule(s.name, Live(s.query, s.reads), s.hold_seconds, "fast", s.severity, s.component, s.summary,
                      s.check) for s in FLEET)
