"""The run context: every part of one training run, built once, and the one learn step both modes share.

A `Run` holds the config, the archive, the telemetry, the network and its
learner, the non-finite guard, the counters (`RunTracker`), the metrics rows
and their observers, and the progress line. A run loop is `Run.drive(source)`:
the source says how rollouts arrive (collected in this process, or from a
fleet of Ray actors); everything that happens to a rollout once it has
arrived is `Run.learn_step`, the same in every mode.

A rollout source has three methods (whoever makes a source releases its envs or actors):
  next()     -> Rollout   blocks until the next batch to learn from has arrived
  drain()                 at a normal end: count what actors finished but nobody took
  summary()  -> dict      mode-specific summary.json fields
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable

import psutil

from rlvitals.actors.boundary import boundary_statistics, largest_measured, split_observation_change
from rlvitals.actors.episode_witness import EpisodeWitness
from rlvitals.actors.rollout import Rollout
from rlvitals.actors.streams import StreamIndependence
from rlvitals.costs import actor_cost_ratios
from rlvitals.learner.invariants import (
    DECLARED,
    is_sampled,
    learning_rate_gap,
    observation_pairing,
    scheduled_learning_rate,
)
from rlvitals.telemetry.attribution import InvariantAttribution, producers
from rlvitals.telemetry.exported import ExportCheck
from rlvitals.telemetry.health import TEXT_KEYS, HealthMonitor
from rlvitals.telemetry.interface import or_null
from rlvitals.telemetry.invariant_monitor import InvariantMonitor
from rlvitals.telemetry.invariants import BY_NAME as INVARIANTS_BY_NAME
from rlvitals.telemetry.memory import memory_in_use
from rlvitals.telemetry.verdicts import SEVERITIES, print_verdict

from .archive import RunArchive
from .checkpoint import restore, save_checkpoint
from .config import TrainConfig
from .evidence import HandedWeights, PipelineEvidence, WitnessedSteps
from .guard import NonFiniteGuard
from .parts import make_learner, make_network, resolve_device
from .progress import ProgressLine, Reading
from .rows import RowObserver, RowWriter
from .status import COMPLETED, ended_by
from .tracker import RunTracker, WaitTimed

WIRED_STATISTICS = (("inv_weights_as_stamped", "weights_mismatch"),)
"""Invariant statistics that are checks the run already makes under their own keys."""
MEMORY_NAMED = INVARIANTS_BY_NAME["memory_per_sample"].names_key
"""Row key of the process whose growth inv_memory_per_sample is (Ray: an actor incarnation or the learner)."""


class Run:
    """The parts of one run and what is done with each arriving rollout."""

    def __init__(self, cfg: TrainConfig, archive: RunArchive, telemetry, net, learner, device, stop=None,
                 observers: Iterable[RowObserver] = ()):
        self.cfg, self.archive, self.device = cfg, archive, device
        self.tracker = RunTracker(cfg.total_env_steps, cfg.return_threshold)
        self.telemetry = WaitTimed(or_null(telemetry), self.tracker)   # the judgement's learner idle share
        self.net, self.learner = net, learner
        self.stop = stop
        self.guard = NonFiniteGuard(archive.path, cfg.max_nonfinite_batches)
        # The health rules watch every run: verdicts print as they fire and end in verdicts.json.
        # Counted in updates on each row; the count is exported, and the Prometheus alerts fire on it.
        self.health = HealthMonitor(run_id=str(archive.meta.get("run_id", "")),
                                    on_verdict=print_verdict if cfg.progress else None,
                                    on_held=self.telemetry.record_rule_held)
        self.rows = RowWriter(archive, [self.health, *observers])
        # Invariants are judged per update on evidence (telemetry/invariants.py); their state rides in every row.
        self.invariants = InvariantMonitor()
        self.evidence = PipelineEvidence()
        self.handed = HandedWeights()
        self.steps_accounted = WitnessedSteps()
        self.exports = ExportCheck()
        """The learner gauges a scrape reads, against the values computed (telemetry/exported.py)."""
        self.streams = StreamIndependence()
        self.episodes = EpisodeWitness()
        self.attribution = InvariantAttribution()
        self.judged: dict = {}
        """The latest `inv_*` statistics and `inv_broken_*` flags (in every row from the first judgement on)."""
        self.progress = ProgressLine(cfg.total_env_steps, enabled=cfg.progress, interval=cfg.log_interval_seconds)
        self.stats: dict = {}
        """The last learn step's statistics ({} when it did not learn)."""
        self.policy_age: int | None = None
        """Network age that produced the last batch (the oldest of its rollouts)."""
        self.published: dict[int, float] = {}
        """Network age -> fingerprint of the learner's weights when that age was handed to actors."""
        self.staleness: int | None = None
        """Learner steps between that network and the learner's when the batch arrived."""
        self.queue_depth: int | None = None
        self.queue_capacity: int | None = None
        self.actor_accounts = None
        """Ray mode: the driver's count of rollouts per actor (rlvitals.distributed.accounting), set by the source."""
        self._process = psutil.Process(os.getpid())
        self._rollouts_before = Rollout.alive()
        self.resumed: dict[str, float] = {}
        """The resume invariants' statistics, until the first batch after a resume reports them."""
        steps_per_update = self._steps_per_update = cfg.update_epochs * cfg.num_minibatches
        self._checkpoint_every = max(1, cfg.checkpoint_interval // steps_per_update)

    @classmethod
    def build(cls, cfg: TrainConfig, archive: RunArchive, obs_space, action_space, telemetry=None, stop=None,
              resume: dict | None = None, observers: Iterable[RowObserver] = ()) -> Run:
        """Network, learner (PPO only) and counters; put back as `resume` (a checkpoint) has them.

        The telemetry's own counters are not touched: whoever starts the telemetry
        loads them (`start_run_telemetry`), before its endpoint first answers.
        """
        device = resolve_device(cfg)
        net = make_network(cfg, obs_space, action_space)
        learner = make_learner(cfg, net, device, telemetry) if cfg.agent == "ppo" else None
        if learner is not None:   # the references read the config's values, not the copy the learner was handed
            learner.invariants.declare({name: getattr(cfg, name) for name in DECLARED})
        run = cls(cfg, archive, telemetry, net, learner, device, stop, observers)
        if resume is not None and learner is not None:
            run.resumed = restore(resume, net, learner, run.tracker)   # judged with the first batch's statistics
            run.invariants.load_state(resume.get("invariants", {}))   # a broken invariant stays broken
        return run

    # ------------------------------------------------------------- the loop
    def drive(self, source) -> dict:
        """Learn from what `source` delivers until the run is done; the summary, however the run ends."""
        self.tracker.loop_started = time.perf_counter()
        try:
            while not self.finished():
                rollout = source.next()
                if rollout is None:  # a batch arrived and was dropped: nothing to learn, still report
                    self.report_idle()
                else:
                    self.learn_step(rollout)
            source.drain()
        except BaseException as exc:  # Ctrl-C, a non-finite stop, an env error: keep what we had
            ending = ended_by(exc)
            self.finish(ending.pop("status"), {**source.summary(), **ending})
            raise
        return self.finish(getattr(self.stop, "status", None) or COMPLETED, source.summary())

    def finished(self) -> bool:
        return (self.tracker.done() or (self.stop is not None and self.stop())
                or (self.cfg.stop_at_threshold and self.tracker.solved_after_s is not None))

    def learn_step(self, rollout) -> dict:
        """Everything that happens to a batch that arrived: count, check, learn, judge, record, row, checkpoint.

        Every part runs in a learner phase (the learner times its own): the phases add up to the loop."""
        phase = self.telemetry.phase
        with phase("bookkeeping"):
            learn = self._arrived(rollout)
        stats = self.learner.learn(rollout) if learn else {}
        with phase("invariants"):
            if learn:   # the optimizer's rates against the config's schedule, recomputed on its own
                stats["inv_learning_rate_as_configured"] = learning_rate_gap(self.learner.learning_rates(),
                                                                             self._expected_lr)
            if self.resumed:   # once, after a resume: the state it started from against the state saved
                stats.update(self.resumed)
                self.resumed = {}
            stats.update(boundary_statistics(rollout))  # what arrived against the env's raw output
            stats["inv_acted_with_its_network"] = largest_measured(rollout.acting_gaps)   # the actors' own checks
            # An observation changed on its way: before the actor acted on it (the actor's), or after (preprocessing).
            stats.update(split_observation_change(stats.get("inv_observations_transformed", math.nan),
                                                  stats.get("logp_discrepancy", math.nan)))
            stats.update(self.streams.observe(rollout))  # each env draws its own episodes
            stats.update(self.episodes.observe(rollout))  # the episodes reported are the env's
            stats.update(self.handed.take_statistic())    # every rollout acted with the weights it was handed
            stats.update(self.steps_accounted.take_statistic())   # every env step the witness counted arrived
            self.exports.from_actors(rollout)   # Ray: each actor's own read of its gauges
            stats.update(self.exports.take_statistic())   # the last sampled update's gauges, as a scrape read them
            stats.update(actor_cost_ratios(rollout))   # each actor phase against its reference (rlvitals/costs.py)
            if self.actor_accounts is not None:
                stats.update(self.actor_accounts.take_statistic())
            else:
                # No Ray actors to compare (the systems dashboard draws the 0s).
                stats["actors_slow"] = stats["actors_silent"] = 0.0
        with phase("bookkeeping"):
            if learn:
                n = rollout.env_steps
                # This run's rollouts (the batch in hand counts: healthy is small); rollouts that were alive before
                # the run began (an earlier run in the same process, a caller's own) are not this run's.
                stats["rollouts_alive"] = float(max(0, Rollout.alive() - self._rollouts_before))
                stats["staleness_batches"] = self.staleness / self._steps_per_update
                mismatch = self.weights_mismatch(rollout)
                if mismatch is not None:
                    stats["weights_mismatch"] = mismatch
                if stats["nonfinite"]:
                    self.tracker.dropped["nonfinite"] += n
                else:
                    self.tracker.learned += n
                actors_memory = stats.pop("actors_memory_per_sample", math.nan)
                actors_memory_named = stats.pop("actors_memory_named", None)
                stats.update(self.evidence.learned(n, rollout.policy_age, stats["learner_steps"] > 0,
                                                   self.queue_capacity, memory_in_use(), stats["rollouts_alive"],
                                                   rollout.bytes_per_sample))
                learner_memory = stats["inv_memory_per_sample"]
                if actors_memory > learner_memory or math.isnan(learner_memory):
                    stats["inv_memory_per_sample"] = actors_memory     # the worst process's growth, and whose
                    if actors_memory_named:
                        stats[MEMORY_NAMED] = actors_memory_named
                elif self.actor_accounts is not None and not math.isnan(learner_memory):
                    stats[MEMORY_NAMED] = (f"the learner (pid {os.getpid()}): {learner_memory:.4g} samples' worth "
                                           "kept per sample")
        with phase("invariants"):
            made_by = producers(rollout)   # Ray: the actors whose rollouts the batch joins, judged apart
            self.judge(stats, self.tracker.updates + 1, made_by)
            stats.update(self.attribution.observe(made_by, stats, self.tracker.updates + 1))   # the verdicts' names
        if learn:
            with phase("telemetry"):
                self.telemetry.record_learn(stats)  # counts a skipped update's samples as dropped itself
                self.exports.count(stats)   # what the counters were given, for the read-back below
                if is_sampled(self.tracker.updates):   # what a scrape reads, against what was computed
                    self.exports.after_record(stats, self.telemetry.exported())
            with phase("bookkeeping"):
                self.guard.update_ok(stats, rollout)
        self.stats = stats
        self.tracker.updates += 1
        with phase("rows"):
            if self.rows.due(self.tracker.updates):
                self.rows.write(self.row())
        if self.learner is not None and self.tracker.updates % self._checkpoint_every == 0:
            with phase("checkpoint"):
                self.save_checkpoint()
        with phase("rows"):
            if self.progress.due():
                self.progress.update(self.reading())
        return stats

    def _arrived(self, rollout) -> bool:
        """Count the batch that arrived; True when the learner should learn from it (learning rate set)."""
        t, n = self.tracker, rollout.env_steps
        t.produced += n
        t.add_rollout(rollout)
        self.policy_age = rollout.policy_age
        self.staleness = self.net.age - rollout.policy_age
        if self.learner is None:
            t.learned += n  # probe agents: consumed, nothing to learn
            return False
        if not self._inputs_ok(rollout):
            return False
        # Set every batch, annealed or not: a resumed optimizer's state holds the rate it was saved with.
        frac = max(0.0, 1 - t.env_steps / self.cfg.total_env_steps) if self.cfg.anneal_lr else 1.0
        self.learner.set_learning_rate(self.cfg.learning_rate * frac)
        self._expected_lr = scheduled_learning_rate(self.cfg.learning_rate, self.cfg.anneal_lr, t.env_steps,
                                                    self.cfg.total_env_steps)
        return True

    def report_idle(self) -> None:
        """Between learn steps that do not come (every batch dropped): a row every few seconds, the progress line."""
        with self.telemetry.phase("rows"):
            if self.rows.idle_due():
                self.rows.write(self.row())
            if self.progress.due():
                self.progress.update(self.reading())

    def _inputs_ok(self, rollout) -> bool:
        ok = False
        try:
            ok = self.guard.inputs_ok(rollout)
        finally:
            if not ok:  # counted even when the guard stops the run on this batch
                self.tracker.dropped["nonfinite"] += rollout.env_steps
                self.telemetry.record_dropped("nonfinite", rollout.env_steps)
        return ok

    # ------------------------------------------------------------- what sources report
    def rollout_recorded(self, rollout) -> None:
        """Local mode, after this process recorded a rollout's actor metrics: on sampled updates, what a scrape reads
        of them against the rollout (telemetry/exported.py)."""
        sampled = is_sampled(self.tracker.updates)
        self.exports.after_rollout(rollout, self.telemetry.exported() if sampled else None)

    def weights_handed_out(self) -> None:
        """The network as it is now goes to the actors (local: acts itself): remember its fingerprint.

        Taken from the learner's network, not from what was sent, so a transport that sends the wrong
        weights under the right age is caught. Bounded: ages older than the staleness limit are forgotten.
        """
        self.published[self.net.age] = self.net.weights_checksum()
        oldest = self.net.age - self.cfg.max_staleness - 1
        for age in [a for a in self.published if a < oldest]:
            del self.published[age]

    def weights_mismatch(self, rollout) -> float | None:
        """Largest relative difference between what acted and what this age's weights were; None: unknown."""
        expected = self.published.get(rollout.policy_age)
        if expected is None or not rollout.weights_checksums:
            return None
        return max(abs(c - expected) for c in rollout.weights_checksums) / max(abs(expected), 1e-30)

    def queue(self, depth: int, capacity: int) -> None:
        """Rollouts finished but not yet taken when a batch arrived, and how many may be."""
        self.queue_depth, self.queue_capacity = depth, capacity
        self.telemetry.record_queue(depth, capacity)

    def drop(self, reason: str, samples: int) -> None:
        """A batch that arrived and is discarded before the learn step (`stale`)."""
        self.tracker.produced += samples
        self.tracker.dropped[reason] += samples
        self.telemetry.record_dropped(reason, samples)
        if reason == "stale":
            newly_broken = self.judge({**self.evidence.dropped(samples), **self.handed.take_statistic(),
                                       **self.steps_accounted.take_statistic()},
                                      self.tracker.updates)
            if newly_broken:  # every batch may be dropped: the verdict must not wait for a timed row
                self.rows.write(self.row())

    def acted(self, requested_age: int, rollout, handed_age: int | None = None) -> None:
        """One actor's rollout arrived (before any joining), requested when the learner's network was
        `requested_age` and handed the weights of `handed_age` (Ray): the weights_current_at_request and
        env_steps_accounted evidence, per actor incarnation in Ray mode."""
        for producer in producers(rollout) or ("",):
            self.handed.arrived(requested_age, rollout.policy_age, producer, handed_age)
        self.steps_accounted.arrived(rollout, (producers(rollout) or ("",))[0])

    def left_in_flight(self, samples: int) -> None:
        """A batch an actor finished that the run ended without taking."""
        self.tracker.produced += samples
        self.tracker.in_flight += samples

    def judge(self, stats: dict, update: int, made_by: list[str] | None = None) -> bool:
        """Add the invariants' verdict flags to `stats` (judged at `update`, on a batch `made_by` these actor
        incarnations, where told); True when one broke just now."""
        before = len(self.invariants.broken_at)
        for statistic, key in WIRED_STATISTICS:
            if key in stats:
                stats[statistic] = stats[key]
        if "logp_discrepancy" in stats:   # the actor's pairing or the learner's reading (observation_pairing)
            shifted = stats.get("logp_discrepancy_shifted", math.nan)
            stats.update(observation_pairing(stats["logp_discrepancy"], shifted))
        stats.update(self.invariants.observe(stats, update, made_by or ()))
        self.judged.update({k: v for k, v in stats.items() if (k.startswith("inv_") and isinstance(v, float))
                            or (k in TEXT_KEYS and isinstance(v, str))})   # names judged on a dropped batch too
        if self.learner is not None and not stats.get("updates"):
            self.telemetry.record_invariants(stats)   # judged without an update (a dropped batch, the run's end)
        return len(self.invariants.broken_at) > before

    # ------------------------------------------------------------- records
    def row(self) -> dict:
        """One metrics.jsonl row (docs/architecture.md lists the keys): the batch's statistics, then the run's
        counters and state, which win on a clash. Undefined values are dropped when it is written."""
        t = self.tracker
        row = {**self.judged, **{k: v for k, v in self.stats.items()
                                 if isinstance(v, float) and not k.startswith("time_")}}
        # Which processes a rule's evidence comes from (Ray actors, the learner): text its verdict quotes.
        row.update({k: v for k, v in self.stats.items() if k in TEXT_KEYS and isinstance(v, str)})
        row.update(t.episode_stats())
        row.update({
            "updates": t.updates, "env_steps": t.env_steps, "episodes": t.episodes,
            "learner_steps": self.net.age, "age": self.net.age,
            "policy_age": self.policy_age, "staleness": self.staleness,
            "mean_return_last_100": t.mean_return(), "wall_seconds": round(t.elapsed, 3),
            "actor_env_steps": t.produced, "queue_depth": self.queue_depth,
            "queue_capacity": self.queue_capacity,
            "dropped_stale": t.dropped["stale"], "dropped_nonfinite": t.dropped["nonfinite"],
            "rss_bytes": self._process.memory_info().rss,
        })
        if self.learner is not None:
            row["samples"] = t.learned
            row["samples_learned"] = self.learner.samples_learned
        return row

    def reading(self) -> Reading:
        """What the progress display shows now."""
        t = self.tracker
        return Reading(t.env_steps, t.elapsed, t.mean_return(), self.stats, self.net.age)

    def save_checkpoint(self) -> None:
        save_checkpoint(self.archive, self.cfg, self.net, self.learner, self.tracker, self.telemetry, self.invariants)

    def finish(self, status: str, extra: dict) -> dict:
        """Final checkpoint, last metrics row, summary.json, observers closed: however the run ends."""
        self.progress.finish(self.reading())  # first: what is printed next (a write error) starts on a new line
        t = self.tracker
        t.loop_ended = time.perf_counter()
        if self.learner is not None and t.updates > 0:
            with self.telemetry.phase("checkpoint"):
                self.save_checkpoint()
        if t.produced > 0 and self.judge({"inv_run_without_updates": float(t.updates == 0)}, t.updates):
            self.rows.last_updates = None   # a whole-run judgement broke: the last row must carry it
        if self.rows.last_updates != t.updates or self.rows.last_dropped_stale != t.dropped["stale"]:
            with self.telemetry.phase("rows"):
                self.rows.write(self.row())
        verdicts = self.health.finish()
        summary = {**t.summary(self.net.age, self.cfg.agent), "status": status, **extra,
                   "nonfinite_batches_skipped": self.guard.skipped,
                   "samples": {**t.accounting(), **extra.get("samples", {})},
                   "judgement": {**t.judgement(), "invariants_broken": dict(self.invariants.broken_at)},
                   "verdicts": {s: sum(v.severity == s for v in verdicts) for s in SEVERITIES}}
        self.archive.write_summary(summary)
        self.rows.close(self.archive.path)
        return summary


# ----------------------------------------------------------------- a run from start to end
def run_info(cfg: TrainConfig, archive: RunArchive) -> dict:
    """The identity labels every process of the run exports (rlvitals_run_info).

    `run_name` is the run directory's base name (`cp0`, `CartPole-v1-20261124-101500-s0`): what the
    dashboards' run selector shows, with the env, instead of the hex run id.
    """
    meta = archive.meta
    return {"run_id": meta["run_id"], "run_name": os.path.basename(os.path.abspath(archive.path)), "env": cfg.env,
            "algorithm": cfg.agent, "mode": cfg.mode, "code_version": meta["code_version"]["commit"][:12]}
