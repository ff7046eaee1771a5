"""`rlvitals doctor`: planted bugs are each named by the right component, a healthy run names none.

Every bug is planted from outside the product code (a monkeypatch around the
seam a real bug would sit at) while the doctor trains the whole probe ladder
for real; the verdict must name the component the bug lives in. Then: the
user's-settings leg, the env check on good and broken envs, the Ray leg, and
bad input. Ladder runs take about 20 s of one core each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from planted_bugs import BY_BUG

from rlvitals.actors.probes import PROBES
from rlvitals.doctor import DoctorRequest, infer, render_table, run_doctor
from rlvitals.doctor.ladder import ProbeResult, evaluate, initial_network, probe_config
from rlvitals.doctor.patterns import PATTERNS
from rlvitals.telemetry.verdicts import COMPONENTS

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "rlvitals.cli"]


# ---------------------------------------------------------------- planted bugs (tests/planted_bugs.py)
PLANTED = {
    # name in this file: the library's bug (its component is what the verdict must name)
    "learning_rate_100x": BY_BUG["learning_rate_100x_in_the_step"],
    "optimizer_state_reset_every_step": BY_BUG["optimizer_state_reset_every_step"],
    "preprocessing_in_the_learner_only": BY_BUG["preprocessing_in_the_learner_only"],
    "observations_paired_with_the_next_step": BY_BUG["observations_one_step_early"],
    "rewards_one_step_late": BY_BUG["rewards_one_step_late"],
    "discount_ignored": BY_BUG["discount_ignored"],
    "truncation_as_termination": BY_BUG["truncation_as_termination"],
    "value_head_gets_no_gradient": BY_BUG["value_head_no_gradient"],
}
entropy_bonus_sign_flipped = BY_BUG["entropy_of_the_distribution_negated"].apply


def doctor_with(plant, **request) -> list:
    with pytest.MonkeyPatch.context() as mp:
        plant(mp)
        return run_doctor(DoctorRequest(seed=0, **request), quiet=True)


SUITE_PLANTED = ["learning_rate_100x", pytest.param("optimizer_state_reset_every_step", marks=pytest.mark.extended),
                 pytest.param("preprocessing_in_the_learner_only", marks=pytest.mark.extended),
                 pytest.param("observations_paired_with_the_next_step", marks=pytest.mark.extended),
                 "truncation_as_termination"]
"""The causes that all failed Probe 2 before the pattern table, and the time-limit probe's bug; bench/diagnosis.py
(--doctor all) puts every planted bug through the doctor. Three are `extended` (13-29 s each): Adam's cleared state
is pinned live by optimizer_state_kept (tests/test_invariants_learner.py), the pairing bug by the boundary tests,
the learner-only preprocessing by the run channel (tests/test_diagnosis.py's preprocessing_learner_only)."""


@pytest.mark.slow
@pytest.mark.parametrize("bug", SUITE_PLANTED)
def test_planted_bug_is_pinned_on_its_component(bug):
    planted = PLANTED[bug]
    verdicts = doctor_with(planted.apply)
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    verdict = verdicts[0]
    assert (verdict.component, verdict.severity) == (planted.component, "critical"), verdict.message
    if verdict.rule.startswith("doctor-invariant-"):
        # named from the invariants the probe runs broke: which ones, and on which probes
        assert verdict.message.startswith("invariants broken with the reference settings: ")
        assert any(f" on {p.name}" in verdict.message for p in PROBES), verdict.message
    else:
        # no invariant broke: the probes' pattern names it, one entry per probe in the message
        assert verdict.message.startswith("pattern with the reference settings: P1 ")
        assert all(f"{p.name} " in verdict.message for p in PROBES)


@pytest.mark.slow
@pytest.mark.extended   # 25 s; bench/diagnosis.py runs every doctor bug
def test_a_negated_entropy_is_named_by_its_invariant_even_where_the_bonus_is_zero(tmp_path):
    """The probes cannot see a negated entropy at the reference entropy_coef 0 (the bonus is inert there), but the
    loss's entropy invariant compares the entropies it is given with the distributions' own: named at once, under
    the reference settings, and once only though the user's large coefficient shows it too."""
    yours = tmp_path / "my.yaml"
    yours.write_text("entropy_coef: 0.5\nclip_coef: 0.3\nlearning_rate: 0.005\nanneal_lr: false\ngamma: 0.9\n"
                     "num_minibatches: 2\nenv: CartPole-v1\ntotal_env_steps: 1000000\n")
    from rlvitals.config import build_config

    verdicts = doctor_with(entropy_bonus_sign_flipped, config=build_config(str(yours)))
    assert len(verdicts) == 1, [v.to_dict() for v in verdicts]
    verdict = verdicts[0]
    assert (verdict.rule, verdict.component, verdict.severity) == \
        ("doctor-invariant-loss-gradient-entropy", "policy", "critical")
    assert verdict.message.startswith("invariants broken with the reference settings: loss_gradient_entropy (policy)")


# ---------------------------------------------------------------- healthy, end to end
@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """`rlvitals doctor --json --keep DIR` on the healthy code, as a user runs it."""
    keep = tmp_path_factory.mktemp("doctor") / "keep"
    proc = subprocess.run([*CLI, "doctor", "--json", "--keep", str(keep)], capture_output=True, text=True,
                          timeout=600, cwd=keep.parent)
    return proc, keep


@pytest.mark.slow
def test_healthy_code_gets_no_verdict(healthy):
    proc, _ = healthy
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout) == []
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_every_probe_is_learned_exactly_when_the_code_is_right(healthy, probe):
    """The kept networks, checked here independently of the doctor's verdict."""
    from rlvitals.evaluate import load_network

    _, keep = healthy
    run_dir = keep / "reference" / probe.env_id.replace("/", "-")
    if probe.uniform_policy:   # reference entropy_coef 0: nothing holds a noise-driven policy, so not run
        assert not run_dir.exists()
        return
    cfg, net = load_network(str(run_dir))
    obs = torch.tensor([[o] for o in probe.observations], dtype=torch.float32)
    with torch.no_grad():
        params, values = net(obs)
    probs = torch.softmax(params, -1)
    for i in range(len(probe.observations)):
        if probe.values:
            want = cfg.gamma if probe.values[i] is None else probe.values[i]
            assert abs(float(values[i]) - want) <= 0.05, (probe.name, float(values[i]), want)
        if probe.best_actions[i] is not None:
            assert float(probs[i, probe.best_actions[i]]) >= 0.95
    checks, frozen, _ = evaluate(probe, net, cfg.gamma, initial_network(cfg))
    assert all(checks.values()) and not frozen


