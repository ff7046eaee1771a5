"""bench/gpu_pong.sh, the one-call device script, checked on the CPU: its refusals and its dry run.

The dry run runs in a copy of the repo's layout (the script finds everything from its own folder):
the wheels it would install are only looked for, so empty files stand for them; the learner profile it
runs is the real bench/learner_profile.py, on the CPU, briefly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEELS = ("rlvitals", "ray", "gymnasium", "ale_py")


def layout(root: Path, wheels=WHEELS, profile_script: bool = True) -> Path:
    (root / "bench" / "configs").mkdir(parents=True)
    for name in ("gpu_pong.sh", "learner_profile.py", "common.py", "configs/pong.yaml"):
        shutil.copy(REPO / "bench" / name, root / "bench" / name)
    (root / ".whl").mkdir()
    for wheel in wheels:
        (root / ".whl" / f"{wheel}-0-py3-none-any.whl").touch()
    if profile_script:
        (root / ".gpu").mkdir()
        (root / ".gpu" / "gpu-pong-profile").write_text("echo never run in a dry run; exit 1\n")
    return root / "bench" / "gpu_pong.sh"


def run(script: Path, out: Path | None, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, **env}
    if out is not None:
        environ["OUT"] = str(out)
    else:
        environ.pop("OUT", None)
    return subprocess.run(["bash", str(script)], env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("change, expected", [
    ({"wheels": ("rlvitals", "gymnasium", "ale_py")}, "no ray wheel in"),
    ({"profile_script": False}, "/.gpu/gpu-pong-profile: mkdir -p .gpu"),
])
def test_missing_prerequisites_are_named_before_anything_runs(tmp_path, change, expected):
    script = layout(tmp_path / "repo", **change)
    result = run(script, tmp_path / "out")
    assert result.returncode == 2, result
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_part_and_missing_out_are_refused(tmp_path):
    script = layout(tmp_path / "repo")
    bad = run(script, tmp_path / "out", PART="everything")
    assert bad.returncode == 2 and "PART=everything: expected profile or pong-config" in bad.stderr
    assert run(script, None).returncode != 0


@pytest.mark.timeout(900)  # a few seconds of CPU; the bound only catches a hang on a crowded machine
def test_dry_run_profiles_the_learner_on_the_cpu_and_plans_the_pong_runs(tmp_path):
    script = layout(tmp_path / "repo")
    out = tmp_path / "out"
    result = run(script, out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "+ env OUT=" in result.stdout and "gpu-pong-profile" in result.stdout  # planned, not run
    assert "--mixed-precision --cudnn-benchmark --channels-last" in result.stdout
    result = json.loads((out / "learner-profile_cuda_fp32.json").read_text())
    assert result["config"]["measured_on"] == "cpu" and result["machine"]["code_version"]
    learner = result["figures"]["learner"]["cartpole"]
    assert set(learner["timed"]["phase_ms_mean"]) == {"transfer", "targets", "forward_backward", "optimizer",
                                                      "statistics"}
    # The learner's phases are contiguous: they add up to its updates' wall time.
    assert 0.9 <= sum(learner["timed"]["phase_share"].values()) <= 1.0 + 1e-6
    assert result["figures"]["actor"]["cartpole"]["ms_per_collect"] > 0
    assert list((out / "traces").glob("*.json.gz"))
    planned = run(script, tmp_path / "out2", PART="pong-config")
    assert planned.returncode == 0 and "bench/configs/pong.yaml" in planned.stdout, planned.stdout + planned.stderr
