"""The learner's running step statistics (learner/step_sums.py) against a plain per-step reference: loss terms
and the clip's norm averaged over every step, the gradient's distribution and the noise scale over the first
epoch, finiteness from the sums."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rlvitals.learner.diagnostics import GradientNoiseScale
from rlvitals.learner.flat_gradients import FlatGradients
from rlvitals.learner.networks import Categorical
from rlvitals.learner.step_sums import HeadRuns, StepSums, head_ranges
from rlvitals.learner.transfer import head_positions


class TwoHeads(nn.Module):
    """A trunk and two heads whose parameters do not lie next to each other in parameters() order."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 3)
        self.policy_out = nn.Linear(3, 2)
        self.value_out = nn.Linear(3, 1)
        self.spread = nn.ParameterDict({"log_std": nn.Parameter(torch.zeros(2))})   # after the value head

    @property
    def log_std(self):
        return self.spread["log_std"]

    def heads(self):
        return {"policy": [*self.policy_out.parameters(), self.log_std], "value": list(self.value_out.parameters())}


def test_head_ranges_are_the_heads_positions_as_runs():
    net = TwoHeads()
    heads = head_positions(net, torch.device("cpu"))
    runs = head_ranges(heads)
    # The trunk (15 numbers), policy_out (8), value_out (4), log_std (2): the policy head in two runs.
    assert runs == {"policy": [(15, 23), (27, 29)], "value": [(23, 27)]}
    for head, at in heads.items():
        assert sorted(at.tolist()) == [i for a, b in runs[head] for i in range(a, b)]


def test_the_sums_match_a_per_step_reference_over_two_epochs():
    torch.manual_seed(0)
    net = TwoHeads()
    sums = StepSums(torch.device("cpu"), HeadRuns(head_positions(net, torch.device("cpu")), torch.device("cpu")))
    steps, per_epoch = 6, 3
    seen = []
    for step in range(steps):
        net.zero_grad()
        x = torch.randn(5, 4)
        h = net.trunk(x).tanh()
        policy_loss, value_loss = net.policy_out(h).pow(2).mean() + net.log_std.sum(), net.value_out(h).pow(2).mean()
        loss = policy_loss + 0.5 * value_loss
        loss.backward()
        parts = {"policy_loss": policy_loss, "value_loss": value_loss}
        flat = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
        if step < per_epoch:
            sums.gradients(flat)
        grad_norm = nn.utils.clip_grad_norm_(net.parameters(), 1e9)   # no clipping: the gradients stay as seen
        sums.add(loss, parts, grad_norm)
        seen.append((loss.item(), policy_loss.item(), value_loss.item(), flat.clone(),
                     {h: torch.cat([p.grad.reshape(-1) for p in ps]).norm().item() for h, ps in net.heads().items()}))
    # The last epoch's KL, taken at the end over its minibatches together: against a per-step reference.
    behaviour = torch.randn(40, 3)
    learned = torch.randperm(40)
    last = [(learned[i * 13: (i + 1) * 13], torch.randn(13, 3)) for i in range(3)]   # 39 of 40 learned
    for mb, params in last:
        sums.kl_step(mb, params)
    kl_reference = sum(
        (torch.softmax(behaviour[mb], -1) * (torch.log_softmax(behaviour[mb], -1) - torch.log_softmax(params, -1)))
        .sum().item() for mb, params in last) / 40
    noise = GradientNoiseScale()
    out = sums.result(steps, 40, noise, Categorical(3), behaviour)
    assert out["kl"].item() == pytest.approx(kl_reference, rel=1e-5)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    first = seen[:per_epoch]
    assert out["policy_loss"] == pytest.approx(mean([s[1] for s in seen]), rel=1e-5)
    assert out["value_loss"] == pytest.approx(mean([s[2] for s in seen]), rel=1e-5)
    assert out["grad_norm"] == pytest.approx(mean([s[3].norm().item() for s in seen]), rel=1e-5)
    assert out["grad_norm_policy"] == pytest.approx(mean([s[4]["policy"] for s in first]), rel=1e-5)
    assert out["grad_norm_value"] == pytest.approx(mean([s[4]["value"] for s in first]), rel=1e-5)
    assert out["grad_meansq"] == pytest.approx(mean([s[3].pow(2).mean().item() for s in first]), rel=1e-5)
    assert out["grad_absmax"] == pytest.approx(max(s[3].abs().max().item() for s in first), rel=1e-6)
    assert out["loss_finite"] == 1.0 and out["grads_finite"] == 1.0
    # The noise scale is fed the first epoch's mean |g_small|^2 and |mean g|^2, minibatch 40/3 against 40.
    small = mean([s[3].pow(2).sum().item() for s in first])
    big = (sum(s[3] for s in first) / per_epoch).pow(2).sum().item()
    reference = GradientNoiseScale()
    expected = reference.update(torch.tensor(small), torch.tensor(big), 40 / per_epoch, 40.0)
    assert out["grad_noise_scale"].item() == pytest.approx(expected.item(), rel=1e-4)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_one_nonfinite_step_makes_the_batch_nonfinite(bad):
    net = TwoHeads()
    sums = StepSums(torch.device("cpu"), HeadRuns(head_positions(net, torch.device("cpu")), torch.device("cpu")))
    one = torch.ones(())
    for step in range(4):
        loss = torch.tensor(bad) if step == 2 else one
        grad_norm = torch.tensor(-bad) if step == 3 else one   # -inf + inf is NaN: still not finite
        for p in net.parameters():
            p.grad = torch.ones_like(p)
        if step == 0:
            sums.gradients(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
        sums.add(loss, {"policy_loss": one}, grad_norm)
    out = sums.result(4, 8, GradientNoiseScale(), Categorical(2), torch.zeros(8, 2))
    assert out["kl"] == 0.0   # no last-epoch step recorded
    assert out["loss_finite"] == 0.0 and out["grads_finite"] == 0.0
    assert out["policy_loss"] == 1.0


def test_the_flat_gradient_is_the_gradients_and_survives_their_replacement():
    torch.manual_seed(1)
    net = TwoHeads()
    flat = FlatGradients(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad(set_to_none=step == 1)   # the second step replaces every .grad
        x = torch.randn(6, 4)
        (net.policy_out(net.trunk(x)).pow(2).sum() + net.value_out(net.trunk(x)).sum() + net.log_std.sum()).backward()
        expected = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
        assert torch.equal(flat.flat(), expected)
        nn.utils.clip_grad_norm_(net.parameters(), 0.1)   # in place on the views: the buffer follows
        assert torch.equal(flat.flat(), torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
        assert flat.flat().norm().item() == pytest.approx(0.1, rel=1e-4)
        optimizer.step()
    assert all(p.grad.data_ptr() == a for p, a in zip(net.parameters(), flat.addresses, strict=True))
