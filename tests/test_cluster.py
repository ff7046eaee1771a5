"""The `ray up` deployment: the cluster files pass Ray's own validation, and a real `ray up` of
deploy/cluster-local.yaml on loopback runs a training that Prometheus on the head scrapes.

The loopback cluster lives in Linux namespaces that the test makes and ends: one network namespace
(only its own loopback, so SSH's port 22 and Ray's default ports are free in it and nothing in it
can be reached from outside), holding three "machines", each a PID and mount namespace with an
empty /root and /tmp of its own: the head (sshd on 127.0.0.1), a worker (sshd on 127.0.0.2) and the
laptop that runs `ray up`. `ray stop` on one machine sees that machine's processes only; ending the
namespaces' first process ends everything in them; the host's /root and /tmp are never written.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CLUSTER_FILES = {name: REPO / "deploy" / f"cluster-{name}.yaml" for name in ("aws", "gcp", "local")}
VENV = Path(sys.prefix)


def prepared(name: str) -> dict:
    """The cluster file as `ray up` sees it after its first step: merged with the provider's defaults."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load(CLUSTER_FILES[name].read_text()))
    validate_config(config)
    return config


def bash_syntax_ok(command: str) -> str:
    """'' when bash can parse the command, else bash's complaint."""
    result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    return result.stderr.strip()


# ======================================================================
# offline: Ray's own validation of every cluster file
# ======================================================================
@pytest.mark.parametrize("name", sorted(CLUSTER_FILES))
def test_cluster_file_passes_rays_validation_and_keeps_the_roles_apart(name):
    config = prepared(name)
    head_type = config["head_node_type"]
    start = " ".join(config["head_start_ray_commands"])
    worker_start = " ".join(config["worker_start_ray_commands"])
    if name == "local":
        # One node type for head and workers: the roles are given to `ray start` itself.
        assert """--resources='{"learner": 1}'""" in start
        assert '--resources="{\\"actor\\":' in worker_start
    else:
        types = config["available_node_types"]
        assert types[head_type]["resources"] == {"learner": 1}
        workers = [t for n, t in types.items() if n != head_type]
        assert workers and all(t["resources"].get("actor", 0) >= 1 and t["min_workers"] == 0 for t in workers)
        assert sum(t["max_workers"] for t in workers) >= 1 and config["idle_timeout_minutes"] <= 10
        head = types[head_type]["node_config"]
        gpu_head = (head.get("InstanceType", "").split(".")[0] in ("g4dn", "g5", "g6", "g6e", "p3", "p4d", "p5")
                    or head.get("machineType", "").startswith(("g2-", "a2-", "a3-")) or "guestAccelerators" in head)
        assert gpu_head, f"{name}: the head must have a GPU for the learner: {head}"
    # Installed from the working copy with pinned versions; Prometheus and Grafana on the head.
    assert config["file_mounts"]["~/rlvitals-src"] == "."
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert any("deploy/cluster/setup-node.sh" in c for c in config["setup_commands"])
    assert any("deploy/cluster/install-monitoring.sh" in c for c in config["head_setup_commands"])
    assert config["head_start_ray_commands"][-1] == "rlvitals stack up"
    # Token auth on every node; the dashboard (and job API) on the head's loopback only.
    assert "RAY_AUTH_MODE=token" in start and "RAY_AUTH_MODE=token" in worker_start
    assert "--dashboard-host=127.0.0.1" in start and "0.0.0.0" not in start + worker_start
    for command in config["head_setup_commands"] + config["worker_setup_commands"] + \
            config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        assert bash_syntax_ok(command) == "", command


