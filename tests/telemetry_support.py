"""What the telemetry tests share: a tiny env in which every statistic is defined, hand-built learner
stats and rollouts, and readers of the exposition and the catalogue. The tests are in
test_telemetry_catalogue.py, test_telemetry_recorder.py, test_telemetry_interface.py and
test_telemetry_live.py.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from itertools import product

import numpy as np
import torch

from rlvitals.actors.rollout import EpisodeStats, Rollout
from rlvitals.telemetry import reference
from rlvitals.telemetry.catalogue import (
    BY_NAME,
    METRICS,
    Metric,
    exposed_names,
)
from rlvitals.telemetry.process import build_registry
from rlvitals.telemetry.recorder import Recorder

CPU = torch.device("cpu")
LIVE_LEVELS = ("minimal", "standard", "debug")
LIVE_STEPS = 50_000_000
"""Far more steps than a live run takes: the tests stop it with SIGTERM once they have seen what they check."""

# A tiny env in which every statistic is defined: 3 to 5 steps per episode, a final reward that
# varies (with an observed sign and the last action), success reported in `info`. Written to a
# temporary module so `rlvitals train --env module:EnvId` can import it in a subprocess.
TEST_ENV_MODULE = "rlvitals_telemetry_test_env"
TEST_ENV_ID = "rlvitals_test/TerminalReward-v0"
TEST_ENV_SOURCE = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TerminalRewardEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._sign, self._length, self._t = 0.0, 3, 0

    def _obs(self):
        return np.array([self._sign, self._t / 8.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sign = float(self.np_random.uniform(-1.0, 1.0))
        self._length = int(self.np_random.integers(3, 6))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        terminated = self._t >= self._length
        reward, info = 0.0, {}
        if terminated:
            reward = self._sign + (0.5 if int(action) == 1 else -0.5)
            info["is_success"] = reward > 0
        return self._obs(), reward, terminated, False, info


if "{env_id}" not in gym.registry:
    gym.register("{env_id}", entry_point=TerminalRewardEnv, disable_env_checker=True)
'''.replace("{env_id}", TEST_ENV_ID)


@contextlib.contextmanager
def installed_test_env(tmp_path_factory):
    """(folder holding the env module, `module:EnvId` to train on); also importable in this process.

    Each test file that needs it makes it a session fixture named `test_env`."""
    folder = tmp_path_factory.mktemp("envmodule")
    (folder / f"{TEST_ENV_MODULE}.py").write_text(TEST_ENV_SOURCE)
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(TEST_ENV_MODULE)
        yield folder, f"{TEST_ENV_MODULE}:{TEST_ENV_ID}"
    finally:
        sys.path.remove(str(folder))


# ---------------------------------------------------------------- helpers
def label_sets(metric: Metric):
    """(labels dict, stats key) for every closed label combination of a metric with a source."""
    if not metric.labels:
        return [({}, metric.source)]
    combos = product(*(metric.label_values[n] for n in metric.labels))
    return [(dict(zip(metric.labels, c, strict=True)), metric.source.format(**dict(zip(metric.labels, c, strict=True))))
            for c in combos]


def sourced(component: str, kinds=("gauge", "counter")) -> list[Metric]:
    return [m for m in METRICS if m.component == component and m.source and m.kind in kinds
            and all(label in m.label_values for label in m.labels)]


def fake_learner_stats(offset: float = 0.0) -> dict:
    """A stats dict like PPOLearner.learn's, with a distinct value for every catalogue source key."""
    stats = {}
    for m in sourced("learner"):
        for _, key in label_sets(m):
            stats[key] = offset + 0.5 + 0.25 * len(stats)
    stats.pop("training_intensity")  # the recorder computes it
    for key in ("time_wait", "time_publish", "time_telemetry", "time_rows", "time_checkpoint",
                "time_bookkeeping"):  # reported with record_phase, not by learn()
        stats.pop(key)
    stats.update(staleness=3.0, samples=64.0, samples_learned=256.0, nonfinite=0.0, nonfinite_samples=0.0)
    return stats


def make_rollout(returns=(1.0, 3.0), lengths=(10, 20), successes=(1.0, 0.0), env_steps=7, age=5,
                 timings=None) -> Rollout:
    T, N = 4, 2
    return Rollout(
        obs=torch.zeros(T + 1, N, 1), actions=torch.zeros(T, N, dtype=torch.int64), rewards=torch.zeros(T, N),
        terminated=torch.zeros(T, N, dtype=torch.bool), truncated=torch.zeros(T, N, dtype=torch.bool),
        valid=torch.ones(T, N, dtype=torch.bool), behaviour_params=torch.zeros(T, N, 2),
        behaviour_logp=torch.zeros(T, N), policy_age=age,
        episodes=EpisodeStats(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64),
                              successes=np.asarray(successes, np.float64)),
        timings=timings if timings is not None else {"env_step": 0.25, "inference": 0.5},
        valid_count=env_steps)


def registry_for(level: str, component: str = "local"):
    recorder = Recorder(level, component)
    return recorder, build_registry(recorder)


def families(registry) -> dict:
    return {f.name: f for f in registry.collect()}


def family_metric(family_name: str) -> Metric:
    """The catalogue metric of a collected family (counter families drop _total, info families _info)."""
    for name in (family_name, family_name + "_total", family_name + "_info"):
        if name in BY_NAME:
            return BY_NAME[name]
    raise AssertionError(f"family {family_name} is not in the catalogue")


def served_metrics(registry) -> set[str]:
    return {family_metric(name).name for name in families(registry)}


def sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def sample_name(line: str) -> str:
    return re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)


EXPOSED = {name: m for m in METRICS for name in exposed_names(m)}


def metric_of(sample: str) -> Metric:
    assert sample in EXPOSED, f"sample {sample} belongs to no catalogue metric"
    return EXPOSED[sample]


def non_hardware_lines(text: str) -> list[str]:
    return [line for line in sample_lines(text) if not metric_of(sample_name(line)).hardware]


def layer_counts(net: torch.nn.Module) -> dict[str, int]:
    linear = sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) for m in net.modules())
    activation = sum(isinstance(m, (torch.nn.ReLU, torch.nn.Tanh)) for m in net.modules())
    return {"linear layer": linear, "activation layer": activation}


def expected_series(component: str, level: str, scale: dict[str, int]) -> int:
    """Non-hardware series of a process: fixed ones plus the per-layer/per-step ones for this run."""
    fixed, per = reference.process_series(component, level)
    return fixed + sum(n * scale[unit] for unit, n in per.items() if unit in scale)
