"""The bodies of the Ray actors: rollout workers, the incarnation ledger, and one vitals sidecar per node.

Each runs in a process Ray starts; whatever it needs comes in through its
constructor arguments (a config dict, run labels, the ledger's name), never
from the driver's globals. The arguments are plain values, never object refs
or actor handles: Ray keeps plain values with the actor's creation task, so a
restart always finds them.
"""

from __future__ import annotations

import os
import sys
import time

from rlvitals.actors.envs import env_seed
from rlvitals.actors.rollout import Rollout
from rlvitals.actors.runner import EnvStepError
from rlvitals.learner.invariants import is_sampled
from rlvitals.telemetry.exported import ActorWindow

from ..config import TrainConfig
from ..env_preflight import atari_options
from ..parts import make_agent, make_network, return_discount, seed_everything
from .accounting import ActorCounters
from .readiness import WORK_PHASES

RESTART_SEED_STRIDE = 104_729
"""Run seeds between an actor's incarnations: each life draws its own episodes."""


def seed_for_actor(seed: int, actor_id: int) -> int:
    """Actor 0 samples with the same generator seed as local mode, so a 1-actor sync run replays it."""
    return seed + 7919 * actor_id


def endpoint_address(telemetry) -> str | None:
    """host:port of a telemetry's /metrics (None when it serves nothing)."""
    return telemetry.url.split("//", 1)[1].rsplit("/", 1)[0] if telemetry.url else None


