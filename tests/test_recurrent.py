"""Recurrent policies (issue 32): the core's replay against a step loop and the reference in the paper's notation,
the actor's state resets under NEXT_STEP autoreset, the learner reproducing the actor exactly, each planted
hidden-state fault named on its owner, a healthy recurrent run with no warning, and the memory probe that a
feed-forward policy cannot solve.

Faults: tests/planted_recurrent.py (bench/diagnosis.py runs them at length too).
"""

from __future__ import annotations

import math

import pytest
import torch
from diagnose import LOUD, diagnose
from planted_bugs import BY_BUG
from planted_recurrent import DOCTOR_RECURRENT_BUGS, RECURRENT, RECURRENT_BUGS

from rlvitals.actors.runner import EnvRunner
from rlvitals.api import train
from rlvitals.config import TrainConfig
from rlvitals.learner.invariants.recurrent_state import lstm_step, reference_replay, starts_from_validity
from rlvitals.learner.recurrent import RecurrentCore
from rlvitals.learner.sequences import episode_starts
from rlvitals.parts import make_learner, make_network
from rlvitals.telemetry.invariants import BY_NAME, STAGE_RANK


def test_hand_worked_lstm_step():
    # One unit, every weight 0 and biases chosen so that the gates are known: i = f = o = sigma(0) = 1/2,
    # g = tanh(0) = 0 -> c' = c / 2, h' = tanh(c') / 2.
    zeros = torch.zeros(4, 1, dtype=torch.float64)
    h, c = lstm_step(torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
                     torch.full((1, 1), 2.0, dtype=torch.float64), zeros, zeros,
                     torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64))
    assert c.item() == pytest.approx(1.0)
    assert h.item() == pytest.approx(math.tanh(1.0) / 2)


def test_the_reference_step_is_torchs_cell():
    g = torch.Generator().manual_seed(0)
    x, h, c = (torch.randn(3, n, generator=g, dtype=torch.float64) for n in (5, 4, 4))
    w_ih, w_hh = torch.randn(16, 5, generator=g, dtype=torch.float64), torch.randn(16, 4, generator=g,
                                                                                     dtype=torch.float64)
    b_ih, b_hh = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    ours = lstm_step(x, h, c, w_ih, w_hh, b_ih, b_hh)
    torchs = torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(ours, torchs, strict=True))


@pytest.mark.parametrize("start_rate", [0.0, 0.05, 0.4])
def test_segment_replay_equals_the_step_loop_values_and_gradients(start_rate):
    g = torch.Generator().manual_seed(1)
    core = RecurrentCore(3, 5)
    x = torch.randn(20, 4, 3, generator=g, requires_grad=True)
    state = torch.randn(4, 2, 5, generator=g)
    starts = torch.rand(20, 4, generator=g) < start_rate
    starts[0, 1] = True
    out, final = core.replay(x, starts, state, final=True)
    fast, _ = core.replay(x, starts, state)
    loop, s = [], state
    for t in range(20):
        s = core.step(x[t], s, starts[t])
        loop.append(s[:, 0])
    loop = torch.stack(loop)
    assert torch.allclose(out, loop, atol=1e-6) and torch.allclose(fast, loop, atol=1e-6)
    assert torch.allclose(final, s, atol=1e-6)
    grad_fast = torch.autograd.grad(fast.square().sum(), x)[0]
    grad_loop = torch.autograd.grad(loop.square().sum(), x)[0]
    assert torch.allclose(grad_fast, grad_loop, atol=1e-5)


def test_episode_starts_follow_the_reset_transitions():
    valid = torch.tensor([[True, True], [False, True], [True, False], [True, True]])
    expected = [[True, False], [False, False], [True, False], [False, True], [False, False]]
    assert episode_starts(torch.tensor([True, False]), valid).tolist() == expected
    assert starts_from_validity(torch.tensor([True, False]), valid).tolist() == expected[:4]


def _recurrent_parts(env="rlvitals/CartPoleNoVelocity-v1", **fields):
    cfg = TrainConfig(env=env, **{**RECURRENT, **fields}).validate()
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    return cfg, runner, net


def test_the_actor_resets_the_state_exactly_at_episode_starts():
    """On the memory probe every episode lasts delay + 1 steps; a reset transition follows each one."""
    cfg, runner, net = _recurrent_parts("rlvitals/MemoryProbe-v0")
    first = runner.collect(net, 16)
    second = runner.collect(net, 16)
    assert first.initial_starts.all() and first.state_age == -1 and first.sequence == 0
    assert second.state_age == first.policy_age and second.sequence == 1
    starts = episode_starts(first.initial_starts, first.valid)[:-1]
    # Delay 4: steps 0-4 one episode, 5 its reset transition, 6 the next episode's first step, ...
    assert starts[:, 0].nonzero().squeeze(-1).tolist() == [0, 6, 12]
    # What the actor acted with at a start is the network's output from the empty state (its flat call).
    at_starts = first.behaviour_params[starts]
    assert torch.allclose(at_starts, net.policy_params(first.obs[:-1][starts]), atol=1e-6)
    # The stored state of the second rollout is where the first ended: replaying the first gives it.
    with torch.no_grad():
        _, _, final = net.replay(first.obs[:-1], starts, first.initial_state, final=True)
    # The first rollout's last step is followed by the second's step 0: its state after the last step carries.
    assert torch.allclose(second.initial_state, final, atol=1e-6)


