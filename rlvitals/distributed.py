"""Ray mode: the same runner, network and learner as local mode, spread over a Ray cluster.

The driver process is the learner (on the GPU when there is one): it never
asks Ray for a CPU, so it cannot wait for one that the actors hold. Actors
are Ray actors that Ray restarts when they die; each keeps up to
`rollouts_in_flight` rollouts requested ahead, so it only idles when the
learner falls that far behind (backpressure, not unbounded memory). New
weights go into the object store once per version; every actor gets the
same reference. One sidecar per node exports host and GPU vitals.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict

import torch

from rlvitals.actors.envs import env_seed, make_vector_env
from rlvitals.actors.rollout import EpisodeStats, Rollout
from rlvitals.actors.runner import EnvStepError
from rlvitals.telemetry.process import write_target

from .archive import RunArchive
from .config import ConfigError, TrainConfig, parse_resources
from .checkpoint import restore
from .guard import NonFiniteGuard
from .training import (RunTracker, after_update, atari_options, finish_run, make_learner, make_network,
                       resolve_device, seed_everything)

log = logging.getLogger("rlvitals.ray")
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


_OWNS_RAY = False


def start_ray(cfg: TrainConfig) -> bool:
    """Join the cluster the config names, or start a private one on loopback. True if we started it."""
    global _OWNS_RAY
    if not cfg.address and not os.environ.get("RAY_ADDRESS"):
        # Ray binds its servers to the machine's public address unless it believes it runs
        # on a single-node platform; this (documented) switch makes a private instance bind
        # to 127.0.0.1 only. It must be set before Ray is imported.
        os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    if ray.is_initialized():
        return False
    quiet = {"configure_logging": False, "log_to_driver": True, "include_dashboard": False}
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        # Actors run in processes the cluster started, not children of this one: hand them our
        # PYTHONPATH so a `module:EnvId` env importable here is importable there too.
        runtime_env = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}} if os.environ.get("PYTHONPATH") else None
        try:
            ray.init(address=address, runtime_env=runtime_env, **quiet)
        except (ConnectionError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"address={address!r} is invalid: no Ray cluster accepted the connection ({first[:160]}); "
                              "expected `auto`, host:port of a running cluster, and RAY_AUTH_MODE/RAY_AUTH_TOKEN "
                              "as that cluster uses them") from None
        return False
    ray.init(address="local", num_cpus=os.cpu_count(), **quiet)
    _OWNS_RAY = True
    return True


def stop_ray() -> None:
    global _OWNS_RAY
    import ray

    if _OWNS_RAY and ray.is_initialized():
        ray.shutdown()
    _OWNS_RAY = False


def check_resources(cfg: TrainConfig) -> int:
    """Number of actors to start; ConfigError when the cluster cannot hold what was asked."""
    import ray

    resources = ray.cluster_resources()
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    custom = parse_resources(cfg.actor_resources)
    fits = [int(cpus) - 1] + [int(resources.get(name, 0.0) / amount + 1e-9) for name, amount in custom.items()]
    num_actors = cfg.num_actors or max(1, min(fits))
    want_cpu, want_gpu = num_actors * cfg.actor_cpus, num_actors * cfg.actor_gpus
    want_custom = {name: num_actors * amount for name, amount in custom.items()}
    if (want_cpu > cpus + 1e-9 or want_gpu > gpus + 1e-9
            or any(want > resources.get(name, 0.0) + 1e-9 for name, want in want_custom.items())):
        also = f" and actor_resources={cfg.actor_resources!r}" if custom else ""
        want_more = "".join(f", {want:g} {name!r}" for name, want in want_custom.items())
        have_more = "".join(f", {resources.get(name, 0.0):g} {name!r}" for name in want_custom)
        raise ConfigError(
            f"num_actors={num_actors} with actor_cpus={cfg.actor_cpus:g} and actor_gpus={cfg.actor_gpus:g}{also} asks "
            f"for {want_cpu:g} CPUs and {want_gpu:g} GPUs{want_more}; the Ray cluster has {cpus:g} CPUs and "
            f"{gpus:g} GPUs{have_more}")
    return num_actors


def preflight_ray(cfg: TrainConfig) -> None:
    """Connect (or start Ray) and check the request fits, before anything is written."""
    start_ray(cfg)
    try:
        check_resources(cfg)
    except ConfigError:
        stop_ray()
        raise


def seed_for_actor(seed: int, actor_id: int) -> int:
    """Actor 0 samples with the same generator seed as local mode, so a 1-actor sync run replays it."""
    return seed + 7919 * actor_id


class RolloutWorker:
    """Body of a Ray actor: an env runner plus a CPU copy of the network, and its own telemetry."""

    def __init__(self, cfg_dict: dict, actor_id: int, run_info: dict, ledger=None):
        import ray

        if ledger is not None:  # first thing, so even an incarnation killed during start-up is counted
            ray.get(ledger.started.remote(actor_id, os.getpid()))
        from rlvitals.actors.runner import EnvRunner
        from rlvitals.telemetry.process import ProcessTelemetry

        from .training import make_agent

        cfg = TrainConfig(**{**cfg_dict, "hidden_sizes": tuple(cfg_dict["hidden_sizes"])})
        seed_everything(seed_for_actor(cfg.seed, actor_id), cfg.torch_threads)
        self.cfg, self.actor_id = cfg, actor_id
        # Native Atari envs run threads of their own: no more than the CPUs Ray reserved for us.
        self.runner = EnvRunner(cfg.env, cfg.num_envs, env_seed(cfg.seed, actor_id), actor_id,
                                atari_options=atari_options(cfg, threads=max(1, int(cfg.actor_cpus))))
        self.net = make_network(cfg, self.runner.obs_space, self.runner.action_space)
        self.net.seed(seed_for_actor(cfg.seed, actor_id))
        self.agent = make_agent(cfg, self.runner, self.net)
        self.version = -1
        self.node_ip = ray.util.get_node_ip_address()
        host = self.node_ip if cfg.metrics_host == "node" else cfg.metrics_host
        self.telemetry = None
        if cfg.verbosity != "off":
            extra = {"actor": str(actor_id)} if cfg.verbosity == "debug" else None
            self.telemetry = ProcessTelemetry.start("actor", cfg.verbosity, host=host, port=0,
                                                    run_info=run_info, extra_labels=extra)

    def endpoint(self) -> dict:
        address = None
        if self.telemetry is not None:
            address = self.telemetry.url.split("//", 1)[1].rsplit("/", 1)[0]
        return {"actor_id": self.actor_id, "address": address, "pid": os.getpid(), "node": self.node_ip}

    def collect(self, weights: list | None, version: int) -> Rollout:
        import ray

        t0 = time.perf_counter()
        if weights and version != self.version:
            self.net.load_state_dict(ray.get(weights[0]))
            self.version = version
        waited = time.perf_counter() - t0
        try:
            rollout = self.runner.collect(self.agent, self.cfg.rollout_length)
        except EnvStepError as exc:
            # The env's state cannot be trusted any more: say why, then die so Ray restarts us
            # with fresh envs (the driver counts the restart).
            print(f"rlvitals: actor {self.actor_id}: {exc}", file=sys.stderr, flush=True)
            os._exit(3)
        rollout.timings["weight_wait"] = waited
        if self.telemetry is not None:
            self.telemetry.record_rollout(rollout)
        return rollout

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

    def started(self, actor_id: int, pid: int) -> None:
        self.starts.setdefault(actor_id, []).append(pid)

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
        return {"address": self.telemetry.url.split("//", 1)[1].rsplit("/", 1)[0], "node": self.node_ip,
                "pid": os.getpid()}


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Rollouts of the same length side by side, as one batch of all their envs."""
    if len(rollouts) == 1:
        return rollouts[0]
    cat = lambda name: torch.cat([getattr(r, name) for r in rollouts], dim=1)  # noqa: E731
    eps = [r.episodes for r in rollouts]
    import numpy as np

    return Rollout(
        obs=cat("obs"), actions=cat("actions"), rewards=cat("rewards"), terminated=cat("terminated"),
        truncated=cat("truncated"), valid=cat("valid"), behaviour_params=cat("behaviour_params"),
        behaviour_logp=cat("behaviour_logp"), policy_age=min(r.policy_age for r in rollouts),
        episodes=EpisodeStats(np.concatenate([e.returns for e in eps]), np.concatenate([e.lengths for e in eps]),
                              np.concatenate([e.successes for e in eps])),
        timings={}, valid_count=sum(r.valid_count for r in rollouts))