def test_initial_network_is_the_one_a_run_starts_from(tmp_path):
    """The frozen-value check compares with initial_network(cfg): it must be the run's own start."""
    from rlvitals.archive import RunArchive
    from rlvitals.evaluate import load_network
    from rlvitals.training import train_local

    cfg = dataclasses.replace(probe_config(PROBES[2].env_id, 3, str(tmp_path / "run")), device="cpu",
                              learning_rate=1e-30, total_env_steps=256)
    archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["test"])
    try:
        train_local(cfg, archive)
    finally:
        archive.close()
    _, trained = load_network(cfg.run_dir)    # steps of 1e-30: weights move by at most about that much
    start = initial_network(cfg)
    for (name, a), (_, b) in zip(trained.state_dict().items(), start.state_dict().items(), strict=True):
        if name != "age_buffer":
            assert float((a - b).abs().max()) <= 1e-25, name
    assert any(float(w.abs().max()) > 0.01 for w in start.state_dict().values())   # a real, random start


# ---------------------------------------------------------------- the pattern table
def test_pattern_table_rows_are_reachable_and_documented():
    assert {p.component for p in PATTERNS} <= set(COMPONENTS)
    assert len({p.rule for p in PATTERNS}) == len(PATTERNS)
    doc = (ROOT / "docs" / "doctor.md").read_text()
    assert render_table() in doc, "docs/doctor.md is out of date: paste rlvitals.doctor.render_table() into it"

    def results(failing: dict[str, str], frozen: set[str] = frozenset(), gap: float = 0.0) -> list[ProbeResult]:
        out = []
        for p in PROBES:
            checks = {"V": True} if p.values else {}
            if any(a is not None for a in p.best_actions) or p.uniform_policy:
                checks["pi"] = True
            if p.reward_check:
                checks["r"] = True
            for check in failing.get(p.name, "").split("+"):
                if check:
                    checks[check] = False
            discrepancy = gap if len(p.best_actions) and (p.best_actions[0] is not None or p.uniform_policy) else None
            out.append(ProbeResult(p, "reference", checks, p.name in frozen, [], 0.0, discrepancy=discrepancy))
        return out

    everything = {p.name for p in PROBES if p.values}
    cases = {   # a canonical pattern for every row: it must reach that row and no earlier one
        "doctor-observations-paired-wrong": ({"P2": "V", "P3": "V", "P5": "V+pi"}, set(), 0.5),
        "doctor-learner-sees-other-observations": ({"P1": "V", "P6": "V", "P9": "V"}, set(), 0.5),
        "doctor-value-gets-no-gradient": ({n: "V" for n in everything} | {"P1": "V+r"}, everything),
        "doctor-rewards-lost": ({"P1": "V+r", "P4": "V+pi", "P7": "V"}, {"P1"}),
        "doctor-optimizer": ({"P1": "V", "P4": "pi", "P9": "V"}, set()),
        "doctor-episode-boundary": ({"P1": "V", "P4": "V", "P6": "V"}, set()),
        "doctor-optimizer-shared": ({"P4": "pi", "P7": "V", "P9": "V"}, set()),
        "doctor-truncation": ({"P7": "V"}, set()),
        "doctor-discounting": ({"P2": "V", "P7": "V", "P9": "V"}, set()),
        "doctor-preprocessing": ({"P2": "V", "P3": "V", "P6": "V"}, set()),
        "doctor-pairing": ({"P2": "V", "P3": "V", "P5": "V+pi"}, set()),
        "doctor-policy": ({"P8": "pi"}, set()),
    }
    assert set(cases) == {p.rule for p in PATTERNS}
    for rule, (failing, frozen, *gap) in cases.items():
        pattern, text = infer(results(failing, frozen, *gap))
        assert pattern is not None and pattern.rule == rule, (rule, text, pattern)
    assert infer(results({}))[0] is None
    assert infer(results({}, gap=0.5))[0].rule == "doctor-observations-paired-wrong"   # C alone fails a leg
    # a learner that records no discrepancy at all leaves C out of the reasoning
    none = results({"P2": "V", "P3": "V", "P5": "V+pi"})
    for r in none:
        r.discrepancy = None
    assert infer(none)[0].rule == "doctor-pairing" and infer(none)[1].endswith("C n/a")


