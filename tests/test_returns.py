"""Discounted returns, GAE and V-trace against slow references in the papers' notation.

In the style of TorchBeast's `vtrace_test.py`: every function is checked
against a reference written as the explicit sums and products of the papers
(Schulman et al. 2016 for GAE, Espeholt et al. 2018 eq. 1 for V-trace), in
plain Python floats, one environment column at a time, plus small cases whose
numbers are worked out by hand in the comments. V-trace is also checked against
RLlib's implementation and GAE against a lambda-return of n-step returns.

Conventions (see `learner/returns.py`): time-major [T, N]; `next_values[t]` is
V(x_{t+1}); termination zeroes the bootstrap, truncation keeps it; `done`
(terminated or truncated) cuts the credit; `valid[t] = False` marks a NEXT_STEP
reset transition, which contributes nothing and lets nothing through.
"""

from __future__ import annotations

import ast
import importlib.util
import math
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from rlvitals.learner.returns import discounted_returns, gae, vtrace

F64 = torch.float64
INF = float("inf")


# --------------------------------------------------------------------------
# Reference implementations: plain Python floats, one column at a time.
# --------------------------------------------------------------------------

def _column(x, n):
    return [v for v in x[:, n].tolist()]


def _segment_end(s, done, valid):
    """Last step e >= s whose credit reaches s: the episode's done step, the last
    step of the rollout, or the step just before a reset transition."""
    T = len(done)
    e = s
    while not (done[e] or e == T - 1 or not valid[e + 1]):
        e += 1
    return e


def _deltas(values, next_values, rewards, terminated, gamma):
    # delta_t = r_t + gamma * (1 - term_t) * V(x_{t+1}) - V(x_t)
    return [r + gamma * (0.0 if term else nv) - v
            for v, nv, r, term in zip(values, next_values, rewards, terminated, strict=True)]


def ref_returns_column(rewards, next_values, terminated, done, valid, gamma):
    """G_s = sum_{k=s}^{e} gamma^{k-s} r_k + gamma^{e-s+1} (1 - term_e) V(x_{e+1})."""
    T = len(rewards)
    out = []
    for s in range(T):
        if not valid[s]:
            out.append(0.0)
            continue
        e = _segment_end(s, done, valid)
        g = sum(gamma ** (k - s) * rewards[k] for k in range(s, e + 1))
        if not terminated[e]:
            g += gamma ** (e - s + 1) * next_values[e]
        out.append(g)
    return out


def ref_gae_column(values, next_values, rewards, terminated, done, valid, gamma, lam):
    """A_s = sum_{l=0}^{e-s} (gamma lam)^l delta_{s+l}   (GAE paper, eq. 16, cut at e)."""
    T = len(rewards)
    delta = _deltas(values, next_values, rewards, terminated, gamma)
    out = []
    for s in range(T):
        if not valid[s]:
            out.append(0.0)
            continue
        e = _segment_end(s, done, valid)
        out.append(sum((gamma * lam) ** k * delta[s + k] for k in range(e - s + 1)))
    return out


def ref_vtrace_column(values, next_values, rewards, terminated, done, valid, log_rhos,
                      gamma, lam, rho_clip, c_clip):
    """Espeholt et al. 2018 eq. 1 with lambda folded into c:

        v_s = V(x_s) + sum_{t=s}^{e} gamma^{t-s} (prod_{i=s}^{t-1} c_i) rho_t delta_t
        rho_t = min(rho_clip, pi/mu(a_t|x_t)),  c_i = lam * min(c_clip, pi/mu(a_i|x_i))

    and the PPO advantage, the estimate of Q(x_s, a_s) - V(x_s) for the action taken
    (section 4.2 with lambda, without the leading rho_s that PPO's ratio supplies):

        A_s = delta_s + gamma lam (v_{s+1} - V(x_{s+1}))     (s < e)
        A_s = delta_s                                          (s = e: the episode or rollout ends)

    with v_{s+1} - V(x_{s+1}) the eq. 1 sum started at s+1. No c_s: a_s is given.
    """
    T = len(rewards)
    delta = _deltas(values, next_values, rewards, terminated, gamma)
    ratio = [math.exp(x) for x in log_rhos]
    rho = [min(rho_clip, x) for x in ratio]
    c = [lam * min(c_clip, x) for x in ratio]

    def correction(s, e):   # v_s - V(x_s), eq. 1 summed out
        total = 0.0
        for t in range(s, e + 1):
            prod_c = 1.0
            for i in range(s, t):
                prod_c *= c[i]
            total += gamma ** (t - s) * prod_c * rho[t] * delta[t]
        return total

    vs, adv = [], []
    for s in range(T):
        if not valid[s]:
            vs.append(values[s])
            adv.append(0.0)
            continue
        e = _segment_end(s, done, valid)
        vs.append(values[s] + correction(s, e))
        adv.append(delta[s] + (gamma * lam * correction(s + 1, e) if s < e else 0.0))
    return vs, adv


