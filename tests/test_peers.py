"""Each Ray actor against its peers (rlvitals/distributed/peers.py), and the run's verdict that names it."""

from __future__ import annotations

import json
import random

import pytest

from rlvitals.distributed.peers import MIN_PEERS, PeerSpeeds, slow_below
from rlvitals.telemetry.health import TEXT_MAX, HealthMonitor, evaluate_run
from rlvitals.telemetry.rules import BY_RULE


def test_slow_bound_by_hand():
    """Four actors at 100 and one at 10: the quartiles are all 100, so the spread is 0 and the bound is the
    floor, half the median: 50. Quartiles 80 and 120 around a median of 100: spread 40 / 1.349 = 29.65, and the
    bound is the lower of 50 and 100 - 3 x 29.65 = 11.05."""
    assert slow_below([100, 100, 100, 100, 10]) == pytest.approx(50.0)
    q = [80.0, 80.0, 100.0, 120.0, 120.0]          # quartiles 80 and 120: spread 40 / 1.349 = 29.65
    assert slow_below(q) == pytest.approx(min(50.0, 100.0 - 3 * 40.0 / 1.349))
    assert slow_below([100.0] * (MIN_PEERS - 1)) is None


def deliver(peers: PeerSpeeds, speeds: dict[int, float], rounds: int, rollout_steps: int = 512) -> None:
    """Each actor delivers `rounds` rollouts of `rollout_steps` steps at its speed (steps per active second)."""
    state = {a: [0, 0.0] for a in speeds}
    for _ in range(rounds):
        for actor, speed in speeds.items():
            state[actor][0] += rollout_steps
            state[actor][1] += rollout_steps / speed
            peers.arrived((actor, 100 + actor), {"samples": state[actor][0],
                                                 "seconds": {"env_step": 0.8 * state[actor][1],
                                                             "inference": 0.2 * state[actor][1],
                                                             "work_wait": 5.0 * state[actor][1]}})


def test_one_slow_actor_is_counted_and_named_and_a_fleet_with_ordinary_spread_is_not():
    rng = random.Random(0)
    for seed in range(5):
        rng.seed(seed)
        healthy = {a: 1000.0 * (1 + rng.uniform(-0.3, 0.3)) for a in range(8)}
        peers = PeerSpeeds()
        deliver(peers, healthy, 6)
        assert peers.take_statistic() == {"actors_slow": 0.0, "actors_silent": 0.0}, seed
    peers = PeerSpeeds()
    deliver(peers, {**healthy, 5: 80.0}, 6)
    out = peers.take_statistic()
    assert out["actors_slow"] == 1.0
    assert out["actors_slow_named"].startswith("actor 5 (pid 105): 80 env steps/s against the median")


def test_too_few_actors_or_rollouts_are_not_judged():
    peers = PeerSpeeds()
    deliver(peers, {0: 1000.0, 1: 1000.0, 2: 10.0}, 6)
    assert peers.take_statistic() == {"actors_slow": 0.0, "actors_silent": 0.0}
    peers = PeerSpeeds()
    deliver(peers, {a: 1000.0 for a in range(6)}, 1)    # one rollout each: no speed yet
    assert peers.take_statistic() == {"actors_slow": 0.0, "actors_silent": 0.0}


def test_an_incarnation_that_stopped_delivering_is_left_out():
    """A slow actor that died (and was restarted under a new pid) is not named for ever after."""
    peers = PeerSpeeds()
    deliver(peers, {**{a: 1000.0 for a in range(6)}, 6: 50.0}, 6)
    assert peers.take_statistic()["actors_slow"] == 1.0
    deliver(peers, {a: 1000.0 for a in range(6)}, 40)          # actor 6's incarnation delivers no more
    out = peers.take_statistic()
    assert out["actors_slow"] == 0.0    # ...and is silent instead, until a new incarnation of actor 6 delivers
    assert out["actors_silent"] == 1.0 and out["actors_silent_named"].startswith("actor 6 (pid 106): nothing in")
    peers.arrived((6, 999), {"samples": 512, "seconds": {"env_step": 0.5}})
    assert peers.take_statistic() == {"actors_slow": 0.0, "actors_silent": 0.0}


def test_an_actor_that_stops_delivering_is_named_silent_after_its_peers_rollouts():
    """Six actors in turn: each one's usual gap is 6 arrivals, so silence is judged beyond 8 x 6 = 48 of them.
    A slow actor with a rhythm of its own (a rollout every 30 arrivals) is slow, never silent."""
    peers = PeerSpeeds()
    deliver(peers, {a: 1000.0 for a in range(6)}, 4)
    for behind in range(1, 60):     # actor 2 hangs; the others go on, one rollout each in turn
        key = (behind % 5 + (behind % 5 >= 2), 0)
        peers.arrived((key[0], 100 + key[0]), {"samples": 512 * (4 + behind), "seconds": {"env_step": 0.5 * behind}})
        out = peers.take_statistic()
        assert out["actors_silent"] == float(behind + 3 > 48), behind      # its last rollout was 3 arrivals back
    assert out["actors_silent_named"] == ("actor 2 (pid 102): nothing in the 62 rollouts its peers delivered "
                                          "since its last")
    steady = PeerSpeeds()
    deliver(steady, {a: 1000.0 for a in range(6)}, 2)
    for n in range(300):
        actor = 5 if n % 30 == 0 else n % 5
        steady.arrived((actor, 100 + actor), {"samples": 512 * (n + 3), "seconds": {"env_step": 0.5 * (n + 1)}})
        assert steady.take_statistic()["actors_silent"] == 0.0, n


def test_the_runs_verdict_names_the_actors_of_its_row():
    rule = BY_RULE["RLActorSlowerThanPeers"]
    monitor = HealthMonitor(rules=[rule], run_id="r")
    named = "actor 5 (pid 105): 80 env steps/s against the median 1000"
    for update in range(1, 12):
        monitor({"updates": update, "wall_seconds": float(update), "actors_slow": float(update >= 3),
                 **({"actors_slow_named": named} if update >= 3 else {})})
    (verdict,) = monitor.verdicts()
    assert verdict.first_update == 3 and verdict.component == "throughput"
    assert f"Named: {named}." in verdict.message


def test_the_offline_evaluator_names_them_from_metrics_jsonl_and_keeps_no_hostile_text(tmp_path):
    named = "actor 2 (pid 4242): 95 env steps/s against the median 2100"
    rows = [{"updates": u, "wall_seconds": float(u), "actors_slow": 1.0, "actors_slow_named": named}
            for u in range(1, 10)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (verdict,) = [v for v in evaluate_run(tmp_path) if v.rule == "RLActorSlowerThanPeers"]
    assert f"Named: {named}." in verdict.message
    for hostile in ("x" * (TEXT_MAX + 1), "actor 1\x1b[2J\n(pid 1)"):   # too long; control characters
        rows = [{**r, "actors_slow_named": hostile} for r in rows]
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (verdict,) = [v for v in evaluate_run(tmp_path) if v.rule == "RLActorSlowerThanPeers"]
        assert "Named:" not in verdict.message
