"""The learner's hooks: PPOLearner calls them at arrival, on its first minibatch, on each step and at the report;
each family's statistics come from its own module (sampling, dataflow, optimisation, telemetry)."""

from __future__ import annotations

import dataclasses
from collections import deque

import torch

from ..reference_returns import vtrace_reference
from ..transfer import head_positions
from .common import F64, LOSS_GRADIENT_TOLERANCE, NAN, KeptSteps, _largest, _relative_error_of
from .dataflow import handoff_error, loss_gradient_errors, returns_error, surrogate_error, value_head_coupling
from .distribution import DISTRIBUTION_TOLERANCE, distribution_error
from .optimisation import (
    _norm,
    _norms,
    age_rise_gap,
    clip_error,
    optimizer_coverage,
    optimizer_state_gap,
    optimizer_steps,
    policy_share,
)
from .optimizer_step import AdamReference
from .preprocessing import running_return_error, scaling_error, snapshot, statistics_error
from .recurrent_state import RECURRENT_KEYS, RecurrentStateChecks
from .sampling import sampling_statistics
from .telemetry import StepStatistics, arrival_disagreement, flat_target_spread, update_disagreement

SAMPLED_FIRST, SAMPLED_EVERY = 16, 16
KEYS = ("inv_sampling_logp", "inv_sampling_frequency", "inv_behaviour_record", "inv_returns_recomputed",
        "inv_loss_gradient_policy", "inv_loss_gradient_value", "inv_loss_gradient_entropy",
        "inv_optimizer_coverage", "inv_gradient_of_loss", "inv_policy_starved", "inv_telemetry_recomputed",
        "inv_minibatch_coverage", "inv_optimizer_state_kept", "inv_gradient_clipped_as_configured",
        "inv_distribution_as_defined", "inv_value_loss_inputs", "inv_policy_loss_inputs",
        "inv_optimizer_step_as_configured", "inv_value_head_affine", "inv_observation_statistics_recomputed",
        "inv_reward_scaling_recomputed", "inv_running_returns_recomputed", "inv_policy_loss_as_configured",
        "inv_network_age_counted", "inv_received_as_sent", "inv_learned_once", *RECURRENT_KEYS)


DECLARED = ("gamma", "gae_lambda", "vtrace_rho_clip", "vtrace_c_clip", "clip_coef", "value_coef", "entropy_coef",
            "normalize_advantages", "max_grad_norm", "update_epochs")
"""The settings the learner's references read, which the run declares from its config (`declare`)."""
ADAM_DEFAULTS = ("adam_betas", "adam_eps")
"""Settings no config field holds: the references take PPOSettings' documented defaults for them."""


