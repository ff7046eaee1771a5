"""Real runs scraped over HTTP: `rlvitals train` subprocesses read by us and by promtool at each
verbosity, and a real Prometheus (the `prometheus` fixture from conftest.py) finding a run through
its discovery file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from telemetry_support import (
    LIVE_LEVELS,
    LIVE_STEPS,
    expected_series,
    installed_test_env,
    layer_counts,
    metric_of,
    non_hardware_lines,
)

from conftest import free_port, http_get
from rlvitals.config import TrainConfig
from rlvitals.learner.networks import ActorCritic
from rlvitals.telemetry import reference
from rlvitals.telemetry.catalogue import (
    BY_NAME,
    METRICS,
    exposed_names,
    metrics_at,
)
from rlvitals.telemetry.recorder import Recorder
from rlvitals.telemetry.rowkeys import OCCASIONAL_KEYS


@pytest.fixture(scope="session")
def test_env(tmp_path_factory):
    with installed_test_env(tmp_path_factory) as env:
        yield env


# ======================================================================
# Live runs scraped over HTTP
# ======================================================================
def rlvitals_command() -> list[str]:
    script = Path(sys.executable).with_name("rlvitals")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rlvitals.cli"]


class LiveRun:
    """`rlvitals train` in a subprocess with its /metrics on a free port; killed if a test fails."""

    def __init__(self, run_dir: Path, level: str, env: str, steps: int, pythonpath: Path | None = None):
        self.run_dir, self.level = run_dir, level
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.log_path = run_dir.with_name(run_dir.name + ".log")
        environ = {k: v for k, v in os.environ.items() if k != "RLVITALS_VERBOSITY"}
        if pythonpath is not None:
            environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), environ.get("PYTHONPATH")]))
        command = rlvitals_command() + [
            "train", "--env", env, "--total-env-steps", str(steps), "--verbosity", level,
            "--metrics-port", str(self.port), "--progress", "false", "--run-dir", str(run_dir), "--device", "cpu"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                            stdin=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.alive:
            self.process.kill()
            self.process.wait(timeout=30)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def scrape(self) -> str | None:
        status, body = http_get(self.url, timeout=5)
        return body.decode() if status == 200 else None

    def discovery_files(self) -> list[Path]:
        return sorted((self.run_dir / "discovery").glob("*.json"))

    def run_id(self) -> str:
        return json.loads((self.run_dir / "meta.json").read_text())["run_id"]

    def wait(self, timeout: float = 120) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, as a user stops a run: it finishes its update, writes its archive and exits 0."""
        assert self.alive, f"the run ended before the test stopped it:\n{self.output()}"
        self.process.send_signal(signal.SIGTERM)
        assert self.wait() == 0, self.output()

    def rows(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len(path.read_bytes().splitlines()) if path.is_file() else 0

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def parse(text: str) -> tuple[dict[str, str], list]:
    """(HELP text by metric name, samples) of an exposition."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, flags=re.M))
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return helps, samples


def check_with_promtool(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); the other checks passed")
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert result.returncode == 0, f"promtool check metrics failed:\n{result.stdout.decode()}{result.stderr.decode()}"


@pytest.mark.slow
@pytest.mark.parametrize("level", LIVE_LEVELS)
def test_live_run_exports_exactly_its_level(level, tmp_path, test_env):
    env_dir, env_spec = test_env
    expected = metrics_at(level)
    assert {m.name for m in expected} == {m.name for m in Recorder(level, "local").metrics}
    needs_samples = {m.name for m in expected if not m.hardware and not m.only_in}   # this run: feed-forward
    seen_targets: list = []  # [(number of discovery files, content of the first)] while alive

    def ready(text: str) -> bool:
        _, samples = parse(text)
        names = {s.name for s in samples}
        steps = [s.value for s in samples if s.name == "rlvitals_learner_steps_total"]
        return bool(steps) and steps[0] > 0 and all(
            any(n in names for n in exposed_names(BY_NAME[name])) for name in needs_samples)

    with LiveRun(tmp_path / "run", level, env_spec, LIVE_STEPS, pythonpath=env_dir) as run:
        text, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline:
            alive = run.alive
            files = run.discovery_files() if alive and not seen_targets else []
            if files:
                try:
                    seen_targets.append((len(files), json.loads(files[0].read_text())))
                except (FileNotFoundError, json.JSONDecodeError):
                    pass
            got = run.scrape()
            if got is not None:
                text = got
                if ready(text) and seen_targets:
                    break
            if not alive:
                break
            time.sleep(0.03)
        assert text is not None, f"never scraped {run.url}; run output:\n{run.output()}"
        helps, samples = parse(text)
        names = {s.name for s in samples}
        missing = sorted(n for n in needs_samples if not any(e in names for e in exposed_names(BY_NAME[n])))
        assert ready(text), (f"the run ended or timed out before every {level} metric had a sample; "
                             f"missing: {missing}; output:\n{run.output()}")

        # Every metric at or below the level is declared, with the catalogue's help text ...
        for m in expected:
            assert helps.get(m.name) == m.help, f"{m.name}: HELP missing or different from the catalogue"
        # ... nothing above it is, and nothing outside the catalogue is served at all.
        for m in METRICS:
            if not m.at(level):
                assert m.name not in helps, f"{m.name} ({m.level}) served at {level}"
                assert not set(exposed_names(m)) & names, f"{m.name} ({m.level}) has samples at {level}"
        assert set(helps) <= {m.name for m in expected}
        for name in names:
            assert metric_of(name).name in helps, name
        for s in samples:
            assert not set(s.labels) & set(reference.FORBIDDEN_LABELS), s

        # Exactly the documented number of series (hardware ones aside).
        net = ActorCritic(*_spaces(env_spec))
        scale = {**layer_counts(net), "rollout step": TrainConfig().rollout_length}
        # Less the invariant statistics a local run measures late or never (telemetry.rowkeys.OCCASIONAL_KEYS).
        lines = non_hardware_lines(text)
        exported = BY_NAME["rlvitals_invariant_statistic"].at(level)
        absent = [key for key in OCCASIONAL_KEYS if key.startswith("inv_") and exported and not any(
            line.startswith(f'rlvitals_invariant_statistic{{invariant="{key.removeprefix("inv_")}"') for line in lines)]
        assert not exported or "inv_actor_accounting" in absent   # the Ray actors' counters: never in local mode
        assert len(lines) == expected_series("local", level, scale) - len(absent)

        # Values that must hold in any synchronous local run.
        run_id = run.run_id()
        info = [s for s in samples if s.name == "rlvitals_run_info"]
        assert len(info) == 1 and info[0].labels["run_id"] == run_id and info[0].labels["mode"] == "local"
        assert info[0].labels["env"] == env_spec and info[0].labels["run_name"] == run.run_dir.name
        values = {s.name: s.value for s in samples if not s.labels}
        assert values["rlvitals_learner_samples_consumed_total"] > 0
        assert values["rlvitals_actor_env_steps_total"] >= values["rlvitals_learner_samples_consumed_total"]
        if level != "minimal":
            staleness = {s.labels.get("le"): s.value for s in samples
                         if s.name == "rlvitals_learner_sample_staleness_steps_bucket"}
            assert staleness["0.0"] == staleness["+Inf"] == values["rlvitals_learner_sample_staleness_steps_count"] > 0
            assert values["rlvitals_learner_training_intensity"] == TrainConfig().update_epochs
            assert -1 <= values["rlvitals_learner_terminal_correlation"] <= 1

        check_with_promtool(text)

        # The discovery file existed while the run was alive and pointed at this port.
        assert seen_targets, "no discovery file while the run was alive"
        count, target = seen_targets[0]
        assert count == 1
        assert target == [{"targets": [f"127.0.0.1:{run.port}"],
                           "labels": {"component": "local", "run_id": run_id, "run_name": run.run_dir.name}}]

        run.stop()
        assert run.discovery_files() == [], "discovery file left behind after the run ended"
        assert (run.run_dir / "summary.json").is_file()
        assert http_get(run.url, timeout=2)[0] == 0, "/metrics still answers after the run ended"


def _spaces(env_spec: str):
    from rlvitals.actors.envs import make_vector_env

    env = make_vector_env(env_spec, 1)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def _listening(pid: int) -> list:
    proc = psutil.Process(pid)
    connections = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections("inet")
    return [c for c in connections if c.status == psutil.CONN_LISTEN]


@pytest.mark.slow
def test_level_off_serves_nothing(tmp_path):
    with LiveRun(tmp_path / "run", "off", "CartPole-v1", LIVE_STEPS) as run:
        # Checked from the archive's start until several updates are done; the bound fails a hung run only.
        checked, deadline = 0, time.monotonic() + 120
        while run.alive and time.monotonic() < deadline and not (checked >= 10 and run.rows() >= 3):
            if (run.run_dir / "meta.json").is_file():  # the archive exists: training is under way
                try:
                    assert _listening(run.process.pid) == [], "a run at verbosity off listens on a socket"
                except psutil.NoSuchProcess:
                    break  # the run died: said below, with its output
                assert http_get(run.url, timeout=1)[0] == 0
                assert not (run.run_dir / "discovery").exists() or run.discovery_files() == []
                checked += 1
            time.sleep(0.05)
        assert checked >= 10 and run.rows() >= 3, f"{checked} checks, {run.rows()} rows:\n{run.output()}"
        run.stop()
        assert not (run.run_dir / "discovery").exists() or run.discovery_files() == []
        assert (run.run_dir / "summary.json").is_file()


# ======================================================================
# A real Prometheus scrapes a live run through its discovery file
# ======================================================================
@pytest.mark.slow
def test_prometheus_discovers_and_scrapes_a_live_run(prometheus, tmp_path):
    steps = 50_000_000  # far more than it will run: stopped with SIGTERM once Prometheus has it
    with LiveRun(tmp_path / "run", "minimal", "CartPole-v1", steps) as run:
        deadline = time.monotonic() + 90
        while run.alive and not run.discovery_files() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.alive and run.discovery_files(), f"no discovery file; output:\n{run.output()}"
        run_id = run.run_id()
        copy = prometheus.discovery_dir / f"run-{run_id}.json"
        shutil.copy(run.discovery_files()[0], copy)
        try:
            query = f'rlvitals_learner_steps_total{{run_id="{run_id}"}}'
            result, deadline = [], time.monotonic() + 60
            while time.monotonic() < deadline:
                assert run.alive, f"the run ended before Prometheus scraped it:\n{run.output()}"
                result = prometheus.query(query)
                if result and float(result[0]["value"][1]) > 0:
                    break
                time.sleep(0.25)
            assert result, (f"Prometheus returned nothing for {query}; targets: {prometheus.targets()}; "
                            f"log:\n{prometheus.log()}")
            assert float(result[0]["value"][1]) > 0
            labels = result[0]["metric"]
            assert labels["run_id"] == run_id
            assert labels["run_name"] == run.run_dir.name  # from the discovery file, on every series
            assert labels["component"] == "local"
            assert labels["job"] == "rlvitals"
            assert labels["instance"] == f"127.0.0.1:{run.port}"
            info = prometheus.query(f'rlvitals_run_info{{run_id="{run_id}"}}')
            assert len(info) == 1 and info[0]["metric"]["env"] == "CartPole-v1"
            assert run.alive
        finally:
            copy.unlink(missing_ok=True)
        run.stop()
        assert run.discovery_files() == []
        summary = json.loads((run.run_dir / "summary.json").read_text())
        assert 0 < summary["env_steps"] < steps
