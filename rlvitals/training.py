"""Local mode: actor and learner take turns in one process.

Local mode is the debugging mode: one thread, so a breakpoint anywhere stops
everything and a traceback points at the line. It differs from the Ray mode
(rlvitals.distributed) only in how rollouts arrive: here `LocalRollouts`
collects each one with the learner's own network; what happens next is the
shared `Run.learn_step` (rlvitals.run).

The part builders live in rlvitals.parts; the names below are kept here too
because tools and tests import them from this module.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlvitals.actors.envs import env_seed
from rlvitals.actors.runner import EnvRunner

from .archive import RunArchive
from .config import TrainConfig
from .env_preflight import atari_options
from .parts import (  # noqa: F401
    DevicePolicy,
    make_agent,
    make_learner,
    make_network,
    ppo_settings,
    resolve_device,
    return_discount,
    seed_everything,
)
from .rows import RowObserver
from .run import Run


class LocalRollouts:
    """Rollouts collected in this process, one per learn step, by the network being trained."""

    def __init__(self, run: Run, runner: EnvRunner):
        self.run, self.runner = run, runner
        self.agent = make_agent(run.cfg, runner, run.net)
        if run.learner is not None and run.device.type != "cpu":
            self.agent = DevicePolicy(run.net, run.device)

    def next(self):
        run = self.run
        # One process: the learner's "wait for data" is the actor's collection, and the
        # hand-off "queue" holds at most the one rollout being learned from.
        with run.telemetry.phase("publish"):  # the fingerprint of the weights that act
            run.weights_handed_out()
        requested_age = run.net.age
        with run.telemetry.phase("wait"):
            rollout = self.runner.collect(self.agent, run.cfg.rollout_length)
        with run.telemetry.phase("telemetry"):
            run.acted(requested_age, rollout)
            run.telemetry.record_rollout(rollout)  # this process is the actor too
            run.rollout_recorded(rollout)
            run.queue(0, 1)
        return rollout

    def drain(self) -> None:
        pass  # nothing is ever in flight

    def summary(self) -> dict:
        return {}


def train_local(cfg: TrainConfig, archive: RunArchive, telemetry=None, stop=None, resume: dict | None = None,
                observers: Iterable[RowObserver] = ()) -> dict:
    """Collect, learn, repeat, in one process. Returns the run summary (also written to the archive).

    `telemetry`: the process's telemetry (None: none). `stop()`: asked before each
    rollout; True ends the run. `resume`: a checkpoint to continue from.
    `observers`: receive every metrics row (rlvitals.rows).
    """
    seed_everything(cfg.seed, cfg.torch_threads)
    # A resumed run cannot recover its envs' internal state; fresh seeds avoid replaying old episodes.
    episode_seed = env_seed(cfg.seed, 0) + (resume["tracker"]["env_steps"] if resume else 0)
    runner = EnvRunner(cfg.env, cfg.num_envs, episode_seed, atari_options=atari_options(cfg),
                       return_discount=return_discount(cfg), env_kwargs=cfg.env_kwargs)
    try:
        run = Run.build(cfg, archive, runner.obs_space, runner.action_space, telemetry, stop, resume, observers)
        return run.drive(LocalRollouts(run, runner))
    finally:
        runner.close()
