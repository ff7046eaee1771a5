"""TensorBoard event files: written live by `train --tensorboard`, or by `export tensorboard`, read back
with TensorBoard's own reader (tensorboard.backend.event_processing, no TensorFlow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator

from rlvitals.report.signals import signal_of
from rlvitals.report.tensorboard import TensorBoardWriter, tag_of
from rlvitals.telemetry.catalogue import SIGNED_BUCKETS

RLVITALS = str(Path(sys.executable).with_name("rlvitals"))


def read_events(path: Path) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0,
                                                                       event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def numeric(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tb") / "run"
    proc = subprocess.run([RLVITALS, "train", "--env", "CartPole-v1", "--total-env-steps", "4096", "--num-envs", "8",
                           "--rollout-length", "64", "--progress", "false", "--tensorboard", "--run-dir", run],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return run


@pytest.mark.slow
def test_train_with_tensorboard_writes_every_row_as_scalars(live_run):
    files = list(live_run.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    rows = [json.loads(line) for line in (live_run / "metrics.jsonl").read_text().splitlines()]
    acc = read_events(live_run)
    tags = set(acc.Tags()["scalars"])
    keys = {k for row in rows for k in numeric(row)}
    catalogued = {k for k in keys if signal_of(k) is not None}
    assert {"kl", "relative_entropy", "clip_fraction", "env_steps"} <= catalogued
    assert {tag_of(k) for k in keys} == tags, "one tag per numeric row key, no more"
    assert tag_of("kl") == "policy/kl"
    for key in catalogued:
        steps = [e.step for e in acc.Scalars(tag_of(key))]
        expected = [row["env_steps"] for row in rows if key in numeric(row)]
        assert steps == expected, key
    kl = [e.value for e in acc.Scalars("policy/kl")]
    assert kl == pytest.approx([row["kl"] for row in rows if "kl" in row], rel=1e-6)


@pytest.mark.slow
def test_export_rewrites_the_same_events_from_metrics_jsonl(live_run, tmp_path):
    live = read_events(live_run)
    live_scalars = {t: [(e.step, e.value) for e in live.Scalars(t)] for t in live.Tags()["scalars"]}
    proc = subprocess.run([RLVITALS, "export", "tensorboard", live_run], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    files = list(live_run.glob("events.out.tfevents.*"))
    assert [str(f) for f in files] == [result["tensorboard"]], "the export replaces the run's event files"
    assert result["rows"] == len((live_run / "metrics.jsonl").read_text().splitlines())
    exported = read_events(live_run)
    assert {t: [(e.step, e.value) for e in exported.Scalars(t)] for t in exported.Tags()["scalars"]} == live_scalars
    assert not (live_run / ".tensorboard-export").exists()


def test_debug_histograms_are_written_when_the_row_carries_them(tmp_path):
    """A debug-level learner row carries (bucket counts over SIGNED_BUCKETS, sum); the observer turns it into
    a TensorBoard histogram with the same count and sum."""
    from rlvitals.learner.diagnostics import bucket_counts

    targets = torch.linspace(-20, 40, 600)
    counts = bucket_counts(targets, torch.ones_like(targets, dtype=torch.bool), torch.tensor(SIGNED_BUCKETS))
    writer = TensorBoardWriter(tmp_path)
    for step in (100, 200):
        writer({"env_steps": step, "wall_seconds": step / 100, "target_min": -20.0, "target_max": 40.0,
                "target_mean": float(targets.mean()), "target_std": float(targets.std()),
                "target_hist": (counts.tolist(), float(targets.sum()))})
    writer.close(tmp_path)
    acc = read_events(tmp_path)
    assert "distributions/value_target" in acc.Tags()["histograms"]
    events = acc.Histograms("distributions/value_target")
    assert [e.step for e in events] == [100, 200]
    value = events[0].histogram_value
    assert value.num == 600 and value.sum == pytest.approx(float(targets.sum()), rel=1e-5)
    assert (value.min, value.max) == (-20.0, 40.0)
    assert acc.Scalars(tag_of("target_mean"))[0].value == pytest.approx(float(targets.mean()), rel=1e-6)


@pytest.mark.parametrize("args, names", [
    (["export", "tensorboard", "{tmp}/nowhere"], ["'{tmp}/nowhere'", "does not exist"]),
    (["export", "tensorboard", "{tmp}/no-rows"], ["'{tmp}/no-rows'", "metrics.jsonl"]),
    (["export", "parquet", "{tmp}/no-rows"], ["'parquet'", "tensorboard"]),
], ids=["missing-dir", "no-metrics", "unknown-format"])
def test_export_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, names):
    from rlvitals.cli import main

    (tmp_path / "no-rows").mkdir()
    (tmp_path / "no-rows" / "config.yaml").write_text("env: CartPole-v1\n")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    capsys.readouterr()
    code = main([a.replace("{tmp}", str(tmp_path)) for a in args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("rlvitals: error: "), err
    for name in names:
        assert name.replace("{tmp}", str(tmp_path)) in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
