"""The run context: metrics rows (cadence, keys, undefined values), row observers, sample accounting,
what a checkpoint holds of the run and its telemetry, and concatenating rollouts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvitals.actors.rollout import EpisodeStats, Rollout
from rlvitals.archive import RunArchive
from rlvitals.checkpoint import telemetry_state
from rlvitals.config import TrainConfig
from rlvitals.rows import DENSE_UPDATES, RowWriter, scheduled
from rlvitals.session import train_in
from rlvitals.telemetry.interface import RecorderTelemetry
from rlvitals.telemetry.recorder import Recorder

ROW_KEYS = {"updates", "env_steps", "episodes", "learner_steps", "wall_seconds", "age", "policy_age", "staleness",
            "rss_bytes", "dropped_stale", "dropped_nonfinite", "queue_depth", "actor_env_steps"}
EPISODE_KEYS = {f"{prefix}_{stat}" for prefix in ("return", "length") for stat in ("mean", "min", "max", "std")}


def small(run_dir: Path, **fields) -> TrainConfig:
    return TrainConfig(**{"env": "CartPole-v1", "seed": 0, "run_dir": str(run_dir), "total_env_steps": 2048,
                          "num_envs": 8, "rollout_length": 32, "num_minibatches": 4, "update_epochs": 2,
                          "device": "cpu", "verbosity": "off", "progress": False, **fields}).validate()


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Observer:
    def __init__(self):
        self.rows: list[dict] = []
        self.closed: list[Path] = []

    def __call__(self, row: dict) -> None:
        self.rows.append(row)

    def close(self, run_dir: Path) -> None:
        self.closed.append(run_dir)


# ---------------------------------------------------------------- cadence
def test_a_row_after_every_update_then_thinned_by_doubling():
    assert all(scheduled(u) for u in range(1, DENSE_UPDATES + 1))
    written = [u for u in range(1, 64 * DENSE_UPDATES + 1) if scheduled(u)]
    assert written[DENSE_UPDATES:DENSE_UPDATES + 3] == [1002, 1004, 1006]
    # 500 rows per doubling of the run after the dense phase: logarithmic in its length.
    assert len(written) == DENSE_UPDATES + 6 * DENSE_UPDATES // 2
    assert [u for u in written if 4000 < u <= 4040] == [4008, 4016, 4024, 4032, 4040]


class ListArchive:
    path = Path("/nonexistent")

    def __init__(self):
        self.rows: list[dict] = []

    def append_metrics(self, row: dict) -> None:
        self.rows.append(row)


def test_the_time_floor_adds_a_row_when_the_schedule_is_sparse():
    writer = RowWriter(ListArchive(), floor_seconds=0.0)
    assert writer.due(1001)  # off the update schedule, but the floor of 0 s has passed
    writer = RowWriter(ListArchive(), floor_seconds=3600.0)
    assert not writer.due(1001) and writer.due(1002)


# ---------------------------------------------------------------- what a row holds
def test_rows_of_a_local_run_carry_every_key_once_per_update(tmp_path):
    observer = Observer()
    summary, run_dir = train_in(small(tmp_path / "run"), ["test"], observers=[observer])
    rows = rows_of(run_dir)
    assert [row["updates"] for row in rows] == list(range(1, summary["updates"] + 1)), "one row per update, no repeat"
    for row in rows:
        assert ROW_KEYS <= row.keys(), ROW_KEYS - row.keys()
        assert {"policy_loss", "kl", "samples", "samples_learned"} <= row.keys()
        assert not any(k.startswith("time_") for k in row)
        assert row["age"] == row["learner_steps"] and row["staleness"] == 0 and row["queue_depth"] == 0
        assert row["policy_age"] == row["age"] - 8, "the batch was collected before its 2 x 4 optimizer steps"
        assert row["actor_env_steps"] == row["env_steps"] and row["dropped_stale"] == row["dropped_nonfinite"] == 0
        assert row["rss_bytes"] > 10_000_000
        if row["episodes"]:
            assert EPISODE_KEYS <= row.keys() and row["return_mean"] == pytest.approx(row["mean_return_last_100"])
            assert row["return_min"] <= row["return_mean"] <= row["return_max"]
    last = rows[-1]
    assert (last["env_steps"], last["learner_steps"], last["samples"]) == \
        (summary["env_steps"], summary["learner_steps"], summary["samples"]["learned"])
    assert last["samples_learned"] == 2 * last["samples"]
    assert observer.rows == rows and observer.closed == [run_dir]


def test_undefined_values_are_left_out_not_zeroed(tmp_path):
    # Probe 1's value targets are all 1: the residual variance (and the return's spread) is undefined.
    _, run_dir = train_in(small(tmp_path / "run", env="rlvitals/Probe1-v0", total_env_steps=512), ["test"])
    rows = rows_of(run_dir)
    assert rows and all("residual_variance" not in row and "policy_loss" in row for row in rows)


# ---------------------------------------------------------------- observers and the end of a run
def test_observers_are_closed_whatever_the_end(tmp_path):
    calls = []

    def stop():
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return False

    observer = Observer()
    cfg = small(tmp_path / "run", total_env_steps=100_000)
    with pytest.raises(KeyboardInterrupt):
        train_in(cfg, ["test"], stop=stop, observers=[observer])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["updates"] == 3
    assert [row["updates"] for row in observer.rows] == [1, 2, 3]
    assert observer.closed == [tmp_path / "run"]


def test_a_failing_observer_stops_a_test_run_but_only_detaches_in_production(caplog):
    def broken(row):
        raise ValueError("evaluator bug")

    strict = RowWriter(ListArchive(), [broken])
    with pytest.raises(ValueError, match="evaluator bug"):
        strict.write({"updates": 1})
    archive, good = ListArchive(), Observer()
    lenient = RowWriter(archive, [broken, good], strict=False)
    with caplog.at_level(logging.ERROR, logger="rlvitals.rows"):
        lenient.write({"updates": 1, "kl": float("nan")})
        lenient.write({"updates": 2})
    assert archive.rows == good.rows == [{"updates": 1}, {"updates": 2}]
    assert lenient.observers == [good] and "evaluator bug" in caplog.text


# ---------------------------------------------------------------- accounting and checkpoints
def test_local_summary_accounts_for_every_sample(tmp_path):
    summary, _ = train_in(small(tmp_path / "run", agent="random"), ["test"])
    samples = summary["samples"]
    assert samples["produced"] == samples["learned"] == summary["env_steps"] > 0
    assert samples["dropped"] == {"stale": 0, "nonfinite": 0} and samples["in_flight"] == 0


def test_checkpoint_holds_the_run_counters_and_the_telemetry_state(tmp_path):
    telemetry = RecorderTelemetry(Recorder("standard", "local"))
    summary, run_dir = train_in(small(tmp_path / "run"), ["test"], telemetry)
    state = RunArchive(run_dir).load_checkpoint()
    assert state["tracker"]["samples"] == summary["samples"]
    assert len(state["tracker"]["lengths"]) == len(state["tracker"]["window"]) > 0
    counters = {(name, tuple(labels)): value for name, labels, value in state["telemetry"]["counters"]}
    assert counters[("rlvitals_learner_steps_total", ())] == summary["learner_steps"]
    assert telemetry_state(state) == state["telemetry"]
    # A checkpoint from before the telemetry kept its own state: the counters list, totals from the run.
    legacy = {k: v for k, v in state.items() if k != "telemetry"}
    legacy["counters"] = state["telemetry"]["counters"]
    assert telemetry_state(legacy) == {"counters": legacy["counters"], "collected": float(summary["env_steps"]),
                                       "learned": float(state["learner"]["samples_learned"])}


# ---------------------------------------------------------------- rollouts side by side
def rollout(num_envs: int, age: int, returns=(1.0,), steps: int = 3) -> Rollout:
    T = steps
    return Rollout(
        obs=torch.full((T + 1, num_envs, 2), float(age)), actions=torch.zeros(T, num_envs, dtype=torch.int64),
        rewards=torch.ones(T, num_envs), terminated=torch.zeros(T, num_envs, dtype=torch.bool),
        truncated=torch.zeros(T, num_envs, dtype=torch.bool), valid=torch.ones(T, num_envs, dtype=torch.bool),
        behaviour_params=torch.zeros(T, num_envs, 2), behaviour_logp=torch.zeros(T, num_envs), policy_age=age,
        episodes=EpisodeStats(np.asarray(returns), np.ones(len(returns), np.int64), np.zeros(0)),
        timings={"env_step": 1.0}, valid_count=T * num_envs)


def test_concat_puts_rollouts_side_by_side():
    a, b = rollout(2, age=7, returns=(1.0, 2.0)), rollout(3, age=5, returns=(3.0,))
    batch = Rollout.concat([a, b])
    assert batch.obs.shape == (4, 5, 2) and batch.num_envs == 5 and batch.num_steps == 3
    assert torch.equal(batch.obs[:, :2], a.obs) and torch.equal(batch.obs[:, 2:], b.obs)
    assert batch.policy_age == 5, "the batch is as stale as its oldest part"
    assert batch.env_steps == a.env_steps + b.env_steps
    assert batch.episodes.returns.tolist() == [1.0, 2.0, 3.0] and batch.timings == {}
    assert Rollout.concat([a]) is a
    with pytest.raises(ValueError, match="different lengths"):
        Rollout.concat([a, rollout(2, age=7, steps=4)])


# ---------------------------------------------------------------- import rules (docs/architecture.md)
def imported_modules(folder: str) -> dict[str, set[str]]:
    """Absolute names each module of a part imports (relative imports resolved within the package)."""
    import ast

    root = Path(__file__).resolve().parent.parent / folder
    out = {}
    for path in sorted(root.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names.add(f"rlvitals.{folder}.{base}".rstrip(".") if node.level == 1 else
                          f"rlvitals.{base}" if node.level == 2 else base)
        out[path.name] = names
    return out


@pytest.mark.parametrize("folder, allowed", [("actors", ("rlvitals.actors",)),
                                             ("learner", ("rlvitals.learner", "rlvitals.actors.rollout"))])
def test_actors_and_learner_import_no_telemetry_and_no_wiring(folder, allowed):
    for module, names in imported_modules(folder).items():
        ours = {n for n in names if n == "rlvitals" or n.startswith("rlvitals.")}
        bad = {n for n in ours if not any(n == a or n.startswith(a + ".") for a in allowed)}
        assert not bad, f"{folder}/{module} imports {sorted(bad)}; the wiring records what it returns instead"
        assert not {n for n in names if n.split(".")[0] in ("ray", "prometheus_client", "telemetry")}, module


def test_a_rollout_that_arrives_pickled_counts_as_alive():
    """Ray hands the learner unpickled rollouts: they count in Rollout.alive() like the ones built here."""
    import gc
    import pickle

    gc.collect()
    before = Rollout.alive()
    original = rollout(2, age=1)
    copy = pickle.loads(pickle.dumps(original))
    assert copy.policy_age == 1 and Rollout.alive() == before + 2
    del original, copy
    gc.collect()
    assert Rollout.alive() == before