def test_the_learner_reproduces_the_actors_log_probabilities():
    cfg, runner, net = _recurrent_parts()
    learner = make_learner(cfg, net, torch.device("cpu"))
    out = learner.learn(runner.collect(net, cfg.rollout_length))
    assert out["logp_discrepancy"] < 1e-5
    out = learner.learn(runner.collect(net, cfg.rollout_length))
    assert out["logp_discrepancy"] < 1e-5
    for key in ("inv_initial_state_as_stored", "inv_state_reset_at_episode_starts", "inv_sequence_replay_recomputed"):
        assert out[key] < 1e-5, key
    # A feed-forward net replays nothing: the statistics are not measured.
    ff_cfg = TrainConfig(env="CartPole-v1", num_envs=4, rollout_length=16, num_minibatches=2).validate()
    ff_runner = EnvRunner(ff_cfg.env, ff_cfg.num_envs, 0)
    ff_net = make_network(ff_cfg, ff_runner.obs_space, ff_runner.action_space)
    ff_out = make_learner(ff_cfg, ff_net, torch.device("cpu")).learn(ff_runner.collect(ff_net, 16))
    assert math.isnan(ff_out["inv_sequence_replay_recomputed"])


def test_a_recurrent_learner_provides_the_recurrent_sources_at_debug():
    from rlvitals.telemetry.catalogue import METRICS

    cfg, runner, net = _recurrent_parts()
    learner = make_learner(cfg, net, torch.device("cpu"), type("Debug", (), {"wants_debug": True})())
    stats = learner.learn(runner.collect(net, cfg.rollout_length))
    sources = [m.source for m in METRICS if m.only_in == "recurrent policy"]
    assert sources and all(key in stats for key in sources), sources
    assert stats["recurrent_state_rms"] >= 0 and 0 <= stats["recurrent_gate_saturated_ratio"] <= 1


def test_the_reference_replay_is_the_products_at_float32_rounding():
    cfg, runner, net = _recurrent_parts()
    rollout = runner.collect(net, 64)
    runner.collect(net, 64)
    starts = starts_from_validity(rollout.initial_starts, rollout.valid)
    reference, _ = reference_replay(net, rollout.obs[:-1], starts, rollout.initial_state)
    assert (reference - rollout.behaviour_params.double()).abs().max().item() < 1e-5


def test_the_recurrent_stages_sit_between_the_actors_record_and_its_draws():
    assert STAGE_RANK["boundary_observations"] < STAGE_RANK["initial_state_as_stored"] \
        < STAGE_RANK["sequence_replay_recomputed"] < STAGE_RANK["sampling_logp"]
    assert BY_NAME["state_reset_at_episode_starts"].per_batch   # a Ray run names the actors


@pytest.mark.parametrize("name", [bug.name for bug in RECURRENT_BUGS])
def test_a_hidden_state_fault_is_named_on_its_owner(name, tmp_path):
    bug = BY_BUG[name]
    found = diagnose(tmp_path / name, bug=bug, budget_s=300)
    first = found.first
    assert first is not None and first.severity in LOUD, found.verdicts
    # The invariant it was designed to break, or another of the same stage (a state never reset also ends each
    # rollout in another state than the reference's, which the next rollout's stored state is held to).
    stage_of = {inv.rule_name: STAGE_RANK[inv.name] for inv in BY_NAME.values()}
    assert first.component == bug.component, found.verdicts
    assert stage_of.get(first.rule) == STAGE_RANK[bug.invariant], found.verdicts
    assert first.first_update <= 4


def test_a_healthy_recurrent_run_solves_the_memory_probe_with_no_warning(tmp_path):
    summary = train(env="rlvitals/MemoryProbe-v0", recurrent_size=16, num_envs=8, rollout_length=32,
                    num_minibatches=4, total_env_steps=12_000, progress=False, run_dir=str(tmp_path / "lstm"))
    assert summary["verdicts"]["critical"] == 0 and summary["verdicts"]["warning"] == 0, summary["verdicts"]
    assert summary["mean_return_last_100"] > 0.9
    assert summary["judgement"]["invariants_broken"] == {}


def test_a_feed_forward_policy_cannot_solve_the_memory_probe(tmp_path):
    summary = train(env="rlvitals/MemoryProbe-v0", num_envs=8, rollout_length=32, num_minibatches=4,
                    total_env_steps=12_000, progress=False, verbosity="off", run_dir=str(tmp_path / "ff"))
    assert summary["mean_return_last_100"] < 0.5   # its best is 0 in expectation: it never sees the cue in time


def _doctor_memory(tmp_path, bug=None):
    from rlvitals.doctor.main import DoctorRequest, run_doctor

    request = DoctorRequest(seed=0, keep=str(tmp_path / "doctor"), ladder=False, recurrent_size=16)
    with pytest.MonkeyPatch.context() as mp:
        if bug is not None:
            bug.apply(mp)
        return run_doctor(request, quiet=True)


def test_the_doctors_memory_probe_passes_a_correct_recurrent_policy(tmp_path):
    assert _doctor_memory(tmp_path) == []


@pytest.mark.parametrize("bug", DOCTOR_RECURRENT_BUGS, ids=lambda b: b.name)
def test_the_doctors_memory_probe_names_a_learner_that_does_not_learn_through_time(bug, tmp_path):
    verdicts = _doctor_memory(tmp_path, bug)
    assert [(v.rule, v.component) for v in verdicts] == [(bug.doctor_rule, bug.component)], verdicts