# ---------------------------------------------------------------- the env check
BAD_ENVS = '''
import time
import gymnasium as gym
import numpy as np


class Base(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def obs(self):
        return self.np_random.uniform(-1, 1, size=2).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.obs(), {}

    def reward(self):
        return 1.0

    def step(self, action):
        self.t += 1
        return self.obs(), self.reward(), self.t >= 20, False, {}


class OutOfSpace(Base):
    def obs(self):
        o = super().obs()
        if self.t == 7:
            o[1] = 3.0
        return o


class NanReward(Base):
    def reward(self):
        return float("nan") if self.t == 5 else 1.0


class Endless(Base):
    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        return obs, reward, False, False, info


class Unseeded(Base):
    def obs(self):
        return np.random.default_rng(time.perf_counter_ns()).uniform(-1, 1, size=2).astype(np.float32)


class OwnLimitKept(Base):
    """Keeps a time limit of its own and never zeroes it in reset(): every episode after the first lasts a step."""

    def __init__(self):
        super().__init__()
        self.elapsed = 0

    def step(self, action):
        obs, reward, terminated, _, info = super().step(action)
        self.elapsed += 1
        return obs, reward, terminated, self.elapsed >= 15, info


class Depleting(Base):
    """Pays from a store that reset() does not refill: later episodes earn less, observing the same."""

    def __init__(self):
        super().__init__()
        self.store = 30

    def reward(self):
        self.store = max(self.store - 1, 0)
        return float(self.store > 0)


for cls in (Base, OutOfSpace, NanReward, Endless, Unseeded, OwnLimitKept, Depleting):
    gym.register(f"doctortest/{cls.__name__}-v0", entry_point=cls)
'''


