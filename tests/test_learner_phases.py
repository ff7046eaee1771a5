"""The learner's phases (rlvitals_learner_phase_seconds_total) account for the whole learner loop.

A real local run records through a real Recorder; the phase counters must add up to the run's wall
time (summary.json `wall_seconds`, from the run's start to its summary) with next to nothing left in no
phase, and every phase a local PPO run goes through must have been timed. Ratios only: no speed assumed.
"""

from __future__ import annotations

from rlvitals.config import TrainConfig
from rlvitals.learner.phases import PhaseLaps
from rlvitals.session import train_in
from rlvitals.telemetry.catalogue import BY_NAME
from rlvitals.telemetry.interface import RecorderTelemetry
from rlvitals.telemetry.recorder import Recorder

PHASE_METRIC = "rlvitals_learner_phase_seconds_total"
PHASES = BY_NAME[PHASE_METRIC].label_values["phase"]


def phase_seconds(recorder: Recorder) -> dict[str, float]:
    values, _, _ = recorder.snapshot()
    return {labels[0]: value for (name, labels), value in values.items() if name == PHASE_METRIC}


def test_phases_add_up_to_the_wall_time_of_a_local_run(tmp_path):
    cfg = TrainConfig(env="CartPole-v1", seed=0, run_dir=str(tmp_path / "run"), total_env_steps=8192, num_envs=8,
                      rollout_length=32, num_minibatches=4, update_epochs=2, checkpoint_interval=64,
                      device="cpu", verbosity="standard", progress=False).validate()
    recorder = Recorder("standard", "local")
    summary, _ = train_in(cfg, ["test"], RecorderTelemetry(recorder))
    seconds = phase_seconds(recorder)
    assert set(seconds) == set(PHASES)
    # Ray-only phases aside, a local PPO run goes through every phase, checkpoints included.
    assert all(seconds[p] > 0 for p in PHASES), seconds
    accounted = sum(seconds.values())
    wall = summary["wall_seconds"]
    # Upper bound: phases never overlap (wall_seconds is rounded to the millisecond).
    assert 0.95 * wall <= accounted <= wall + 0.001, (accounted, wall, seconds)
    print(f"phases {accounted:.3f} s of {wall:.3f} s", seconds)


def test_laps_are_contiguous_and_the_update_splits_into_its_two_phases():
    laps = PhaseLaps()
    sum(range(10_000))
    laps.lap("transfer")
    sum(range(10_000))
    laps.split_update(forward_backward_s=0.0)
    laps.lap("transfer")
    assert set(laps.seconds) == {"time_transfer", "time_optimizer", "time_forward_backward"}
    assert laps.seconds["time_forward_backward"] == 0.0
    assert all(v >= 0 for v in laps.seconds.values())
