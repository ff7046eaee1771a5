"""The probe ladder: every probe is learned, `rlvitals doctor` says so, and the doctor can fail.

`rlvitals doctor` (a subprocess of ~25 s) is started when this module starts,
so it runs on a second core while the in-process probe tests run here.
"""

from __future__ import annotations

import inspect
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvitals import doctor
from rlvitals.actors.probes import PROBES
from rlvitals.doctor import PROBABILITY_TOLERANCE, VALUE_TOLERANCE, check_probe, run_doctor, run_probe
from rlvitals.evaluate import load_network

RLVITALS = str(Path(sys.executable).with_name("rlvitals")) if Path(sys.executable).with_name("rlvitals").exists() \
    else shutil.which("rlvitals")
DOCTOR_TEST = "test_doctor_command_passes"


@pytest.fixture(scope="module", autouse=True)
def doctor_process(request, tmp_path_factory):
    """`rlvitals doctor` running in the background, when the doctor test is selected."""
    proc = None
    if any(item.name == DOCTOR_TEST for item in request.session.items):
        cwd = tmp_path_factory.mktemp("doctor")
        proc = subprocess.Popen([RLVITALS, "doctor", "--seed", "0"], cwd=cwd, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield proc
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()


def _probe_id(probe) -> str:
    return probe.env_id.split("/")[-1]


def test_probe_specs_are_decisive():
    assert [p.env_id for p in PROBES] == [f"rlvitals/Probe{k}-v0" for k in range(1, 6)]
    for probe in PROBES:
        assert len(probe.observations) == len(probe.values) == len(probe.best_actions)
        assert probe.implicates
    assert "discounting" in PROBES[1].implicates


@pytest.mark.slow
@pytest.mark.parametrize("probe", PROBES, ids=_probe_id)
def test_probe_is_learned(probe, tmp_path):
    result = run_probe(probe, seed=0, parent=tmp_path)
    assert result.passed, f"{probe.env_id}: {'; '.join(result.details)}"
    assert not any("wrong" in d for d in result.details)

    # Check the learned network directly, not only through check_probe's verdict.
    cfg, net = load_network(str(tmp_path / probe.env_id.replace("/", "-")))
    assert cfg.env == probe.env_id
    obs = torch.tensor([[o] for o in probe.observations], dtype=torch.float32)
    with torch.no_grad():
        params, values = net(obs)
    probs = torch.softmax(params, -1)
    for i, o in enumerate(probe.observations):
        expected = probe.values[i] if probe.values[i] is not None else cfg.gamma
        assert abs(float(values[i]) - expected) <= VALUE_TOLERANCE, f"V({o}) = {float(values[i])}, want {expected}"
        if probe.best_actions[i] is not None:
            assert float(probs[i, probe.best_actions[i]]) >= 1 - PROBABILITY_TOLERANCE
    assert VALUE_TOLERANCE == 0.05 and PROBABILITY_TOLERANCE == 0.05
    assert check_probe(probe, net, cfg.gamma)[0]
    if probe.env_id.endswith("Probe2-v0"):  # V(first) is gamma, so a wrong gamma cannot pass
        assert 1.0 - cfg.gamma > VALUE_TOLERANCE
        assert not check_probe(probe, net, 1.0)[0]


@pytest.mark.slow
def test_doctor_names_discounting_when_the_learner_ignores_gamma(monkeypatch, tmp_path):
    """Negative control: a learner that never discounts must fail probe 2 and be blamed on discounting."""
    from rlvitals.learner import ppo

    real_vtrace = ppo.vtrace
    signature = inspect.signature(real_vtrace)

    def undiscounted_vtrace(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["gamma"] = 1.0
        return real_vtrace(*bound.args, **bound.kwargs)

    monkeypatch.setattr(ppo, "vtrace", undiscounted_vtrace)
    monkeypatch.setattr(doctor, "PROBES", PROBES[:2])  # probe 1 must still pass, probe 2 must not
    out = io.StringIO()
    assert run_doctor(seed=0, keep=str(tmp_path), stream=out) is False
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("PASS  rlvitals/Probe1-v0"), lines
    assert lines[1].startswith("FAIL  rlvitals/Probe2-v0") and "<-- wrong" in lines[1], lines
    assert lines[-1] == "first failing probe: rlvitals/Probe2-v0: suspect reward discounting"
    assert "all probes pass" not in out.getvalue()


@pytest.mark.slow
def test_doctor_command_passes(doctor_process):
    assert doctor_process is not None
    try:
        out, err = doctor_process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        doctor_process.kill()
        out, err = doctor_process.communicate()
    assert doctor_process.returncode == 0, out + err
    assert "Traceback" not in err
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines[:len(PROBES)]] == [["PASS", p.env_id] for p in PROBES]
    assert "all probes pass" in lines[-1]
