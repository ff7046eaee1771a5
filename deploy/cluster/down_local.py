"""Take a cluster of deploy/cluster-local.yaml (Ray's `local` provider) down completely.

`ray down` stops Ray on the head only: with this provider the workers are machines Ray does not own,
so their Ray is left to notice that the head is gone (the raylet exits after a minute, its agents do
not). And Prometheus and Grafana, which `rlvitals stack up` started on the head, are no part of Ray.
This stops, in order: the stack on the head (`rlvitals stack down`, through `ray exec`), Ray on every
worker (`ray stop` over SSH with the cluster file's auth), then Ray on the head (`ray down`).

    python deploy/cluster/down_local.py deploy/cluster-local.yaml

Cloud clusters need none of this: `ray down` terminates their machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REMOTE_RAY = "~/rlvitals-src/.venv/bin/ray"  # where deploy/cluster/setup-node.sh put it


def ssh_command(auth: dict, host: str, command: str) -> list[str]:
    options = {"StrictHostKeyChecking": "no", "UserKnownHostsFile": os.devnull, "BatchMode": "yes",
               "ConnectTimeout": "30", "LogLevel": "ERROR", "IdentitiesOnly": "yes"}
    if auth.get("ssh_proxy_command"):
        options["ProxyCommand"] = auth["ssh_proxy_command"]
    argv = ["ssh"]
    if auth.get("ssh_private_key"):
        argv += ["-i", os.path.expanduser(auth["ssh_private_key"])]
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    return argv + [f"{auth['ssh_user']}@{host}", command]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], "\nusage: python deploy/cluster/down_local.py CLUSTER.yaml",
              file=sys.stderr)
        return 2
    config_file = argv[0]
    config = yaml.safe_load(Path(config_file).read_text())
    if config.get("provider", {}).get("type") != "local":
        print(f"down_local: {config_file} is not a local-provider cluster; use `ray down {config_file}`",
              file=sys.stderr)
        return 2
    ray = str(Path(sys.executable).with_name("ray"))
    failed = 0
    steps = [("stop Prometheus and Grafana on the head", [ray, "exec", config_file, "rlvitals stack down"])]
    for worker in config["provider"].get("worker_ips", []):
        steps.append((f"stop Ray on worker {worker}", ssh_command(config["auth"], worker, f"{REMOTE_RAY} stop")))
    steps.append(("stop Ray on the head", [ray, "down", "-y", config_file]))
    for what, command in steps:
        print(f"down_local: {what}", flush=True)
        if subprocess.run(command, stdin=subprocess.DEVNULL).returncode != 0:
            print(f"down_local: could not {what} ({' '.join(command[:3])} ... failed); going on", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
