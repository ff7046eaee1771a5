"""The wheel works anywhere: built from this tree, installed into a fresh virtual environment, run elsewhere.

The module builds the wheel (`pip wheel --no-deps --no-build-isolation`, from a
copy of the tree so the checkout gets no build/ or egg-info), makes a virtual
environment without pip, and installs the wheel into it with this interpreter's
pip (`pip --python`). Nothing is downloaded: the new environment sees this
environment's dependencies (torch, ray, ...) through a folder of links to its
site-packages, every entry but rlvitals's own, added by a .pth file. Every
command then runs from a folder outside the checkout, without PYTHONPATH, and
the first test proves the code and the files it reads come from the new
environment, not from the checkout:

  1. the wheel holds every package and every runtime file of the tree
  2. the installed package, its data (Prometheus config and rules, Grafana
     provisioning, dashboards, docs/metrics.md) and its code version come from
     the new environment; the shipped dashboards and metric reference are current
  3. `rlvitals train` (a short CartPole run) and the doctor: `rlvitals doctor
     --help` and its first probe (the whole ladder takes minutes; tests/test_probes.py
     runs it from the checkout)
  4. `rlvitals stack up` / `down` with the real Prometheus and the installed rules
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import free_port, http_get

pytestmark = pytest.mark.slow  # builds and installs a wheel, trains

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"rlvitals": "rlvitals", "rlvitals/actors": "actors", "rlvitals/learner": "learner",
           "rlvitals/telemetry": "telemetry", "rlvitals/dashboards": "dashboards", "rlvitals/deploy": "deploy",
           "rlvitals/docs": "docs"}
"""Where each part lives in the wheel -> its folder in the tree (setup.py's mapping)."""
RUNTIME_FILES = ("deploy/docker-compose.yml", "deploy/prometheus/prometheus.yml", "deploy/prometheus/rules/*.yml",
                 "deploy/grafana/provisioning/*/*.yml", "dashboards/*.json", "docs/metrics.md")
"""Files the commands read at run time, as patterns in the tree."""
NOT_COPIED = (".git", ".venv", "build", "dist", "runs", "__pycache__", ".pytest_cache")


@dataclass
class Installed:
    root: Path
    venv: Path
    wheel: Path
    elsewhere: Path
    """A folder outside the checkout: the working directory of every command."""
    env: dict

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=self.elsewhere, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def rlvitals(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.run(str(self.venv / "bin" / "rlvitals"), *args, timeout=timeout)

    def python(self, code: str) -> subprocess.CompletedProcess:
        return self.run(str(self.venv / "bin" / "python"), "-c", code)


def copy_tree(target: Path) -> None:
    """The files of this tree as git sees them (tracked and new, not ignored), else all but build leftovers."""
    listed = None
    if (REPO / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, timeout=60)
        if out.returncode == 0:
            listed = [name for name in out.stdout.decode().split("\0") if name]
    if listed is None:
        ignore = shutil.ignore_patterns(*NOT_COPIED, "*.egg-info")
        shutil.copytree(REPO, target, ignore=ignore, symlinks=True)
        return
    for name in listed:
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not built
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def site_overlay(folder: Path) -> Path:
    """Links to every entry of this interpreter's site-packages except rlvitals's own (its code, dist-info, .pth)."""
    folder.mkdir()
    paths = sysconfig.get_paths()
    for site in dict.fromkeys(Path(paths[key]).resolve() for key in ("purelib", "platlib")):
        for entry in site.iterdir():
            if "rlvitals" not in entry.name.lower() and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("package")
    assert REPO not in root.parents, "the test folder must be outside the checkout"
    source, dist = root / "source", root / "dist"
    copy_tree(source)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "--no-index", "--disable-pip-version-check", "-q", "-w", str(dist)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("rlvitals-*.whl")

    venv = root / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    overlay = site_overlay(root / "dependencies")
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, timeout=60).stdout.strip()
    Path(purelib, "rlvitals_test_dependencies.pth").write_text(f"import site; site.addsitedir({str(overlay)!r})\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "--no-deps", "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr

    tools = root / "bin"  # PATH: the new environment, Prometheus and promtool, nothing else (no Grafana, no git)
    tools.mkdir()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool):
            (tools / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "RLVITALS_", "GF_"))}
    env.update(PATH=f"{venv / 'bin'}:{tools}", HOME=str(root / "home"), XDG_CACHE_HOME=str(root / "cache"))
    elsewhere = root / "elsewhere"
    for folder in (elsewhere, root / "home", root / "cache"):
        folder.mkdir()
    return Installed(root, venv, wheel, elsewhere, env)


def tree_files(pattern: str) -> set[str]:
    """Wheel paths of the tree's files matching `pattern` (folder-relative, e.g. 'deploy/prometheus/*.yml')."""
    folder, _, rest = pattern.partition("/")
    inside = next(wheel for wheel, tree in FOLDERS.items() if tree == folder)
    return {f"{inside}/{p.relative_to(REPO / folder).as_posix()}" for p in (REPO / folder).glob(rest)}


