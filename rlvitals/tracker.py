"""The counters of one run: steps, episodes, updates, the recent-episode window, and where every sample went."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

DROP_REASONS = ("stale", "nonfinite")
WINDOW = 100
"""Episodes in the recent-episode window (the `_last_100` of the summary and the rows)."""


def _window() -> deque:
    return deque(maxlen=WINDOW)


@dataclass
class RunTracker:
    """Counters, the recent-episode window, the solved-time and the sample accounting of one run.

    Sample accounting: every sample an actor produced and the learner received is
    either learned from, dropped (by reason), or, at the end of a run, still in
    flight: produced = learned + dropped + in_flight. For the probe agents, which
    do not learn, "learned" means consumed.
    """

    total_env_steps: int
    return_threshold: float | None = None
    window: deque = field(default_factory=_window)
    """Returns of the last finished episodes (episodes with a non-finite reward have none)."""
    lengths: deque = field(default_factory=_window)
    """Lengths of the same episodes."""
    successes: deque = field(default_factory=_window)
    """1/0 per recent episode whose env reports success."""
    env_steps: int = 0
    episodes: int = 0
    updates: int = 0
    started: float = field(default_factory=time.perf_counter)
    solved_after_s: float | None = None
    solved_at_env_steps: int | None = None
    resume_offset: float = 0.0
    """Training seconds before this process took over (resumed runs)."""
    produced: int = 0
    learned: int = 0
    dropped: dict = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    in_flight: int = 0
    first_returns: list = field(default_factory=list)
    """Returns of the run's first WINDOW finished episodes: the policy as initialised, near a random agent's."""
    waited: float = 0.0
    """Seconds this process's learner loop spent in its `wait` phases: waiting for the next batch of data."""
    loop_started: float | None = None
    loop_ended: float | None = None
    """perf_counter() when this process's learner loop (`Run.drive`) started and ended."""

    @property
    def elapsed(self) -> float:
        return self.resume_offset + time.perf_counter() - self.started

    def mean_return(self) -> float | None:
        return float(np.mean(self.window)) if self.window else None

    def add_rollout(self, rollout) -> None:
        """A rollout the learner takes (learned from, or skipped as non-finite): count its steps and episodes."""
        self.env_steps += rollout.env_steps
        self.episodes += len(rollout.episodes.returns)
        returns = rollout.episodes.returns
        finite = np.isfinite(returns)  # a NaN reward's episode has no return
        self.window.extend(returns[finite].tolist())
        if len(self.first_returns) < WINDOW:
            self.first_returns.extend(returns[finite].tolist()[: WINDOW - len(self.first_returns)])
        self.lengths.extend(rollout.episodes.lengths[finite].tolist())
        self.successes.extend(rollout.episodes.successes.tolist())
        if (self.return_threshold is not None and self.solved_after_s is None
                and len(self.window) == self.window.maxlen and self.mean_return() >= self.return_threshold):
            self.solved_after_s = self.elapsed
            self.solved_at_env_steps = self.env_steps

    def done(self) -> bool:
        # The budget counts every env step that arrived, dropped as stale or not: a run whose actors
        # only ever deliver stale batches still ends.
        return self.env_steps + self.dropped["stale"] >= self.total_env_steps

    def episode_stats(self) -> dict:
        """return_/length_ mean, min, max, std over the window, and solve_ratio; {} where undefined."""
        out = {}
        for prefix, values in (("return", self.window), ("length", self.lengths)):
            if values:
                arr = np.asarray(values, dtype=np.float64)
                out.update({f"{prefix}_mean": float(arr.mean()), f"{prefix}_min": float(arr.min()),
                            f"{prefix}_max": float(arr.max()), f"{prefix}_std": float(arr.std())})
        if self.successes:
            out["solve_ratio"] = float(np.mean(self.successes))
        return out

    def accounting(self) -> dict:
        return {"produced": self.produced, "learned": self.learned, "dropped": dict(self.dropped),
                "in_flight": self.in_flight}

    def loop_seconds(self) -> float | None:
        """Seconds of this process's learner loop so far (to its end, once it ended); None before it started."""
        if self.loop_started is None:
            return None
        end = self.loop_ended if self.loop_ended is not None else time.perf_counter()
        return end - self.loop_started

    def learner_idle_share(self) -> float | None:
        """The share of the learner loop's time spent waiting for data (its `wait` phases), in [0, 1]."""
        seconds = self.loop_seconds()
        if not seconds:
            return None
        return round(min(1.0, self.waited / seconds), 6)

    def judgement(self) -> dict:
        """The whole run in a few numbers: where its samples went, its return against its start, and how much
        of the learner's time went to waiting for data.

        The first episodes are played by the freshly initialised policy, whose action distribution is
        near uniform: their mean return is the run's own random-agent baseline, on the env as configured.
        `improvement_z` is (last 100 - first 100) over the standard error of the difference: above 3
        the run learned, near 0 it learned nothing. `learner_idle_share` is the share of this process's
        learner loop spent waiting for the next batch: in local mode that wait is the collection itself, in
        Ray mode it is time the actors did not keep the learner busy (near 1: the actors are the bottleneck).
        """
        produced = max(self.produced, 1)
        out = {"dropped_share": round(sum(self.dropped.values()) / produced, 6),
               "learned_share": round(self.learned / produced, 6),
               "first_episodes_mean_return": None, "last_100_mean_return": self.mean_return(),
               "improvement_z": None, "learner_idle_share": self.learner_idle_share()}
        if len(self.first_returns) >= 10 and len(self.window) >= 10:
            first, last = np.asarray(self.first_returns), np.asarray(self.window)
            out["first_episodes_mean_return"] = float(first.mean())
            error = float(np.sqrt(first.var() / len(first) + last.var() / len(last)))
            diff = float(last.mean() - first.mean())
            out["improvement_z"] = round(diff / error, 3) if error > 0 else (0.0 if diff == 0 else None)
        return out

    def summary(self, learner_steps: int, algorithm: str) -> dict:
        return {
            "algorithm": algorithm, "env_steps": self.env_steps, "episodes": self.episodes,
            "updates": self.updates, "learner_steps": learner_steps, "wall_seconds": round(self.elapsed, 3),
            "env_steps_per_second": round(self.env_steps / max(self.elapsed, 1e-9), 1),
            "mean_return_last_100": self.mean_return(),
            "return_threshold": self.return_threshold, "seconds_to_threshold": self.solved_after_s,
            "env_steps_to_threshold": self.solved_at_env_steps,
        }

    # ------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """Plain data for a checkpoint (the keys of checkpoint format v1, plus newer optional ones)."""
        return {"env_steps": self.env_steps, "episodes": self.episodes, "updates": self.updates,
                "window": list(self.window), "lengths": list(self.lengths), "successes": list(self.successes),
                "elapsed": self.elapsed, "solved_after_s": self.solved_after_s,
                "solved_at_env_steps": self.solved_at_env_steps, "samples": self.accounting(),
                "first_returns": list(self.first_returns)}

    def load_state(self, t: dict) -> None:
        """Counters go on from a checkpoint's `state()`; keys older checkpoints lack start empty."""
        self.env_steps, self.episodes, self.updates = t["env_steps"], t["episodes"], t["updates"]
        self.window.extend(t["window"])
        self.lengths.extend(t.get("lengths", ()))
        self.successes.extend(t.get("successes", ()))
        self.first_returns = list(t.get("first_returns", ()))
        self.resume_offset = float(t["elapsed"])
        self.solved_after_s, self.solved_at_env_steps = t["solved_after_s"], t["solved_at_env_steps"]
        samples = t.get("samples")
        if samples:
            self.produced, self.learned = samples["produced"], samples["learned"]
            self.dropped.update(samples["dropped"])
        else:  # a checkpoint from before sample accounting in local mode: count what it took as learned
            self.produced = self.learned = self.env_steps


class WaitTimed:
    """A run's telemetry with its `wait` phases also timed into the tracker, at every verbosity (`off`
    included: its phases time nothing there), for the whole-run judgement's learner idle share. Everything
    else is the telemetry's own."""

    def __init__(self, telemetry, tracker: RunTracker):
        self._telemetry, self._tracker = telemetry, tracker

    def __getattr__(self, name: str):
        return getattr(self._telemetry, name)

    def phase(self, name: str):
        inner = self._telemetry.phase(name)
        return _Waiting(inner, self._tracker) if name == "wait" else inner


class _Waiting:
    __slots__ = ("inner", "tracker", "start")

    def __init__(self, inner, tracker: RunTracker):
        self.inner, self.tracker, self.start = inner, tracker, 0.0

    def __enter__(self):
        self.inner.__enter__()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.tracker.waited += time.perf_counter() - self.start
        return self.inner.__exit__(*exc)