class Cluster:
    """The actors and sidecars of one run, their endpoints, and their restarts."""

    def __init__(self, cfg: TrainConfig, archive: RunArchive, telemetry, run_info: dict):
        import ray

        self.ray = ray
        self.cfg = cfg
        self.telemetry = telemetry
        self.discovery = archive.path / "discovery"
        self.run_info = run_info
        self.num_actors = check_resources(cfg)
        custom = parse_resources(cfg.actor_resources)  # e.g. {"actor": 1}: only nodes that advertise it take actors
        worker_cls = ray.remote(RolloutWorker).options(
            num_cpus=cfg.actor_cpus, num_gpus=cfg.actor_gpus, max_restarts=-1, max_task_retries=0,
            **({"resources": custom} if custom else {}))
        cfg_dict = asdict(cfg)
        self.ledger = ray.remote(IncarnationLedger).options(num_cpus=0).remote()
        self.actors = [worker_cls.remote(cfg_dict, i, run_info, self.ledger) for i in range(self.num_actors)]
        self.sidecars = []
        if cfg.verbosity != "off":
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            sidecar_cls = ray.remote(NodeSidecar)
            for node in ray.nodes():
                if node.get("Alive"):
                    strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
                    self.sidecars.append(sidecar_cls.options(num_cpus=0, scheduling_strategy=strategy)
                                         .remote(cfg.verbosity, cfg.metrics_host, run_info))
        self.pids: dict[int, int] = {}
        self.generation = [0] * len(self.actors)
        self.restarts = 0
        self.produced = self.learned_samples = self.in_flight = 0
        self.dropped = {"stale": 0, "nonfinite": 0}
        self.pending_endpoints: dict = {}
        self._wait_until_started()

    def _wait_until_started(self) -> None:
        refs = [a.endpoint.remote() for a in self.actors] + [s.endpoint.remote() for s in self.sidecars]
        ready, pending = self.ray.wait(refs, num_returns=len(refs), timeout=self.cfg.startup_timeout_seconds)
        if pending:
            free = self.ray.available_resources()
            raise ConfigError(
                f"{len(pending)} of {len(refs)} Ray actors did not start within startup_timeout_seconds="
                f"{self.cfg.startup_timeout_seconds:g}; asked for {self.num_actors} actors x "
                f"{self.cfg.actor_cpus:g} CPU, free now: {free.get('CPU', 0):g} CPUs, {free.get('GPU', 0):g} GPUs")
        for info in self.ray.get(refs[: len(self.actors)]):  # raises if an actor failed in __init__
            self._note_actor(info)
        for i, info in enumerate(self.ray.get(refs[len(self.actors):])):
            self._write(f"node-{i}", info["address"], {"component": "node", "node": info["node"]})

    def _write(self, name: str, address: str | None, labels: dict) -> None:
        if address is not None and self.cfg.verbosity != "off":
            write_target(str(self.discovery), name, address, {**labels, "run_id": self.run_info["run_id"]})

    def _note_actor(self, info: dict) -> None:
        i = info["actor_id"]
        previous = self.pids.get(i)
        if previous is not None and previous != info["pid"]:
            log.warning("actor %d is back (pid %d -> %d)", i, previous, info["pid"])
        self.pids[i] = info["pid"]
        self._write(f"actor-{i}", info["address"], {"component": "actor", "node": info["node"]})

    # Each task remembers the incarnation ("generation") of the actor it was sent to, so the several
    # tasks that fail with one death are handled once. After a death nothing is sent to the actor
    # until its endpoint call answers, proof that the new incarnation is up.
    def submit(self, i: int, weights, version: int):
        return self.actors[i].collect.remote(weights, version), (i, self.generation[i])

    def actor_failed(self, task: tuple[int, int], error: Exception) -> None:
        i, generation = task
        if generation != self.generation[i]:
            return  # this incarnation's death is already handled
        self.generation[i] += 1
        cause = str(error).strip().splitlines()[-1][:300] if str(error).strip() else type(error).__name__
        log.warning("actor %d failed and is restarted by Ray: %s", i, cause)
        self.pending_endpoints[self.actors[i].endpoint.remote()] = (i, self.generation[i])

    def count_restarts(self) -> int:
        try:
            restarts = self.ray.get(self.ledger.restarts.remote(), timeout=30)
        except self.ray.exceptions.RayError:
            return self.restarts  # the ledger is gone (cluster shutting down): keep the last count
        if self.telemetry is not None:
            for _ in range(restarts - self.restarts):
                self.telemetry.recorder.record_restart()
        self.restarts = restarts
        return restarts

    def endpoint_answered(self, ref) -> int | None:
        """The actor index if its new incarnation is up, None if it died again (counted, asked again)."""
        i, generation = self.pending_endpoints.pop(ref)
        try:
            self._note_actor(self.ray.get(ref))
        except self.ray.exceptions.RayError:
            # Still restarting (or died again while it did): ask again.
            self.pending_endpoints[self.actors[i].endpoint.remote()] = (i, generation)
            return None
        self.count_restarts()
        return i

    def wait_until_back(self, i: int) -> None:
        while any(task[0] == i for task in self.pending_endpoints.values()):
            ref = next(r for r, task in self.pending_endpoints.items() if task[0] == i)
            self.ray.wait([ref], num_returns=1)
            self.endpoint_answered(ref)

    # --- sample accounting: produced = learned + dropped + in flight, checked at the end of a run
    def received(self, samples: int) -> None:
        self.produced += samples

    def learned(self, stats: dict, samples: int) -> None:
        if stats.get("nonfinite") or not stats and self.cfg.agent == "ppo":
            self.dropped["nonfinite"] += samples
        else:
            self.learned_samples += samples

    def count_in_flight(self, in_flight: dict) -> None:
        """Rollouts that actors finished but the learner never took: counted, not silently lost."""
        if not in_flight:
            return
        ready, _ = self.ray.wait(list(in_flight), num_returns=len(in_flight), timeout=5)
        for ref in ready:
            try:
                samples = self.ray.get(ref).env_steps
            except self.ray.exceptions.RayError:
                continue
            self.produced += samples
            self.in_flight += samples

    def accounting(self) -> dict:
        return {"produced": self.produced, "learned": self.learned_samples, "dropped": dict(self.dropped),
                "in_flight": self.in_flight}

    def shutdown(self) -> None:
        for handle in self.actors + self.sidecars + [self.ledger]:
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception:
                pass
        for path in self.discovery.glob("actor-*.json"):
            path.unlink(missing_ok=True)
        for path in self.discovery.glob("node-*.json"):
            path.unlink(missing_ok=True)


