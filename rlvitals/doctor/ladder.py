"""The probe ladder: train every probe in local mode with one leg's settings and check it exactly.

A *leg* is a set of learning settings: the reference settings (small, fast PPO
that learns every probe when the code is right) or the reference settings with
the user's learning settings laid over them (`rlvitals doctor --config`). Each
probe run yields its checks: the value at every probe observation, the best
action's probability, a policy that must stay uniform, and whether the value
moved at all from the network's initial weights.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlvitals.actors.probes import GAMMA_PROBES, PROBES, REFERENCE_GAMMA, ProbeSpec, gamma_env_id

from ..archive import RunArchive
from ..config import TrainConfig
from .invariant_evidence import broken_in

VALUE_TOLERANCE = 0.05
"""|V - correct V| allowed for a probe's value to count as learned."""
PROBABILITY_TOLERANCE = 0.05
"""pi(best action) must reach 1 - this."""
UNIFORM_TOLERANCE = 0.35
"""|pi(a) - 1/n| allowed where no action is better than another."""
UNIFORM_MIN_ENTROPY_COEF = 0.1
"""The entropy coefficient from which a uniform policy is a decisive answer (P8).

Without an entropy bonus nothing holds a policy whose advantages are pure
noise: the noise alone walks it, and Adam, which takes steps of the same size
whatever the gradient's, can walk it to a single action within a probe run.
With the bonus the walk is pulled back; from about 0.1 the pull keeps pi well
inside the tolerance, and a bonus with its sign flipped drives pi to one action."""
FROZEN_TOLERANCE = 1e-6
"""A value that moved less than this from its initial value over a whole probe run never learned."""

PROBE_ENV_STEPS = 4_000
"""Agent steps each probe is trained for (31 updates of 8 optimizer steps for the one-step probes)."""

LEARNING_SETTINGS: dict[str, str] = {
    "learning_rate": "optimizer",
    "anneal_lr": "optimizer",
    "max_grad_norm": "optimizer",
    "update_epochs": "optimizer",
    "num_minibatches": "optimizer",
    "hidden_sizes": "optimizer",
    "gamma": "returns",
    "gae_lambda": "returns",
    "vtrace_rho_clip": "returns",
    "vtrace_c_clip": "returns",
    "value_coef": "value",
    "clip_coef": "policy",
    "entropy_coef": "policy",
    "normalize_advantages": "policy",
}
"""The config fields `doctor --config` takes from the user's file, and the component each one tunes."""


def probe_config(env_id: str, seed: int, run_dir: str) -> TrainConfig:
    """The reference settings: small, fast PPO that learns every probe in a second or two when the code is right.

    The learning rate stays constant: a decaying one would settle even an
    optimizer that is broken (steps too large, or its state lost every step),
    and the probes must judge the optimizer at its working step size.
    """
    return TrainConfig(env=env_id, seed=seed, run_dir=run_dir, total_env_steps=PROBE_ENV_STEPS, num_envs=16,
                       rollout_length=16, num_minibatches=2, update_epochs=4, learning_rate=5e-3, anneal_lr=False,
                       gamma=REFERENCE_GAMMA, progress=False, verbosity="off").validate()


@dataclass(frozen=True)
class Leg:
    """One set of learning settings the whole ladder is run with."""

    name: str
    settings: dict = field(default_factory=dict)
    """Learning settings laid over the reference ones (field -> value); empty for the reference leg."""

    def config(self, probe: ProbeSpec, seed: int, run_dir: str) -> TrainConfig:
        cfg = dataclasses.replace(probe_config(probe.env_id, seed, run_dir), device="cpu", torch_threads=1,
                                  **self.settings)
        if probe.env_id in GAMMA_PROBES:
            # V = 1 is learned by bootstrapping alone, which at gamma near 1 takes far longer than a probe
            # run; what they test (bootstrapping, time limits, discounting at all) does not depend on gamma's
            # value, so they run at gamma <= the reference one, with reward (1 - gamma): V = 1.
            cfg.gamma = min(cfg.gamma, REFERENCE_GAMMA)
            cfg.env = gamma_env_id(probe.env_id, cfg.gamma)
        # num_minibatches must divide the batch: widen the batch to a multiple of it
        cfg.num_envs = cfg.num_minibatches * math.ceil(cfg.num_envs / cfg.num_minibatches)
        return cfg.validate()

    def differences(self, reference: Leg) -> dict[str, tuple]:
        """field -> (this leg's value, the reference's value) for every learning setting that differs."""
        ref = probe_config(PROBES[0].env_id, 0, "")
        out = {}
        for name in LEARNING_SETTINGS:
            mine = self.settings.get(name, getattr(ref, name))
            theirs = reference.settings.get(name, getattr(ref, name))
            if mine != theirs:
                out[name] = (mine, theirs)
        return out


