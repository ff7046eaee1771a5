"""The reference cost of the learner's minibatch phase: one forward, backward and optimizer step of a copy of the
network on a minibatch of the configured size, timed in the learner's own process.

The minibatch phase of an update (`PPOLearner._update`'s loop, per optimizer step) is the forward pass, the loss,
the backward pass, the clip and the optimizer's step, plus what the project does around them: the running sums of
the statistics, the head gradient norms, the KL of the last epoch and, on sampled updates, the invariant checks.
The reference is the part the network and the configured optimizer need: a copy of the network with the learner's
current weights, a plain squared-error loss of its outputs (written here, apart from the product's loss), the
backward pass, the configured clip and a fresh Adam with the configured settings. Healthy readings are a small
factor (the product's loss and bookkeeping on top); work hidden in the step (a forward pass repeated, a copy of
the weights per step, a host round trip per sample) reads as a large one.

The copy is made once, from the first batch's network; each measurement first loads the learner's weights into it,
so its cost follows the network as it is. It draws no random numbers and touches neither the learner's network
nor its optimizer: the run's weights and random streams are the same with and without it. Both sides are CPU
seconds: of this thread where torch runs single-threaded (other threads, a /metrics scrape or Ray's fetch,
count in neither), else of the process (torch's worker threads do the work).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections import deque

import torch
from torch import nn

from .adam import make_adam

KEY = "learner_minibatch_cost_ratio"
EVERY = 32
"""Measure every this many updates (and on the first): with REPEATS, under 1% of a 4-epoch, 4-minibatch update's
steps."""
REPEATS = 2
"""Timed steps per measurement, after one untimed step (the copy's first is cold: lazy state, caches)."""
KEPT = 2 * REPEATS
"""The reference is the cheapest of this many latest timings."""


def cpu_seconds() -> float:
    """CPU seconds of the thread where torch runs in it alone, else of the process."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


class MinibatchCost:
    def __init__(self, settings):
        self.s = settings
        self.updates = 0
        self.net: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.timings: deque[float] = deque(maxlen=KEPT)

    def measure(self, net: nn.Module, obs: torch.Tensor, autocast=contextlib.nullcontext, sequences=None) -> None:
        """After an update: every EVERY-th time, REPEATS timed reference steps on a minibatch of `obs` (the batch's
        observations, as many as one minibatch of the configured size holds). A recurrent policy's minibatch is a
        share of the batch's env sequences (`sequences`, learner/sequences.py), replayed whole as the learner does."""
        self.updates += 1
        # The first updates each measure (the cheapest of them is the reference at once: one slow first reading
        # on a busy machine would otherwise stand for EVERY updates), then every EVERY-th.
        if (self.updates > KEPT and (self.updates - 1) % EVERY) or obs.shape[0] == 0:
            return
        if sequences is not None:
            envs = math.ceil(sequences.state.shape[0] / self.s.num_minibatches)
            minibatch = (sequences.obs[:, :envs], sequences.starts[:, :envs], sequences.state[:envs])
        else:
            minibatch = obs[:math.ceil(obs.shape[0] / self.s.num_minibatches)]
        if self.net is None:
            self.net = copy.deepcopy(net)
            self.optimizer = make_adam(self.net.parameters(), self.s.learning_rate, self.s.adam_betas, self.s.adam_eps)
        with torch.no_grad():
            for mine, theirs in zip(self.net.parameters(), net.parameters(), strict=True):
                mine.copy_(theirs)
        self._step(minibatch, autocast)   # untimed: the first step after a load may touch cold memory
        for _ in range(REPEATS):
            start = cpu_seconds()
            self._step(minibatch, autocast)   # queued device work is not waited for: neither is the phase's
            self.timings.append(cpu_seconds() - start)

    def _step(self, obs, autocast) -> None:
        with autocast():
            params, values = self.net(obs) if isinstance(obs, torch.Tensor) else self.net.replay(*obs)[:2]
            loss = params.float().pow(2).mean() + values.float().pow(2).mean()
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), self.s.max_grad_norm)
        self.optimizer.step()

    def ratio(self, phase_seconds: float, steps: int) -> dict[str, float]:
        """{KEY: the minibatch phase's CPU seconds per step over the reference's}, once a reference was timed."""
        if not self.timings or steps <= 0 or min(self.timings) <= 0:
            return {}
        return {KEY: phase_seconds / steps / min(self.timings)}
