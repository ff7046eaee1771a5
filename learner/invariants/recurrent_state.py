"""A recurrent policy's state, held to a reference replay written apart from the product code.

The reference runs each core's LSTM in float64 in the notation of Hochreiter & Schmidhuber (with the
forget gate of Gers et al.), one step at a time, from the state the actor stored when the rollout
began, zeroing it where episodes start. Where episodes start is derived here from the rollout's own
validity flags (NEXT_STEP autoreset: the step after a reset transition begins an episode; whether
step 0 does is the actor's record). Only batches the learner's current weights acted on (staleness
0) can be replayed: older weights are gone.

initial_state_as_stored (actor)
    The stored initial state is the state the actor acted from: the behaviour parameters before each
    env's first episode start equal the reference's; and it is the state the previous rollout of the
    same runner ended with (its reference final state, kept from that batch), stamped with the age of
    the weights that computed it.
state_reset_at_episode_starts (actor)
    From each env's first episode start on, the behaviour parameters equal the reference's: the actor
    zeroed its state at every episode start and nowhere else.
sequence_replay_recomputed (learner)
    What the learner replays (at arrival, for the targets, and on its first minibatch, for the loss)
    equals the reference on the same stored inputs: the learner starts from the stored state, cuts at
    the same episode starts, and keeps each env's steps in order.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .common import F64, NAN

RECURRENT_KEYS = ("inv_initial_state_as_stored", "inv_state_reset_at_episode_starts",
                  "inv_sequence_replay_recomputed")


def lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """i, f, g, o = sigma(W_i x + U_i h + b_i), sigma(...), tanh(...), sigma(...); c' = f c + i g; h' = o tanh(c')."""
    gates = x @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def starts_from_validity(initial_starts: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[T, N]: step t begins an episode when t = 0 and the actor says so, or when step t-1 was a reset transition."""
    starts = torch.empty(valid.shape, dtype=torch.bool, device=valid.device)
    starts[0] = initial_starts.bool()
    starts[1:] = ~valid[:-1].bool()
    return starts


@torch.no_grad()
def reference_replay(net, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor):
    """The policy parameters [T, N, P] of the stored sequence and the state after it, [N, 2 * cores, H], float64.
    The trunks (feed-forward, judged elsewhere) give each step's features; the recurrence and heads are here."""
    length, n = starts.shape
    x = net.normalized(obs.reshape(length * n, *obs.shape[2:]))
    cores = list(net.cores)
    intakes = [net.policy_intake] if len(cores) == 1 else [net.policy_intake, net.value_intake]
    hs, finals = [], []
    for i, (core, intake) in enumerate(zip(cores, intakes, strict=True)):
        lstm = core.lstm
        weights = [p.to(F64) for p in (lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)]
        features = intake(x).to(F64).reshape(length, n, -1)
        h, c = state[:, 2 * i].to(F64), state[:, 2 * i + 1].to(F64)
        out = []
        for t in range(length):
            keep = (~starts[t]).to(F64).unsqueeze(-1)
            h, c = lstm_step(features[t], h * keep, c * keep, *weights)
            out.append(h)
        hs.append(torch.stack(out))
        finals.append(torch.stack((h, c), 1))
    params = F.linear(hs[0], net.policy_out.weight.to(F64), net.policy_out.bias.to(F64))
    if net.log_std is not None:
        params = torch.cat([params, net.log_std.to(F64).expand_as(params)], -1)
    return params, torch.cat(finals, 1)


def _error(product: torch.Tensor, reference: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """max |product - reference| / max(|reference|, 1) over the steps `where` ([T, N]); NaN where there are none."""
    if not bool(where.any()):
        return torch.full((), NAN, dtype=F64, device=reference.device)
    gap = (product.to(F64) - reference).abs().amax(-1)[where]
    scale = reference.abs().amax(-1)[where].clamp_min(1.0)
    return (gap / scale).amax()


class RecurrentStateChecks:
    """Per batch on sampled updates: the reference replay and the three statistics; across batches, each
    runner's reference final state (for the next rollout's stored initial state)."""

    def __init__(self):
        self.finals: dict[tuple, tuple[int, int, torch.Tensor]] = {}
        """(actor id, envs) -> (the rollout's sequence number, its weights' age, its reference final state)."""
        self.reference: torch.Tensor | None = None
        self.index: torch.Tensor | None = None

    def arrival(self, net, r: dict, params_all: torch.Tensor, stamp: dict, staleness: int, index: torch.Tensor):
        """The statistics from the batch as it arrived; `params_all` [T+1, N, P] as the learner replayed it."""
        nan = torch.full((), NAN, dtype=F64, device=params_all.device)
        out = dict.fromkeys(RECURRENT_KEYS, nan)
        self.reference = None
        if staleness != 0 or r.get("initial_state") is None:
            return out
        valid = r["valid"].bool()
        T, N = valid.shape
        starts = starts_from_validity(r["initial_starts"], valid)
        reference, final = reference_replay(net, r["obs"][:T], starts, r["initial_state"])
        # Each env's steps before its first episode start within the rollout read the stored state itself.
        before_first = torch.cumsum(starts.long(), 0) == 0
        behaviour = r["behaviour_params"]
        out["inv_initial_state_as_stored"] = torch.fmax(
            _error(behaviour, reference, valid & before_first),
            self._carried(stamp, r["initial_state"], N, final))
        out["inv_state_reset_at_episode_starts"] = _error(behaviour, reference, valid & ~before_first)
        out["inv_sequence_replay_recomputed"] = _error(params_all[:T], reference, valid)
        self.reference, self.index = reference.reshape(T * N, -1).index_select(0, index), index
        return out

    def _carried(self, stamp: dict, stored: torch.Tensor, n: int, final: torch.Tensor) -> torch.Tensor:
        """The stored initial state against the previous rollout's reference final state, and its age stamp
        against that rollout's weights' age (1 when the stamp is wrong); NaN without the previous rollout."""
        key = (stamp["actor_id"], n)
        previous = self.finals.get(key)
        self.finals[key] = (stamp["sequence"], stamp["policy_age"], final)
        if previous is None or stamp["sequence"] < 0 or previous[0] != stamp["sequence"] - 1:
            return torch.full((), NAN, dtype=F64, device=final.device)
        _, age, kept = previous
        if stamp["state_age"] != age:
            return torch.ones((), dtype=F64, device=final.device)
        gap = (stored.to(F64) - kept).abs().amax()
        return gap / kept.abs().amax().clamp_min(1.0)

    def first_minibatch(self, params: torch.Tensor, mb: torch.Tensor) -> torch.Tensor | None:
        """The first minibatch's replayed parameters (before any step) against the reference at its samples."""
        if self.reference is None:
            return None
        reference = self.reference.index_select(0, mb)
        gap = (params.detach().to(F64) - reference).abs().amax()
        return gap / reference.abs().amax().clamp_min(1.0)