REFERENCE = Leg("reference")


def user_leg(cfg: TrainConfig) -> Leg:
    """The leg of a user's config: its learning settings over the reference ones."""
    return Leg("yours", {name: getattr(cfg, name) for name in LEARNING_SETTINGS})


def not_decisive(probe: ProbeSpec, cfg: TrainConfig) -> str:
    """Why the probe has no decisive answer under these settings ('' when it has one)."""
    if probe.uniform_policy and cfg.entropy_coef < UNIFORM_MIN_ENTROPY_COEF:
        return f"entropy_coef={cfg.entropy_coef:g} < {UNIFORM_MIN_ENTROPY_COEF:g}: nothing holds a noise-driven policy"
    return ""


@dataclass
class ProbeResult:
    probe: ProbeSpec
    leg: str
    checks: dict[str, bool]
    """Check name -> passed: "V" values, "pi" action probabilities, "r" (P1) a reward reached the learner."""
    frozen: bool
    """The value never moved from its initial value at any probe observation."""
    details: list[str]
    seconds: float
    skipped: str = ""
    """Why the probe was not run under this leg (empty when it was)."""
    discrepancy: float | None = None
    """Largest |learner log pi(a|o) - actor log mu(a|o)| over the run's batches (all at staleness 0 in local
    mode, so it must be 0); None where the learner recorded none (one-action probes: log pi is always 0)."""
    invariants: dict[str, int | None] = field(default_factory=dict)
    """Invariants the probe run broke (telemetry/invariants.py) -> the update each broke at."""

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def mark(self) -> str:
        """The probe's cell in the printed pattern."""
        if self.skipped:
            return "n/a"
        if self.passed:
            return "pass"
        bad = [name for name, ok in self.checks.items() if not ok]
        frozen = " frozen" if self.frozen and "V" in bad else ""
        return f"FAIL({'+'.join(bad)}{frozen})"


def expected_value(probe: ProbeSpec, i: int, gamma: float, probs=None) -> float:
    """The correct V at the probe's i-th observation (for action probes: of the policy `probs` learned)."""
    if probe.rewards and probs is not None:
        return float(sum(float(p) * r for p, r in zip(probs[i], probe.rewards[i], strict=True)))
    want = probe.values[i]
    return gamma if want is None else want


