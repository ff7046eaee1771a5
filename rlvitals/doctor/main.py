"""Running the doctor: the ladder under each leg, the Ray leg, the env check; verdicts and the printed report."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlvitals.actors.probes import PROBES
from rlvitals.telemetry.verdicts import Verdict

from ..config import TrainConfig
from .invariant_evidence import broken_in, invariant_verdict
from .ladder import LEARNING_SETTINGS, REFERENCE, Leg, ProbeResult, probe_config, run_ladder, user_leg
from .patterns import FALLBACK_RULE, fallback_component, healthy, infer, pattern_text
from .settings import settings_verdict, show
from .steplimit import DEFAULT_STEP_TIMEOUT


@dataclass
class DoctorRequest:
    seed: int = 0
    keep: str | None = None
    config: TrainConfig | None = None
    """The user's config (`--config`): its learning settings make the second leg."""
    ray: bool = False
    env: str | None = None
    """A resolved gymnasium id to check (`--env`)."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for that env's constructor (`--env-kwargs`, else the config's for the same env)."""
    max_episode_steps: int | None = None
    step_timeout: float = DEFAULT_STEP_TIMEOUT
    """Seconds one step of that env may take before the check reports it blocked (`--step-timeout`)."""
    ladder: bool = True
    """Run the probe ladder (the reference leg, and the user's leg with `config`)."""
    probes: tuple = field(default_factory=lambda: PROBES)
    recurrent_size: int = 0
    """Run the memory probe with a recurrent policy of this size (`--recurrent-size`, else the config's; 0: not)."""


def _verdict(rule: str, severity: str, component: str, started: float, message: str) -> Verdict:
    return Verdict(rule, severity, component, round(time.perf_counter() - started, 3), None, message)


def _leg_verdict(results: list[ProbeResult], leg: Leg, started: float) -> Verdict | None:
    """The verdict of one leg on its own: the invariants it broke, else its pattern, the row it matches."""
    where = f"with the {_label(leg)}"
    broken: dict[str, list[str]] = {}
    for r in results:
        for name in r.invariants:
            broken.setdefault(name, []).append(r.probe.name)
    from_invariants = invariant_verdict(broken, where, time.perf_counter() - started)
    if from_invariants is not None:
        return from_invariants
    pattern, text = infer(results)
    if healthy(results):
        return None
    if pattern is None:
        component = fallback_component(results)
        return _verdict(FALLBACK_RULE, "critical", component, started,
                        f"pattern {where}: {text}. No row of the pattern table matches; the first failing probe "
                        f"alone implicates {component}.")
    return _verdict(pattern.rule, "critical", pattern.component, started,
                    f"pattern {where}: {text}. Reading: {pattern.reading}. Check {pattern.check}.")


def run_doctor(request: DoctorRequest, stream=None, quiet: bool = False) -> list[Verdict]:
    """Run what the request asks for; print the report to `stream` unless quiet; return the verdicts."""
    stream = stream or sys.stdout
    say = (lambda line: None) if quiet else (lambda line: print(line, file=stream, flush=True))
    started = time.perf_counter()
    verdicts: list[Verdict] = []
    if request.env is not None:
        from .envcheck import check_env

        found, lines = check_env(request.env, request.seed, request.max_episode_steps, request.env_kwargs,
                                 request.step_timeout)
        verdicts += found
        for line in lines:
            say(line)
    with tempfile.TemporaryDirectory(prefix="rlvitals-doctor-") as tmp:
        parent = Path(request.keep) if request.keep else Path(tmp)
        if request.ladder:
            verdicts += _run_ladder(request, parent, started, say)
        if request.recurrent_size:
            from .memory import run_memory_probe

            settings = user_leg(request.config).settings if request.config is not None else None
            found, lines = run_memory_probe(request.seed, parent, request.recurrent_size, settings, started)
            verdicts += found
            for line in lines:
                say(line)
        if request.ray:
            from .rayleg import RAY_PROBE, run_ray_leg

            say(f"ray leg: {RAY_PROBE.name} with one Ray actor, local vs synchronous, and asynchronous")
            found, lines = run_ray_leg(request.seed, parent, REFERENCE, started)
            verdicts += _ray_invariants(parent, started) + found
            for line in lines:
                say(line)
    say(f"doctor finished in {time.perf_counter() - started:.1f}s")
    if verdicts:
        for v in verdicts:
            say(f"verdict [{v.severity}] {v.component}: {v.rule}: {v.message}")
    else:
        done = (["every probe passes" + (" with both settings" if request.config is not None else "")]
                if request.ladder else [])
        done += ["the recurrent policy remembers the memory probe's cue"] if request.recurrent_size else []
        done += ["the Ray actor follows the learner and replays local mode"] if request.ray else []
        done += ["the env checks pass"] if request.env is not None else []
        say("healthy: " + "; ".join(done))
    return verdicts


