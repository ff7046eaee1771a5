"""Local mode on CPU is deterministic: the same seed reproduces a run bit for bit; another seed does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlvitals.archive import RunArchive
from rlvitals.config import TrainConfig
from rlvitals.rows import MEASURED_KEYS
from rlvitals.session import train_in


def small_config(seed: int, run_dir: Path) -> TrainConfig:
    return TrainConfig(env="CartPole-v1", seed=seed, run_dir=str(run_dir), total_env_steps=2048, num_envs=8,
                       rollout_length=32, num_minibatches=4, update_epochs=2,
                       device="cpu", verbosity="off", progress=False).validate()


def train(seed: int, run_dir: Path) -> dict:
    """Train in this process; the run's metric rows (clock and memory readings dropped), summary and checkpoint."""
    summary, _ = train_in(small_config(seed, run_dir), ["test"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "rows": [{k: v for k, v in row.items() if k not in MEASURED_KEYS} for row in rows],
        "summary": summary,
        "checkpoint": RunArchive(run_dir).load_checkpoint(),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("determinism")
    first = train(0, root / "seed0-a")
    other = train(1, root / "seed1")  # in between, so leftover global state would show up in the repeat
    repeat = train(0, root / "seed0-b")
    return first, repeat, other


def test_same_seed_gives_identical_metric_rows(runs):
    first, repeat, _ = runs
    assert len(first["rows"]) >= 5, "a short run should get a row after every update"
    assert all({"policy_loss", "value_loss"} <= row.keys() for row in first["rows"]), \
        "rows should carry learner statistics, not just counters"
    assert first["rows"] == repeat["rows"]
    for key in ("env_steps", "episodes", "updates", "learner_steps", "mean_return_last_100"):
        assert first["summary"][key] == repeat["summary"][key], key


def test_same_seed_gives_identical_checkpoint_tensors(runs):
    first, repeat, _ = runs
    a, b = first["checkpoint"]["network"], repeat["checkpoint"]["network"]
    assert a.keys() == b.keys() and len(a) > 2
    for name in a:
        assert torch.equal(a[name], b[name]), f"network tensor {name} differs between identical seeds"
    assert first["checkpoint"]["age"] == repeat["checkpoint"]["age"] > 0
    assert first["checkpoint"]["tracker"]["env_steps"] == repeat["checkpoint"]["tracker"]["env_steps"]


def test_different_seed_differs(runs):
    first, _, other = runs
    assert first["rows"] != other["rows"]
    a, c = first["checkpoint"]["network"], other["checkpoint"]["network"]
    differing = [name for name in a if a[name].is_floating_point() and not torch.equal(a[name], c[name])]
    assert differing, "a different seed must give different weights"