# ======================================================================
# 1. What the wheel holds
# ======================================================================
def test_the_wheel_holds_every_package_and_runtime_file(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    packages = {f"{inside}/{init.parent.relative_to(REPO / folder).as_posix()}/__init__.py".replace("/./", "/")
                for inside, folder in FOLDERS.items() for init in (REPO / folder).rglob("__init__.py")
                if "__pycache__" not in init.parts}
    assert packages and packages <= names, f"packages missing from the wheel: {sorted(packages - names)}"
    for pattern in RUNTIME_FILES:
        files = tree_files(pattern)
        assert files, f"nothing in the tree matches {pattern}"
        assert files <= names, f"runtime files missing from the wheel: {sorted(files - names)}"
    assert not any(n.startswith(("tests/", "bench/", "rlvitals/deploy/cluster/")) for n in names)


# ======================================================================
# 2. The installed copy runs, with its own files
# ======================================================================
WHERE = """
import json
from importlib import metadata

import rlvitals
from rlvitals.archive import code_version
from rlvitals.dashboards import DASHBOARD_DIR, generate
from rlvitals.stack import render
from rlvitals.telemetry import reference

print(json.dumps({
    "package": rlvitals.__file__, "dashboards": str(DASHBOARD_DIR), "deploy": str(render.DEPLOY),
    "rules": sorted(str(p) for p in render.RULES_DIR.glob("*.yml")), "reference": str(reference.DEFAULT_OUTPUT),
    "reference_current": reference.DEFAULT_OUTPUT.read_text() == reference.render(),
    "stale_dashboards": generate.stale_files(), "code_version": code_version(), "version": metadata.version("rlvitals"),
}))
"""


def test_the_installed_package_and_its_files_are_the_ones_used(installed):
    result = installed.python(WHERE)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    venv = installed.venv.resolve()
    for key in ("package", "dashboards", "deploy", "reference"):
        assert venv in Path(found[key]).resolve().parents, f"{key} found outside the new environment: {found[key]}"
    assert found["rules"] and all(venv in Path(r).resolve().parents for r in found["rules"])
    assert found["reference_current"], "the shipped docs/metrics.md is not what the catalogue generates"
    assert found["stale_dashboards"] == [], "the shipped dashboards are not what the catalogue generates"
    # No checkout to ask git: the version comes from the installed package's metadata.
    assert found["code_version"] == {"commit": "unknown", "dirty": False, "version": found["version"],
                                     "source": "metadata"}


# ======================================================================
# 3. train and doctor
# ======================================================================
def test_train_a_short_cartpole_run(installed):
    run_dir = installed.root / "runs" / "cartpole"
    result = installed.rlvitals("train", "--env", "CartPole-v1", "--mode", "local", "--total-env-steps", "2048",
                                "--seed", "0", "--run-dir", str(run_dir), "--verbosity", "minimal",
                                "--progress", "false")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 2048 and summary["episodes"] > 0
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["code_version"]["source"] == "metadata"
    assert meta["packages"]["rlvitals"] == meta["code_version"]["version"]


ONE_PROBE = """
import json, sys
from pathlib import Path

import rlvitals.doctor
from rlvitals.actors.probes import PROBES
from rlvitals.doctor import run_probe

result = run_probe(PROBES[0], 0, Path(sys.argv[1]))
print(json.dumps({"doctor": rlvitals.doctor.__file__, "probe": PROBES[0].env_id, "passed": bool(result.passed),
                  "details": list(result.details)}))
"""


def test_doctor_command_and_its_first_probe(installed):
    usage = installed.rlvitals("doctor", "--help")
    assert usage.returncode == 0 and "probe" in usage.stdout, usage.stdout + usage.stderr
    result = installed.run(str(installed.venv / "bin" / "python"), "-c", ONE_PROBE, str(installed.root / "probes"))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert installed.venv.resolve() in Path(found["doctor"]).resolve().parents
    assert found["passed"], found


# ======================================================================
# 4. stack up / down with the real Prometheus
# ======================================================================
def test_stack_up_and_down_with_the_installed_configuration(installed):
    if shutil.which("prometheus") is None:
        pytest.skip("the `prometheus` binary is not on PATH (Debian: apt-get install prometheus)")
    state_dir, port = installed.root / "stack", free_port()
    args = ["--state-dir", str(state_dir)]
    up = installed.rlvitals("stack", "up", "--run-dir", str(installed.root / "runs" / "watched"),
                            "--prometheus-port", str(port), "--grafana-port", str(free_port()),
                            "--scrape-interval", "1s", *args, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = f"http://127.0.0.1:{port}"
        assert f"Prometheus  {url}" in up.stdout and "Grafana is not installed" in up.stdout
        assert http_get(f"{url}/-/ready")[0] == 200
        config = yaml.safe_load((state_dir / "prometheus" / "prometheus.yml").read_text())
        rules_dir = installed.venv.resolve()
        assert all(rules_dir in Path(p).resolve().parents for p in config["rule_files"]), config["rule_files"]
        groups = json.loads(http_get(f"{url}/api/v1/rules")[1])["data"]["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"]}
        shipped = {r.get("alert") or r["record"] for f in (REPO / "deploy/prometheus/rules").glob("*.yml")
                   for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]}
        assert loaded == shipped
    finally:
        down = installed.rlvitals("stack", "down", *args, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped prometheus" in down.stdout
    assert not (state_dir / "state.json").exists()
