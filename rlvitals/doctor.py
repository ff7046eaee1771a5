"""`rlvitals doctor`: the probe ladder, run in local mode, naming the first broken component.

Each probe adds one piece of RL to the one before it, so the first probe that
fails points at that piece (see rlvitals.actors.probes.PROBES).
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvitals.actors.probes import PROBES, ProbeSpec

from .archive import RunArchive
from .config import TrainConfig
from .training import train_local

VALUE_TOLERANCE = 0.05
PROBABILITY_TOLERANCE = 0.05


def probe_config(env_id: str, seed: int, run_dir: str) -> TrainConfig:
    """Small, fast PPO settings; the probes are learned in a second or two when the code is right."""
    return TrainConfig(env=env_id, seed=seed, run_dir=run_dir, total_env_steps=12_000, num_envs=16,
                       rollout_length=16, num_minibatches=2, update_epochs=4, learning_rate=5e-3,
                       gamma=0.9, progress=False, verbosity="off", log_every_updates=1000).validate()


@dataclass
class ProbeResult:
    probe: ProbeSpec
    passed: bool
    details: list[str]
    seconds: float


def check_probe(probe: ProbeSpec, net, gamma: float) -> tuple[bool, list[str]]:
    """Compare the learned values and action probabilities with the probe's exact answers."""
    obs = torch.tensor([[o] for o in probe.observations], dtype=torch.float32)
    with torch.no_grad():
        params, values = net(obs)
        probs = torch.softmax(params, -1)
    ok, details = True, []
    for i, o in enumerate(probe.observations):
        expected = probe.values[i] if probe.values[i] is not None else gamma
        v = float(values[i])
        good = abs(v - expected) <= VALUE_TOLERANCE
        ok &= good
        details.append(f"V({o:+.0f})={v:.3f} want {expected:.3f}{'' if good else '  <-- wrong'}")
        best = probe.best_actions[i]
        if best is not None:
            p = float(probs[i, best])
            good = p >= 1 - PROBABILITY_TOLERANCE
            ok &= good
            details.append(f"pi(a={best}|{o:+.0f})={p:.3f} want >= {1 - PROBABILITY_TOLERANCE:.2f}"
                           f"{'' if good else '  <-- wrong'}")
    return ok, details


def run_probe(probe: ProbeSpec, seed: int, parent: Path) -> ProbeResult:
    from .evaluate import load_network

    start = time.perf_counter()
    run_dir = parent / probe.env_id.replace("/", "-")
    cfg = probe_config(probe.env_id, seed, str(run_dir))
    archive = RunArchive.create(str(run_dir), cfg.to_dict(), ["doctor"])
    try:
        train_local(cfg, archive)
    finally:
        archive.close()
    _, net = load_network(str(run_dir))
    passed, details = check_probe(probe, net, cfg.gamma)
    return ProbeResult(probe, passed, details, time.perf_counter() - start)


def run_doctor(seed: int = 0, keep: str | None = None, stream=None) -> bool:
    stream = stream or sys.stdout
    with tempfile.TemporaryDirectory(prefix="rlvitals-doctor-") as tmp:
        parent = Path(keep) if keep else Path(tmp)
        results = []
        for probe in PROBES:
            result = run_probe(probe, seed, parent)
            results.append(result)
            mark = "PASS" if result.passed else "FAIL"
            print(f"{mark}  {probe.env_id:22s} {result.seconds:5.1f}s  {'; '.join(result.details)}", file=stream)
    failures = [r for r in results if not r.passed]
    if not failures:
        print("all probes pass: value loss, discounting, backprop, policy update and batching look right",
              file=stream)
        return True
    first = failures[0]
    print(f"first failing probe: {first.probe.env_id}: suspect {first.probe.implicates}", file=stream)
    return False
