"""Building the parts of a run from its config, and the local (one-process) run loop.

Local mode is the debugging mode: actor and learner take turns in one thread,
so a breakpoint anywhere stops everything and a traceback points at the line.
The Ray mode (rlvitals.distributed) builds the same runner, network and
learner through the functions here.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from rlvitals.actors.agents import FixedActionAgent, RandomAgent
from rlvitals.actors.envs import env_seed
from rlvitals.actors.runner import EnvRunner
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.ppo import PPOLearner, PPOSettings

from .archive import RunArchive
from .checkpoint import restore, save_checkpoint
from .config import TrainConfig
from .guard import NonFiniteGuard
from .progress import ProgressLine


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' is invalid: no CUDA GPU is visible; expected auto or cpu")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)


def atari_options(cfg: TrainConfig, threads: int = 0):
    """The Atari preprocessing choices of a config (ignored by non-Atari envs)."""
    from rlvitals.actors.atari import AtariOptions

    return AtariOptions(episodic_life=cfg.atari_episodic_life, reward_clipping=cfg.atari_reward_clipping,
                        num_threads=threads)


def make_network(cfg: TrainConfig, obs_space, action_space) -> ActorCritic:
    net = ActorCritic(obs_space, action_space, cfg.hidden_sizes, image_network=cfg.image_network)
    net.seed(cfg.seed)
    return net


def make_agent(cfg: TrainConfig, runner: EnvRunner, net: ActorCritic):
    """The policy the actors act with: the network, or a probe agent."""
    if cfg.agent == "random":
        return RandomAgent(runner.action_space, cfg.seed)
    if cfg.agent == "fixed":
        return FixedActionAgent(runner.action_space, cfg.fixed_action)
    return net


def make_learner(cfg: TrainConfig, net: ActorCritic, device: torch.device, telemetry=None) -> PPOLearner:
    debug = telemetry is not None and telemetry.wants_debug
    from rlvitals.telemetry.catalogue import SIGNED_BUCKETS

    return PPOLearner(net, ppo_settings(cfg), device, cfg.seed,
                      value_trace=telemetry is not None and telemetry.wants_value_trace,
                      debug=debug, hist_bounds=SIGNED_BUCKETS)


def ppo_settings(cfg: TrainConfig) -> PPOSettings:
    return PPOSettings(**{f: getattr(cfg, f) for f in PPOSettings.__dataclass_fields__})


class DevicePolicy:
    """Acts with a network that lives on another device (local mode with a GPU learner)."""

    def __init__(self, net: ActorCritic, device: torch.device):
        self.net, self.device = net, device

    @property
    def age(self) -> int:
        return self.net.age

    def act(self, obs):
        actions, params, logp = self.net.act(obs.to(self.device, non_blocking=True))
        return actions.cpu(), params.cpu(), logp.cpu()


@dataclass
class RunTracker:
    """Counters, the recent-episode window and the solved-time of one run."""

    total_env_steps: int
    return_threshold: float | None = None
    window: deque = field(default_factory=lambda: deque(maxlen=100))
    env_steps: int = 0
    episodes: int = 0
    updates: int = 0
    started: float = field(default_factory=time.perf_counter)
    solved_after_s: float | None = None
    solved_at_env_steps: int | None = None
    resume_offset: float = 0.0
    """Training seconds before this process took over (resumed runs)."""

    @property
    def elapsed(self) -> float:
        return self.resume_offset + time.perf_counter() - self.started

    def mean_return(self) -> float | None:
        return float(np.mean(self.window)) if self.window else None

    def add_rollout(self, rollout) -> None:
        self.env_steps += rollout.env_steps
        self.episodes += len(rollout.episodes.returns)
        returns = rollout.episodes.returns
        self.window.extend(returns[np.isfinite(returns)].tolist())  # a NaN reward's episode has no return
        if (self.return_threshold is not None and self.solved_after_s is None
                and len(self.window) == self.window.maxlen and self.mean_return() >= self.return_threshold):
            self.solved_after_s = self.elapsed
            self.solved_at_env_steps = self.env_steps

    def done(self) -> bool:
        return self.env_steps >= self.total_env_steps

    def summary(self, learner_steps: int, algorithm: str) -> dict:
        return {
            "algorithm": algorithm, "env_steps": self.env_steps, "episodes": self.episodes,
            "updates": self.updates, "learner_steps": learner_steps, "wall_seconds": round(self.elapsed, 3),
            "env_steps_per_second": round(self.env_steps / max(self.elapsed, 1e-9), 1),
            "mean_return_last_100": self.mean_return(),
            "return_threshold": self.return_threshold, "seconds_to_threshold": self.solved_after_s,
            "env_steps_to_threshold": self.solved_at_env_steps,
        }


def clean_row(row: dict) -> dict:
    """A metrics.jsonl row: finite numbers only (undefined statistics are left out, not zeroed)."""
    return {k: v for k, v in row.items() if not (isinstance(v, float) and not math.isfinite(v))}


def train_local(cfg: TrainConfig, archive: RunArchive, telemetry=None, stop=None, resume: dict | None = None) -> dict:
    """Collect, learn, repeat, in one process. Returns the run summary (also written to the archive)."""
    seed_everything(cfg.seed, cfg.torch_threads)
    device = resolve_device(cfg)
    # A resumed run cannot recover its envs' internal state; fresh seeds avoid replaying old episodes.
    episode_seed = env_seed(cfg.seed, 0) + (resume["tracker"]["env_steps"] if resume else 0)
    runner = EnvRunner(cfg.env, cfg.num_envs, episode_seed, atari_options=atari_options(cfg))
    net = make_network(cfg, runner.obs_space, runner.action_space)
    learner = None
    if cfg.agent == "ppo":
        learner = make_learner(cfg, net, device, telemetry)
    agent = make_agent(cfg, runner, net)
    if learner is not None and device.type != "cpu":
        agent = DevicePolicy(net, device)
    tracker = RunTracker(cfg.total_env_steps, cfg.return_threshold)
    if resume is not None and learner is not None:
        restore(resume, net, learner, tracker, telemetry)
    guard = NonFiniteGuard(archive.path, cfg.max_nonfinite_batches, telemetry)
    progress = ProgressLine(cfg.total_env_steps, enabled=cfg.progress)
    last_draw = 0.0
    stats: dict = {}
    try:
        while not tracker.done() and not (stop is not None and stop()):
            t_collect = time.perf_counter()
            rollout = runner.collect(agent, cfg.rollout_length)
            tracker.add_rollout(rollout)
            if telemetry is not None:
                # One process: the learner's "wait for data" is the actor's collection, and the
                # hand-off "queue" holds at most the one rollout being learned from.
                telemetry.record_rollout(rollout)
                telemetry.recorder.record_phase("wait", time.perf_counter() - t_collect)
                telemetry.recorder.record_queue(0, 1)
            if learner is not None and guard.inputs_ok(rollout):
                if cfg.anneal_lr:
                    learner.set_learning_rate(cfg.learning_rate * max(0.0, 1 - tracker.env_steps / cfg.total_env_steps))
                stats = learner.learn(rollout)
                if telemetry is not None:
                    telemetry.record_learn(stats)
                guard.update_ok(stats, rollout)
            after_update(cfg, tracker, net, learner, archive, stats, telemetry)
            now = time.perf_counter()
            if now - last_draw >= cfg.log_interval_seconds:
                last_draw = now
                progress.update(tracker.env_steps, tracker.env_steps / max(tracker.elapsed, 1e-9),
                                tracker.mean_return(), {**stats, "age": net.age})
            if cfg.stop_at_threshold and tracker.solved_after_s is not None:
                break
    except BaseException as exc:  # Ctrl-C, a non-finite stop, an env error: keep what we had
        finish_run(archive, cfg, net, learner, tracker, telemetry, stats,
                   {"status": type(exc).__name__, "nonfinite_batches_skipped": guard.skipped})
        raise
    finally:
        progress.close()
        runner.close()
    return finish_run(archive, cfg, net, learner, tracker, telemetry, stats,
                      {"status": "completed", "nonfinite_batches_skipped": guard.skipped})


def finish_run(archive, cfg, net, learner, tracker, telemetry, stats, extra: dict) -> dict:
    """Final checkpoint, last metrics row and summary.json: written however the run ends."""
    if learner is not None and tracker.updates > 0:
        save_checkpoint(archive, cfg, net, learner, tracker, telemetry)
    summary = {**tracker.summary(net.age, cfg.agent), **extra}
    archive.append_metrics(clean_row(_row(tracker, net, stats)))
    archive.write_summary(summary)
    return summary


def after_update(cfg: TrainConfig, tracker: RunTracker, net, learner, archive: RunArchive, stats: dict,
                 telemetry) -> None:
    """Count the update; write a metrics row and a checkpoint when their intervals say so (both run loops)."""
    tracker.updates += 1
    if tracker.updates % cfg.log_every_updates == 0:
        archive.append_metrics(clean_row(_row(tracker, net, stats)))
    steps_per_update = cfg.update_epochs * cfg.num_minibatches
    if learner is not None and tracker.updates % max(1, cfg.checkpoint_interval // steps_per_update) == 0:
        save_checkpoint(archive, cfg, net, learner, tracker, telemetry)


def _row(tracker: RunTracker, net, stats: dict) -> dict:
    """One metrics.jsonl row: the batch's statistics, then the run's counters (which win on a clash)."""
    row = {k: v for k, v in stats.items() if isinstance(v, float) and not k.startswith("time_")}
    row.update({"updates": tracker.updates, "env_steps": tracker.env_steps, "episodes": tracker.episodes,
                "learner_steps": net.age, "mean_return_last_100": tracker.mean_return(),
                "wall_seconds": round(tracker.elapsed, 3)})
    return row