def copy_differs(copy: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
    """0-d bool on the device: the copy is not the tensor sent (shape, dtype or any element; NaN equals NaN)."""
    if copy.shape != sent.shape or copy.dtype != sent.dtype:
        return torch.ones((), dtype=torch.bool, device=sent.device)
    same = copy == sent
    if copy.is_floating_point():
        same = same | (copy.isnan() & sent.isnan())
    return ~same.all()


class LearnedRecords:
    """Which witness records (a runner's rollouts, by the witness's origin and sequence number) the learner has
    learned: each arrives once, so one seen again is a batch learned twice. Bounded: the last KEPT per witness."""

    KEPT = 256

    def __init__(self):
        self.seen: dict[int, deque[int]] = {}

    def repeats(self, rollout) -> int | None:
        """How many of the batch's records were learned before (None: the batch carries no witness record)."""
        records = getattr(rollout, "witness", ()) or ()
        if not records:
            return None
        again = 0
        for record in records:
            seen = self.seen.setdefault(record.origin, deque(maxlen=self.KEPT))
            again += record.seq in seen
            seen.append(record.seq)
        return again


def is_sampled(update: int) -> bool:
    """Whether the expensive checks run on this update (counted from 0)."""
    return update < SAMPLED_FIRST or update % SAMPLED_EVERY == 0


class LearnerInvariants:
    """Per update: hooks called by PPOLearner at arrival, on its first minibatch, on each step and at the report.

    Everything is kept on the learner's device; `report` hands the `inv_*` statistics to the update's one
    host transfer. State lives for one update only.
    """

    def __init__(self, learner):
        self.learner = learner
        self.sampled = False
        """Whether this update runs the checks (is_sampled): every check of the learner but the optimizer's step
        counts and its groups' membership, which are a few Python look-ups."""
        self.out: dict[str, torch.Tensor] = {}
        self.steps: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
        self.grad_norms: torch.Tensor | None = None
        self.grad_before: torch.Tensor | None = None
        self.behaviour_logp: torch.Tensor | None = None
        self.arrival_telemetry: tuple[torch.Tensor, torch.Tensor] | None = None
        self.head_positions = head_positions(learner.net, learner.device)
        self.step_statistics = StepStatistics(self.head_positions)
        self.optimizer_steps_before: dict[int, float] | None = None
        self.settings = learner.s
        """The settings the references use: the learner's own until the run declares its config's (`declare`)."""
        self.adam = AdamReference(learner.s.adam_betas, learner.s.adam_eps)
        self.moves: torch.Tensor | None = None
        """Per parameter: the reference step of the first minibatch moves it beyond float32 rounding."""
        self.distribution_off = torch.zeros((), dtype=torch.bool)
        """This update's distribution formulas are off their reference: what reads through them is not judged."""
        self.handed: dict[str, torch.Tensor] = {}
        """What the losses must be handed (the returns' output and the rollout's records, flat): sampled updates."""
        self.reward_scaling: tuple | None = None
        self.running_returns: torch.Tensor | None = None
        """Before the learner scales a batch's rewards (sampled updates): the scaler's statistics, the raw
        rewards and the batch's discounted returns."""
        self.observation_statistics: tuple | None = None
        """The observation normaliser's statistics before this batch, and the batch's raw observations."""
        self.initial_entropy: torch.Tensor | None = None
        """The initial policy's mean entropy per action dimension, recomputed here from the run's first batch (a
        resumed run: the learner's restored value, taken once), which entropy_change is held to."""
        self.received_gap: torch.Tensor | None = None
        """The share of transferred tensors whose learner copy differs from the rollout's (sampled updates)."""
        self.learned = LearnedRecords()
        self.learned_again: int | None = None
        """Parts of this batch (witness records) that an earlier learn step already learned (learned_once)."""
        self.age_before = 0
        self.staleness_gap = 0
        """The network's age when the batch arrived, and |staleness - (that age - the batch's stamp)|."""
        self.count = 0
        """The batch's valid samples (minibatch_coverage counts each one's steps from `steps`)."""
        self.recurrent = RecurrentStateChecks()
        self.rollout: tuple[dict, int] = ({}, -1)
        """The arriving rollout's stamps (actor, sequence number, weights' and state's ages) and its staleness."""

    def declare(self, declared: dict) -> None:
        """The run's settings as its config declares them, read by the wiring apart from the learner's copy
        (`DECLARED` names them; the Adam ones the config does not hold are PPOSettings' documented defaults).
        The references compute with these, so a setting handed to the learner wrong (a swapped or mis-scaled
        field) breaks the invariant of the stage that reads it instead of passing through both sides."""
        defaults = {f.name: f.default for f in dataclasses.fields(self.learner.s) if f.name in ADAM_DEFAULTS}
        self.settings = dataclasses.replace(self.learner.s, **{**defaults, **declared})
        self.adam = AdamReference(self.settings.adam_betas, self.settings.adam_eps)

    def received(self, rollout, tensors: dict, index: torch.Tensor) -> None:
        """Right after the transfer (sampled updates): the learner's copy of each transferred tensor against the
        rollout as it arrived, and the valid samples' positions against the rollout's own valid mask."""
        self.received_gap = None
        if not is_sampled(self.learner.updates):
            return
        device = self.learner.device
        pairs = [(tensors[key], getattr(rollout, key)) for key in tensors]
        pairs.append((index, rollout.valid.reshape(-1).nonzero().squeeze(-1)))
        differ = [copy_differs(copy, sent.to(device, non_blocking=True)) for copy, sent in pairs]
        self.received_gap = torch.stack(differ).to(F64).mean()

    def stamp(self, rollout, staleness: int) -> None:
        """Before arrival: who produced the batch and with which weights (the recurrent state's checks), the
        network's age now and the batch's staleness against it (network_age_counted)."""
        self.rollout = ({"actor_id": rollout.actor_id, "sequence": rollout.sequence,
                         "policy_age": rollout.policy_age, "state_age": rollout.state_age}, staleness)
        self.age_before = int(self.learner.net.age)
        self.staleness_gap = abs(int(staleness) - (self.age_before - int(rollout.policy_age)))
        self.learned_again = self.learned.repeats(rollout)

    def before_scaling(self, tensors: dict) -> None:
        """The batch on the device, before its rewards are scaled (with reward normalisation on)."""
        scaler = self.learner.normalization.returns
        self.reward_scaling = self.running_returns = None
        if scaler is None or not is_sampled(self.learner.updates) or "discounted_returns" not in tensors:
            return
        self.reward_scaling = ((scaler.count.clone(), scaler.mean.clone(), scaler.var.clone()),
                               tensors["rewards"], tensors["discounted_returns"])
        self.running_returns = running_return_error(tensors["discounted_returns"], tensors["rewards"],
                                                    tensors["terminated"], tensors["truncated"], tensors["valid"],
                                                    self.settings.gamma)

    def arrival(self, batch, r: dict, params_all: torch.Tensor, values_all: torch.Tensor,
                index: torch.Tensor, log_rhos: torch.Tensor) -> None:
        """The batch as it arrived: the distribution's formulas, sampling, the returns' own output against its
        reference from the returns' own inputs (`log_rhos` as the learner handed them), and the arrival
        statistics' recomputation."""
        learner = self.learner
        s, dist = self.settings, learner.net.dist
        self.sampled = is_sampled(learner.updates)
        self.steps, self.grad_norms, self.arrival_telemetry, self.moves = [], None, None, None
        self.step_statistics = StepStatistics(self.head_positions)
        self.distribution_off = torch.zeros((), dtype=torch.bool, device=learner.device)
        self.count = batch.count
        self.optimizer_steps_before = optimizer_steps(learner.optimizer)
        nan = torch.full((), NAN, device=learner.device)
        self.out = dict.fromkeys(KEYS, nan)
        if self.learned_again is not None:
            self.out["inv_learned_once"] = torch.full((), float(self.learned_again), dtype=F64, device=learner.device)
        if self.received_gap is not None:
            self.out["inv_received_as_sent"] = self.received_gap
        if not self.sampled:
            return
        valid, actions = r["valid"], r["actions"]
        T = valid.shape[0]
        if getattr(learner.net, "recurrent_size", 0):   # the state first: every later stage reads through it
            self.out.update(self.recurrent.arrival(learner.net, r, params_all, *self.rollout, index))
        flat = lambda x: x.reshape(T * valid.shape[1], *x.shape[2:]).index_select(0, index)  # noqa: E731
        self.behaviour_logp = flat(r["behaviour_logp"])
        params = params_all[:T]
        # The formula actor and learner share comes first: what reads through it is judged only where it holds.
        self.out["inv_distribution_as_defined"] = distribution_error(dist, flat(params), flat(actions))
        self.distribution_off = self.out["inv_distribution_as_defined"] > DISTRIBUTION_TOLERANCE
        logp_stat, frequency_stat = sampling_statistics(dist, flat(r["behaviour_params"]), flat(actions),
                                                        self.behaviour_logp)
        self.out["inv_sampling_logp"] = torch.where(self.distribution_off, NAN, logp_stat)
        self.out["inv_sampling_frequency"] = torch.where(self.distribution_off, NAN, frequency_stat)
        # The returns stage from its own inputs: the log-rhos as handed (the distribution's formula is judged
        # above), held to the formula's own output, and the returns' output (not what the losses are later
        # handed, judged at the first minibatch) against the reference.
        produced_log_rhos = dist.log_prob(params, actions) - r["behaviour_logp"]
        ref_targets, ref_advantages = vtrace_reference(
            values_all[:T], values_all[1:], r["rewards"], r["terminated"], r["truncated"], valid,
            log_rhos.to(F64), s.gamma, s.gae_lambda, s.vtrace_rho_clip, s.vtrace_c_clip)
        self.out["inv_returns_recomputed"] = torch.fmax(
            returns_error(flat(ref_targets), flat(ref_advantages), flat(batch.targets), flat(batch.advantages)),
            handoff_error([flat(log_rhos)], [flat(produced_log_rhos)]))
        # What the losses must be handed: the returns' output and the rollout's records, flattened here apart.
        if self.reward_scaling is not None:
            before, raw, returns = self.reward_scaling
            self.out["inv_reward_scaling_recomputed"] = scaling_error(
                before, raw, returns, valid, r["rewards"], learner.normalization.returns.clip)
            self.out["inv_running_returns_recomputed"] = self.running_returns
            self.reward_scaling = None
        normalizer = learner.normalization.observations
        self.observation_statistics = (snapshot(normalizer), flat(r["obs"][:T])) if normalizer is not None else None
        self.handed = {"targets": flat(batch.targets), "advantages": flat(batch.advantages),
                       "actions": flat(actions), "behaviour_params": flat(r["behaviour_params"])}
        min_std = flat_target_spread(learner.reward_scale, valid, r["terminated"] | r["truncated"], s.gamma)
        if self.initial_entropy is None and learner.updates > 0:   # resumed: the initial policy is not here
            self.initial_entropy = learner.initial_entropy
        entropy_gap, others, entropy = arrival_disagreement(
            dist, params, batch.values, batch.targets, batch.advantages, valid, min_std, batch.stats, r["rewards"],
            r["terminated"], r["terminated"] | r["truncated"], self.initial_entropy, learner.reward_scale, s.gamma)
        self.arrival_telemetry = (entropy_gap, others)
        if self.initial_entropy is None:
            self.initial_entropy = entropy

    @property
    def keeps_graph(self) -> bool:
        """Whether the first minibatch's backward pass must keep its graph (for policy_starved)."""
        return self.sampled

    def before_backward(self) -> None:
        """On the first minibatch, between zero_grad and the backward pass: what .grad holds already."""
        if not self.sampled:
            return
        held = [p.grad for p in self.learner.net.parameters() if p.grad is not None]
        self.grad_before = _norm(held) if held else torch.zeros((), dtype=F64, device=self.learner.device)

    def first_minibatch(self, policy_loss, dist_params, logp, values, entropy, b, mb) -> None:
        """After the first minibatch's backward pass (outputs' gradients retained, gradients not yet clipped)."""
        if not self.sampled:
            return
        learner = self.learner
        # Before policy_share frees the graph: how each value moves with the value head's bias.
        self.out["inv_value_head_affine"] = value_head_coupling(values, getattr(learner.net, "value_bias", None))
        # What each loss was handed on this minibatch against what the stage before it produced (exact copies).
        h = self.handed
        recurrent = getattr(learner.net, "recurrent_size", 0)
        replayed = self.recurrent.first_minibatch(dist_params, mb) if recurrent else None
        if replayed is not None:
            self.out["inv_sequence_replay_recomputed"] = torch.fmax(self.out["inv_sequence_replay_recomputed"],
                                                                    replayed)
        self.out["inv_value_loss_inputs"] = handoff_error([b.mb_targets[mb]], [h["targets"][mb]])
        self.out["inv_policy_loss_inputs"] = handoff_error(
            [b.mb_adv[mb], b.mb_logp[mb], b.mb_actions[mb], b.mb_params[mb]],
            [h["advantages"][mb], self.behaviour_logp[mb], h["actions"][mb], h["behaviour_params"][mb]])
        self.out.update(loss_gradient_errors(learner.net.dist, dist_params, logp, values, entropy,
                                             self.behaviour_logp[mb], b.mb_adv[mb], b.mb_targets[mb], self.settings))
        params = list(learner.net.parameters())
        self.grad_norms = _norms([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        grad_norm = self.grad_norms.to(F64).norm()
        # What the optimizer steps with must be this backward pass's alone: nothing may be in .grad before it.
        self.out["inv_gradient_of_loss"] = _relative_error_of(self.grad_before, self.grad_before, grad_norm)
        # The graph was kept (keeps_graph) for one more backward pass through the policy term.
        self.out["inv_policy_starved"] = policy_share(params, grad_norm, policy_loss, self.settings.max_grad_norm,
                                                      self.out["inv_loss_gradient_policy"])

    def clipped(self, before: torch.Tensor, after: torch.Tensor) -> None:
        """On the first minibatch, between the gradient clip and the optimizer's step: the flat gradient before
        the clip and after it (only asked for on sampled updates: `sampled`)."""
        self.out["inv_gradient_clipped_as_configured"] = clip_error(before, after, self.settings.max_grad_norm)
        self.adam.before(self.learner.optimizer, list(self.learner.net.parameters()))

    def stepped(self) -> None:
        """Right after the first minibatch's optimizer step (sampled updates): the step against the reference."""
        self.out["inv_optimizer_step_as_configured"], self.moves = self.adam.after()

    def step(self, mb: torch.Tensor, mb_params: torch.Tensor, mb_values: torch.Tensor, first_epoch: bool,
             last_epoch: bool) -> None:
        """After each minibatch's backward pass, before the clip (sampled updates): its policy parameters, kept for
        the KL and clip fraction's check, and its step statistics recomputed from the gradients as they are."""
        if self.sampled:
            self.steps.append((mb, mb_params.detach(), last_epoch))
            self.step_statistics.step(self.learner.net, mb_values, self.handed["targets"][mb], first_epoch)

    def report(self, b, u, after: torch.Tensor, stats: dict) -> dict[str, torch.Tensor]:
        """The update's `inv_*` statistics (0-d tensors on the device)."""
        learner = self.learner
        params = list(learner.net.parameters())
        self.out["inv_behaviour_record"] = stats["record_discrepancy"]
        steps_after = optimizer_steps(learner.optimizer)
        gap = optimizer_state_gap(learner.optimizer, self.optimizer_steps_before, steps_after, u.steps)
        self.out["inv_optimizer_state_kept"] = torch.full((), gap, dtype=F64, device=learner.device)
        age_gap = max(age_rise_gap(learner.optimizer, self.optimizer_steps_before, steps_after,
                                   int(learner.net.age) - self.age_before), self.staleness_gap)
        self.out["inv_network_age_counted"] = torch.full((), age_gap, dtype=F64, device=learner.device)
        kept = KeptSteps.of(learner.net.dist, self.steps, b.mb_actions, self.behaviour_logp) if self.steps else None
        if kept is not None and self.count:
            # Each epoch is one pass over the batch: every valid sample in exactly update_epochs minibatch steps.
            # One scatter-add over every step's indices (not one per step: a tenth of a sampled update's checks).
            mbs = kept.positions
            uses = torch.zeros(self.count, dtype=torch.int32, device=mbs.device).index_add_(
                0, mbs, torch.ones_like(mbs, dtype=torch.int32))
            self.out["inv_minibatch_coverage"] = (uses != self.settings.update_epochs).to(F64).mean()
        if self.sampled and self.observation_statistics is not None:
            before, raw = self.observation_statistics
            self.out["inv_observation_statistics_recomputed"] = statistics_error(
                learner.normalization.observations, before, raw)
        self.observation_statistics = None
        self.out["inv_optimizer_coverage"] = optimizer_coverage(params, learner.optimizer, self.moves,
                                                                u.before, after)
        if kept is not None and not learner.amp:   # every step's loss, at the ratios it stepped with
            self.out["inv_policy_loss_as_configured"] = surrogate_error(self.settings, kept, b.mb_adv,
                                                                        stats["policy_loss"])
        if self.sampled and self.arrival_telemetry is not None:
            # The exported entropy is the distribution's, which the loss uses too: when the loss's entropies are
            # off their closed form, the policy's invariant names the fault and the diagnostic is not held to it.
            entropy_gap, others = self.arrival_telemetry
            entropy_off = self.out["inv_loss_gradient_entropy"] > LOSS_GRADIENT_TOLERANCE
            # Likewise the entropy and the clip fraction read through the distribution's formulas (the clip
            # fraction through the recorded log-probabilities): its own invariant names a wrong formula.
            gaps = [others, torch.where(entropy_off | self.distribution_off, NAN, entropy_gap)]
            if kept is not None:
                clip_gap, kl_gap = update_disagreement(learner.net.dist, self.settings.clip_coef, kept, self.steps,
                                                       b, stats, self.out["inv_loss_gradient_policy"])
                # The clip fraction is the loss's own: a loss off its configured surrogate is named as such.
                loss_off = self.out["inv_policy_loss_as_configured"] > LOSS_GRADIENT_TOLERANCE
                gaps += [torch.where(self.distribution_off | loss_off, NAN, clip_gap), kl_gap]
            if not learner.amp:   # bfloat16 loss terms round at 1e-2: their sums are not held to float64
                # The value loss is recomputed on the targets the returns produced: a loss handed others, or off
                # its closed form, is named by the value's own invariants.
                value_off = ((self.out["inv_loss_gradient_value"] > LOSS_GRADIENT_TOLERANCE)
                             | (self.out["inv_value_loss_inputs"] > 0))   # exact copies: 0
                gaps.append(self.step_statistics.disagreement(stats, learner.net.dist, kept, value_off,
                                                              entropy_off | self.distribution_off))
            self.out["inv_telemetry_recomputed"] = _largest(gaps)
        out, self.steps = self.out, []
        return out