@pytest.fixture(scope="module")
def env_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("envs")
    (folder / "doctor_bad_envs.py").write_text(textwrap.dedent(BAD_ENVS))
    return folder


@pytest.mark.parametrize("env, rules", [
    ("Base-v0", set()),
    ("OutOfSpace-v0", {"doctor-env-observation-outside-space"}),
    ("NanReward-v0", {"doctor-env-reward-not-finite"}),
    ("Endless-v0", {"doctor-env-episode-never-ends"}),
    ("Unseeded-v0", {"doctor-env-seeding-not-reproducible"}),
    ("OwnLimitKept-v0", {"doctor-env-reset-does-not-restore"}),
    ("Depleting-v0", {"doctor-env-reset-does-not-restore"}),
])
def test_env_check_flags_each_broken_env(env_module, monkeypatch, env, rules):
    from rlvitals.actors.envs import resolve_env_id
    from rlvitals.doctor.envcheck import check_env

    monkeypatch.syspath_prepend(str(env_module))
    verdicts, lines = check_env(resolve_env_id(f"doctor_bad_envs:doctortest/{env}"), seed=0, max_episode_steps=200)
    assert {v.rule for v in verdicts} == rules, lines
    assert all(v.component == "env" for v in verdicts)
    assert lines[0].startswith("FAIL" if rules else "PASS")
    if env == "OutOfSpace-v0":
        assert "element 1 is 3" in verdicts[0].message and "bounds [-1, 1]" in verdicts[0].message
    if env == "Endless-v0":
        assert "the bound is 200 steps" in verdicts[0].message


def test_env_check_names_a_time_limit_that_keeps_its_count_across_resets():
    from planted_bugs import BY_BUG

    from rlvitals.doctor.envcheck import check_env

    with pytest.MonkeyPatch.context() as mp:
        BY_BUG["time_limit_counter_not_reset"].apply(mp)
        verdicts, lines = check_env("Pendulum-v1", seed=0)
    assert {v.rule for v in verdicts} == {"doctor-env-reset-does-not-restore", "doctor-env-time-limit-broken"}, lines
    assert all(v.component == "env" and v.severity == "critical" for v in verdicts)


def test_env_check_passes_registered_envs():
    from rlvitals.doctor.envcheck import check_env

    for env in ("CartPole-v1", "Pendulum-v1"):       # discrete and continuous actions
        verdicts, lines = check_env(env, seed=1)
        assert verdicts == [], lines


