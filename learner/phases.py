"""Timing one learn call by phases that add up to the whole call."""

from __future__ import annotations

import time

import torch


class PhaseLaps:
    """Contiguous timing of one learn call: each lap closes the interval since the previous one, so the
    phases add up to the whole call. Given a CUDA device it waits for the device at each boundary (the
    queued kernels then count where they were launched, not at the next host sync)."""

    def __init__(self, sync_device: torch.device | None = None):
        self.sync = sync_device if sync_device is not None and sync_device.type == "cuda" else None
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.sync is not None:
            torch.cuda.synchronize(self.sync)
        now = time.perf_counter()
        key = f"time_{phase}"
        self.seconds[key] = self.seconds.get(key, 0.0) + now - self.last
        self.last = now

    def split_update(self, forward_backward_s: float) -> None:
        """The update's lap: its forward/backward seconds, the rest (clipping, steps, running sums) optimizer."""
        self.lap("optimizer")
        self.seconds["time_optimizer"] -= forward_backward_s
        self.seconds["time_forward_backward"] = forward_backward_s