def test_ray_up_refuses_a_broken_cluster_file():
    """The validation above can fail: a misspelt field is what `ray up` itself would refuse."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(CLUSTER_FILES["aws"].read_text())
    config["available_node_types"]["cpu_worker"]["max_worker"] = 4
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


def test_cluster_nodes_install_pinned_versions_that_fit_the_project():
    from packaging.requirements import Requirement
    from packaging.version import Version

    pins = {}
    for line in (REPO / "deploy/cluster/constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"not an exact pin: {line!r}"
            pins[name.lower().replace("_", "-")] = Version(version)
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in deploy/cluster/constraints.txt"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} breaks {spec}"


def test_job_entrypoint_refuses_bad_flags_before_it_touches_the_cluster():
    result = subprocess.run([sys.executable, str(REPO / "deploy/cluster/job.py"), "--num-actors", "-1"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_ADDRESS": ""})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlvitals: error: num_actors=-1 is invalid"), result.stderr
    bad = subprocess.run([sys.executable, str(REPO / "deploy/cluster/job.py"), "--actor-resources", "actor"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "actor_resources='actor' is invalid" in bad.stderr


def test_submit_names_the_run_directory_itself():
    result = subprocess.run(["bash", str(REPO / "deploy/cluster/submit.sh"), "--run-dir", "/elsewhere"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "give --name NAME instead of --run-dir" in result.stderr


def test_actor_resources_decide_how_many_actors_fit(monkeypatch):
    import ray

    from rlvitals.config import ConfigError, TrainConfig
    from rlvitals.distributed import check_resources

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 12.0, "actor": 8.0, "learner": 1.0})
    assert check_resources(TrainConfig(mode="ray", actor_resources="actor=1")) == 8   # not 12 - 1
    assert check_resources(TrainConfig(mode="ray", actor_resources="actor=2")) == 4
    assert check_resources(TrainConfig(mode="ray")) == 11
    with pytest.raises(ConfigError, match=r"num_actors=9 .* actor_resources='actor=1' asks for 9 CPUs and 0 GPUs, "
                                          r"9 'actor'; the Ray cluster has 12 CPUs and 0 GPUs, 8 'actor'"):
        check_resources(TrainConfig(mode="ray", num_actors=9, actor_resources="actor=1"))
    with pytest.raises(ConfigError, match="0 'gpu_box'"):
        check_resources(TrainConfig(mode="ray", num_actors=1, actor_resources="gpu_box=1"))


# ======================================================================
# a real `ray up` on loopback
# ======================================================================
# Run as: unshare --net --pid --mount --fork bash SANDBOX ROOT HOME KEEP...
# Each machine mounts an empty tmpfs on HOME and /tmp (and /run, for sshd), then puts back the KEEP
# paths that lie under them (the checkout, the venv's Python, ROOT), so it sees the same code.
SANDBOX = r"""
set -eu
ROOT=$1 HOME_DIR=$2; shift 2
ip link set lo up
PRIVATE='
set -e
mount -t tmpfs -o mode=755 tmpfs /run
i=0
for p in "$@"; do
    case $p in "$HOME_DIR"|"$HOME_DIR"/*|/tmp|/tmp/*) mkdir -p /run/keep/$i; mount --bind "$p" /run/keep/$i;; esac
    i=$((i+1))
done
mount -t tmpfs -o mode=700 tmpfs "$HOME_DIR"
mount -t tmpfs -o mode=1777 tmpfs /tmp
i=0
for p in "$@"; do
    case $p in "$HOME_DIR"|"$HOME_DIR"/*|/tmp|/tmp/*) mkdir -p "$p"; mount --move /run/keep/$i "$p";; esac
    i=$((i+1))
done
mkdir -p /run/sshd
touch "$ROOT/$0.ready"
'
export ROOT HOME_DIR
for machine in head:127.0.0.1 worker:127.0.0.2; do
    IP=${machine#*:}
    export IP
    unshare --pid --mount --fork --mount-proc --propagation private bash -c "$PRIVATE"'
        /usr/sbin/sshd -D -e -f "$ROOT/sshd_config" -o ListenAddress=$IP:22 &
        while true; do wait; sleep 1; done' "${machine%%:*}" "$@" \
        >"$ROOT/${machine%%:*}-sshd.log" 2>&1 &
done
unshare --pid --mount --fork --mount-proc --propagation private bash -c "$PRIVATE"'
    while true; do sleep 3600 & wait; done' laptop "$@" &
wait
"""
SSHD_CONFIG = """\
HostKey {root}/host_key
AuthorizedKeysFile {root}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
PrintMotd no
X11Forwarding no
LogLevel ERROR
"""
ROLES = ("head", "worker", "laptop")
HANG_S = 180
"""Seconds after which a machine, its sshd or a namespace that never came up fails the test (a hang, not a speed)."""


def unavailable() -> str | None:
    """Why a loopback `ray up` cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "needs Linux namespaces"
    for tool, package in (("/usr/sbin/sshd", "openssh-server"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client"), ("rsync", "rsync"), ("prometheus", "prometheus"),
                          ("unshare", "util-linux"), ("nsenter", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian: apt-get install {package}; `bash deploy/setup.sh --test` installs it)"
    probe = subprocess.run(["unshare", "--net", "--pid", "--mount", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make network, PID and mount namespaces (needs root): {probe.stderr.strip()[:200]}"
    return None


class LoopbackMachines:
    """The head, worker and laptop namespaces; `run` runs a command on the laptop."""

    def __init__(self, root: Path):
        self.root = root
        self.home = pwd.getpwuid(os.getuid()).pw_dir
        keep = {str(p) for p in (REPO, VENV.resolve(), Path(sys.base_prefix).resolve(), root)}
        self.keep = sorted(p for p in keep if not any(p != q and p.startswith(q + "/") for q in keep))
        self.proc: subprocess.Popen | None = None
        self.inits: dict[str, psutil.Process] = {}
        self.namespaces: set[str] = set()

    def start(self) -> None:
        """Start the machines and wait until both sshds answer; a launch whose sshd never answers is taken down
        and launched once more. (Twice in about ten suite runs sshd "never answered" with nothing in its log:
        the scan for each machine's first process could take a short-lived fork of it, a `mkdir` or `mount`
        about to exec, as the laptop, and every probe then entered a process that was gone. The scan now takes
        only pid 1 of each namespace; the second launch stays as a guard.)"""
        failed = ""
        for _ in range(2):
            failed = self._launch()
            if not failed:
                return
            self.stop()
        raise AssertionError(failed)

    def _launch(self) -> str:
        """'' once every machine is up and both sshds answer; else what was seen."""
        self.inits, self.namespaces = {}, set()
        for role in ROLES:      # a first launch's: this one writes its own
            (self.root / f"{role}.ready").unlink(missing_ok=True)
        (self.root / "sandbox.sh").write_text(SANDBOX)
        log = open(self.root / "sandbox.log", "wb")
        self.proc = subprocess.Popen(["unshare", "--net", "--pid", "--mount", "--fork", "--propagation", "private",
                                      "bash", str(self.root / "sandbox.sh"), str(self.root), self.home, *self.keep],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        # Hang guards, not timings: each step takes a second or two when it works.
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and len(self.inits) < len(ROLES):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    argv = child.cmdline()
                    first = namespace_pid(child.pid) == 1   # not a fork of it about to exec sshd or sleep
                except (psutil.NoSuchProcess, OSError):
                    continue
                if first and len(argv) > 3 and argv[:2] == ["bash", "-c"] and argv[3] in ROLES:
                    self.inits[argv[3]] = child
            time.sleep(0.1)
        while time.monotonic() < deadline and not all((self.root / f"{role}.ready").exists() for role in ROLES):
            time.sleep(0.1)  # each machine's own /root and /tmp are mounted
        if len(self.inits) < len(ROLES) or not all((self.root / f"{role}.ready").exists() for role in ROLES):
            return f"namespaces did not start: {self.log('sandbox.log')}"
        for process in psutil.Process(self.proc.pid).children(recursive=True):  # not unshare itself: host side
            try:
                self.namespaces.add(os.readlink(f"/proc/{process.pid}/ns/pid"))
            except OSError:
                pass
        self.namespaces.discard(os.readlink("/proc/self/ns/pid"))
        probe = "import socket,sys\nfor ip in ('127.0.0.1','127.0.0.2'): socket.create_connection((ip, 22), 2).close()"
        deadline = time.monotonic() + HANG_S / 2
        while (probed := self.run([sys.executable, "-c", probe], timeout=10)).returncode != 0:
            if time.monotonic() > deadline:
                return (f"sshd did not start: head log {self.log('head-sshd.log')!r}, worker log "
                        f"{self.log('worker-sshd.log')!r}; probe: {probed.stderr[-1500:]}; head runs "
                        f"{self.processes('head')}, worker runs {self.processes('worker')}")
            time.sleep(0.2)
        return ""

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TMPDIR", "VIRTUAL_ENV"))}
        env.update(HOME=self.home, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", RAY_USAGE_STATS_ENABLED="0",
                   PYTHONWARNINGS="ignore::DeprecationWarning")
        command = ["nsenter", "-t", str(self.inits["laptop"].pid), "-n", "-m", "-p", f"--wd={REPO}", "--", *argv]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def processes(self, role: str) -> list[str]:
        """What runs on a machine besides its first process and its sshd."""
        names = []
        try:
            children = self.inits[role].children(recursive=True)
        except psutil.NoSuchProcess:    # the machine's first process ended: its pid namespace ended with it
            return []
        for process in children:
            try:
                if process.name() != "sshd" and process.status() != psutil.STATUS_ZOMBIE:
                    names.append(" ".join(process.cmdline())[:160])
            except psutil.NoSuchProcess:
                pass
        return names

    def log(self, name: str) -> str:
        path = self.root / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else f"({name} missing)"

    def stop(self) -> None:
        if self.proc is None:
            return
        for process in psutil.Process(self.proc.pid).children():  # the network namespace's first process
            process.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def namespace_pid(pid: int) -> int:
    """A process's pid inside its innermost pid namespace (1: that namespace's first process)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return pid


def left_in(namespaces: set[str]) -> list[str]:
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.readlink(f"/proc/{process.pid}/ns/pid") in namespaces:
                left.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])[:120]}")
        except OSError:
            pass
    return left


def sshd_processes() -> set[tuple[int, float]]:
    found = set()
    for process in psutil.process_iter(["name", "create_time"]):
        if process.info["name"] == "sshd":
            found.add((process.pid, process.info["create_time"]))
    return found


def host_traces(cluster_name: str) -> set[Path]:
    """What `ray up`/`ray down` and the nodes would leave in the host's home and /tmp, were they not isolated."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    paths = [home / n for n in ("ray_bootstrap_config.yaml", "ray_bootstrap_key.pem", "rlvitals-src", "runs")]
    paths += [Path("/tmp/ray") / f"cluster-{cluster_name}.state", Path("/tmp/ray") / f"cluster-{cluster_name}.lock"]
    paths += Path("/tmp").glob(f"ray_ssh_*/{hashlib.sha256(cluster_name.encode()).hexdigest()[:10]}")
    return {p for p in paths if p.exists()}


