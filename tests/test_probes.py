"""The probe ladder: every probe is learned, `rlvitals doctor` says so, and the doctor can fail.

Training the five probes takes ~20 s of one core, so it is done once: this
module starts `rlvitals doctor --keep DIR` in the background when it starts
(the doctor trains each probe with `run_probe` and keeps its run directory),
runs the in-process negative control on the other core meanwhile, and then
checks every kept network independently of the doctor's own verdict.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlvitals import doctor
from rlvitals.actors.probes import PROBES
from rlvitals.doctor import PROBABILITY_TOLERANCE, VALUE_TOLERANCE, check_probe, probe_config, run_doctor
from rlvitals.evaluate import load_network

RLVITALS = str(Path(sys.executable).with_name("rlvitals")) if Path(sys.executable).with_name("rlvitals").exists() \
    else shutil.which("rlvitals")
DOCTOR_FIXTURE = "doctor_run"


@dataclass
class DoctorRun:
    proc: subprocess.Popen | None
    keep: Path
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""

    def wait(self) -> "DoctorRun":
        if self.proc is not None and self.returncode is None:
            try:
                self.stdout, self.stderr = self.proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.stdout, self.stderr = self.proc.communicate()
            self.returncode = self.proc.returncode
        return self


@pytest.fixture(scope="module", autouse=True)
def _doctor_in_background(request, tmp_path_factory):
    """Start `rlvitals doctor` as the module starts, when a selected test needs it."""
    keep = tmp_path_factory.mktemp("doctor-keep")
    proc = None
    if any(DOCTOR_FIXTURE in getattr(item, "fixturenames", ()) for item in request.session.items):
        proc = subprocess.Popen([RLVITALS, "doctor", "--seed", "0", "--keep", str(keep)], cwd=keep, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run = DoctorRun(proc, keep)
    yield run
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.fixture
def doctor_run(_doctor_in_background) -> DoctorRun:
    run = _doctor_in_background.wait()
    assert run.proc is not None
    return run


def _probe_id(probe) -> str:
    return probe.env_id.split("/")[-1]


def test_probe_specs_are_decisive():
    assert [p.env_id for p in PROBES] == [f"rlvitals/Probe{k}-v0" for k in range(1, 6)]
    for probe in PROBES:
        assert len(probe.observations) == len(probe.values) == len(probe.best_actions)
        assert probe.implicates
    assert "discounting" in PROBES[1].implicates
    # probe 2's first value is gamma: the probe gamma must be far enough from 1 for a wrong one to show
    assert 1.0 - probe_config(PROBES[1].env_id, 0, "unused").gamma > VALUE_TOLERANCE


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
    # the network really learned the undiscounted value, which check_probe rejects for gamma 0.9
    _, net = load_network(str(tmp_path / "rlvitals-Probe2-v0"))
    ok, details = check_probe(PROBES[1], net, 0.9)
    assert not ok and "V(+0)=1.0" in details[0] and "<-- wrong" in details[0]


@pytest.mark.slow
def test_doctor_command_passes(doctor_run):
    assert doctor_run.returncode == 0, doctor_run.stdout + doctor_run.stderr
    assert "Traceback" not in doctor_run.stderr
    lines = doctor_run.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:len(PROBES)]] == [["PASS", p.env_id] for p in PROBES]
    assert lines[-1].startswith("all probes pass")


@pytest.mark.slow
@pytest.mark.parametrize("probe", PROBES, ids=_probe_id)
def test_probe_is_learned(doctor_run, probe):
    """run_probe's network for each probe (kept by the doctor) has the exact values and best actions."""
    run_dir = doctor_run.keep / probe.env_id.replace("/", "-")
    assert (run_dir / "checkpoints" / "latest.pt").is_file(), doctor_run.stdout + doctor_run.stderr
    cfg, net = load_network(str(run_dir))
    assert cfg.env == probe.env_id and cfg.total_env_steps == probe_config(probe.env_id, 0, "").total_env_steps

    ok, details = check_probe(probe, net, cfg.gamma)
    assert ok, f"{probe.env_id}: {'; '.join(details)}"

    # The same criteria computed here, so a check_probe that always passed would be caught.
    obs = torch.tensor([[o] for o in probe.observations], dtype=torch.float32)
    with torch.no_grad():
        params, values = net(obs)
    probs = torch.softmax(params, -1)
    for i, o in enumerate(probe.observations):
        expected = probe.values[i] if probe.values[i] is not None else cfg.gamma
        assert abs(float(values[i]) - expected) <= 0.05, f"V({o}) = {float(values[i])}, want {expected}"
        if probe.best_actions[i] is not None:
            assert float(probs[i, probe.best_actions[i]]) >= 0.95, f"pi(a={probe.best_actions[i]}|{o})"
    assert VALUE_TOLERANCE == 0.05 and PROBABILITY_TOLERANCE == 0.05

    # check_probe must reject the same network against a wrong answer
    if probe.env_id.endswith("Probe2-v0"):
        assert not check_probe(probe, net, 1.0)[0]
    if any(a is not None for a in probe.best_actions):
        flipped = dataclasses.replace(probe, best_actions=tuple(None if a is None else 1 - a
                                                                for a in probe.best_actions))
        assert not check_probe(flipped, net, cfg.gamma)[0]