def _publish(ray, net, telemetry) -> tuple[list, int]:
    t0 = time.perf_counter()
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    ref = ray.put(state)
    if telemetry is not None:
        telemetry.recorder.record_publish(sum(v.numel() * v.element_size() for v in state.values()))
        telemetry.recorder.record_phase("publish", time.perf_counter() - t0)
    return [ref], net.age


def train_ray(cfg: TrainConfig, archive: RunArchive, telemetry=None, stop=None, resume: dict | None = None) -> dict:
    start_ray(cfg)
    import ray

    cluster = None
    try:
        seed_everything(cfg.seed, cfg.torch_threads)
        device = resolve_device(cfg)
        probe_env = make_vector_env(cfg.env, 1)
        net = make_network(cfg, probe_env.single_observation_space, probe_env.single_action_space)
        probe_env.close()
        learner = make_learner(cfg, net, device, telemetry) if cfg.agent == "ppo" else None
        meta = archive.meta
        run_info = {"run_id": meta["run_id"], "env": cfg.env, "algorithm": cfg.agent, "mode": "ray",
                    "code_version": meta["code_version"]["commit"][:12]}
        tracker = RunTracker(cfg.total_env_steps, cfg.return_threshold)
        if resume is not None and learner is not None:
            restore(resume, net, learner, tracker, telemetry)
        cluster = Cluster(cfg, archive, telemetry, run_info)
        guard = NonFiniteGuard(archive.path, cfg.max_nonfinite_batches, telemetry)
        loop = _sync_loop if cfg.sync else _async_loop
        state = {"stats": {}}
        try:
            loop(cfg, ray, cluster, net, learner, tracker, archive, telemetry, stop, guard, state)
        except BaseException as exc:
            finish_run(archive, cfg, net, learner, tracker, telemetry, state["stats"],
                       {"status": type(exc).__name__, **_ray_summary(cfg, cluster, guard)})
            raise
        return finish_run(archive, cfg, net, learner, tracker, telemetry, state["stats"],
                          {"status": "completed", **_ray_summary(cfg, cluster, guard)})
    finally:
        if cluster is not None:
            cluster.shutdown()
        stop_ray()


