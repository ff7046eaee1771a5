"""A fingerprint of the state a checkpoint saves, taken from the live objects, to check a resume against.

`fingerprint` reads the network, the learner, its optimizer and the run's counters as they are: at save time
beside the state it writes, at resume time after the state was loaded. `resume_gaps` compares the two owner by
owner, as the statistics of the resume invariants (telemetry/invariants_resume.py): 0 where the resume gave back
exactly what was saved.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from rlvitals.learner.networks import float64_sums
from rlvitals.telemetry.invariants import BY_NAME

OWNERS = {owner: BY_NAME[f"resumed_{owner}_as_saved"].statistic for owner in ("weights", "optimizer", "preprocessing")}
"""Each part of the fingerprint and the statistic of the resume invariant that judges it."""


def _digest(value) -> float:
    """A number that changes when any byte of `value` (tensors, arrays, numbers, nested) does."""
    parts: list[bytes] = []

    def walk(v):
        if torch.is_tensor(v):
            parts.append(v.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(v, np.ndarray):
            parts.append(v.tobytes())
        elif isinstance(v, dict):
            for key in sorted(v, key=str):
                parts.append(str(key).encode())
                walk(v[key])
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        else:
            parts.append(repr(v).encode())
    walk(value)
    return float(zlib.crc32(b"".join(parts)))


def fingerprint(net, learner, tracker, rng: dict) -> dict[str, list[float]]:
    """The state a checkpoint holds, per owner, as numbers; `rng` the generators' states as saved
    (rlvitals.checkpoint.rng_state)."""
    extra = learner.extra_state()
    normalization = extra.pop("normalization", {})
    optimizer = learner.optimizer.state_dict()
    hyper = [float(v) for group in optimizer["param_groups"] for k, v in sorted(group.items())
             if k != "params" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    hyper += [float(x) for group in optimizer["param_groups"] for x in group.get("betas", ())]
    # What a resume does not carry over by design: the clock goes on, and batches left in flight at the end
    # were counted as lost there (a resumed run starts with none in flight).
    tracker_state = {k: v for k, v in tracker.state().items() if k != "elapsed"}
    tracker_state["samples"] = {k: v for k, v in tracker_state.get("samples", {}).items() if k != "in_flight"}
    return {
        "weights": [*float64_sums(net.parameters()), float(net.age), float(learner.samples_learned),
                    float(learner.updates), float(learner.nonfinite_batches), _digest(tracker_state), _digest(extra),
                    _digest(rng)],
        "optimizer": [*float64_sums(t for state in optimizer["state"].values() for t in state.values()), *hyper,
                      float(len(optimizer["state"]))],
        "preprocessing": [*float64_sums(b for b in net.buffers() if b.is_floating_point()), _digest(normalization)],
    }


def network_gaps(saved: dict[str, list[float]] | None, net) -> dict[str, float]:
    """For a network loaded from a checkpoint (eval, load_policy): the relative gap of its parameters' and its
    normalisers' sums from the fingerprint saved with them ({} for a checkpoint without one)."""
    if not saved:
        return {}
    now = {"weights": float64_sums(net.parameters()),
           "preprocessing": float64_sums(b for b in net.buffers() if b.is_floating_point())}
    return {owner: _gap(saved.get(owner, [])[:2], now[owner]) for owner in now}


def _gap(a, b) -> float:
    """The largest relative difference of two lists of numbers; 1 when their lengths differ."""
    if len(a) != len(b):
        return 1.0   # a part of the state is there in one and not the other
    return max((abs(x - y) / max(abs(x), 1e-30) if x != y else 0.0 for x, y in zip(a, b, strict=True)), default=0.0)


def resume_gaps(saved: dict[str, list[float]] | None, now: dict[str, list[float]]) -> dict[str, float]:
    """Per owner's statistic, the largest relative difference between the fingerprint saved and the one after the
    resume ({} for a checkpoint without a fingerprint: written before it existed)."""
    if not saved:
        return {}
    return {key: _gap(saved.get(owner, []), now[owner]) for owner, key in OWNERS.items()}