class RolloutWorker:
    """Body of a Ray actor: an env runner plus a CPU copy of the network, and its own telemetry."""

    def __init__(self, cfg_dict: dict, actor_id: int, run_info: dict, ledger: tuple[str, str] | None = None):
        """`ledger`: (name, namespace) of the run's IncarnationLedger actor, looked up by name."""
        import ray

        born = time.perf_counter()   # the actor's wall time, which its phases add up to, starts here
        incarnation = 0
        if ledger is not None:  # first thing, so even an incarnation killed during start-up is counted
            name, namespace = ledger
            incarnation = ray.get(ray.get_actor(name, namespace=namespace).started.remote(actor_id, os.getpid()))
        from rlvitals.actors.runner import EnvRunner
        from rlvitals.telemetry.process import start_telemetry

        cfg = TrainConfig(**{**cfg_dict, "hidden_sizes": tuple(cfg_dict["hidden_sizes"])})
        # A restarted actor draws new episodes: replaying its first life's would feed the learner the same data
        # twice (the streams_independent invariant). The first incarnation keeps the seeds local mode replays.
        seed = cfg.seed + RESTART_SEED_STRIDE * incarnation
        seed_everything(seed_for_actor(seed, actor_id), cfg.torch_threads)
        self.cfg, self.actor_id = cfg, actor_id
        # Native Atari envs run threads of their own: no more than the CPUs Ray reserved for us.
        self.runner = EnvRunner(cfg.env, cfg.num_envs, env_seed(seed, actor_id), actor_id,
                                atari_options=atari_options(cfg, threads=max(1, int(cfg.actor_cpus))),
                                return_discount=return_discount(cfg), env_kwargs=cfg.env_kwargs)
        self.net = make_network(cfg, self.runner.obs_space, self.runner.action_space)
        self.net.seed(seed_for_actor(seed, actor_id))
        self.agent = make_agent(cfg, self.runner, self.net)
        self.weights_age = -1  # network age of the weights loaded last
        self.node_ip = ray.util.get_node_ip_address()
        host = self.node_ip if cfg.metrics_host == "node" else cfg.metrics_host
        extra = {"actor": str(actor_id)} if cfg.verbosity == "debug" else None
        self.telemetry = start_telemetry("actor", cfg.verbosity, host=host, port=0, run_info=run_info,
                                         extra_labels=extra)
        self.accounting = ActorCounters(actor_id, os.getpid(), born)  # every second since `born` is in a phase
        self.export_window = ActorWindow()   # the exported actor gauges' reference (telemetry/exported.py)
        self.recorded = 0
        # Every load into the network that acts is counted where it happens, whoever calls it: the version is the
        # age the loaded state carries (its buffer; the plain int is set after the hooks run).
        self.net.register_load_state_dict_post_hook(
            lambda net, _keys: self.accounting.loaded(int(net.age_buffer)))

    def endpoint(self) -> dict:
        return {"actor_id": self.actor_id, "address": endpoint_address(self.telemetry), "pid": os.getpid(),
                "node": self.node_ip}

    def collect(self, weights: list | None, weights_age: int) -> Rollout:
        import ray

        t0 = self.accounting.task_started()
        if weights and weights_age != self.weights_age:
            self.net.load_state_dict(ray.get(weights[0]))
            self.weights_age = weights_age
        waited = time.perf_counter() - t0
        try:
            rollout = self.runner.collect(self.agent, self.cfg.rollout_length)
        except EnvStepError as exc:
            # The env's state cannot be trusted any more: say why, then die so Ray restarts us
            # with fresh envs (the driver counts the restart).
            print(f"rlvitals: actor {self.actor_id}: {exc}", file=sys.stderr, flush=True)
            os._exit(3)
        self.accounting.produced_one()
        self.accounting.phases(rollout, waited)  # in the rollout's timings, like env_step and inference
        try:
            self.telemetry.record_rollout(rollout)
        except Exception as exc:  # produced, never delivered: counted with why
            self.accounting.dropped_one(type(exc).__name__, rollout)
            raise
        self._check_exports(rollout)
        self.accounting.deliver(rollout)
        # The producer's own completion stamp, the last thing before the rollout goes back: the driver judges the
        # learner's waits against it, not against its own view of what is ready (readiness.py).
        self.accounting.stamp(rollout, sum(rollout.timings.get(p, 0.0) for p in WORK_PHASES))
        return rollout

    def _check_exports(self, rollout: Rollout) -> None:
        """What a scrape of this actor reads of the rollout just recorded, against the rollout (on the learner's
        sampling schedule, counted in this actor's rollouts): the driver judges it with the learner's gauges."""
        gap = self.export_window.observe(rollout, self.telemetry.exported() if is_sampled(self.recorded) else None)
        if gap is not None:
            rollout.export_gaps = (gap,)
        self.recorded += 1

    def counters(self) -> dict:
        """This incarnation's own accounting (rollouts produced, delivered, dropped; seconds by phase)."""
        return self.accounting.snapshot()

    def crash(self) -> None:
        """For fault-injection tests: end this process as a kill -9 would."""
        os._exit(1)


class IncarnationLedger:
    """Counts actor processes as they start: restarts = starts - actors.

    Counting starts is exact where counting failures is not: one death fails
    several tasks, and calls made during a restart can fail without a new death.
    """

    def __init__(self):
        self.starts: dict[int, list[int]] = {}

    def started(self, actor_id: int, pid: int) -> int:
        """Count a start; its incarnation (0: the actor's first process)."""
        self.starts.setdefault(actor_id, []).append(pid)
        return len(self.starts[actor_id]) - 1

    def restarts(self) -> int:
        return sum(len(pids) - 1 for pids in self.starts.values())


class NodeSidecar:
    """One per node: exports the node's host and GPU vitals."""

    def __init__(self, verbosity: str, metrics_host: str, run_info: dict):
        import ray

        from rlvitals.telemetry.process import ProcessTelemetry

        self.node_ip = ray.util.get_node_ip_address()
        host = self.node_ip if metrics_host == "node" else metrics_host
        self.telemetry = ProcessTelemetry.start("node", verbosity, host=host, port=0, run_info=run_info)

    def endpoint(self) -> dict:
        return {"address": endpoint_address(self.telemetry), "node": self.node_ip, "pid": os.getpid()}
