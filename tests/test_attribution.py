"""Which actors' batches broke an invariant: the text a Ray run's verdict quotes, worked by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

from rlvitals.evidence import HandedWeights
from rlvitals.telemetry.attribution import NAMED, InvariantAttribution, producers
from rlvitals.telemetry.health import TEXT_KEYS
from rlvitals.telemetry.invariants import BY_NAME, INVARIANTS, Invariant

TOY = Invariant("toy", "boundary", "actor", 1.0, 2, "s", "c", "d")
LATE = Invariant("late", "boundary", "actor", 1.0, 2, "s", "c", "d", after_updates=3)


def test_one_actor_of_four_is_named_with_its_count_and_the_others_in_one():
    attribution = InvariantAttribution([TOY])
    texts = [attribution.observe([f"actor {i % 4} (pid {100 + i % 4})"], {"inv_toy": 2.0 if i % 4 == 2 else 0.5},
                                 i + 1) for i in range(12)]
    assert texts[:2] == [{}, {}]      # nothing broke yet: no text
    assert texts[-1] == {"toy_named": "actor 2 (pid 102): 3 of 3 measured batches over the limit; "
                                          "the other 3 actors: 0 of 9"}


def test_a_fault_in_every_actor_is_said_once():
    attribution = InvariantAttribution([TOY])
    for i in range(6):
        out = attribution.observe([f"actor {i % 3} (pid {i % 3})"], {"inv_toy": 3.0}, i + 1)
    assert out == {"toy_named": "every one of the 3 actors: 6 of 6 measured batches over the limit"}
    joined = InvariantAttribution([TOY])     # a synchronous batch joins them all
    assert joined.observe(["a", "b"], {"inv_toy": 3.0}, 1) == {
        "toy_named": "every one of the 2 actors: 2 of 2 measured batches over the limit"}


def test_unmeasured_batches_warm_up_and_the_limit_itself_are_no_evidence():
    attribution = InvariantAttribution([LATE])
    assert attribution.observe(["a"], {"inv_late": 9.0}, 3) == {}       # update 3: not judged yet
    assert attribution.observe(["a"], {"inv_late": 1.0}, 4) == {}       # at the limit: within it
    assert attribution.observe(["b"], {"inv_late": math.nan}, 5) == {}  # not measured
    out = attribution.observe(["b"], {"inv_late": 1.5}, 6)
    assert out == {"late_named": "b: 1 of 1 measured batches over the limit; the other 1 actor: 0 of 2"}
    assert attribution.observe(["a"], {}, 7) == out    # the text stays once something broke


def test_at_most_named_actors_are_listed_worst_first():
    attribution = InvariantAttribution([TOY])
    for i in range(NAMED + 3):
        for _ in range(i + 1):
            attribution.observe([f"actor {i}"], {"inv_toy": 2.0}, 10)
    attribution.observe(["actor 99"], {"inv_toy": 0.0}, 10)
    text = attribution.text("toy")
    assert text.startswith(f"actor {NAMED + 2}: {NAMED + 3} of {NAMED + 3}")
    assert "actor 0:" not in text and "3 more actors over it" in text and text.endswith("the other 1 actor: 0 of 1")


def test_local_batches_and_run_wide_invariants_name_nothing():
    attribution = InvariantAttribution()
    assert attribution.observe([], {"inv_boundary_rewards": 5.0}, 1) == {}
    assert all(inv.per_batch for inv in attribution.invariants)
    assert "streams_independent" not in {inv.name for inv in attribution.invariants}
    assert producers(SimpleNamespace(actor_counters=None)) == []
    assert producers(SimpleNamespace(actor_counters=({"actor": 3, "pid": 7}, {"actor": 4, "pid": 8}))) == [
        "actor 3 (pid 7)", "actor 4 (pid 8)"]


def test_every_names_key_is_text_the_readers_keep():
    keys = {inv.names_key for inv in INVARIANTS if inv.names_key}
    assert keys <= TEXT_KEYS and "memory_per_sample_named" in keys
    assert BY_NAME["boundary_rewards"].names_key == "boundary_rewards_named"
    assert BY_NAME["returns_recomputed"].names_key == ""     # the learner's own: no actor to name


def test_handed_weights_measure_learner_steps_behind_the_request_and_name_the_laggard():
    handed = HandedWeights()
    assert handed.take_statistic() == {}                          # nothing arrived: not measured
    handed.arrived(8, 8, "actor 0 (pid 10)")
    handed.arrived(8, 8, "actor 1 (pid 11)")
    assert handed.take_statistic() == {"inv_weights_current_at_request": 0.0}   # acted as handed: no text
    handed.arrived(16, 4, "actor 1 (pid 11)")                    # handed 16, kept the weights of age 4
    handed.arrived(16, 16, "actor 0 (pid 10)")
    handed.arrived(20, 24, "actor 0 (pid 10)")                   # newer than requested: not behind
    out = handed.take_statistic()
    assert out["inv_weights_current_at_request"] == 12.0
    assert out["weights_current_at_request_named"] == (
        "actor 1 (pid 11): 1 of 2 rollouts over the limit (acted up to 12 learner steps behind the weights it was "
        "handed); the other 1 actor: 0 of 3")
    assert handed.take_statistic() == {"weights_current_at_request_named": out["weights_current_at_request_named"]}
    assert "weights_current_at_request_named" in TEXT_KEYS          # rows carry it, the verdict quotes it
    local = HandedWeights()                                         # one process: measured, nobody to name
    local.arrived(3, 2)
    assert local.take_statistic()["inv_weights_current_at_request"] == 1.0


def test_weights_published_late_are_the_publications_not_the_actor_that_received_them():
    handed = HandedWeights()
    handed.arrived(8, 8, "actor 0 (pid 10)", handed_age=8)
    handed.arrived(40, 8, "actor 1 (pid 11)", handed_age=8)      # the driver handed age 8 while the learner was at 40
    out = handed.take_statistic()
    assert out["inv_weights_current_at_request"] == 32.0
    assert out["weights_current_at_request_named"] == (
        "the learner's publication: 1 of 2 requests were handed weights older than the learner's network "
        "(up to 32 learner steps)")                                 # actor 1 loaded what it got: not named
