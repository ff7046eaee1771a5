"""The non-finite guard: no NaN or inf reaches the weights, and a run that keeps producing them stops.

Inputs (observations, rewards) are checked on the host before a batch is
learned from; the loss, gradients and weights are checked by the learner,
which undoes an update that produced non-finite values. Either way the batch
is skipped and counted, the first offending batch is saved for inspection,
and after `max_nonfinite_batches` consecutive bad batches the run stops.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import torch

from .archive import atomic_write_bytes

log = logging.getLogger("rlvitals.guard")


class NonFiniteError(RuntimeError):
    """Too many consecutive batches with NaN or inf; the message says where they appeared first."""


def nonfinite_inputs(rollout) -> str:
    """'observations' or 'rewards' when the batch holds NaN/inf there, else ''."""
    if not np.isfinite(rollout.rewards.numpy()).all():
        return "rewards"
    obs = rollout.obs
    if obs.is_floating_point() and not torch.isfinite(obs).all():
        return "observations"
    return ""


class NonFiniteGuard:
    def __init__(self, run_dir: Path, limit: int):
        self.run_dir = Path(run_dir)
        self.limit = limit
        self.consecutive = 0
        self.skipped = 0
        self.first_where = ""

    def inputs_ok(self, rollout) -> bool:
        """False when the batch's inputs are non-finite (the caller counts it as dropped)."""
        where = nonfinite_inputs(rollout)
        if not where:
            return True  # the update may still go wrong: update_ok has the last word on this batch
        return self._note(where, rollout)

    def update_ok(self, stats: dict, rollout) -> bool:
        return self._note(stats.get("nonfinite_where", ""), rollout)

    def _note(self, where: str, rollout) -> bool:
        if not where:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.skipped += 1
        if not self.first_where:
            self.first_where = where
            path = self.run_dir / "nonfinite_batch.pt"
            buffer = io.BytesIO()
            torch.save({"where": where, "obs": rollout.obs, "actions": rollout.actions, "rewards": rollout.rewards,
                        "terminated": rollout.terminated, "truncated": rollout.truncated, "valid": rollout.valid,
                        "behaviour_logp": rollout.behaviour_logp, "policy_age": rollout.policy_age}, buffer)
            atomic_write_bytes(path, buffer.getvalue())
            log.warning("non-finite values in %s: batch skipped, saved to %s", where, path)
        if self.consecutive >= self.limit:
            raise NonFiniteError(
                f"stopping after {self.consecutive} consecutive batches with NaN or inf; they appeared first in "
                f"{self.first_where} (batch saved to {self.run_dir / 'nonfinite_batch.pt'})")
        return False
