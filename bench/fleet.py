"""A simulated fleet of N actors scraped by a real Prometheus with the project's rules and dashboards.

    nice -n 10 python bench/fleet.py --actors 100 1000 [--faulty 3] [--healthy-seconds 150] [--fault-seconds 150]

One HTTP server process (loopback only, stopped after --max-seconds) serves every simulated process on
its own port: N actors, one node sidecar per 20 actors, one learner. What each serves is generated from
the metric catalogue (telemetry/catalogue.py: the metrics a process of that component exports at
`standard`, with every closed label value), so the simulation follows the catalogue when it changes;
known metrics get realistic values (actor speeds spread +-30%, rollouts of 512 steps, network ages a
few seconds of learner progress behind), any other a plain one (a counter rising at 1/s, a gauge at 0).

Prometheus runs with the shipped deploy/prometheus/prometheus.yml (rendered as `rlvitals stack up` does:
5 s scrapes and evaluations, the generated rules). After a healthy phase, K actors stall, K slow down
to a fifth, K stop loading weights, K leak 64 MiB a minute and one node (20 actors) is lost. Reported per
N: series, scrape durations, rule-group evaluation times, Prometheus resident memory and CPU, each
dashboard query's latency and series count, the alerts of the healthy phase (should be none) and, per
alert after the faults, when it fired, its value and the processes it named.
Results: bench/results/fleet_<actors>.json (with machine info; fleet.json: the first run, before the fleet
rules were restructured).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlvitals.dashboards import dashboard_files
from rlvitals.telemetry.catalogue import METRICS, Metric
from rlvitals.telemetry.recorder import COMPONENTS

RUN_ID = "fleet-sim"
ACTORS_PER_NODE = 20
LEVEL = "standard"
MiB = 2 ** 20
ROLLOUT = 512                       # env steps per rollout: the actor's counter moves a rollout at a time
LEARNER_STEPS_PER_SECOND = 4.0
SCRAPE = 5.0                        # the shipped prometheus.yml's interval
FAULTS = ("stall", "slow", "lag", "leak")
EXPECTED = {"stall": "RLActorStalled", "slow": "RLActorSlow", "lag": "RLActorWeightsLagging",
            "leak": "RLActorMemoryGrowing", "lost": "RLComponentDown"}

# A healthy run drops no samples and restarts no actors: these counters stay at 0 (other counters rise at 1/s).
COUNTERS_AT_ZERO = {"rlvitals_samples_dropped_total", "rlvitals_actor_restarts_total"}
# Healthy learner readings (gauges not listed read 0): what the rules read as a run that learns.
LEARNER_GAUGES = {
    "rlvitals_learner_relative_entropy_ratio": 0.5, "rlvitals_learner_kl_divergence_nats": 0.01,
    "rlvitals_learner_residual_variance_ratio": 0.5, "rlvitals_learner_clip_fraction_ratio": 0.05,
    ("rlvitals_learner_head_gradient_norm", "policy"): 0.1, ("rlvitals_learner_head_gradient_norm", "value"): 0.1,
    ("rlvitals_learner_update_step", "meansq"): 1e-3, ("rlvitals_learner_update_step", "absmax"): 0.05,
    ("rlvitals_learner_loss", "value"): 0.1, ("rlvitals_learner_value_target", "std"): 1.0,
    ("rlvitals_learner_advantage", "std"): 1.0, ("rlvitals_learner_loss_direction", "policy"): 1.0,
    ("rlvitals_learner_loss_direction", "value"): 0.5, ("rlvitals_learner_loss_direction", "entropy"): 0.01,
    "rlvitals_learner_reward_scale": 1.0, "rlvitals_learner_reward_divisor": 1.0,
    "rlvitals_learner_value_target_scale_ratio": 0.5, "rlvitals_learner_staleness_batches": 1.0,
    "rlvitals_learner_rollouts_alive": 2.0, "rlvitals_queue_capacity": 4.0, "rlvitals_queue_depth": 1.0,
}


# ====================================================================== what each simulated process serves
def served_metrics(component: str) -> list[Metric]:
    """The catalogue metrics a real process of `component` exports at LEVEL (hardware ones need a GPU)."""
    wanted = COMPONENTS[component]
    return [m for m in METRICS if m.at(LEVEL) and m.component in wanted and not m.hardware
            and all(label in m.label_values for label in m.labels if m.kind != "info")]


def label_sets(m: Metric) -> list[dict[str, str]]:
    sets = [{}]
    for label in m.labels:
        sets = [{**s, label: v} for s in sets for v in m.label_values[label]]
    return sets


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


MAIN_PHASES = {"env_step": 0.7, "inference": 0.25}
"""Share of a simulated actor's wall time in its main phases."""


