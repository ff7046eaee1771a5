"""`rlvitals doctor --ray`: the Ray path with one actor, asynchronous and synchronous.

- Asynchronous: the actor's network age must follow the learner's age. With
  one actor keeping `rollouts_in_flight` rollouts requested ahead, a batch can be
  at most that many updates old (`bound`); anything older means weights are not
  reaching the actor. The probe must still be learned (V-trace corrects the lag).
- Synchronous: one actor acting with the newest weights every round replays
  local mode exactly, so the trained network's values and action
  probabilities must equal the local run's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from rlvitals.actors.probes import PROBES
from rlvitals.telemetry.verdicts import Verdict

from ..archive import RunArchive
from .ladder import REFERENCE, Leg, evaluate, initial_network

RAY_PROBE = PROBES[4]
"""Probe 5: observations, actions and rewards must stay paired across the process boundary."""


def staleness_bound(cfg) -> int:
    """Largest staleness one actor can produce when weights reach it: rollouts ahead x steps per update."""
    return cfg.rollouts_in_flight * cfg.update_epochs * cfg.num_minibatches


def _outputs(net) -> torch.Tensor:
    obs = torch.tensor([[o] for o in RAY_PROBE.observations], dtype=torch.float32)
    with torch.no_grad():
        params, values = net(obs)
    return torch.cat([torch.softmax(params, -1), values.unsqueeze(-1)], -1)


def _train(cfg, run_dir: Path, mode: str) -> dict:
    from ..evaluate import load_network

    archive = RunArchive.create(str(run_dir), cfg.to_dict(), ["doctor", "--ray"])
    try:
        if mode == "local":
            from ..training import train_local

            summary = train_local(cfg, archive)
        else:
            from ..distributed import train_ray

            summary = train_ray(cfg, archive)
    finally:
        archive.close()
    # A run that made no update saved no checkpoint: there is no network to compare, which is itself the finding.
    net = load_network(str(run_dir))[1] if summary.get("updates", 0) > 0 else None
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return {"net": net, "summary": summary, "rows": rows}


def no_update_message(mode: str, run: dict) -> str | None:
    """Why a leg's run is not judged further: it made no update (None when it made some)."""
    if run["net"] is not None:
        return None
    samples = run["summary"].get("samples", {})
    dropped = sum(samples.get("dropped", {}).values())
    return (f"the {mode} run made no update in its whole budget of {run['cfg'].total_env_steps} env steps "
            f"({samples.get('produced', 0)} samples arrived, {dropped} dropped, {samples.get('in_flight', 0)} left "
            "in flight): no batch reached the learner's update; check that actors deliver rollouts, that they are "
            "not all dropped (stale weights), and that the learner is not stalled")


def run_ray_leg(seed: int, parent: Path, leg: Leg = REFERENCE, started: float | None = None
                ) -> tuple[list[Verdict], list[str]]:
    """(verdicts, human lines) of the Ray leg: probe 5 in local, Ray-sync and Ray-async mode."""
    started = time.perf_counter() if started is None else started
    base = leg.config(RAY_PROBE, seed, "")
    ray_cfg = dict(mode="ray", num_actors=1, actor_cpus=1.0, address="", verbosity="off")
    verdicts: list[Verdict] = []
    lines: list[str] = []

    def verdict(rule: str, component: str, message: str) -> None:
        verdicts.append(Verdict(rule, "critical", component, round(time.perf_counter() - started, 3), None, message))

    runs = {}
    for mode, extra in (("local", {}), ("sync", {**ray_cfg, "sync": True}), ("async", {**ray_cfg, "sync": False})):
        t0 = time.perf_counter()
        run_dir = parent / "ray" / mode
        cfg = dataclasses.replace(base, run_dir=str(run_dir), **extra).validate()
        runs[mode] = _train(cfg, run_dir, "local" if mode == "local" else "ray")
        runs[mode]["cfg"] = cfg
        runs[mode]["seconds"] = time.perf_counter() - t0

    stalled = {mode: no_update_message(mode, run) for mode, run in runs.items()}
    for mode, message in stalled.items():
        if message is not None:
            lines.append(f"FAIL  {mode:<20} {runs[mode]['seconds']:5.1f}s  no update: nothing to compare")
            verdict(f"doctor-ray-{mode}-no-update", "throughput", message)
    local, sync, asyn = runs["local"], runs["sync"], runs["async"]
    if stalled["local"] is None and stalled["sync"] is None:  # both made updates: compare them
        same = torch.equal(_outputs(local["net"]), _outputs(sync["net"]))
        lines.append(f"{'PASS' if same else 'FAIL'}  ray sync, 1 actor   {sync['seconds']:5.1f}s  {RAY_PROBE.name} "
                     f"values and action probabilities {'equal' if same else 'differ from'} local mode's")
        if not same:
            diff = float((_outputs(local["net"]) - _outputs(sync["net"])).abs().max())
            verdict("doctor-ray-sync-differs-from-local", "weight-sync",
                    f"Ray mode with one synchronous actor does not replay local mode on {RAY_PROBE.name} "
                    f"(outputs differ by up to {diff:.3g}): the actor acts with other weights or other data than "
                    "the learner's; check that weights are published after every update and that the actor loads them")

    if stalled["async"] is None:
        cfg = asyn["cfg"]
        bound = staleness_bound(cfg)
        staleness = [row["staleness"] for row in asyn["rows"] if "staleness" in row]
        dropped = asyn["summary"].get("samples", {}).get("dropped", {}).get("stale", 0)
        checks, frozen, details = evaluate(RAY_PROBE, asyn["net"], cfg.gamma, initial_network(cfg))
        worst = max(staleness) if staleness else None
        follows = bool(staleness) and worst <= bound and not dropped
        lines.append(f"{'PASS' if follows else 'FAIL'}  ray async, 1 actor  {asyn['seconds']:5.1f}s  "
                     f"staleness max {worst} (bound {bound}) over {len(staleness)} batches, {dropped} samples dropped "
                     "as stale")
        if not staleness:
            verdict("doctor-ray-staleness-unrecorded", "telemetry",
                    "the asynchronous Ray run recorded no `staleness` in metrics.jsonl, so the actor's network age "
                    "cannot be checked against the learner's age")
        elif not follows:
            first = next((i for i, s in enumerate(staleness) if s > bound), len(staleness) - 1)
            verdict("doctor-ray-weights-fall-behind", "weight-sync",
                    f"with one asynchronous actor and rollouts_in_flight={cfg.rollouts_in_flight}, batches should be "
                    f"at most {bound} learner steps old, but batch {first + 1} was {staleness[first]:g} old (max "
                    f"{worst:g}, {dropped} samples dropped as stale): the actor's network age does not follow the "
                    "learner's age; check that new weights are published and that the actor loads them")
        passed = all(checks.values())
        lines.append(f"{'PASS' if passed else 'FAIL'}  ray async {RAY_PROBE.name} learned        {'; '.join(details)}")
        if not passed and follows:
            verdict("doctor-ray-async-probe-fails", "weight-sync",
                    f"{RAY_PROBE.name} is learned in local mode but not with one asynchronous Ray actor "
                    f"({'; '.join(d for d in details if 'wrong' in d)}): the off-policy correction or what crosses "
                    "the process boundary (observations, actions, behaviour log-probabilities) is wrong")
    return verdicts, lines
