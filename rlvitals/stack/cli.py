"""The `stack` command line: `up` (start or extend), `down`, `status`, and their parser."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .common import HOST, StackError, default_state_dir, say
from .compose import down_docker, up_docker
from .native import up_native, watch_more
from .render import discovery_globs
from .supervise import STATE_FILE, http_ok, port_free, read_state, running, stop_process
from .tools import choose_backend

PROMETHEUS_DURATION = re.compile(r"((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?")


def check_up_args(args: argparse.Namespace) -> None:
    """StackError (one line, exit 2) for a bad flag of `up`, before any folder is made."""
    for port, flag in ((args.prometheus_port, "--prometheus-port"), (args.grafana_port, "--grafana-port")):
        if not 1 <= port <= 65535:
            raise StackError(f"{flag}={port} is invalid: expected a port from 1 to 65535")
    interval = args.scrape_interval
    if interval is not None and (not PROMETHEUS_DURATION.fullmatch(interval) or not re.search(r"[1-9]", interval)):
        raise StackError(f"--scrape-interval={interval!r} is invalid: expected a Prometheus duration > 0 such as "
                         "1s, 500ms or 1m30s")
    state_dir = Path(args.state_dir).expanduser()
    existing = next((p for p in (state_dir, *state_dir.absolute().parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise StackError(f"--state-dir={args.state_dir!r} is invalid: {str(existing)!r} is a file; expected a "
                         "folder (new or the stack's own)")


def up(args: argparse.Namespace) -> int:
    check_up_args(args)
    state_dir = Path(args.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "targets").mkdir(exist_ok=True)
    state = read_state(state_dir)
    if running(state):
        return already_up(state_dir, state, args)
    if state:
        (state_dir / STATE_FILE).unlink()  # left by processes that ended without `down`
    backend = choose_backend(args.backend)
    globs = discovery_globs(args.run_dir, state_dir)
    for port, flag in ((args.prometheus_port, "--prometheus-port"), (args.grafana_port, "--grafana-port")):
        if not port_free(port):
            raise StackError(f"{flag}={port} is invalid: port {port} on {HOST} is in use; expected a free port")
    if backend == "docker":
        return up_docker(args, state_dir, globs)
    return up_native(args, state_dir, globs)


def already_up(state_dir: Path, state: dict, args: argparse.Namespace) -> int:
    """`up` on a running stack: add any new run folders (native: re-render and SIGHUP Prometheus)."""
    new = [d for d in args.run_dir if str(Path(d).expanduser().resolve()) not in
           {str(Path(r).expanduser().resolve()) for r in state.get("run_dirs", [])}]
    if new and state.get("backend") == "native":
        watch_more(state_dir, state, new)
    elif new:
        raise StackError("the stack runs in Docker and watches fixed folders; `rlvitals stack down` and up again "
                         "with every --run-dir")
    say("the stack is already up")
    for name, url in state.get("urls", {}).items():
        say(f"{name:<11} {url}")
    return 0


def down(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = read_state(state_dir)
    if state is None:
        say(f"nothing to stop: no stack state in {state_dir}")
        return 0
    if state.get("backend") == "docker":
        down_docker(state)
    else:
        for record in reversed(state.get("processes", [])):
            if stop_process(record):
                say(f"stopped {record['name']} (pid {record['pid']})")
            else:
                say(f"{record['name']} (pid {record['pid']}) was no longer running")
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return 0


def status(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = read_state(state_dir)
    if not running(state):
        say(f"the stack is down (state folder {state_dir})")
        return 1
    for name, url in state.get("urls", {}).items():
        health = url + ("/-/ready" if name == "prometheus" else "/api/health")
        say(f"{name:<11} {url}  {'up' if http_ok(health) else 'not answering'}")
    for d in state.get("run_dirs", []):
        say(f"watching {d}")
    return 0


def add_parser(sub) -> None:
    stack = sub.add_parser("stack", help="start or stop Prometheus (and Grafana) for watching runs, on loopback")
    actions = stack.add_subparsers(dest="action", required=True)
    state_help = f"folder for the stack's config, data, logs and pids (default {default_state_dir()})"
    up_p = actions.add_parser("up", help="start Prometheus (and Grafana where installed) and print their URLs")
    up_p.add_argument("--run-dir", action="append", default=[], metavar="DIR",
                      help="a run directory whose discovery/ folder Prometheus watches (repeatable; the run may "
                           "start later); running `up` again with new ones adds them")
    up_p.add_argument("--prometheus-port", type=int, default=9090, help="port on 127.0.0.1 (default 9090)")
    up_p.add_argument("--grafana-port", type=int, default=3000, help="port on 127.0.0.1 (default 3000)")
    up_p.add_argument("--backend", choices=("auto", "native", "docker"), default="auto",
                      help="native binaries or docker compose; auto: native when `prometheus` is installed, "
                           "else docker when available")
    up_p.add_argument("--scrape-interval", default=None, metavar="DURATION",
                      help="override deploy/prometheus's scrape interval (e.g. 1s for short runs)")
    for p in (up_p, actions.add_parser("down", help="stop what `stack up` started, nothing else"),
              actions.add_parser("status", help="show whether the stack is up and its URLs")):
        p.add_argument("--state-dir", default=str(default_state_dir()), help=state_help)


def run(args: argparse.Namespace) -> int:
    try:
        return {"up": up, "down": down, "status": status}[args.action](args)
    except StackError as exc:
        print(f"rlvitals: error: {exc}", file=sys.stderr)
        return exc.code
