"""The metric reference (docs/metrics.md) says which keys metrics.jsonl holds: a real short run at each
verbosity writes exactly those. The env is the telemetry tests' tiny env, in which every statistic is defined.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from telemetry_support import installed_test_env

from rlvitals.telemetry import reference, rowkeys
from rlvitals.telemetry.catalogue import LEVELS, METRICS

PAGE = reference.DEFAULT_OUTPUT.read_text()


@pytest.fixture(scope="module")
def test_env(tmp_path_factory):
    with installed_test_env(tmp_path_factory) as env:
        yield env


def written_keys(run_dir, level: str, test_env) -> set[str]:
    folder, env_spec = test_env
    done = subprocess.run(
        [sys.executable, "-m", "rlvitals.cli", "train", "--env", env_spec, "--total-env-steps", "2000",
         "--num-envs", "4", "--rollout-length", "32", "--num-minibatches", "2", "--update-epochs", "2",
         "--run-dir", str(run_dir), "--verbosity", level, "--progress", "false"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(folder)})
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= 10
    return set().union(*rows)


def page_patterns(level: str) -> list[re.Pattern]:
    """What the page says a row holds at `level`, as patterns (`{label}` stands for any of its values)."""
    keys = re.findall(r"^- \*\*metrics\.jsonl key:\*\* `([^`]+)`$", PAGE, flags=re.M)
    section = PAGE[PAGE.index("## metrics.jsonl"):PAGE.index("## Index")]
    keys += re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    if level == "debug":
        keys += re.findall(r"`([a-z_]+/)<layer>`", section)
    return [re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[a-z_]+", re.escape(k)) + ("[^/]+" if k.endswith("/") else ""))
            for k in keys]


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS)
def test_a_run_writes_exactly_the_keys_the_reference_names(level, tmp_path, test_env):
    written = written_keys(tmp_path / "run", level, test_env)

    patterns = page_patterns(level)
    unnamed = sorted(key for key in written if not any(p.fullmatch(key) for p in patterns))
    assert not unnamed, f"written at {level} but not on docs/metrics.md: {unnamed}"
    never = [p.pattern for p in patterns if not any(p.fullmatch(key) for key in written)
             and p.pattern not in rowkeys.OCCASIONAL_KEYS]   # Ray-only keys: this run is local
    assert not never, f"on docs/metrics.md but never written at {level}: {never}"

    # Every value of every label, and each per-layer key for some layer.
    keys, prefixes = rowkeys.row_keys(level)
    exact = written - {k for k in written if k.startswith(tuple(prefixes))}
    assert keys - set(rowkeys.OCCASIONAL_KEYS) <= exact <= keys, (sorted(keys - exact), sorted(exact - keys))
    assert all(any(k.startswith(prefix) for k in written) for prefix in prefixes)


def test_the_page_names_no_key_that_is_left_out_of_rows():
    for metric in METRICS:
        if metric.source and metric.not_in_rows:
            assert f"**metrics.jsonl key:** `{metric.source}`" not in PAGE, metric.name
            assert f"**Not in metrics.jsonl:** {metric.not_in_rows}." in PAGE, metric.name
