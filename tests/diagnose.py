"""Run a planted bug (or none) on a real env and collect what the health rules said, and when.

Shared by tests/test_diagnosis.py and bench/diagnosis.py. A run stops as soon
as a warning-or-worse verdict fires (the diagnosis is in), or once `until`
says the event a test waits for has happened, or after its time budget of run
seconds: in a test, an upper bound that only a hung run reaches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from planted_bugs import PlantedBug, plant_in_ray_workers
from throttle import slow_down

from rlvitals.config import TrainConfig
from rlvitals.session import train_in
from rlvitals.telemetry.health import read_rows
from rlvitals.telemetry.rules import BY_RULE, HEURISTIC_RANK
from rlvitals.telemetry.verdicts import Verdict, read_verdicts

LOUD = ("critical", "warning")


@dataclass
class Diagnosis:
    verdicts: list[Verdict]
    fired_after_s: float | None
    """Run seconds at which the first warning-or-worse verdict fired (its streak start + hold)."""
    run_dir: Path
    rows: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def first(self) -> Verdict | None:
        """The diagnosis: the earliest loud verdict to fire (critical first on a tie)."""
        loud = [v for v in self.verdicts if v.severity in LOUD]
        if not loud:
            return None
        # Evidence first: the update it held at, then the clock (which differs from machine to machine), then
        # the stage (the naming rule: telemetry.invariants.STAGES, upstream first; other rules after them).
        return min(loud, key=lambda v: (v.first_update if v.first_update is not None else float("inf"),
                                        v.first_seconds or 0.0, LOUD.index(v.severity),
                                        BY_RULE[v.rule].rank if v.rule in BY_RULE else HEURISTIC_RANK))


def diagnose(run_dir: Path, env: str = "CartPole-v1", bug: PlantedBug | None = None, budget_s: float = 60.0,
             stop_on_verdict: bool = True, seed: int = 0, slowdown: float = 1.0,
             until: Callable[[list[dict], list[Verdict]], bool] | None = None, serve_metrics: bool | None = None,
             **overrides) -> Diagnosis:
    """`until(rows, loud)`: stop once true, given the rows written so far and the loud verdicts fired so far.
    `slowdown`: every collection and learner update takes that many times as long (a slower machine,
    tests/throttle.py), Ray's actors included. `serve_metrics`: the run
    serves its metrics (and writes its discovery file) as `rlvitals train` does; by default wherever its verbosity
    exports any (the planted runs' default, off, exports none)."""
    loud: list[Verdict] = []
    rows: list[dict] = []

    started = time.monotonic()

    def stop() -> bool:
        return ((stop_on_verdict and bool(loud)) or (until is not None and until(rows, loud))
                or time.monotonic() - started > budget_s)

    if bug is not None and env == "CartPole-v1":
        env = bug.env   # the env the bug was designed on (a continuous-action one for some)
    cfg_fields = {"env": env, "seed": seed, "run_dir": str(run_dir), "progress": False, "verbosity": "off",
                  "total_env_steps": 10_000_000, **(bug.overrides if bug else {}), **overrides}
    cfg = TrainConfig(**cfg_fields).validate()

    monitor_hook = _LoudHook(loud)
    owns_ray = plant_in_ray_workers(bug, slowdown if cfg.mode == "ray" else 1.0)
    try:
        with pytest.MonkeyPatch.context() as mp:
            slow_down(mp, slowdown)
            if bug is not None:
                bug.apply(mp)
            summary, path = train_in(cfg, ["diagnose"], stop=stop, observers=[monitor_hook, rows.append],
                                     serve_metrics=cfg.verbosity != "off" if serve_metrics is None else serve_metrics)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    verdicts = read_verdicts(path / "verdicts.json")
    return Diagnosis(verdicts, monitor_hook.fired_at, path, read_rows(path / "metrics.jsonl"), summary)


class _LoudHook:
    """Evaluates the rules alongside the run's own monitor, to stop the run once a loud verdict fires."""

    def __init__(self, sink: list):
        from rlvitals.telemetry.health import HealthMonitor

        self.sink = sink
        self.fired_at: float | None = None
        """Run seconds of the row at which the first loud verdict fired."""
        self.monitor = HealthMonitor(on_verdict=self._verdict)
        self.row: dict = {}

    def _verdict(self, verdict) -> None:
        if verdict.severity in LOUD:
            self.sink.append(verdict)
            if self.fired_at is None:
                self.fired_at = self.row.get("wall_seconds")

    def __call__(self, row: dict) -> None:
        self.row = row
        self.monitor(row)