def ref_lambda_return_gae_column(values, next_values, rewards, terminated, done, valid, gamma, lam):
    """GAE as the lambda-return minus the baseline (Sutton & Barto eq. 12.9, truncated at e):

        G^(n)_s  = sum_{k<n} gamma^k r_{s+k} + gamma^n (1 - term_{s+n-1}) V(x_{s+n})
        G^lam_s  = (1 - lam) sum_{n=1}^{L-1} lam^{n-1} G^(n)_s + lam^{L-1} G^(L)_s,   L = e - s + 1
        A_s      = G^lam_s - V(x_s)

    Built from n-step returns, not TD errors: a second formulation, independent of
    ref_gae_column. Needs consistent values (V(x_{s+n}) = values[s+n] inside an episode).
    """
    out = []
    for s in range(len(rewards)):
        if not valid[s]:
            out.append(0.0)
            continue
        e = _segment_end(s, done, valid)
        L = e - s + 1

        def n_step(s, n):
            last = s + n - 1
            g = sum(gamma ** k * rewards[s + k] for k in range(n))
            return g + (0.0 if terminated[last] else gamma ** n * next_values[last])

        g_lam = (1 - lam) * sum(lam ** (n - 1) * n_step(s, n) for n in range(1, L)) + lam ** (L - 1) * n_step(s, L)
        out.append(g_lam - values[s])
    return out


def ref_returns(rewards, next_values, terminated, done, gamma, valid=None):
    valid = torch.ones_like(done) if valid is None else valid
    cols = [ref_returns_column(_column(rewards, n), _column(next_values, n), _column(terminated, n),
                               _column(done, n), _column(valid, n), gamma)
            for n in range(rewards.shape[1])]
    return torch.tensor(cols, dtype=F64).T


def ref_gae(values, next_values, rewards, terminated, done, gamma, lam, valid=None):
    valid = torch.ones_like(done) if valid is None else valid
    cols = [ref_gae_column(_column(values, n), _column(next_values, n), _column(rewards, n),
                           _column(terminated, n), _column(done, n), _column(valid, n), gamma, lam)
            for n in range(rewards.shape[1])]
    return torch.tensor(cols, dtype=F64).T


def ref_vtrace(values, next_values, rewards, terminated, done, log_rhos, gamma, lam,
               rho_clip, c_clip, valid=None):
    valid = torch.ones_like(done) if valid is None else valid
    vs_cols, adv_cols = [], []
    for n in range(rewards.shape[1]):
        vs, adv = ref_vtrace_column(_column(values, n), _column(next_values, n), _column(rewards, n),
                                    _column(terminated, n), _column(done, n), _column(valid, n),
                                    _column(log_rhos, n), gamma, lam, rho_clip, c_clip)
        vs_cols.append(vs)
        adv_cols.append(adv)
    return torch.tensor(vs_cols, dtype=F64).T, torch.tensor(adv_cols, dtype=F64).T


# --------------------------------------------------------------------------
# Random rollouts shaped like the runner's (NEXT_STEP autoreset).
# --------------------------------------------------------------------------