def cluster_file(root: Path, name: str) -> Path:
    """deploy/cluster-local.yaml with only the machines, the auth, the installation and the scrape interval replaced."""
    config = yaml.safe_load(CLUSTER_FILES["local"].read_text())
    config["cluster_name"] = name
    config["provider"].update(head_ip="127.0.0.1", worker_ips=["127.0.0.2"])
    config["auth"] = {"ssh_user": pwd.getpwuid(os.getuid()).pw_name, "ssh_private_key": str(root / "id_ed25519")}
    # No package downloads here: every machine uses this checkout's venv (the same code, via the
    # editable install); Prometheus is installed on the host, Grafana is not needed.
    config["setup_commands"] = [f"bash ~/rlvitals-src/deploy/cluster/setup-node.sh --venv {VENV}"]
    config["head_setup_commands"] = []
    # A run of seconds: Prometheus scrapes every second (the stack's own interval is 5 s).
    assert config["head_start_ray_commands"][-1] == "rlvitals stack up"
    config["head_start_ray_commands"][-1] = "rlvitals stack up --scrape-interval 1s"
    path = root / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def prometheus_query(machines: LoopbackMachines, path: str) -> dict:
    """GET http://127.0.0.1:9090{path} from the laptop, as a tunnel from `ray attach -p 9090` would."""
    script = ("import json,sys,urllib.request\n"
              "print(urllib.request.urlopen('http://127.0.0.1:9090' + sys.argv[1], timeout=5).read().decode())")
    result = machines.run([sys.executable, "-c", script, path], timeout=30)
    assert result.returncode == 0, f"Prometheus on the head did not answer {path}: {result.stderr[-500:]}"
    return json.loads(result.stdout)