def _ray_invariants(parent: Path, started: float) -> list[Verdict]:
    """The invariants the Ray leg's runs broke (local, synchronous, asynchronous), as one verdict."""
    broken: dict[str, list[str]] = {}
    for mode in ("local", "sync", "async"):
        for name in broken_in(parent / "ray" / mode):
            broken.setdefault(name, []).append(f"ray {mode}")
    found = invariant_verdict(broken, "in the Ray leg", time.perf_counter() - started)
    return [found] if found is not None else []


def _run_ladder(request: DoctorRequest, parent: Path, started: float, say) -> list[Verdict]:
    legs = [REFERENCE] + ([user_leg(request.config)] if request.config is not None else [])
    results: dict[str, list[ProbeResult]] = {}
    for leg in legs:
        say(f"probe ladder, {_label(leg)}: {_settings_line(leg)}")
        results[leg.name] = run_ladder(request.seed, parent, leg, request.probes,
                                       on_result=lambda r: say(_result_line(r)))
    for line in _side_by_side(legs, results):
        say(line)
    for leg in legs:
        say(f"pattern, {_label(leg)}: {pattern_text(results[leg.name])}")
    reference = _leg_verdict(results[REFERENCE.name], REFERENCE, started)
    out = [reference] if reference is not None else []
    for leg in legs[1:]:
        mine = results[leg.name]
        if healthy(mine):
            continue
        if reference is None:
            out.append(settings_verdict(mine, leg, request.seed, parent, started, say))
        elif pattern_text(mine) != pattern_text(results[REFERENCE.name]):
            found = _leg_verdict(mine, leg, started)
            if found is not None and (found.rule, found.component) != (reference.rule, reference.component):
                out.append(found)   # the same broken invariant under both settings is one finding
    return out


def _label(leg: Leg) -> str:
    return "reference settings" if leg is REFERENCE else "your settings"


def _settings_line(leg: Leg) -> str:
    cfg = probe_config(PROBES[0].env_id, 0, "")
    values = {name: leg.settings.get(name, getattr(cfg, name)) for name in LEARNING_SETTINGS}
    return ", ".join(f"{name}={show(value)}" for name, value in values.items())


def _result_line(r: ProbeResult) -> str:
    mark = "n/a " if r.skipped else ("PASS" if r.passed else "FAIL")
    return f"{mark}  {r.leg:9s} {r.probe.name} {r.probe.env_id:20s} {r.seconds:5.1f}s  {'; '.join(r.details)}"


def _side_by_side(legs: list[Leg], results: dict[str, list[ProbeResult]]) -> list[str]:
    width = max(len(p.summary) for p in PROBES)
    lines = [f"{'probe':5s} {'what it is':{width}s}  " + "  ".join(f"{leg.name:16s}" for leg in legs)]
    for probe in PROBES:
        marks = [next((r.mark() for r in results[leg.name] if r.probe is probe), "-") for leg in legs]
        lines.append(f"{probe.name:5s} {probe.summary:{width}s}  " + "  ".join(f"{m:16s}" for m in marks))
    return [line.rstrip() for line in lines]


def verdicts_json(verdicts: list[Verdict]) -> str:
    return json.dumps([v.to_dict() for v in verdicts], indent=1)
