"""Planted faults in Ray mode's learner loop and in the actors' weight loads (issue 31, part 3), from outside the
product code: the loop's waits are judged against the actors' completion stamps, the loads against the versions
the driver published."""

from __future__ import annotations

import pytest
from planted_bug import PlantedBug


def loop_waits_for_every_rollout_in_flight(mp: pytest.MonkeyPatch) -> None:
    """Before taking a batch the loop waits until every rollout in flight has finished (a barrier left from the
    synchronous loop), although finished ones are there to take."""
    from rlvitals.distributed.loops import AsyncRollouts

    original = AsyncRollouts._take

    def _take(self):
        if self.in_flight:
            self.ray.wait(list(self.in_flight), num_returns=len(self.in_flight))
        return original(self)

    mp.setattr(AsyncRollouts, "_take", _take)


def loop_poll_says_nothing_is_ready(mp: pytest.MonkeyPatch) -> None:
    """The loop's own poll of finished rollouts always says none (beyond one it already knows of), so nothing is
    prefetched; it then waits for the request it made last, not for whichever finishes first."""
    from rlvitals.distributed import loops

    mp.setattr(loops, "finished_in_request_order", lambda ray, requested, known=None: [] if known is None else [known])

    def _take(self):
        self._restarted_actors()
        newest = list(self.in_flight)[-1]
        self.ray.wait([newest], num_returns=1)
        return self._fetch(self._finished(newest)[0])

    mp.setattr(loops.AsyncRollouts, "_take", _take)


def _worker_collect_with(mp: pytest.MonkeyPatch, change, one_actor: bool) -> None:
    """RolloutWorker.collect runs `change(worker, weights, weights_age)` first, in every actor process or in the one
    that claims the bug."""
    from rlvitals.distributed.workers import RolloutWorker

    original = RolloutWorker.collect
    state: dict = {}

    def collect(self, weights, weights_age):
        if "mine" not in state:
            from planted_bugs import claim_for_this_process

            state["mine"] = claim_for_this_process() if one_actor else True
        if state["mine"]:
            change(self, weights, weights_age)
        return original(self, weights, weights_age)

    mp.setattr(RolloutWorker, "collect", collect)


def one_actor_reloads_its_weights_every_request(mp: pytest.MonkeyPatch) -> None:
    """One actor forgets which version it loaded (its cache check compares a field it resets), so it deserialises and
    loads the weights handed to it on every request, the same version again included."""

    def forget(worker, weights, weights_age):
        worker.weights_age = -1

    _worker_collect_with(mp, forget, one_actor=True)


def actor_loads_weights_one_version_ahead(mp: pytest.MonkeyPatch) -> None:
    """The actors load the weights handed to them under the next network age (an off-by-one in their version
    bookkeeping): the parameters are the published ones, the version never was."""

    def load_ahead(worker, weights, weights_age):
        import ray

        if weights and weights_age != worker.weights_age:
            state = dict(ray.get(weights[0]))
            state["age_buffer"] = state["age_buffer"] + 1
            worker.net.load_state_dict(state)
            worker.weights_age = weights_age     # the product's own load sees it done

    _worker_collect_with(mp, load_ahead, one_actor=False)


RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}
"""Ray mode with two actors (as planted_bugs.RAY; not imported from there, which imports this module)."""
RAY_FOUR = {**RAY, "num_actors": 4, "actor_cpus": 0.25}

RAY_STAGE_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("ray_loop_waits_for_every_rollout_in_flight_of_four_actors", "learner", "run",
               loop_waits_for_every_rollout_in_flight, overrides=RAY_FOUR, mode="ray",
               invariant="learner_waits_while_ready",
               what="Ray async mode, 4 actors x 2 in flight: the loop waits for every rollout in flight before "
                    "taking a finished one"),
    PlantedBug("ray_loop_poll_says_nothing_is_ready", "learner", "run", loop_poll_says_nothing_is_ready,
               overrides=RAY, mode="ray", invariant="learner_waits_while_ready",
               what="Ray async mode: the loop's readiness poll always says nothing is finished, and it waits for "
                    "its newest request instead of the rollout that finished"),
    PlantedBug("ray_one_actor_of_four_reloads_its_weights_every_request", "weight-sync", "run",
               one_actor_reloads_its_weights_every_request, overrides=RAY_FOUR, mode="ray", in_actors=True,
               one_actor=True, invariant="weight_loads_per_published_version",
               what="one Ray actor of four deserialises and loads the weights on every request, the same version "
                    "again included"),
    PlantedBug("ray_actors_load_weights_one_version_ahead", "weight-sync", "run",
               actor_loads_weights_one_version_ahead, overrides=RAY, mode="ray", in_actors=True,
               invariant="weight_loads_per_published_version",
               what="Ray actors load the published parameters under the next network age, a version never "
                    "published"),
)