def scraped(machines: LoopbackMachines) -> dict[str, set[tuple[str, str]]]:
    """component -> {(instance, node)} of the rlvitals targets Prometheus scrapes successfully now."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for target in prometheus_query(machines, "/api/v1/targets")["data"]["activeTargets"]:
        labels = target["labels"]
        if labels.get("job") == "rlvitals" and target["health"] == "up":
            seen.setdefault(labels.get("component", "?"), set()).add((labels["instance"], labels.get("node", "")))
    return seen


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hung run; `ray up` alone takes up to 4 min here
def test_ray_up_on_loopback_trains_and_prometheus_on_the_head_scrapes_every_process():
    reason = unavailable()
    if reason:
        pytest.skip(f"loopback `ray up`: {reason}")
    cluster_name = f"rlvitals-ci-{os.urandom(4).hex()}"
    before = host_traces(cluster_name)
    sshd_before = sshd_processes()
    root = Path(tempfile.mkdtemp(prefix="rlvitals-cluster-"))
    machines = LoopbackMachines(root)
    try:
        for key in ("id_ed25519", "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", cluster_name, "-f", str(root / key)],
                           check=True, capture_output=True)
        shutil.copy(root / "id_ed25519.pub", root / "authorized_keys")
        (root / "sshd_config").write_text(SSHD_CONFIG.format(root=root))
        config = str(cluster_file(root, cluster_name))
        machines.start()

        def laptop(*argv: str, timeout: float = 120) -> str:
            result = machines.run(list(argv), timeout=timeout)
            with (root / "laptop.log").open("a") as log:
                log.write(f"$ {shlex.join(argv)}\n{result.stdout}\n{result.stderr}\n")
            assert result.returncode == 0, (f"`{shlex.join(argv)}` failed ({result.returncode}):\n"
                                            f"{result.stdout[-2500:]}\n{result.stderr[-2500:]}")
            return result.stdout + result.stderr

        # What README.md "Run on a cluster" tells a user to do, from the checkout's root.
        laptop("ray", "get-auth-token", "--generate")
        up = laptop("ray", "up", "-y", "--no-config-cache", config, timeout=240)
        assert re.search(r"Prometheus\s+http://127\.0\.0\.1:9090", up), up[-2000:]
        # Far more steps than it will run: the run is stopped with SIGTERM once every process was scraped.
        budget = 1_000_000_000
        run = laptop("ray", "exec", config, "~/rlvitals-src/deploy/cluster/submit.sh --name ci --num-actors 2 "
                     f"--num-envs 8 --total-env-steps {budget} --verbosity standard")
        assert "submit: run ci" in run

        def job_log() -> str:
            return machines.run(["ray", "exec", config, "ray job logs ci"], timeout=120).stdout[-3000:]

        # Prometheus on the head finds every process of the run through its discovery folder and
        # scrapes it: the learner on the head, both actors on the worker, a node sidecar on each, and
        # both actors' step counters. A target counts once scraped: a busy process can miss one 1 s
        # scrape on a loaded machine. The bound only fails a hung run.
        actor_steps = "/api/v1/query?query=max_over_time(rlvitals_actor_env_steps_total%5B15m%5D)"

        def stepping(result: dict) -> bool:
            series = result["data"]["result"]
            return len(series) == 2 and all(float(s["value"][1]) > 0 for s in series)

        seen: dict = {}
        steps: dict = {}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for component, targets in scraped(machines).items():
                seen.setdefault(component, set()).update(targets)
            if seen.get("learner") and len(seen.get("actor", ())) == 2 and len(seen.get("node", ())) == 2:
                steps = prometheus_query(machines, actor_steps)
                if stepping(steps):
                    break
            time.sleep(1)
        assert seen.get("learner") and len(seen.get("actor", ())) == 2 and len(seen.get("node", ())) == 2, (
            f"scraped: {seen}\njob log:\n{job_log()}")
        assert stepping(steps), f"actor steps in Prometheus: {steps}\njob log:\n{job_log()}"
        assert {instance.split(":")[0] for instance, _ in seen["learner"]} == {"127.0.0.1"}
        assert {node for _, node in seen["actor"]} == {"127.0.0.2"}, "actors must run on the worker only"
        assert {node for _, node in seen["node"]} == {"127.0.0.1", "127.0.0.2"}

        # Stop the run as a user's `kill` would: the learner's pid is in its run directory's lock file.
        laptop("ray", "exec", config, 'kill -TERM "$(cat ~/runs/ci/.lock)"')
        logs = laptop("ray", "exec", config, "ray job logs -f ci", timeout=240)
        assert "succeeded" in laptop("ray", "exec", config, "ray job status ci"), logs[-3000:]
        summary = json.loads([line for line in logs.splitlines() if line.startswith('{"algorithm"')][-1])
        assert summary["status"] == "terminated" and summary["mode"] == "ray" and summary["num_actors"] == 2, summary
        assert 0 < summary["env_steps"] < budget

        # Take it all down the way README.md says: nothing of Ray or the stack stays on any machine.
        down = laptop(sys.executable, "deploy/cluster/down_local.py", config, timeout=180)
        assert "stopped prometheus" in down, down[-2000:]
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and (machines.processes("head") or machines.processes("worker")):
            time.sleep(0.5)
        assert not machines.processes("head"), machines.processes("head")
        assert not machines.processes("worker"), machines.processes("worker")
    finally:
        machines.stop()
        shutil.rmtree(root, ignore_errors=True)
    left = left_in(machines.namespaces)
    assert not left, f"processes left in the test's namespaces: {left}"
    assert sshd_processes() <= sshd_before, "an sshd the test started is still running"
    assert not root.exists()
    assert host_traces(cluster_name) == before, "the loopback cluster wrote outside its namespaces"
