"""Does the learner wait while a finished rollout is ready? (Ray's asynchronous loop; measured by the driver.)

inv_learner_waits_while_ready (per update; the largest over the waits since the last update)
    When the learner starts waiting for its next batch, a zero-timeout
    `ray.wait` (or a rollout already prefetched) says whether a finished
    rollout is ready. If one is, a correct loop needs only to fetch it: the
    statistic is the time the learner then stayed blocked beyond the fetch
    itself (ray.get and unpacking, timed in the thread that does it), as a
    share of its loop since the previous wait began. Not measured (NaN) when
    nothing was ready: waiting for actors that have not finished is not a
    fault of the learner's loop. Local mode collects its own rollouts and
    synchronous Ray mode waits for every actor by design: not measured there.
"""

from __future__ import annotations

import math
import time

STATISTIC = "inv_learner_waits_while_ready"


class ReadyWaits:
    def __init__(self):
        self._loop_start: float | None = None   # when the previous wait began
        self._wait_start = 0.0
        self._ready = False
        self._worst = math.nan
        self._measured = False

    def waiting(self, ready: bool) -> None:
        """The learner starts waiting for a batch; `ready`: a finished rollout is there to take."""
        now = time.perf_counter()
        self._wait_start, self._ready = now, ready
        if self._loop_start is None:
            self._loop_start = now

    def took(self, fetch_s: float) -> None:
        """The batch is in hand; fetching it took `fetch_s` seconds (in the fetching thread)."""
        now = time.perf_counter()
        loop, self._loop_start = now - self._loop_start, self._wait_start
        if not self._ready:
            return
        share = max(0.0, now - self._wait_start - fetch_s) / loop if loop > 0 else 0.0
        self._worst = share if math.isnan(self._worst) else max(self._worst, share)
        self._measured = True

    def take_statistic(self) -> dict[str, float]:
        """The statistic over the waits since the last call; {} when no wait began with a rollout ready."""
        if not self._measured:
            return {}
        value, self._worst, self._measured = self._worst, math.nan, False
        return {STATISTIC: value}
