"""`rlvitals runs --filter KEY=VALUE --sort KEY` on any config field, values compared as the field's type.

The run directories are made by the real archive (`RunArchive.create` writes config.yaml as a run does,
`write_summary` its summary.json); one imitates an older run whose config.yaml predates some fields.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlvitals.archive import RunArchive
from rlvitals.cli import main
from rlvitals.config import TrainConfig

RUNS = {  # name: (config fields, mean_return_last_100 or None for a run without summary.json)
    "lr-big": ({"learning_rate": 0.0025, "gamma": 0.9, "hidden_sizes": (128, 128), "sync": True, "seed": 1,
                "env_kwargs": {"g": 2, "wind": {"speed": 1.5}}}, 200.0),
    "lr-small": ({"learning_rate": 0.001, "seed": 2, "env_kwargs": {"g": 9.81}}, 100.0),
    "old": ({"learning_rate": 0.01, "seed": 3}, None),
}
OLDER_THAN = ("gamma", "sync", "hidden_sizes", "env_kwargs")
"""Fields the `old` run's config.yaml lacks: it ran with their defaults."""


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    parent = tmp_path_factory.mktemp("runs")
    for name, (fields, final_return) in RUNS.items():
        config = TrainConfig(run_dir=str(parent / name), **fields).validate().to_dict()
        archive = RunArchive.create(str(parent / name), config, ["test"])
        if final_return is not None:
            archive.write_summary({"env_steps": 1000, "mean_return_last_100": final_return})
        archive.close()
    older = parent / "old" / "config.yaml"
    older.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(older.read_text()).items()
                                     if k not in OLDER_THAN}))
    return parent


def listed(runs_dir: Path, capsys, *flags: str) -> list[str]:
    """The run names `rlvitals runs DIR --json FLAGS` prints, in order."""
    capsys.readouterr()
    code = main(["runs", str(runs_dir), "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return [row["run"] for row in json.loads(out)]


@pytest.mark.parametrize("flt, expected", [
    ("learning_rate=0.001", ["lr-small"]),
    ("learning_rate=1e-3", ["lr-small"]),           # the same number written otherwise
    ("gamma=0.99", ["lr-small", "old"]),            # the old run ran with the default
    ("gamma=0.9", ["lr-big"]),
    ("sync=true", ["lr-big"]),
    ("sync=yes", ["lr-big"]),                       # every spelling a flag accepts
    ("sync=false", ["lr-small", "old"]),
    ("hidden_sizes=128,128", ["lr-big"]),
    ("hidden_sizes=64,64", ["lr-small", "old"]),
    ("return_threshold=none", ["lr-big", "lr-small", "old"]),
    ("final_return=200", ["lr-big"]),               # a column: 200 finds 200.0
    ("algorithm=ppo", ["lr-big", "lr-small", "old"]),
    ("env_kwargs.g=9.81", ["lr-small"]),            # a key inside a mapping field
    ("env_kwargs.g=2.0", ["lr-big"]),               # 2.0 finds 2
    ("env_kwargs.wind.speed=1.5", ["lr-big"]),
    ("env_kwargs={g: 9.81}", ["lr-small"]),         # the whole mapping, as JSON or YAML
    ('env_kwargs={"g": 2, "wind": {"speed": 1.5}}', ["lr-big"]),
    ("env_kwargs={}", ["old"]),                     # a run older than the field had none
    ("env_kwargs.g=null", ["old"]),                 # the key is not set
], ids=lambda value: value if isinstance(value, str) else None)
def test_filter_compares_as_the_field_is_typed(runs_dir, capsys, flt, expected):
    assert listed(runs_dir, capsys, "--filter", flt, "--sort", "seed") == expected


def test_env_kwargs_is_a_difference_like_any_config_field(runs_dir, capsys):
    capsys.readouterr()
    assert main(["runs", str(runs_dir), "--json", "--sort", "seed"]) == 0
    differences = {row["run"]: row["differences"] for row in json.loads(capsys.readouterr().out)}
    assert "env_kwargs={'g': 2, 'wind': {'speed': 1.5}}" in differences["lr-big"]
    assert "env_kwargs={'g': 9.81}" in differences["lr-small"]


def test_filters_combine(runs_dir, capsys):
    assert listed(runs_dir, capsys, "--filter", "gamma=0.99", "--filter", "learning_rate=0.01") == ["old"]
    assert listed(runs_dir, capsys, "--filter", "gamma=0.9", "--filter", "learning_rate=0.01") == []


@pytest.mark.parametrize("sort, expected", [
    ("learning_rate", ["lr-small", "lr-big", "old"]),
    ("-learning_rate", ["old", "lr-big", "lr-small"]),
    ("-gamma", ["lr-small", "old", "lr-big"]),             # equal values keep the directory order
    ("gamma", ["lr-big", "lr-small", "old"]),
    ("hidden_sizes", ["lr-small", "old", "lr-big"]),       # as numbers: 64,64 before 128,128
    ("-hidden_sizes", ["lr-big", "lr-small", "old"]),
    ("-final_return", ["lr-big", "lr-small", "old"]),      # the run without a summary last, either way
    ("final_return", ["lr-small", "lr-big", "old"]),
    ("env_kwargs.g", ["lr-big", "lr-small", "old"]),       # the run without the key last
    ("-env_kwargs.g", ["lr-small", "lr-big", "old"]),
])
def test_sort_by_any_config_field(runs_dir, capsys, sort, expected):
    assert listed(runs_dir, capsys, f"--sort={sort}") == expected


@pytest.mark.parametrize("args, names", [
    (["--filter", "learning_rat=0.1"], ["--filter", "'learning_rat'", "did you mean learning_rate", "config field",
                                        "final_return"]),
    (["--sort=-gama"], ["--sort", "'gama'", "did you mean gamma", "config field"]),
    (["--filter", "seed=abc"], ["--filter 'seed=abc'", "seed='abc'", "integer"]),
    (["--filter", "sync=maybe"], ["sync='maybe'", "true or false"]),
], ids=["unknown-filter-key", "unknown-sort-key", "filter-value-not-an-integer", "filter-value-not-a-bool"])
def test_bad_key_or_value_is_one_line_exit_2(runs_dir, capsys, args, names):
    capsys.readouterr()
    code = main(["runs", str(runs_dir), *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out)
    assert len(err.splitlines()) == 1 and err.startswith("rlvitals: error: "), err
    for name in names:
        assert name in err, f"{name!r} missing from {err!r}"