class Process:
    """One simulated process: its exposition lines as (prefix, value function of time)."""

    def __init__(self, component: str, index: int, rng: random.Random):
        self.component, self.index = component, index
        self.speed = 1000.0 * (1 + rng.uniform(-0.3, 0.3))          # env steps/s: ordinary spread
        self.lag = rng.uniform(1.0, 5.0)                             # seconds of learner progress behind
        self.rss = (300 if component == "actor" else 100) * MiB + rng.uniform(-20, 20) * MiB
        self.faults: dict[str, float] = {}                           # fault -> time it started
        self.lost = False
        lines = []
        for m in served_metrics(component):
            if m.kind == "histogram":
                continue    # the learner's staleness histogram: below
            for labels in label_sets(m) if m.kind != "info" else [{}]:
                text = (f"{m.name}{_labels(self._info())}" if m.kind == "info"
                        else f"{m.name}{_labels(labels)}")
                lines.append((text, self._value_fn(m, labels)))
        if component == "learner":
            lines += [(f'rlvitals_learner_sample_staleness_steps_bucket{{le="{le}"}}', self._count)
                      for le in ("0.0", "1.0", "+Inf")]
            lines += [("rlvitals_learner_sample_staleness_steps_sum", self._count),
                      ("rlvitals_learner_sample_staleness_steps_count", self._count)]
        # The exposition text is rendered once with its constant values in place; a scrape only formats the
        # values that move (5,000 simulated actors are 1,000 scrapes a second on one Python process).
        self.dynamic = [fn for _, fn in lines if callable(fn)]
        template, i = [], 0
        for text, fn in lines:
            text = text.replace("{", "{{").replace("}", "}}")
            if callable(fn):
                template.append(f"{text} {{{i}}}\n")
                i += 1
            else:
                template.append(f"{text} {fn}\n")
        self.template = "".join(template)

    def _info(self) -> dict[str, str]:
        return {"run_id": RUN_ID, "run_name": "fleet-sim", "env": "CartPole-v1", "algorithm": "ppo", "mode": "ray",
                "code_version": "sim"}

    def _count(self, t: float) -> float:
        return float(int(t))

    def _value_fn(self, m: Metric, labels: dict):
        """A function of time for a value that moves, the value itself for one that does not."""
        key = (m.name, next(iter(labels.values()))) if labels else m.name
        name = m.name
        if name == "rlvitals_rule_held_updates":
            return -1.0   # a healthy run: no health rule's condition holds (the monitor exports -1)
        if name == "rlvitals_actor_env_steps_total":
            return self.env_steps
        if name == "rlvitals_actor_episodes_total":
            return lambda t: float(int(self.env_steps(t) / 200))
        if name == "rlvitals_actor_network_age":
            return self.network_age
        if name in ("rlvitals_learner_steps_total", "rlvitals_learner_network_age"):
            return lambda t: float(int(LEARNER_STEPS_PER_SECOND * t))
        if name == "rlvitals_process_resident_memory_bytes":
            return self.resident
        if name == "rlvitals_process_cpu_seconds_total":
            return lambda t: round(0.9 * t, 2)
        if name == "rlvitals_actor_phase_seconds_total":
            # Stepping and inference take most of an actor's time; the catalogue's other phases share the rest,
            # so the phases add up to the wall time whatever phases the catalogue lists.
            others = [p for p in m.label_values["phase"] if p not in MAIN_PHASES]
            share = MAIN_PHASES.get(labels["phase"], (1 - sum(MAIN_PHASES.values())) / max(1, len(others)))
            return lambda t: round(share * t, 2)
        if name.startswith("rlvitals_actor_episode_"):
            return {"min": 20.0, "max": 500.0, "mean": 200.0, "std": 80.0}[labels["stat"]]
        if name == "rlvitals_node_memory_total_bytes":
            return 64.0 * 2 ** 30
        if name == "rlvitals_node_memory_used_bytes":
            return 8.0 * 2 ** 30 + self.index * MiB
        if name == "rlvitals_node_cpu_utilization_ratio":
            return 0.6
        if m.kind == "info":
            return 1.0
        if m.kind == "counter":
            return 0.0 if name in COUNTERS_AT_ZERO else self._count
        return LEARNER_GAUGES.get(key, LEARNER_GAUGES.get(name, 0.0))

    def env_steps(self, t: float) -> float:
        start = self.faults.get("stall", self.faults.get("slow", math.inf))
        if "stall" in self.faults:
            done = self.speed * min(t, start)
        else:
            done = self.speed * min(t, start) + 0.2 * self.speed * max(0.0, t - start)
        return float(int(done // ROLLOUT) * ROLLOUT)

    def network_age(self, t: float) -> float:
        t = min(t, self.faults.get("lag", math.inf))
        return float(max(0, int(LEARNER_STEPS_PER_SECOND * (t - self.lag))))

    def resident(self, t: float) -> float:
        leak = 64 * MiB * max(0.0, t - self.faults.get("leak", math.inf)) / 60
        noise = 2 * MiB * math.sin(t * 0.7 + self.index)
        return float(int(self.rss + leak + noise))

    def body(self, t: float) -> bytes:
        return self.template.format(*[fn(t) for fn in self.dynamic]).encode()


class Fleet:
    def __init__(self, actors: int, seed: int = 0):
        rng = random.Random(seed)
        self.nodes = max(1, math.ceil(actors / ACTORS_PER_NODE))
        self.processes = {f"/actor/{i}": Process("actor", i, rng) for i in range(actors)}
        self.processes.update({f"/node/{j}": Process("node", j, rng) for j in range(self.nodes)})
        self.processes["/learner"] = Process("learner", 0, rng)

    @staticmethod
    def node_of(path: str) -> int:
        kind, _, i = path.strip("/").partition("/")
        return int(i) // ACTORS_PER_NODE if kind == "actor" else int(i) if kind == "node" else 0


def node_name(j: int) -> str:
    return f"10.0.{j // 250}.{j % 250 + 1}"


def targets(fleet: Fleet, ports: dict[str, int]) -> list[dict]:
    """file_sd target groups: each simulated process on its own port, with its instance, node and component."""
    instances = targets_by_path(fleet)
    return [{"targets": [f"127.0.0.1:{ports[path]}"], "labels": {
        "instance": instances[path], "node": node_name(fleet.node_of(path)), "component": proc.component,
        "run_id": RUN_ID, "run_name": "fleet-sim"}} for path, proc in fleet.processes.items()]


def targets_by_path(fleet: Fleet) -> dict[str, str]:
    """Each simulated process's `instance`: the host:port it would have on its node."""
    first_port = {"actor": 10000, "node": 9100, "learner": 9000}
    return {path: f"{node_name(fleet.node_of(path))}:{first_port[proc.component] + proc.index}"
            for path, proc in fleet.processes.items()}


# ====================================================================== the server process
class _Exporter(asyncio.Protocol):
    """One HTTP/1.1 connection: each request answered by `answer(path)`, `Connection: close` honoured. A protocol,
    not a task per connection: at 5,000 targets the stream-based server fell behind on a loaded machine,
    connections Prometheus had given up on piled up unclosed and the process ran out of file descriptors."""

    def __init__(self, answer):
        self.answer, self.buffer, self.transport = answer, b"", None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            try:
                status, body = self.answer(head.split(b" ", 2)[1].decode())
            except IndexError:
                status, body = "400 Bad Request", b""
            close = b"connection: close" in head.lower()
            extra = "Connection: close\r\n" if close else ""
            self.transport.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                                 f"Content-Length: {len(body)}\r\n{extra}\r\n".encode() + body)
            if close:
                self.transport.close()
                return


async def _serve(fleet: Fleet, port: int, ports_file: Path, max_seconds: float) -> None:
    """Each simulated process on a port of its own (as real ones are), faults on `port`."""
    start = time.monotonic()
    loop = asyncio.get_running_loop()

    def control(path: str) -> tuple[str, bytes]:
        query = urllib.parse.parse_qs(path.partition("?")[2])
        for p in query.get("path", []):
            proc = fleet.processes[p]
            if query["kind"][0] == "lost":
                proc.lost = True
            else:
                proc.faults[query["kind"][0]] = time.monotonic() - start
        return "200 OK", b""

    def exporter(proc: Process):
        return lambda path: (("503 Service Unavailable", b"") if proc.lost
                             else ("200 OK", proc.body(time.monotonic() - start)))

    servers = [await loop.create_server(lambda: _Exporter(control), "127.0.0.1", port)]
    ports = {}
    for path, proc in fleet.processes.items():
        servers.append(await loop.create_server(functools.partial(_Exporter, exporter(proc)), "127.0.0.1", 0))
        ports[path] = servers[-1].sockets[0].getsockname()[1]
    partial = ports_file.with_suffix(".partial")
    partial.write_text(json.dumps(ports))
    partial.replace(ports_file)
    await asyncio.sleep(max_seconds)   # bounded in time whatever happens to the driver


def serve_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleet.py serve")
    parser.add_argument("--actors", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ports-file", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=1200)
    args = parser.parse_args(argv)
    asyncio.run(_serve(Fleet(args.actors), args.port, args.ports_file, args.max_seconds))
    return 0


# ====================================================================== the driver
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 60) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def api(prom: str, path: str, **params) -> dict:
    return get_json(f"{prom}/api/v1/{path}?" + urllib.parse.urlencode(params))["data"]


def scalar(prom: str, query: str) -> float | None:
    result = api(prom, "query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


class Prometheus:
    def __init__(self, root: Path, target_file: Path):
        from rlvitals.stack.render import render_prometheus_config

        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("the `prometheus` binary is not on PATH (Debian: apt-get install prometheus)")
        config = root / "prometheus.yml"
        config.write_text(render_prometheus_config([str(target_file)]))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(root / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"Prometheus did not start; see {root / 'prometheus.log'}")
            time.sleep(0.5)

    def usage(self) -> tuple[float, float]:
        """(resident bytes, CPU seconds so far)."""
        import psutil

        p = psutil.Process(self.process.pid)
        cpu = p.cpu_times()
        return float(p.memory_info().rss), cpu.user + cpu.system

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def dashboard_queries(instance: str, window: int, run: str = RUN_ID) -> list[dict]:
    """Every panel target of every dashboard as Grafana would send it for run `run`."""
    out = []
    for path in dashboard_files():
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p.get("targets", []):
                expr = t["expr"]
                for var, value in (("$__rate_interval", "20s"), ("$__range", f"{window}s"), ("$run", run),
                                   ("$node", ".*"), ("$instance", instance)):
                    expr = expr.replace(var, value)
                out.append({"dashboard": path.stem, "panel": p["title"], "legend": t.get("legendFormat", ""),
                            "expr": expr, "instant": bool(t.get("instant"))})
    return out


def run_queries(prom: str, window: int, instance: str, run: str = RUN_ID, passes: int = 3) -> list[dict]:
    """Each dashboard query `passes` times (one pass over all of them after another, so a rule evaluation or
    compaction that lands on one run of a query does not decide its figure): the median and every run."""
    queries = dashboard_queries(instance, window, run)
    runs: list[list[float]] = [[] for _ in queries]
    series = [0] * len(queries)
    end = time.time()
    for _ in range(passes):
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            if q["instant"]:
                data = api(prom, "query", query=q["expr"], time=end)
            else:
                data = api(prom, "query_range", query=q["expr"], start=end - window, end=end, step=SCRAPE)
            runs[i].append(round(time.perf_counter() - t0, 4))
            series[i] = len(data["result"])
    return [{"dashboard": q["dashboard"], "panel": q["panel"], "legend": q["legend"],
             "seconds": sorted(r)[len(r) // 2], "runs_seconds": r, "series": n}
            for q, r, n in zip(queries, runs, series, strict=True)]


def rule_times(prom: str, evals: dict[str, list[float]], seen: set, intervals: dict[str, float]) -> None:
    """Append each group's and each rule's evaluation time (rules keyed `group/rule`) to `evals`, once per
    evaluation (`seen`: the (group, lastEvaluation) pairs taken; a group slower than the poll is polled twice)."""
    for g in api(prom, "rules")["groups"]:
        intervals[g["name"]] = g["interval"]
        if (g["name"], g["lastEvaluation"]) in seen:
            continue
        seen.add((g["name"], g["lastEvaluation"]))
        evals.setdefault(g["name"], []).append(g["evaluationTime"])
        for r in g["rules"]:
            evals.setdefault(f"{g['name']}/{r['name']}", []).append(r["evaluationTime"])


def eval_figures(evals: dict[str, list[float]], intervals: dict[str, float], phase: str) -> dict:
    """Per rule group: its interval, median, max and count of its evaluation times, and its rules by median
    (all of a fleet group's, the 5 slowest of others'); `fleet_seconds_per_scrape_interval`: the fleet groups'
    median evaluation times, each spread over its interval, per scrape interval (Prometheus's work for them)."""
    med = {k: sorted(v)[len(v) // 2] for k, v in evals.items()}

    def slowest(group: str) -> dict[str, float]:
        rules = sorted((k for k in evals if k.startswith(group + "/")), key=lambda k: -med[k])
        return {k.split("/", 1)[1]: round(med[k], 4) for k in rules[:None if "fleet" in group else 5]}

    out = {g: {"interval_seconds": intervals.get(g), "median": med[g], "max": max(v), "n": len(v), "phase": phase,
               "slowest_rules": slowest(g)} for g, v in evals.items() if "/" not in g}
    out["fleet_seconds_per_scrape_interval"] = round(sum(
        f["median"] * SCRAPE / f["interval_seconds"] for g, f in out.items() if "fleet" in g), 4)
    return out


def alerts(prom: str) -> list[dict]:
    return [a for a in api(prom, "alerts")["alerts"]]


def control(server: str, kind: str, paths: list[str]) -> None:
    query = urllib.parse.urlencode([("kind", kind)] + [("path", p) for p in paths])
    urllib.request.urlopen(f"{server}/fault?{query}", timeout=30).read()


def pick_faulty(fleet: Fleet, k: int, lost_node: int, seed: int = 1) -> dict[str, list[str]]:
    """K distinct actors per fault, none on the node that will be lost."""
    rng = random.Random(seed)
    actors = [p for p in fleet.processes if p.startswith("/actor/") and fleet.node_of(p) != lost_node]
    chosen = rng.sample(actors, k * len(FAULTS))
    return {kind: chosen[i * k:(i + 1) * k] for i, kind in enumerate(FAULTS)}


def wait_for_targets(prom: str, expected: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        up = scalar(prom, 'count(up{job="rlvitals"} == 1)') or 0
        if up >= expected:
            return time.monotonic() - t0
        time.sleep(1)
    raise SystemExit(f"only {up} of {expected} targets up after {timeout} s")


def start_fleet(actors: int, port: int, root: Path, max_seconds: float) -> tuple[subprocess.Popen, dict[str, int]]:
    """The server process of a fleet of `actors` (faults on `port`) and the port of each simulated process."""
    ports_file = root / "ports.json"
    server = subprocess.Popen([sys.executable, __file__, "serve", "--actors", str(actors), "--port", str(port),
                               "--ports-file", str(ports_file), "--max-seconds", str(max_seconds)],
                              stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not ports_file.exists():
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit("the simulated fleet did not start listening")
        time.sleep(0.2)
    return server, json.loads(ports_file.read_text())


def simulate(actors: int, faulty: int, healthy_seconds: float, fault_seconds: float, max_seconds: float) -> dict:
    fleet = Fleet(actors)
    lost_node = fleet.nodes - 1
    with tempfile.TemporaryDirectory(prefix="rlvitals-fleet-") as tmp:
        root = Path(tmp)
        port = free_port()
        server_url = f"http://127.0.0.1:{port}"
        server, ports = start_fleet(actors, port, root, max_seconds)
        prom = None
        try:
            target_file = root / "targets.json"
            target_file.write_text(json.dumps(targets(fleet, ports)))
            prom = Prometheus(root, target_file)
            started = time.monotonic()
            ready = wait_for_targets(prom.url, len(fleet.processes), 180)
            import psutil

            server_proc = psutil.Process(server.pid)
            server_cpu0 = sum(server_proc.cpu_times()[:2])
            rss0, cpu0 = prom.usage()
            t_cpu0 = time.monotonic()
            evals: dict[str, list[float]] = {}
            fault_evals: dict[str, list[float]] = {}
            seen: set = set()
            intervals: dict[str, float] = {}
            healthy_alerts: dict[str, dict] = {}
            while time.monotonic() - started < healthy_seconds:
                rule_times(prom.url, evals, seen, intervals)
                for a in alerts(prom.url):
                    healthy_alerts.setdefault(a["labels"]["alertname"], a)
                time.sleep(SCRAPE)
            rss, cpu = prom.usage()
            cpu_share = (cpu - cpu0) / (time.monotonic() - t_cpu0)
            server_share = (sum(server_proc.cpu_times()[:2]) - server_cpu0) / (time.monotonic() - t_cpu0)
            instance = targets(fleet, ports)[0]["labels"]["instance"]
            queries = run_queries(prom.url, int(min(300, healthy_seconds)), instance)
            scrape = {k: scalar(prom.url, f'{agg}scrape_duration_seconds{{job="rlvitals"}})')
                      for k, agg in (("median", "quantile(0.5, "), ("p99", "quantile(0.99, "), ("max", "max("))}
            head = api(prom.url, "status/tsdb")["headStats"]
            samples = scalar(prom.url, 'sum(scrape_samples_scraped{job="rlvitals"})')

            # ---- faults
            chosen = pick_faulty(fleet, faulty, lost_node)
            lost = [p for p in fleet.processes if fleet.node_of(p) == lost_node and not p.startswith("/learner")
                    and (p.startswith("/actor/") or p == f"/node/{lost_node}")]
            t_fault = time.monotonic()
            for kind, paths in chosen.items():
                control(server_url, kind, paths)
            control(server_url, "lost", lost)
            fired: dict[str, dict] = {}
            named_after: dict[str, dict[str, float]] = {}
            """Alert -> instance -> seconds after the faults when a firing alert first named it."""
            while time.monotonic() - t_fault < fault_seconds:
                for a in alerts(prom.url):
                    key = a["labels"]["alertname"] + "".join(f"/{a['labels'][k]}" for k in ("process",)
                                                              if k in a["labels"])
                    if a["state"] != "firing":
                        continue
                    now = round(time.monotonic() - t_fault, 1)
                    if key not in fired:
                        fired[key] = {"after_seconds": now, "value": a["value"], "labels": a["labels"],
                                      "processes": a["annotations"].get("processes", "")}
                    for named in named_instances(a["annotations"].get("processes", "")):
                        named_after.setdefault(key, {}).setdefault(named, now)
                rule_times(prom.url, fault_evals, seen, intervals)
                time.sleep(SCRAPE / 2)
            by_path = targets_by_path(fleet)
            instances = {kind: sorted(by_path[p] for p in paths) for kind, paths in chosen.items()}
            verdicts = judge(fired, instances, named_after)
            rss_end, _ = prom.usage()
        finally:
            if prom is not None:
                prom.stop()
            server.terminate()
            server.wait(timeout=30)
    per_panel: dict[str, int] = {}
    for q in queries:
        key = f"{q['dashboard']} / {q['panel']}"
        per_panel[key] = per_panel.get(key, 0) + q["series"]
    return {
        "actors": actors, "nodes": fleet.nodes, "processes": len(fleet.processes),
        "targets_up_after_seconds": round(ready, 1),
        "series_in_head": head["numSeries"], "samples_per_scrape_round": samples,
        "scrape_duration_seconds": scrape,
        "rule_group_evaluation_seconds": eval_figures(evals, intervals, "healthy"),
        "rule_group_evaluation_seconds_with_faults": eval_figures(fault_evals, intervals, "faults firing"),
        "prometheus": {"resident_bytes_after_healthy": rss, "resident_bytes_at_end": rss_end,
                       "cpu_cores_busy_healthy": round(cpu_share, 3)},
        "simulator_cpu_cores_busy": round(server_share, 3),
        "dashboard_queries": {"count": len(queries), "max_seconds": max(q["seconds"] for q in queries),
                              "max_series": max(q["series"] for q in queries),
                              "max_series_per_panel": max(per_panel.values()),
                              "slowest": sorted(queries, key=lambda q: -q["seconds"])[:5],
                              "all": queries},
        "healthy_phase_alerts": sorted(healthy_alerts),
        "faults": {"per_kind": faulty, "faulty_instances": instances, "lost_node": node_name(lost_node),
                   "lost_processes": len(lost)},
        "alerts_after_faults": fired,
        "verdicts": verdicts,
    }


def named_instances(processes: str) -> list[str]:
    """The instances a `processes` annotation names ("host:port on node n; ...")."""
    return [p.split(" on node ")[0] for p in processes.split("; ") if p]


def judge(fired: dict[str, dict], instances: dict[str, list[str]],
          named_after: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Per fault: did its alert fire, when, counting how many, naming which of the faulty (and any healthy) actors,
    and when each faulty actor was first named (an alert names the 5 worst, and a fault's actors cross the bound
    at different times: the first firing may name only some).

    RLActorSlow leaves stalled actors to RLActorStalled, but a stalling actor is slow first (its 30 s rate
    reaches 0 only 30 s after it stopped), so RLActorSlow may count and name stalling ones early on."""
    faulty = {i for kind in instances.values() for i in kind}
    out = {}
    for kind in FAULTS:
        alert = fired.get(EXPECTED[kind])
        named = named_instances(alert["processes"]) if alert else []
        first = named_after.get(EXPECTED[kind], {})
        when = [first.get(i) for i in instances[kind]]
        out[kind] = {"alert": EXPECTED[kind], "fired_after_seconds": alert and alert["after_seconds"],
                     "evaluation_intervals": alert and math.ceil(alert["after_seconds"] / SCRAPE),
                     "value": alert and float(alert["value"]),
                     "faulty_of_this_kind_named": sum(i in named for i in instances[kind]),
                     "each_faulty_named_after_seconds": when,
                     "all_named_within_intervals": (math.ceil(max(when) / SCRAPE)
                                                    if when and None not in when else None),
                     "healthy_actors_named": sorted(set(named) - faulty),
                     "healthy_actors_ever_named": sorted(set(first) - faulty)}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--faulty", type=int, default=3, help="actors per fault kind (default 3)")
    parser.add_argument("--healthy-seconds", type=float, default=150)
    parser.add_argument("--fault-seconds", type=float, default=150)
    parser.add_argument("--name", default=None,
                        help="result file name (default fleet_<actors>, e.g. fleet_1000: one file per size run)")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    for n in args.actors:
        if n < ACTORS_PER_NODE * 2 or n < args.faulty * len(FAULTS) + ACTORS_PER_NODE:
            print(f"--actors {n}: need at least {max(2 * ACTORS_PER_NODE, args.faulty * len(FAULTS) + 20)} "
                  "(two nodes, room for the faulty actors off the lost node)", file=sys.stderr)
            return 2
    from common import write_result

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop Prometheus and the server on the way out

    figures = {}
    for n in args.actors:
        print(f"simulating {n} actors ...", flush=True)
        figures[str(n)] = simulate(n, args.faulty, args.healthy_seconds, args.fault_seconds,
                                   max_seconds=args.healthy_seconds + args.fault_seconds + 600)
        summary = {k: figures[str(n)][k] for k in ("series_in_head", "scrape_duration_seconds", "prometheus",
                                                   "healthy_phase_alerts", "verdicts")}
        for phase in ("rule_group_evaluation_seconds", "rule_group_evaluation_seconds_with_faults"):
            summary[phase] = {g: f if not isinstance(f, dict) else f["median"]
                              for g, f in figures[str(n)][phase].items()}
        summary["slowest_dashboard_query_seconds"] = figures[str(n)]["dashboard_queries"]["max_seconds"]
        print(json.dumps(summary), flush=True)
    config = {"actors": args.actors, "faulty_per_kind": args.faulty, "healthy_seconds": args.healthy_seconds,
              "fault_seconds": args.fault_seconds, "actors_per_node": ACTORS_PER_NODE, "level": LEVEL,
              "scrape_interval_seconds": SCRAPE}
    name = args.name or "fleet_" + "_".join(str(n) for n in args.actors)
    path = write_result("fleet", config, figures, name=name, results_dir=args.results_dir)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
