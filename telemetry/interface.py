"""The one object the wiring talks to about metrics, and its two implementations without a server.

`Telemetry` is the interface: named methods, each taking values the caller
already has on the host. The run loops, the actor bodies, the non-finite
bookkeeping and the checkpoint code call these and nothing else; none of them
reaches into a recorder.

- `NullTelemetry` does nothing, fast: what a run gets at verbosity `off`, so
  no caller ever checks for None.
- `RecorderTelemetry` records into a `Recorder` (no HTTP): the base of
  `process.ProcessTelemetry`, which adds the /metrics endpoint and the
  discovery file, and what tests use to look at recorded values directly.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from .recorder import Recorder


@runtime_checkable
class Telemetry(Protocol):
    """What a process's telemetry offers the code that runs training."""

    wants_value_trace: bool
    """The learner should return the per-step value/reward trace (debug level)."""
    wants_debug: bool
    """The learner should return per-layer statistics and histograms (debug level)."""
    url: str | None
    """Where /metrics is served (None: nowhere)."""

    def record_rollout(self, rollout) -> None:
        """Actor-side metrics of one rollout: env steps, episodes, actor phases, network age."""

    def record_learn(self, stats: dict) -> None:
        """Learner-side metrics of one batch, from the dict `PPOLearner.learn` returned."""

    def record_invariants(self, judged: dict) -> None:
        """The invariants judged without an update (a dropped batch, the run's end): `inv_*` keys as in stats."""

    def record_rule_held(self, held: dict) -> None:
        """Per health rule, the updates its condition has held (-1: it does not hold), as the health monitor
        counts them on each row."""

    def record_queue(self, depth: int, capacity: int) -> None:
        """Rollouts finished by actors but not yet taken by the learner, and how many may be."""

    def record_dropped(self, reason: str, samples: float) -> None:
        """Samples discarded before learning: reason `stale` or `nonfinite`."""

    def record_publish(self, num_bytes: float) -> None:
        """The network of one new age put where the actors fetch it."""

    def record_restarts(self, count: int) -> None:
        """`count` more actor processes were restarted."""

    def phase(self, name: str):
        """Context manager adding the seconds spent inside it to the learner's phase `name`."""

    def exported(self) -> dict[str, dict[tuple, float]] | None:
        """What a scrape reads of the gauges and counters (telemetry/exported.py); None where nothing is exported."""

    def state(self) -> dict:
        """Plain data for a checkpoint: counters go on from it after a resume."""

    def load_state(self, state: dict) -> None:
        """Counters continue from `state()` of an earlier process; call before the endpoint serves."""

    def stop(self) -> None:
        """Stop serving and remove the discovery file; idempotent."""


class _NoPhase:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


_NO_PHASE = _NoPhase()


class NullTelemetry:
    """Telemetry at verbosity `off`: every call returns at once and nothing is kept."""

    wants_value_trace = False
    wants_debug = False
    url = None

    def record_rollout(self, rollout) -> None:
        pass

    def record_learn(self, stats: dict) -> None:
        pass

    def record_invariants(self, judged: dict) -> None:
        pass

    def record_rule_held(self, held: dict) -> None:
        pass

    def record_queue(self, depth: int, capacity: int) -> None:
        pass

    def record_dropped(self, reason: str, samples: float) -> None:
        pass

    def record_publish(self, num_bytes: float) -> None:
        pass

    def record_restarts(self, count: int) -> None:
        pass

    def phase(self, name: str):
        return _NO_PHASE

    def exported(self) -> None:
        return None   # nothing is exported

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def stop(self) -> None:
        pass


class _Phase:
    """Times one `with` block into the recorder's phase counter."""

    __slots__ = ("recorder", "name", "start")

    def __init__(self, recorder: Recorder, name: str):
        self.recorder, self.name, self.start = recorder, name, 0.0

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.recorder.record_phase(self.name, time.perf_counter() - self.start)


class RecorderTelemetry:
    """The interface over a Recorder, without an endpoint."""

    url = None

    def __init__(self, recorder: Recorder):
        self._recorder = recorder

    @property
    def wants_value_trace(self) -> bool:
        return self._recorder.wants_value_trace

    @property
    def wants_debug(self) -> bool:
        return self._recorder.wants_debug

    def record_rollout(self, rollout) -> None:
        self._recorder.record_rollout(rollout)

    def record_learn(self, stats: dict) -> None:
        self._recorder.record_learn(stats)

    def record_invariants(self, judged: dict) -> None:
        # The same gauges as a batch's statistics; nothing here is a counter, so nothing is counted twice.
        self._recorder.record_learn({k: v for k, v in judged.items() if k.startswith("inv_")})

    def record_rule_held(self, held: dict) -> None:
        self._recorder.record_rule_held({rule: float(n) for rule, n in held.items()})

    def record_queue(self, depth: int, capacity: int) -> None:
        self._recorder.record_queue(depth, capacity)

    def record_dropped(self, reason: str, samples: float) -> None:
        self._recorder.record_dropped(reason, samples)

    def record_publish(self, num_bytes: float) -> None:
        self._recorder.record_publish(num_bytes)

    def record_restarts(self, count: int) -> None:
        if count > 0:
            self._recorder.record_restarts(count)

    def phase(self, name: str):
        return _Phase(self._recorder, name)

    def exported(self) -> dict[str, dict[tuple, float]]:
        """What a scrape reads of the catalogue's gauges and counters: metric name -> {label values: value}, through
        the same collector the endpoint serves (every family this process exports; one with no series is empty)."""
        from .catalogue import BY_NAME
        from .collectors import CatalogueCollector

        out: dict[str, dict[tuple, float]] = {}
        for family in CatalogueCollector(self._recorder).collect():
            # Gauges keep their catalogue name; counters' families drop the _total their samples carry.
            metric = BY_NAME.get(family.name) or BY_NAME.get(family.name + "_total")
            if metric is None or metric.kind not in ("gauge", "counter"):
                continue
            series = out.setdefault(metric.name, {})
            for sample in family.samples:
                if metric.kind == "counter" and sample.name != metric.name:
                    continue   # a counter's _created sample
                series[tuple(sample.labels.get(label) for label in metric.labels)] = sample.value
        return out

    def state(self) -> dict:
        return self._recorder.state()

    def load_state(self, state: dict) -> None:
        self._recorder.load_state(state)

    def stop(self) -> None:
        pass


NULL_TELEMETRY = NullTelemetry()
"""The one no-op instance (it holds no state, so every caller may share it)."""


def or_null(telemetry) -> Telemetry:
    """`telemetry`, or the no-op one for None (for public entry points that accept None)."""
    return NULL_TELEMETRY if telemetry is None else telemetry