def random_rollout(seed, T, N, p_term=0.12, p_trunc=0.08, dtype=F64, log_rho_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    values_all = torch.randn(T + 1, N, generator=g, dtype=dtype)
    rewards = torch.randn(T, N, generator=g, dtype=dtype)
    terminated = torch.rand(T, N, generator=g) < p_term
    truncated = torch.rand(T, N, generator=g) < p_trunc   # may coincide with terminated
    done = terminated | truncated
    # A reset transition follows every done; the first step may be one too
    # (the previous rollout ended on a done).
    valid = torch.empty(T, N, dtype=torch.bool)
    valid[0] = torch.rand(N, generator=g) > 0.25
    valid[1:] = ~done[:-1]
    # Garbage on reset transitions: it must never matter.
    rewards = torch.where(valid, rewards, 100.0 * torch.randn(T, N, generator=g, dtype=dtype))
    log_rhos = log_rho_scale * torch.randn(T, N, generator=g, dtype=dtype)
    return dict(values=values_all[:T], next_values=values_all[1:], rewards=rewards,
                terminated=terminated, truncated=truncated, done=done, valid=valid,
                log_rhos=log_rhos)


def independent_values(seed, T, N):
    """Variant where next_values[t] is unrelated to values[t+1] (the formulas must not care)."""
    d = random_rollout(seed, T, N)
    g = torch.Generator().manual_seed(seed + 1000)
    d["next_values"] = torch.randn(T, N, generator=g, dtype=F64)
    return d


SHAPES = [(1, 1), (5, 1), (7, 3), (16, 4), (24, 8)]
SEEDS = [0, 1, 2]


def close(actual, expected, atol=1e-10, rtol=1e-10):
    torch.testing.assert_close(actual.to(F64), expected.to(F64), atol=atol, rtol=rtol)


def as_t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


# --------------------------------------------------------------------------
# (1) discounted_returns, worked by hand.
# --------------------------------------------------------------------------

def test_discounted_returns_hand_worked():
    # gamma = 0.5, T = 4, three columns with the same rewards and bootstrap values:
    #   rewards      r = [1, 2, 3, 4]
    #   next_values  V(x_{t+1}) = [10, 20, 30, 40]
    # col 0: terminated at t=1 -> no bootstrap there, a new episode starts at t=2
    # col 1: truncated at t=1  -> bootstrap from V(x_2) = 20 at t=1
    # col 2: no done           -> bootstrap from V(x_4) = 40 at the end of the rollout
    gamma = 0.5
    rewards = as_t([[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]])
    next_values = as_t([[10, 10, 10], [20, 20, 20], [30, 30, 30], [40, 40, 40]])
    terminated = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    truncated = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    done = terminated | truncated
    # Every column, rollout end: G_3 = 4 + 0.5*40 = 24, G_2 = 3 + 0.5*24 = 15.
    # col 0: G_1 = 2 + 0.5*0          = 2     G_0 = 1 + 0.5*2    = 2
    # col 1: G_1 = 2 + 0.5*20         = 12    G_0 = 1 + 0.5*12   = 7
    # col 2: G_1 = 2 + 0.5*15         = 9.5   G_0 = 1 + 0.5*9.5  = 5.75
    expected = as_t([[2, 7, 5.75], [2, 12, 9.5], [15, 15, 15], [24, 24, 24]])
    out = discounted_returns(rewards, next_values, terminated, done, gamma)
    close(out, expected)
    close(ref_returns(rewards, next_values, terminated, done, gamma), expected)


def test_discounted_returns_hand_worked_with_reset_transition():
    # gamma = 0.5. Termination at t=1, t=2 is the NEXT_STEP reset transition
    # (valid False) carrying a garbage reward of 100 and a garbage V of 1000.
    #   r = [1, 2, 100, 4],  V(x_{t+1}) = [10, 20, 1000, 40]
    # G_3 = 4 + 0.5*40 = 24   (new episode, bootstrapped at the rollout's end)
    # G_2 = 0                 (reset transition)
    # G_1 = 2 + 0 = 2         (terminated)
    # G_0 = 1 + 0.5*2 = 2     (the 100 and the 24 never reach the old episode)
    rewards = as_t([[1], [2], [100], [4]])
    next_values = as_t([[10], [20], [1000], [40]])
    terminated = torch.tensor([[0], [1], [0], [0]], dtype=torch.bool)
    valid = torch.tensor([[1], [1], [0], [1]], dtype=torch.bool)
    out = discounted_returns(rewards, next_values, terminated, terminated, 0.5, valid=valid)
    close(out, as_t([[2], [2], [0], [24]]))


def test_discounted_returns_truncation_at_last_step_and_termination_at_last_step():
    # gamma = 0.9, T = 2. col 0 truncates at the last step, col 1 terminates there.
    #   r = [1, 1], V(x_{t+1}) = [5, 10]
    # col 0: G_1 = 1 + 0.9*10 = 10,  G_0 = 1 + 0.9*10 = 10
    # col 1: G_1 = 1 + 0      = 1,   G_0 = 1 + 0.9*1  = 1.9
    rewards = as_t([[1, 1], [1, 1]])
    next_values = as_t([[5, 5], [10, 10]])
    terminated = torch.tensor([[0, 0], [0, 1]], dtype=torch.bool)
    done = torch.tensor([[0, 0], [1, 1]], dtype=torch.bool)
    out = discounted_returns(rewards, next_values, terminated, done, 0.9)
    close(out, as_t([[10, 1.9], [10, 1]]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T,N", SHAPES)
def test_discounted_returns_matches_reference(seed, T, N):
    d = independent_values(seed, T, N)
    for gamma in (0.0, 0.9, 1.0):
        args = (d["rewards"], d["next_values"], d["terminated"], d["done"], gamma)
        close(discounted_returns(*args, valid=d["valid"]), ref_returns(*args, valid=d["valid"]))
        close(discounted_returns(*args), ref_returns(*args))


# --------------------------------------------------------------------------
# (2) GAE against the reference.
# --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T,N", SHAPES)
@pytest.mark.parametrize("make", [random_rollout, independent_values])
def test_gae_matches_reference(seed, T, N, make):
    d = make(seed, T, N)
    for gamma, lam in [(0.99, 0.95), (0.9, 0.0), (0.9, 1.0), (1.0, 0.5), (0.0, 0.7)]:
        args = (d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"], gamma, lam)
        close(gae(*args, valid=d["valid"]), ref_gae(*args, valid=d["valid"]))
        close(gae(*args), ref_gae(*args))


def test_gae_hand_worked():
    # gamma = 0.5, lam = 0.5 (gamma*lam = 0.25), one column, truncation at t=1:
    #   V(x_t) = [1, 2, 3],  V(x_{t+1}) = [2, 8, 4],  r = [1, 1, 1]
    #   (V(x_2) = 8 is the true final observation of the truncated episode)
    # delta_0 = 1 + 0.5*2 - 1 = 1
    # delta_1 = 1 + 0.5*8 - 2 = 3        (truncated: bootstrap kept)
    # delta_2 = 1 + 0.5*4 - 3 = 0
    # A_2 = 0;  A_1 = delta_1 = 3 (done: nothing flows back from t=2);  A_0 = 1 + 0.25*3 = 1.75
    values, next_values, rewards = as_t([[1], [2], [3]]), as_t([[2], [8], [4]]), as_t([[1], [1], [1]])
    terminated = torch.zeros(3, 1, dtype=torch.bool)
    done = torch.tensor([[0], [1], [0]], dtype=torch.bool)
    close(gae(values, next_values, rewards, terminated, done, 0.5, 0.5), as_t([[1.75], [3], [0]]))
    # Same, but terminated at t=1: delta_1 = 1 + 0 - 2 = -1, A_1 = -1, A_0 = 1 - 0.25 = 0.75.
    close(gae(values, next_values, rewards, done, done, 0.5, 0.5), as_t([[0.75], [-1], [0]]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T,N", [(9, 3), (24, 8)])
def test_gae_limits(seed, T, N):
    """lam = 0 is the one-step TD error; lam = 1 is G_t - V(x_t) (consistent values)."""
    d = random_rollout(seed, T, N)
    v, nv, r, term, done, valid = (d[k] for k in ("values", "next_values", "rewards", "terminated",
                                                  "done", "valid"))
    gamma = 0.9
    td = (r + gamma * (~term).to(F64) * nv - v) * valid
    close(gae(v, nv, r, term, done, gamma, 0.0, valid=valid), td)
    a1 = gae(v, nv, r, term, done, gamma, 1.0, valid=valid)
    g = discounted_returns(r, nv, term, done, gamma, valid=valid)
    close(a1[valid], (g - v)[valid])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T,N", [(1, 1), (9, 3), (24, 8)])
def test_gae_matches_lambda_return_reference(seed, T, N):
    d = random_rollout(seed, T, N, p_term=0.15, p_trunc=0.1)   # consistent values: V(x_{t+1}) shared
    for gamma, lam in [(0.99, 0.95), (0.9, 0.0), (0.9, 1.0), (1.0, 0.5)]:
        cols = []
        for n in range(N):
            cols.append(ref_lambda_return_gae_column(
                *(_column(d[k], n) for k in ("values", "next_values", "rewards", "terminated", "done", "valid")),
                gamma, lam))
        expected = torch.tensor(cols, dtype=F64).T
        out = gae(d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"], gamma, lam,
                  valid=d["valid"])
        close(out, expected, atol=1e-9, rtol=1e-9)


# --------------------------------------------------------------------------
# (3) V-trace against the reference, off-policy.
# --------------------------------------------------------------------------

CLIPS = [(0.5, 0.5), (1.0, 1.0), (2.0, 1.5), (1.0, 0.5), (0.7, 2.0), (INF, INF)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T,N", [(1, 1), (7, 3), (24, 8)])
@pytest.mark.parametrize("rho_clip,c_clip", CLIPS)
def test_vtrace_matches_reference(seed, T, N, rho_clip, c_clip):
    d = independent_values(seed, T, N)
    gamma = 0.9
    for lam in (0.0, 0.5, 0.95, 1.0):
        args = (d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"],
                d["log_rhos"], gamma, lam, rho_clip, c_clip)
        for valid in (d["valid"], None):
            vs, adv = vtrace(*args, valid=valid)
            ref_vs, ref_adv = ref_vtrace(*args, valid=valid)
            close(vs, ref_vs)
            close(adv, ref_adv)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rho_clip,c_clip", CLIPS)
def test_vtrace_advantage_is_q_estimate_minus_baseline(seed, rho_clip, c_clip):
    """Section 4.2 with lambda, from vtrace's own targets (consistent values):
        A_s = r_s + gamma (1 - term_s) [(1 - lam) V(x_{s+1}) + lam v_{s+1}] - V(x_s)
    where v_{s+1} = V(x_{s+1}) at a cut (no later step belongs to the episode)."""
    T, N, gamma = 16, 4, 0.9
    d = random_rollout(seed, T, N)
    v, nv, r, term, done, valid, lr = (d[k] for k in ("values", "next_values", "rewards", "terminated",
                                                      "done", "valid", "log_rhos"))
    for lam in (0.0, 0.8, 1.0):
        vs, adv = vtrace(v, nv, r, term, done, lr, gamma, lam, rho_clip, c_clip, valid=valid)
        v_next = nv.clone()
        through = ~done[:-1] & valid[1:]
        v_next[:-1] = torch.where(through, vs[1:], nv[:-1])
        q = r + gamma * (~term).to(F64) * ((1 - lam) * nv + lam * v_next)
        close(adv[valid], (q - v)[valid])
        # And the target's recursion: v_s - V(x_s) = rho_s delta_s + gamma c_s (v_{s+1} - V(x_{s+1})).
        delta = r + gamma * (~term).to(F64) * nv - v
        rho, c = lr.exp().clamp(max=rho_clip), lam * lr.exp().clamp(max=c_clip)
        close((vs - v)[valid], (rho * delta + gamma * c * (v_next - nv))[valid])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rho_clip,c_clip", [(1.0, 1.0), (INF, INF), (0.5, 2.0)])
def test_vtrace_advantage_ignores_its_own_actions_ratio(seed, rho_clip, c_clip):
    """A_s is about the action taken at s: d A_s / d log_rho_s = 0, while later ratios
    (which weigh later actions) and the target v_s (which averages over a_s) do move."""
    T, N = 10, 3
    d = random_rollout(seed, T, N, p_term=0.1, p_trunc=0.05, log_rho_scale=0.3)
    args = lambda lr: (d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"], lr,  # noqa: E731
                       0.9, 0.8, rho_clip, c_clip)
    J_adv, J_vs = torch.autograd.functional.jacobian(
        lambda lr: tuple(reversed(vtrace(*args(lr), valid=d["valid"]))), d["log_rhos"])
    for s in range(T):
        for n in range(N):
            assert J_adv[s, n, s, n] == 0.0, (s, n)
    assert J_adv.abs().sum() > 0 and J_vs.abs().sum() > 0


# --------------------------------------------------------------------------
# (3b) V-trace against RLlib's implementation (an independent transcription).
# --------------------------------------------------------------------------

def rllib_from_importance_weights():
    """RLlib's `vtrace_torch.from_importance_weights`, from the installed `ray` wheel.

    Importing it through `ray.rllib` pulls in ray.tune, pandas, pyarrow and dm-tree,
    which this project does not install; the function itself needs only torch. So
    when the import fails, its source text is taken verbatim from the wheel's file
    and compiled on its own (RLlib's tensor conversion replaced by torch.as_tensor).
    """
    try:
        from ray.rllib.algorithms.impala.vtrace_torch import from_importance_weights
        return from_importance_weights
    except Exception:  # any import failure means: read the file instead
        pass
    spec = importlib.util.find_spec("ray")
    path = Path(spec.origin).parent / "rllib" / "algorithms" / "impala" / "vtrace_torch.py" if spec else None
    if path is None or not path.exists():
        pytest.skip("ray's rllib/algorithms/impala/vtrace_torch.py is not installed")
    fns = [n for n in ast.parse(path.read_text()).body
           if isinstance(n, ast.FunctionDef) and n.name == "from_importance_weights"]
    if not fns:
        pytest.skip(f"{path} has no from_importance_weights")
    namespace = {"torch": torch, "VTraceReturns": namedtuple("VTraceReturns", "vs pg_advantages"),
                 "convert_to_torch_tensor": lambda x, device=None: torch.as_tensor(x, device=device)}
    exec(compile(ast.Module(body=fns, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["from_importance_weights"]


def _segments(done, valid):
    """(start, end) of each stretch of one column whose credit flows together."""
    out, s, T = [], 0, len(done)
    while s < T:
        if not valid[s]:
            s += 1
            continue
        e = _segment_end(s, done, valid)
        out.append((s, e))
        s = e + 1
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rho_clip", [0.5, 1.0, 2.0, INF])
@pytest.mark.parametrize("log_rho_scale", [0.0, 0.7, 2.0])
def test_vtrace_matches_rllib(seed, rho_clip, log_rho_scale):
    """Per episode stretch, RLlib's v_s equals ours and its pg_advantages equal ours times
    the clipped rho_s. RLlib has no lambda and clips c at 1 (lam = 1, c_clip = 1 here), and
    bootstraps only at the end of its input: each stretch between cuts goes in alone, with
    discount 0 at a termination and V of the true final observation after a truncation."""
    fiw = rllib_from_importance_weights()
    T, N, gamma = 20, 6, 0.95
    d = random_rollout(seed, T, N, p_term=0.08, p_trunc=0.05, log_rho_scale=log_rho_scale)
    vs, adv = vtrace(d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"], d["log_rhos"],
                     gamma, 1.0, rho_clip, 1.0, valid=d["valid"])
    clip = None if rho_clip == INF else rho_clip
    stretches = 0
    for n in range(N):
        for s, e in _segments(d["done"][:, n].tolist(), d["valid"][:, n].tolist()):
            part = {k: d[k][s:e + 1, n:n + 1] for k in ("terminated", "log_rhos", "rewards", "values")}
            discounts = gamma * (~part["terminated"]).to(F64)
            out = fiw(part["log_rhos"], discounts, part["rewards"], part["values"], d["next_values"][e, n:n + 1],
                      clip_rho_threshold=clip, clip_pg_rho_threshold=clip)
            pg_rho = part["log_rhos"].exp().clamp(max=rho_clip)
            close(vs[s:e + 1, n:n + 1], out.vs, atol=1e-9, rtol=1e-9)
            close(adv[s:e + 1, n:n + 1] * pg_rho, out.pg_advantages, atol=1e-9, rtol=1e-9)
            stretches += 1
    assert stretches > N


# --------------------------------------------------------------------------
# (4) On-policy V-trace is GAE.
# --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("T,N", SHAPES)
def test_vtrace_on_policy_equals_gae(seed, T, N):
    d = random_rollout(seed, T, N)
    gamma = 0.99
    common = (d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"])
    for lam in (0.0, 0.5, 0.95, 1.0):
        for rho_clip, c_clip in [(1.0, 1.0), (1.5, 1.0), (1.0, 3.0), (INF, INF)]:
            for valid in (d["valid"], None):
                a = gae(*common, gamma, lam, valid=valid)
                vs, adv = vtrace(*common, torch.zeros_like(d["rewards"]), gamma, lam, rho_clip,
                                 c_clip, valid=valid)
                close(adv, a, atol=1e-12, rtol=1e-12)
                close(vs - d["values"], a, atol=1e-12, rtol=1e-12)


def test_vtrace_on_policy_equals_gae_float32():
    d = random_rollout(7, 32, 16, dtype=torch.float32)
    common = (d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"])
    a = gae(*common, 0.99, 0.95, valid=d["valid"])
    vs, adv = vtrace(*common, torch.zeros_like(d["rewards"]), 0.99, 0.95, valid=d["valid"])
    assert vs.dtype == adv.dtype == a.dtype == torch.float32
    assert vs.shape == adv.shape == a.shape == (32, 16)
    torch.testing.assert_close(adv, a, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(vs - d["values"], a, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------
# (5) V-trace worked by hand.
# --------------------------------------------------------------------------

def test_vtrace_hand_worked_three_steps():
    # gamma = 0.5, lam = 1, rho_clip = c_clip = 1, no dones.
    #   V(x_t)     = [1, 2, 3]
    #   V(x_{t+1}) = [2, 3, 4]
    #   r          = [1, 0, 2]
    #   pi/mu      = [2, 0.5, 0.25]  ->  rho = [1, 0.5, 0.25],  c = [1, 0.5, 0.25]
    # delta_0 = 1 + 0.5*2 - 1 = 1
    # delta_1 = 0 + 0.5*3 - 2 = -0.5
    # delta_2 = 2 + 0.5*4 - 3 = 1
    # v_2 - V_2 = rho_2 delta_2                       = 0.25*1                     = 0.25
    # v_1 - V_1 = rho_1 delta_1 + g c_1 (v_2 - V_2)   = 0.5*-0.5 + 0.5*0.5*0.25    = -0.1875
    # v_0 - V_0 = rho_0 delta_0 + g c_0 (v_1 - V_1)   = 1*1 + 0.5*1*-0.1875        = 0.90625
    # vs = [1.90625, 1.8125, 3.25]
    # A_2 = delta_2                                   = 1
    # A_1 = delta_1 + g lam (v_2 - V_2)               = -0.5 + 0.5*0.25            = -0.375
    # A_0 = delta_0 + g lam (v_1 - V_1)               = 1 + 0.5*-0.1875            = 0.90625
    # (A_1 is r_1 + g v_2 - V_1 = 0 + 0.5*3.25 - 2: the ratio 0.5 of a_1 does not cut it.)
    values, next_values, rewards = as_t([[1], [2], [3]]), as_t([[2], [3], [4]]), as_t([[1], [0], [2]])
    log_rhos = torch.log(as_t([[2], [0.5], [0.25]]))
    no = torch.zeros(3, 1, dtype=torch.bool)
    vs, adv = vtrace(values, next_values, rewards, no, no, log_rhos, 0.5, 1.0, 1.0, 1.0)
    close(vs, as_t([[1.90625], [1.8125], [3.25]]))
    close(adv, as_t([[0.90625], [-0.375], [1.0]]))
    ref_vs, ref_adv = ref_vtrace(values, next_values, rewards, no, no, log_rhos, 0.5, 1.0, 1.0, 1.0)
    close(ref_vs, vs)
    close(ref_adv, adv)


def test_vtrace_hand_worked_termination_and_distinct_clips():
    # gamma = 0.5, lam = 0.5, rho_clip = 3, c_clip = 1, terminated at t=1.
    #   V(x_t) = [1, 2, 3],  V(x_{t+1}) = [2, 3, 4],  r = [1, 0, 2]
    #   pi/mu = [0.5, 0.5, 4]  ->  rho = min(3, .) = [0.5, 0.5, 3]
    #                              c   = 0.5*min(1, .) = [0.25, 0.25, 0.5]
    # delta_0 = 1 + 0.5*2 - 1 = 1
    # delta_1 = 0 + 0 - 2     = -2     (terminated: no bootstrap)
    # delta_2 = 2 + 0.5*4 - 3 = 1
    # v_2 - V_2 = 3*1                         = 3      -> v_2 = 6
    # v_1 - V_1 = 0.5*-2 (done: nothing back) = -1     -> v_1 = 1
    # v_0 - V_0 = 0.5*1 + 0.5*0.25*-1         = 0.375  -> v_0 = 1.375
    # A_2 = 1;  A_1 = -2 (terminal: A = delta);  A_0 = 1 + 0.5*0.5*-1 = 0.75
    # (the old, wrong A_0 = delta_0 + g c_0 (v_1 - V_1) = 1 + 0.5*0.25*-1 = 0.875)
    values, next_values, rewards = as_t([[1], [2], [3]]), as_t([[2], [3], [4]]), as_t([[1], [0], [2]])
    log_rhos = torch.log(as_t([[0.5], [0.5], [4]]))
    term = torch.tensor([[0], [1], [0]], dtype=torch.bool)
    vs, adv = vtrace(values, next_values, rewards, term, term, log_rhos, 0.5, 0.5, 3.0, 1.0)
    close(vs, as_t([[1.375], [1.0], [6.0]]))
    close(adv, as_t([[0.75], [-2.0], [1.0]]))


def test_vtrace_hand_worked_truncation_bootstraps_off_policy():
    # gamma = 0.5, lam = 1, clips 1, truncated at t=0 with the true final V(x_1) = 8;
    # the reset transition at t=1 carries garbage; a new episode at t=2.
    #   V(x_t) = [2, 900, 1],  V(x_{t+1}) = [8, 700, 4],  r = [1, 50, 3],  pi/mu = [0.25, 9, 0.5]
    # delta_0 = 1 + 0.5*8 - 2 = 3;  rho_0 = 0.25
    # v_0 - V_0 = 0.25*3 = 0.75 (cut: nothing follows)   -> v_0 = 2.75
    # A_0 = delta_0 = 3          (truncation bootstraps: r_0 + g V(x_1) - V(x_0), not cut by 0.25)
    # delta_2 = 3 + 0.5*4 - 1 = 4; v_2 = 1 + 0.5*4 = 3; A_2 = 4
    values, next_values, rewards = as_t([[2], [900], [1]]), as_t([[8], [700], [4]]), as_t([[1], [50], [3]])
    log_rhos = torch.log(as_t([[0.25], [9], [0.5]]))
    no = torch.zeros(3, 1, dtype=torch.bool)
    done = torch.tensor([[1], [0], [0]], dtype=torch.bool)
    valid = torch.tensor([[1], [0], [1]], dtype=torch.bool)
    vs, adv = vtrace(values, next_values, rewards, no, done, log_rhos, 0.5, 1.0, valid=valid)
    close(vs, as_t([[2.75], [900], [3.0]]))
    close(adv, as_t([[3.0], [0.0], [4.0]]))


# --------------------------------------------------------------------------
# (6) Pairing: columns stay paired, time stays aligned, no credit across a done.
# --------------------------------------------------------------------------

def _all_outputs(d, gamma=0.9, lam=0.8, rho_clip=1.2, c_clip=0.9, with_valid=True):
    valid = d["valid"] if with_valid else None
    v, nv, r, term, done, lr = (d[k] for k in ("values", "next_values", "rewards", "terminated",
                                               "done", "log_rhos"))
    vs, adv = vtrace(v, nv, r, term, done, lr, gamma, lam, rho_clip, c_clip, valid=valid)
    return {
        "returns": discounted_returns(r, nv, term, done, gamma, valid=valid),
        "gae": gae(v, nv, r, term, done, gamma, lam, valid=valid),
        "vs": vs,
        "vtrace_adv": adv,
    }


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_valid", [True, False])
def test_permuting_env_columns_permutes_outputs(seed, with_valid):
    T, N = 12, 6
    d = independent_values(seed, T, N)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed + 99))
    permuted = {k: x[:, perm] for k, x in d.items()}
    out = _all_outputs(d, with_valid=with_valid)
    out_p = _all_outputs(permuted, with_valid=with_valid)
    for name in out:
        assert torch.equal(out_p[name], out[name][:, perm]), name


def test_single_reward_is_credited_at_its_own_step_and_earlier_only():
    # One reward of 1 at t=3, zero values, no dones, gamma = 0.5, lam = 1:
    # G_t = 0.5^(3-t) for t <= 3 and 0 after -> [0.125, 0.25, 0.5, 1, 0, 0].
    # Column 1 carries the reward at t=1 instead: the columns must not mix.
    T = 6
    rewards = torch.zeros(T, 2, dtype=F64)
    rewards[3, 0] = 1.0
    rewards[1, 1] = 1.0
    zeros = torch.zeros(T, 2, dtype=F64)
    no = torch.zeros(T, 2, dtype=torch.bool)
    col0 = as_t([0.125, 0.25, 0.5, 1, 0, 0])
    col1 = as_t([0.5, 1, 0, 0, 0, 0])
    expected = torch.stack([col0, col1], dim=1)
    close(discounted_returns(rewards, zeros, no, no, 0.5), expected)
    close(gae(zeros, zeros, rewards, no, no, 0.5, 1.0), expected)
    vs, adv = vtrace(zeros, zeros, rewards, no, no, zeros, 0.5, 1.0)
    close(vs, expected)
    close(adv, expected)


def _same_episode(s, t, done, valid):
    """Can the reward at step t legitimately reach the target at step s (same column)?"""
    if t < s or not valid[s] or not valid[t]:
        return False
    return not any(done[k] for k in range(s, t))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_valid", [True, False])
def test_rewards_only_reach_earlier_steps_of_their_own_episode(seed, with_valid):
    """d target[s, n] / d r[t, m] is zero unless m == n, t >= s and s..t lie in one episode;
    it is exactly gamma^(t-s) for the returns and (gamma lam)^(t-s) for GAE."""
    T, N, gamma, lam = 10, 3, 0.9, 0.8
    d = independent_values(seed, T, N)
    valid = d["valid"] if with_valid else torch.ones(T, N, dtype=torch.bool)

    def outputs(r):
        return _all_outputs({**d, "rewards": r}, gamma=gamma, lam=lam, with_valid=with_valid)

    names = ["returns", "gae", "vs", "vtrace_adv"]
    jac = torch.autograd.functional.jacobian(
        lambda r: tuple(outputs(r)[k] for k in names), d["rewards"], vectorize=True)
    done, valid_l = d["done"].tolist(), valid.tolist()
    for name, J in zip(names, jac, strict=True):  # J: [T, N, T, N]
        J = J.tolist()
        for s in range(T):
            for n in range(N):
                for t in range(T):
                    for m in range(N):
                        allowed = m == n and _same_episode(
                            s, t, [row[n] for row in done], [row[n] for row in valid_l])
                        val = J[s][n][t][m]
                        if not allowed:
                            assert val == 0.0, (name, s, n, t, m, val)
                        elif name == "returns":
                            assert val == pytest.approx(gamma ** (t - s)), (name, s, t)
                        elif name == "gae":
                            assert val == pytest.approx((gamma * lam) ** (t - s)), (name, s, t)
                        elif t == s:
                            assert val != 0.0, (name, s, n)


@pytest.mark.parametrize("seed", SEEDS)
def test_changing_a_later_episode_leaves_earlier_targets_unchanged(seed):
    """Rewrite everything after the first done of each column (rewards, values, ratios,
    flags); the targets up to and including that done must not move."""
    T, N = 14, 5
    d = random_rollout(seed, T, N, p_term=0.2, p_trunc=0.1)
    base = _all_outputs(d)
    other = random_rollout(seed + 500, T, N)
    changed = {k: x.clone() for k, x in d.items()}
    cut = []
    for n in range(N):
        dones = d["done"][:, n].nonzero().flatten().tolist()
        k = dones[0] if dones else T - 1
        cut.append(k)
        for key in ("values", "rewards", "log_rhos"):
            changed[key][k + 1:, n] = other[key][k + 1:, n]
        changed["next_values"][k + 1:, n] = other["next_values"][k + 1:, n]
        # next_values[k] is V of the episode's own final observation: kept.
    out = _all_outputs(changed)
    for name in base:
        for n in range(N):
            k = cut[n]
            assert torch.equal(out[name][: k + 1, n], base[name][: k + 1, n]), (name, n)


# --------------------------------------------------------------------------
# (7) Reset transitions.
# --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_reset_transitions_get_zero_advantage_and_no_correction(seed):
    d = random_rollout(seed, 20, 8, p_term=0.2, p_trunc=0.1)
    invalid = ~d["valid"]
    assert invalid.any()
    out = _all_outputs(d)
    assert torch.all(out["returns"][invalid] == 0)
    assert torch.all(out["gae"][invalid] == 0)
    assert torch.all(out["vtrace_adv"][invalid] == 0)
    assert torch.equal(out["vs"][invalid], d["values"][invalid])


def test_reset_transition_does_not_leak_next_episode_into_previous():
    # gamma = lam = 1 so that any leak would show up at full size.
    # Steps: 0 1 | 2 (reset) | 3 4; the episode 0-1 is truncated at t=1 with V(x_2) = 5.
    #   r          = [1, 1, 50, 7, 7]      (50 on the reset step is garbage)
    #   V(x_t)     = [0, 0, 900, 0, 0]
    #   V(x_{t+1}) = [0, 5, 800, 0, 3]
    # Episode A:  G_1 = 1 + 5 = 6,  G_0 = 1 + 6 = 7   (no 50, no 7s)
    # Reset:      0
    # Episode B:  G_4 = 7 + 3 = 10, G_3 = 7 + 10 = 17
    # With V = 0 on valid steps, GAE(lam=1) and on-policy V-trace give the same numbers.
    rewards = as_t([[1], [1], [50], [7], [7]])
    values = as_t([[0], [0], [900], [0], [0]])
    next_values = as_t([[0], [5], [800], [0], [3]])
    terminated = torch.zeros(5, 1, dtype=torch.bool)
    done = torch.tensor([[0], [1], [0], [0], [0]], dtype=torch.bool)
    valid = torch.tensor([[1], [1], [0], [1], [1]], dtype=torch.bool)
    log_rhos = as_t([[0], [0], [3.0], [0], [0]])   # a huge ratio on the reset step is ignored too
    expected = as_t([[7], [6], [0], [17], [10]])
    close(discounted_returns(rewards, next_values, terminated, done, 1.0, valid=valid), expected)
    close(gae(values, next_values, rewards, terminated, done, 1.0, 1.0, valid=valid), expected)
    vs, adv = vtrace(values, next_values, rewards, terminated, done, log_rhos, 1.0, 1.0,
                     rho_clip=INF, c_clip=INF, valid=valid)
    close(adv, expected)
    close(vs, as_t([[7], [6], [900], [17], [10]]))


@pytest.mark.parametrize("seed", SEEDS)
def test_garbage_on_reset_transitions_changes_nothing(seed):
    """Anything stored on a reset step (reward, value, bootstrap, ratio) is ignored
    everywhere except vs at that step, which is its own V."""
    d = random_rollout(seed, 20, 8, p_term=0.2, p_trunc=0.1)
    invalid = ~d["valid"]
    g = torch.Generator().manual_seed(seed + 7)
    changed = dict(d)
    for key in ("rewards", "values", "next_values", "log_rhos"):
        noise = 1e3 * torch.randn(d[key].shape, generator=g, dtype=F64)
        changed[key] = torch.where(invalid, noise, d[key])
    base, out = _all_outputs(d), _all_outputs(changed)
    for name in base:
        a, b = base[name], out[name]
        if name == "vs":
            assert torch.equal(a[~invalid], b[~invalid])
            assert torch.equal(b[invalid], changed["values"][invalid])
        else:
            assert torch.equal(a, b), name


def test_inputs_are_not_modified():
    d = random_rollout(3, 9, 4)
    before = {k: x.clone() for k, x in d.items()}
    _all_outputs(d)
    for k in d:
        assert torch.equal(d[k], before[k]), k