def _ray_summary(cfg, cluster, guard) -> dict:
    return {"mode": "ray", "num_actors": cluster.num_actors, "sync": cfg.sync, "actor_restarts": cluster.count_restarts(),
            "nonfinite_batches_skipped": guard.skipped, "samples": cluster.accounting()}


def _learn(cfg, learner, rollout, tracker, telemetry, guard) -> dict:
    if learner is None or not guard.inputs_ok(rollout):
        return {}
    if cfg.anneal_lr:
        learner.set_learning_rate(cfg.learning_rate * max(0.0, 1 - tracker.env_steps / cfg.total_env_steps))
    stats = learner.learn(rollout)
    if telemetry is not None:
        telemetry.record_learn(stats)
        telemetry.recorder.record_age(learner.net.age)
    guard.update_ok(stats, rollout)
    return stats


def _sync_loop(cfg, ray, cluster, net, learner, tracker, archive, telemetry, stop, guard, state) -> None:
    """All actors act with the newest weights; the learner waits for every one of them."""
    weights, version = _publish(ray, net, telemetry)
    while not tracker.done() and not (stop is not None and stop()):
        t0 = time.perf_counter()
        refs = dict(cluster.submit(i, weights, version) for i in range(len(cluster.actors)))
        rollouts: dict[int, Rollout] = {}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            task = refs.pop(ready[0])
            try:
                rollouts[task[0]] = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                cluster.actor_failed(task, exc)
                cluster.wait_until_back(task[0])
                ref, task = cluster.submit(task[0], weights, version)
                refs[ref] = task
        batch = concat_rollouts([rollouts[i] for i in sorted(rollouts)])
        tracker.add_rollout(batch)
        if telemetry is not None:
            telemetry.recorder.record_phase("wait", time.perf_counter() - t0)
            telemetry.recorder.record_queue(0, len(cluster.actors))
        cluster.received(batch.env_steps)
        stats = state["stats"] = _learn(cfg, learner, batch, tracker, telemetry, guard)
        cluster.learned(stats, batch.env_steps)
        weights, version = _publish(ray, net, telemetry)
        after_update(cfg, tracker, net, learner, archive, stats, telemetry)


