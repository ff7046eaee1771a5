"""The recurrent core: an LSTM between a network's trunk and its heads, and the state it carries.

A core's state is one tensor [n, 2, H]: the hidden output h (index 0) and the cell c (index 1) of each
of n envs, so it travels and concatenates like every other per-env field of a rollout (a network with
two cores keeps both side by side, [n, 4, H]). `starts` marks the steps that begin an episode: there
the state is zeroed before the step, so nothing of an earlier episode reaches the new one (the
NEXT_STEP autoreset contract: the first observation of an episode follows the env's reset transition).

Acting runs the LSTM one step at a time. Replay cuts each env's sequence at its episode starts into
segments, packs them, and runs the LSTM over all of them in one call (torch's fused loop, one
autograd node), as sb3-contrib's RecurrentPPO does: a Python loop over 128 steps of small cell calls
spent most of an update in per-step overhead.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class RecurrentCore(nn.Module):
    """One single-layer LSTM; the same weights serve acting (one step) and replay (a sequence)."""

    def __init__(self, in_dim: int, size: int):
        super().__init__()
        self.size = size
        self.lstm = nn.LSTM(in_dim, size)
        for name, p in self.lstm.named_parameters():   # CleanRL's LSTM initialisation
            if name.startswith("weight"):
                nn.init.orthogonal_(p, 1.0)
            else:
                nn.init.zeros_(p)

    def initial_state(self, n: int, device=None) -> torch.Tensor:
        return torch.zeros((n, 2, self.size), device=device)

    def step(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The state after one step on features x [n, F]; zeroed first where `starts` [n] is True."""
        state = state * (~starts.bool()).to(state.dtype).view(-1, 1, 1)
        lstm = self.lstm   # the cell function on the LSTM's own weights: a third of a one-step LSTM call's cost
        h, c = torch.lstm_cell(x, (state[:, 0], state[:, 1]), lstm.weight_ih_l0, lstm.weight_hh_l0,
                               lstm.bias_ih_l0, lstm.bias_hh_l0)
        return torch.stack((h, c), 1)

    def replay(self, x: torch.Tensor, starts: torch.Tensor, state: torch.Tensor,
               final: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Outputs h [L, n, H] of a sequence of features x [L, n, F] from the state [n, 2, H] it began with,
        and with `final` the state after its last step (else None). Backpropagation runs through the whole
        sequence.

        The segments are laid side by side, each from step 0 of a padded sequence; the padding after a short
        segment comes after every output read from it (the LSTM is causal), so one unpacked call serves, which
        torch runs faster than a packed one. The final state needs each segment's own last step: packed."""
        length, n = starts.shape
        cut = starts.bool().clone()
        cut[0] = True                                   # every env's sequence opens a segment
        # Segments in env-major order: the k-th True of the transposed mask opens segment k.
        opens = cut.t().reshape(-1)
        segment = (torch.cumsum(opens.long(), 0) - 1).reshape(n, length).t()       # [L, n] segment of each step
        first_step = torch.nonzero(opens).squeeze(-1) % length                      # where each segment opens
        offset = torch.arange(length, device=x.device).unsqueeze(1) - first_step[segment]   # step within it
        count = int(first_step.shape[0])
        last = segment[-1]                              # each env's last segment: it holds the final state
        env_of = torch.repeat_interleave(torch.arange(n, device=x.device),
                                         torch.diff(last, prepend=last.new_full((1,), -1)), output_size=count)
        lengths = torch.bincount(segment.reshape(-1), minlength=count)
        padded = x.new_zeros((int(lengths.max()), count, x.shape[-1]))
        padded[offset, segment] = x
        # An env's first segment continues the stored state unless the rollout's first step began an episode.
        carried = (first_step == 0) & ~starts.bool()[0][env_of]
        begin = torch.where(carried.view(-1, 1, 1), state[env_of], torch.zeros_like(state[env_of]))
        begin = (begin[:, 0].unsqueeze(0).contiguous(), begin[:, 1].unsqueeze(0).contiguous())
        if not final:
            out, _ = self.lstm(padded, begin)
            return out[offset, segment], None
        packed = pack_padded_sequence(padded, lengths.cpu(), enforce_sorted=False)
        out, (h, c) = self.lstm(packed, begin)
        out = pad_packed_sequence(out, total_length=padded.shape[0])[0]
        return out[offset, segment], torch.stack((h[0][last], c[0][last]), 1)
