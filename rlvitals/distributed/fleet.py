"""The actor fleet of one run: starting actors and sidecars, their discovery files, deaths and restarts, weights.

Ray restarts an actor that dies (killed, or its env raised). Each task sent
to an actor remembers the incarnation ("generation") it was sent to, so the
several tasks that fail with one death are handled once; after a death
nothing is sent to that actor until its `endpoint` call answers, proof that
the new incarnation is up. Restarts are counted from the incarnation ledger
(starts - actors), which is exact where counting failures is not.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict

from rlvitals.telemetry.process import run_target_labels, write_target

from ..archive import RunArchive
from ..config import ConfigError, TrainConfig, parse_resources
from .connect import check_resources
from .workers import IncarnationLedger, NodeSidecar, RolloutWorker

log = logging.getLogger("rlvitals.ray")


class Fleet:
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
        # Actors get plain values only, which Ray keeps with each actor's creation task: an object ref
        # or an actor handle as an argument lives in the object store, where a restart after it went
        # out of scope fails (Ray says so at every start). The ledger is found by its name instead.
        ledger_name = f"rlvitals-ledger-{run_info['run_id']}-{uuid.uuid4().hex[:8]}"
        self.ledger = ray.remote(IncarnationLedger).options(num_cpus=0, name=ledger_name).remote()
        namespace = ray.get_runtime_context().namespace
        cfg_dict = asdict(cfg)
        self.actors = [worker_cls.remote(cfg_dict, i, run_info, (ledger_name, namespace))
                       for i in range(self.num_actors)]
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
        self.pending_endpoints: dict = {}
        """endpoint() call of a restarting actor -> (actor index, generation)."""
        self._wait_until_started()

    def _wait_until_started(self) -> None:
        refs = [a.endpoint.remote() for a in self.actors] + [s.endpoint.remote() for s in self.sidecars]
        ready, pending = self.ray.wait(refs, num_returns=len(refs), timeout=self.cfg.startup_timeout_seconds)
        if pending:
            free = self.ray.available_resources()
            raise ConfigError(
                f"{len(pending)} of {len(refs)} Ray actors did not start within startup_timeout_seconds="
                f"{self.cfg.startup_timeout_seconds:g}; asked for {self.num_actors} actors x "
                f"{self.cfg.actor_cpus:g} CPU, free now: {free.get('CPU', 0):g} CPUs, {free.get('GPU', 0):g} GPUs "
                "(Ray runs actors at niceness 15: on a busy machine set RAY_worker_niceness=0 or give them longer)")
        for info in self.ray.get(refs[: len(self.actors)]):  # raises if an actor failed in __init__
            self._note_actor(info)
        for i, info in enumerate(self.ray.get(refs[len(self.actors):])):
            self._write(f"node-{i}", info["address"], {"component": "node", "node": info["node"]})

    def _write(self, name: str, address: str | None, labels: dict) -> None:
        if address is not None:
            write_target(str(self.discovery), name, address, {**labels, **run_target_labels(self.run_info)})

    def _note_actor(self, info: dict) -> None:
        i = info["actor_id"]
        previous = self.pids.get(i)
        if previous is not None and previous != info["pid"]:
            log.warning("actor %d is back (pid %d -> %d)", i, previous, info["pid"])
        self.pids[i] = info["pid"]
        self._write(f"actor-{i}", info["address"], {"component": "actor", "node": info["node"]})

    # ------------------------------------------------------------- work and weights
    def publish(self, net) -> tuple[list, int]:
        """The network's weights into the object store, once per network age: ([ref], age) for `submit`."""
        with self.telemetry.phase("publish"):
            state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
            ref = self.ray.put(state)
            self.telemetry.record_publish(sum(v.numel() * v.element_size() for v in state.values()))
        return [ref], net.age

    def submit(self, i: int, weights, weights_age: int):
        """Ask actor i for a rollout: (object ref, task), where task = (actor index, its generation)."""
        return self.actors[i].collect.remote(weights, weights_age), (i, self.generation[i])

    # ------------------------------------------------------------- deaths and restarts
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
        self.telemetry.record_restarts(restarts - self.restarts)
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

    def finished_samples(self, refs: list, timeout: float = 5.0) -> list[int]:
        """Env steps of the rollouts among `refs` that are (or within `timeout` become) ready."""
        if not refs:
            return []
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        samples = []
        for ref in ready:
            try:
                samples.append(self.ray.get(ref).env_steps)
            except self.ray.exceptions.RayError:
                continue
        return samples

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