def test_env_check_command_prints_verdicts_as_json(env_module):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(env_module), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([*CLI, "doctor", "--env", "doctor_bad_envs:doctortest/NanReward-v0", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    found = json.loads(proc.stdout)
    assert [v["rule"] for v in found] == ["doctor-env-reward-not-finite"]
    assert set(found[0]) == {"rule", "severity", "component", "first_seconds", "first_update", "message"}
    assert found[0]["component"] == "env" and "reward nan" in found[0]["message"]
    good = subprocess.run([*CLI, "doctor", "--env", "CartPole-v1"], capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[0].startswith("PASS  env CartPole-v1")
    assert good.stdout.splitlines()[-1] == "healthy: the env checks pass"


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv, names", [
    (["--seed", "-1"], "--seed=-1"),
    (["--seed", "x"], "--seed"),
    (["--max-episode-steps", "0", "--env", "CartPole-v1"], "--max-episode-steps=0"),
    (["--max-episode-steps", "50"], "--max-episode-steps=50 is invalid without --env"),
    (["--env", "NoSuchEnv-v9"], "env='NoSuchEnv-v9'"),
    (["--env", "no_such_module_xyz:Thing-v0"], "module 'no_such_module_xyz'"),
    (["--config", "missing.yaml"], "missing.yaml"),
    (["--config", "bad.yaml"], "learning_rate=-1"),
    (["--config", "unknown.yaml"], "unknown config field 'lerning_rate'"),
    (["--keep", "full"], "--keep='full' is invalid"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv, names):
    from rlvitals.cli import main

    (tmp_path / "bad.yaml").write_text("learning_rate: -1\n")
    (tmp_path / "unknown.yaml").write_text("lerning_rate: 0.1\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "something").write_text("x")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    keep = ["--keep", "new-keep"] if "--keep" not in argv else []     # must not be created either
    assert main(["doctor", *argv, *keep]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlvitals: error: ") and names in lines[0], err
    assert out == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before       # no keep dir, no run dir


# ---------------------------------------------------------------- the Ray leg
RAY_LEG = """
import json, sys
from pathlib import Path
from rlvitals.doctor.rayleg import run_ray_leg

if sys.argv[2] == "weights-never-republished":   # planted: the learner publishes its first weights only
    from rlvitals.distributed.fleet import Fleet

    first_publish = Fleet.publish

    def publish(self, net):
        if not hasattr(self, "_first"):
            self._first = first_publish(self, net)
        return self._first

    Fleet.publish = publish
verdicts, lines = run_ray_leg(0, Path(sys.argv[1]))
print(json.dumps({"verdicts": [v.to_dict() for v in verdicts], "lines": lines}))
"""


def ray_leg(folder: Path, bug: str = "none") -> dict:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16), "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", RAY_LEG, str(folder), bug], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ray_leg_follows_the_learner_and_replays_local_mode(tmp_path):
    found = ray_leg(tmp_path / "healthy")
    assert found["verdicts"] == [], found
    sync, asyn, learned = found["lines"]
    assert sync.startswith("PASS  ray sync") and "equal local mode's" in sync
    assert asyn.startswith("PASS  ray async") and "0 samples dropped" in asyn
    assert learned.startswith("PASS  ray async P5 learned")
    # the runs really went through Ray: the archive says so, and batches were stale but bounded
    for mode in ("sync", "async"):
        summary = json.loads((tmp_path / "healthy" / "ray" / mode / "summary.json").read_text())
        assert summary["mode"] == "ray" and summary["num_actors"] == 1
    rows = [json.loads(line) for line in
            (tmp_path / "healthy" / "ray" / "async" / "metrics.jsonl").read_text().splitlines()]
    staleness = [row["staleness"] for row in rows if "staleness" in row]
    assert staleness and max(staleness) > 0 and max(staleness) <= 2 * 4 * 2


@pytest.mark.extended   # 25 s; tests/test_stale_drops.py plants the same bug in a Ray run
def test_ray_leg_names_weight_sync_when_weights_are_never_republished(tmp_path):
    # planted: weights published once and never again; the actor's network age stops following the learner
    found = ray_leg(tmp_path / "bug", "weights-never-republished")
    rules = {v["rule"]: v for v in found["verdicts"]}
    assert set(rules) >= {"doctor-ray-sync-differs-from-local", "doctor-ray-weights-fall-behind"}, found
    assert {v["component"] for v in found["verdicts"]} == {"weight-sync"}
    assert "does not follow the learner's age" in rules["doctor-ray-weights-fall-behind"]["message"]