def _async_loop(cfg, ray, cluster, net, learner, tracker, archive, telemetry, stop, guard, state) -> None:
    """Learn from whichever rollout arrives first; keep every actor `rollouts_in_flight` ahead."""
    weights, version = _publish(ray, net, telemetry)
    in_flight: dict = {}
    for _ in range(cfg.rollouts_in_flight):
        for i in range(len(cluster.actors)):
            ref, task = cluster.submit(i, weights, version)
            in_flight[ref] = task
    capacity = len(cluster.actors) * cfg.rollouts_in_flight
    while not tracker.done() and not (stop is not None and stop()):
        t0 = time.perf_counter()
        ready, _ = ray.wait(list(in_flight) + list(cluster.pending_endpoints), num_returns=1)
        ref = ready[0]
        if ref in cluster.pending_endpoints:
            back = cluster.endpoint_answered(ref)
            for _ in range(cfg.rollouts_in_flight if back is not None else 0):
                ref, task = cluster.submit(back, weights, version)
                in_flight[ref] = task
            continue
        task = in_flight.pop(ref)
        i = task[0]
        try:
            rollout = ray.get(ref)
        except ray.exceptions.RayError as exc:
            cluster.actor_failed(task, exc)  # resubmitted once its endpoint answers
            continue
        if telemetry is not None:
            telemetry.recorder.record_phase("wait", time.perf_counter() - t0)
            done_now, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
            telemetry.recorder.record_queue(len(done_now), capacity)
        cluster.received(rollout.env_steps)
        staleness = net.age - rollout.policy_age
        if staleness > cfg.max_staleness:
            cluster.dropped["stale"] += rollout.env_steps
            if telemetry is not None:
                telemetry.recorder.record_dropped("stale", rollout.env_steps)
            ref, task = cluster.submit(i, weights, version)
            in_flight[ref] = task
            continue
        tracker.add_rollout(rollout)
        stats = state["stats"] = _learn(cfg, learner, rollout, tracker, telemetry, guard)
        cluster.learned(stats, rollout.env_steps)
        if learner is not None:
            weights, version = _publish(ray, net, telemetry)
        ref, task = cluster.submit(i, weights, version)
        in_flight[ref] = task
        after_update(cfg, tracker, net, learner, archive, stats, telemetry)
    cluster.count_in_flight(in_flight)
