"""A recurrent policy's batch as sequences: episode starts, and minibatches that split by env, never by time.

Each env's column of a rollout is one sequence, replayed from the state the actor stored when the
rollout began (truncated backpropagation through the rollout). The flat per-sample arrays the loss
reads (`mb_*` of the learner's batch, valid samples in time-major order) stay as they are: a
minibatch of envs is turned into the positions of its valid samples in them, in the order the
replay's output is flattened, so the loss code is the same for both kinds of policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def episode_starts(initial_starts: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[T+1, N]: which observations obs[0..T] begin an episode. Under NEXT_STEP autoreset the step after a
    reset transition (valid False) begins one; whether obs[0] does is the actor's record."""
    return torch.cat([initial_starts.bool().unsqueeze(0), ~valid.bool()])


@dataclass
class Sequences:
    """The batch's envs as sequences on the learner's device."""

    obs: torch.Tensor
    """[T, N, ...] the observations acted on."""
    starts: torch.Tensor
    """[T, N] bool: the step begins an episode (the state is zeroed before it)."""
    state: torch.Tensor
    """[N, 2, H] each env's state when the rollout began."""
    valid: torch.Tensor
    """[T, N] bool: the samples the loss learns from."""

    def __post_init__(self):
        flat = self.valid.reshape(-1)
        # Rank of each valid sample among the batch's valid samples, time-major: its index in the flat arrays.
        self.position = (torch.cumsum(flat.long(), 0) - 1).reshape(self.valid.shape)

    def minibatches(self, count: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch's minibatches: (flat positions of their valid samples, their env columns), envs shuffled."""
        n = self.valid.shape[1]
        order = torch.randperm(n, generator=generator).to(self.valid.device)
        return [(self.samples_of(cols), cols) for cols in order.chunk(count)]

    def samples_of(self, cols: torch.Tensor) -> torch.Tensor:
        """Flat positions of the valid samples of env columns `cols`, in the order `outputs` returns them."""
        return self.position[:, cols].reshape(-1)[self.valid[:, cols].reshape(-1)]

    def outputs(self, net, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(params, values) of the valid samples of env columns `cols`, replayed from their stored states."""
        params, values, _ = net.replay(self.obs[:, cols], self.starts[:, cols], self.state[cols])
        keep = self.valid[:, cols].reshape(-1)
        return params.reshape(keep.shape[0], -1)[keep], values.reshape(-1)[keep]
