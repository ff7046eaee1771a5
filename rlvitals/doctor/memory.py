"""The memory probe: a recurrent policy must name a cue it saw `delay` steps before it answers.

rlvitals/MemoryProbe-v0 (actors/partial.py) shows +1 or -1 once, then zeros, then ends on the agent's
answer: +1 if it names the cue, -1 if not. A feed-forward policy's best expected return is 0; a correct
recurrent one reaches 1 within MEMORY_ENV_STEPS. So when the state's path is broken the probe says so
even where every invariant holds: the learner that cuts backpropagation through time, or a core whose
output never reaches the heads, replays exactly what the actor did and still cannot learn the cue.

A broken invariant of the probe's run names its owner first (the naming rule of telemetry/invariants.py);
an unsolved probe with every invariant holding names the learner: the actor's carry and resets and the
learner's replay are the invariants' (state, replay), what is left is how the learner learns through time.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from rlvitals.actors.partial import MEMORY_PROBE
from rlvitals.telemetry.verdicts import Verdict

from ..archive import RunArchive
from ..config import TrainConfig
from .invariant_evidence import broken_in, invariant_verdict

MEMORY_ENV_STEPS = 12_000
"""Agent steps of the probe run: a correct recurrent policy is at 1.0 well before (about 6,000 on this code)."""
SOLVED_RETURN = 0.9
"""Mean return of the last 100 episodes that counts as remembering: a policy without memory averages 0."""
RULE = "RLDoctorMemoryProbeUnsolved"


def memory_config(seed: int, run_dir: str, recurrent_size: int, settings: dict | None = None) -> TrainConfig:
    """The probe's run: small and fast, with the user's learning settings (a leg's) laid over it."""
    cfg = TrainConfig(env=MEMORY_PROBE, seed=seed, run_dir=run_dir, total_env_steps=MEMORY_ENV_STEPS, num_envs=8,
                      rollout_length=32, num_minibatches=4, update_epochs=4, recurrent_size=recurrent_size,
                      device="cpu", torch_threads=1, progress=False, verbosity="standard")
    for name, value in (settings or {}).items():
        setattr(cfg, name, value)
    if cfg.num_envs % cfg.num_minibatches:   # minibatches split a recurrent batch by env
        cfg.num_envs = cfg.num_minibatches * math.ceil(cfg.num_envs / cfg.num_minibatches)
    return cfg.validate()


def run_memory_probe(seed: int, parent: Path, recurrent_size: int, settings: dict | None,
                     started: float) -> tuple[list[Verdict], list[str]]:
    """Train the probe once with a recurrent policy of `recurrent_size`; its verdicts and printed lines."""
    from ..session import train

    run_dir = parent / "memory" / f"recurrent-{recurrent_size}"
    cfg = memory_config(seed, str(run_dir), recurrent_size, settings)
    archive = RunArchive.create(str(run_dir), cfg.to_dict(), ["doctor", "memory"])
    begun = time.perf_counter()
    try:
        summary = train(cfg, archive)
    finally:
        archive.close()
    reached = summary.get("mean_return_last_100")
    reached = float("nan") if reached is None else float(reached)
    solved = reached >= SOLVED_RETURN
    lines = [f"{'PASS' if solved else 'FAIL'}  memory    {MEMORY_PROBE} {time.perf_counter() - begun:5.1f}s  "
             f"recurrent_size={recurrent_size}: mean return of the last 100 episodes {reached:.2f} after "
             f"{MEMORY_ENV_STEPS} steps, want >= {SOLVED_RETURN} (no memory: 0)"]
    broken = {name: ["memory probe"] for name in broken_in(run_dir)}
    found = invariant_verdict(broken, "on the memory probe", time.perf_counter() - started)
    if found is not None:
        return [found], lines
    if solved:
        return [], lines
    return [Verdict(RULE, "critical", "learner", round(time.perf_counter() - started, 3), None,
                    f"a recurrent policy (recurrent_size={recurrent_size}) reached a mean return of {reached:.2f} on "
                    f"the memory probe, which a correct one brings to 1 within {MEMORY_ENV_STEPS} steps (a policy "
                    "without memory: 0), while the actor's state and the learner's replay hold their invariants: "
                    "the learner does not learn through time. Check that gradients flow back through the "
                    "sequence (no detach between steps) and that the core's output reaches the heads.")], lines