def evaluate(probe: ProbeSpec, net, gamma: float, initial=None) -> tuple[dict[str, bool], bool, list[str]]:
    """(checks, frozen, details) of a trained network against the probe's exact answers.

    `initial` is the same network before training; without it the value never counts as frozen.
    """
    obs = torch.tensor([[o] for o in probe.observations], dtype=torch.float32)
    with torch.no_grad():
        params, values = net(obs)
        probs = torch.softmax(params, -1)
        start = initial(obs)[1] if initial is not None else None
    checks: dict[str, bool] = {}
    details: list[str] = []
    for i, o in enumerate(probe.observations):
        v = float(values[i])
        if i < len(probe.values):
            want = expected_value(probe, i, gamma, probs)
            good = math.isfinite(v) and abs(v - want) <= VALUE_TOLERANCE
            checks["V"] = checks.get("V", True) and good
            details.append(f"V({o:+.0f})={v:.3f} want {want:.3f}{'' if good else '  <-- wrong'}")
            if probe.reward_check:
                seen = not (abs(v) <= VALUE_TOLERANCE)
                checks["r"] = checks.get("r", True) and seen
                if not seen:
                    details.append("V is the value of no reward at all: no reward reached the learner")
        best = probe.best_actions[i]
        if best is not None:
            p = float(probs[i, best])
            good = p >= 1 - PROBABILITY_TOLERANCE
            checks["pi"] = checks.get("pi", True) and good
            details.append(f"pi(a={best}|{o:+.0f})={p:.3f} want >= {1 - PROBABILITY_TOLERANCE:.2f}"
                           f"{'' if good else '  <-- wrong'}")
        if probe.uniform_policy:
            n = probs.shape[-1]
            worst = float((probs[i] - 1.0 / n).abs().max())
            good = worst <= UNIFORM_TOLERANCE
            checks["pi"] = checks.get("pi", True) and good
            shown = ", ".join(f"{float(p):.3f}" for p in probs[i])
            details.append(f"pi(.|{o:+.0f})=({shown}) want each within {UNIFORM_TOLERANCE} of {1 / n:.2f}"
                           f"{'' if good else '  <-- wrong'}")
    frozen = start is not None and bool(probe.values) and bool(
        ((values - start).abs()[: len(probe.values)] <= FROZEN_TOLERANCE).all())
    return checks, frozen, details


def check_probe(probe: ProbeSpec, net, gamma: float) -> tuple[bool, list[str]]:
    """Whether a trained network has the probe's exact values and action probabilities, and what it has."""
    checks, _, details = evaluate(probe, net, gamma)
    return all(checks.values()), details


def initial_network(cfg: TrainConfig):
    """The network a run of `cfg` starts from (same seed, same construction as the run loop)."""
    from rlvitals.actors.runner import EnvRunner

    from ..training import make_network, seed_everything

    runner = EnvRunner(cfg.env, 1, seed=0, env_kwargs=cfg.env_kwargs)
    try:
        seed_everything(cfg.seed, cfg.torch_threads)
        net = make_network(cfg, runner.obs_space, runner.action_space)
    finally:
        runner.close()
    net.eval()
    return net


def run_probe(probe: ProbeSpec, seed: int, parent: Path, leg: Leg = REFERENCE) -> ProbeResult:
    """Train one probe in local mode under `leg` (run directory kept under `parent`) and check it."""
    from ..evaluate import load_network
    from ..training import train_local

    start = time.perf_counter()
    run_dir = parent / leg.name / probe.env_id.replace("/", "-")
    cfg = leg.config(probe, seed, str(run_dir))
    why = not_decisive(probe, cfg)
    if why:
        return ProbeResult(probe, leg.name, {}, False, [f"not run: not decisive with {why}"], 0.0, skipped=why)
    initial = initial_network(cfg)
    archive = RunArchive.create(str(run_dir), cfg.to_dict(), ["doctor"])
    try:
        train_local(cfg, archive)
    finally:
        archive.close()
    _, net = load_network(str(run_dir))
    checks, frozen, details = evaluate(probe, net, cfg.gamma, initial)
    return ProbeResult(probe, leg.name, checks, frozen, details, time.perf_counter() - start,
                       discrepancy=recorded_discrepancy(run_dir) if probe.best_actions[0] is not None or
                       probe.uniform_policy else None, invariants=broken_in(run_dir))


def recorded_discrepancy(run_dir: Path) -> float | None:
    """The largest actor-learner log-probability discrepancy a run's metrics rows recorded (None: none)."""
    found = None
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else ():
        value = json.loads(line).get("logp_discrepancy")
        if isinstance(value, (int, float)) and math.isfinite(value):
            found = value if found is None else max(found, value)
    return found


def run_ladder(seed: int, parent: Path, leg: Leg = REFERENCE, probes=PROBES, on_result=None) -> list[ProbeResult]:
    results = []
    for probe in probes:
        result = run_probe(probe, seed, parent, leg)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
