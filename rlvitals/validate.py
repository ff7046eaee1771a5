"""Checks of the places a run will use, made before anything is written: the run directory, the
/metrics address, a checkpoint's content, seeds given as flags. Each failure is one ConfigError line
naming the bad value and what is accepted."""

from __future__ import annotations

import errno
import math
import os
import shutil
import socket
import tempfile
from pathlib import Path

from .config import ConfigError

ACCEPTED_HOSTS = "expected an address of this machine such as 127.0.0.1 or 0.0.0.0, or node"


def check_run_dir_creatable(run_dir: str) -> None:
    """ConfigError unless `run_dir` is a new or empty directory that can be made where it is named."""
    check_dir_creatable("run_dir", run_dir)


def check_dir_creatable(name: str, value: str) -> None:
    """ConfigError naming `name`={value} unless it is a new or empty directory that can be made where it is named.

    Whether a directory can be made is tried, not inferred from permission bits (root, read-only
    mounts, /proc): a probe directory is made beside where the first new directory will go
    and removed at once.
    """
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name}={value!r} is invalid: it is a file; expected a new or empty directory")
    if path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"{name}={value!r} is invalid: it already exists and is not empty; "
                          "expected a new or empty directory")
    existing = path if path.exists() else next((p for p in path.absolute().parents if p.exists()), Path("/"))
    if not existing.is_dir():
        raise ConfigError(f"{name}={value!r} is invalid: {str(existing)!r} is a file, not a directory; "
                          "expected a path under a directory")
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".rlvitals-probe-", dir=existing))
    except OSError as exc:
        raise ConfigError(f"{name}={value!r} is invalid: nothing can be created in {str(existing)!r} "
                          f"({exc.strerror or exc}); expected a writable place") from None


def metrics_bind_host(host: str) -> str:
    """The address the /metrics endpoint binds to for `metrics_host` (`node`: this machine's address)."""
    if host != "node":
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        raise ConfigError(f"metrics_host='node' is invalid: this machine's name {socket.gethostname()!r} does not "
                          f"resolve ({exc}); {ACCEPTED_HOSTS.replace(', or node', '')}") from None


def check_metrics_address(host: str, port: int) -> None:
    """ConfigError unless this process can bind its /metrics endpoint to (host, port); the socket is closed."""
    if not host.strip():  # an empty host binds every interface: say so explicitly with 0.0.0.0
        raise ConfigError(f"metrics_host={host!r} is invalid: {ACCEPTED_HOSTS}")
    address = metrics_bind_host(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET  # as telemetry/server.py opens it
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except socket.gaierror:
            raise ConfigError(f"metrics_host={host!r} is invalid: the name does not resolve; "
                              f"{ACCEPTED_HOSTS}") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"metrics_port={port} is invalid: it is in use on {address}; "
                                  "expected a free port or 0") from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise ConfigError(f"metrics_port={port} is invalid: binding it needs privileges on {address}; "
                                  "expected a port >= 1024 or 0") from None
            raise ConfigError(f"metrics_host={host!r} is invalid: it cannot be bound here "
                              f"({exc.strerror or exc}); {ACCEPTED_HOSTS}") from None
        except (OverflowError, ValueError) as exc:
            raise ConfigError(f"metrics_host={host!r} is invalid ({exc}); {ACCEPTED_HOSTS}") from None


def check_seed_flag(flag: str, value: int) -> None:
    """The seed limits of the config, for a command's own --seed flag."""
    from .limits import check_seed

    check_seed(flag, value)


CHECKPOINT_PARTS = {"config": dict, "network": dict, "optimizer": dict, "tracker": dict, "learner": dict,
                    "rng": dict}
"""The parts of a checkpoint a resume or an eval reads, and their types."""


def check_checkpoint_content(path, state: dict, parts=tuple(CHECKPOINT_PARTS)) -> None:
    """ConfigError unless the checkpoint holds `parts` of the right types, with tensors as its network."""
    import torch

    for part in parts:
        if not isinstance(state.get(part), CHECKPOINT_PARTS[part]):
            found = "missing" if part not in state else f"a {type(state[part]).__name__}"
            raise ConfigError(f"checkpoint {str(path)!r} is incomplete: its {part} is {found}; expected a "
                              f"{CHECKPOINT_PARTS[part].__name__} as rlvitals train writes it")
    bad = [name for name, value in state["network"].items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise ConfigError(f"checkpoint {str(path)!r} is invalid: network entry {bad[0]!r} is not a tensor")
    if "tracker" in parts and not isinstance(state["tracker"].get("env_steps"), int):
        raise ConfigError(f"checkpoint {str(path)!r} is incomplete: its tracker has no env_steps count")
    fingerprint = state.get("fingerprint")
    if fingerprint is not None and not (isinstance(fingerprint, dict) and all(
            isinstance(v, list) and all(isinstance(x, float) and math.isfinite(x) for x in v)
            for v in fingerprint.values())):
        raise ConfigError(f"checkpoint {str(path)!r} is invalid: its fingerprint is not lists of finite numbers "
                          "per part, as rlvitals train writes it")



RAY_ADDRESS_ACCEPTED = "expected empty (a private Ray on this machine), `auto`, or host:port of a running Ray cluster"
RAY_CONNECT_SECONDS = 5.0


def check_ray_address(address: str) -> None:
    """ConfigError unless host:port resolves and accepts a connection (Ray itself retries for minutes)."""
    if address in ("", "auto"):
        return
    host, sep, port_text = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"address={address!r} is invalid: {RAY_ADDRESS_ACCEPTED}")
    try:
        socket.create_connection((host.strip("[]"), int(port_text)), timeout=RAY_CONNECT_SECONDS).close()
    except socket.gaierror:
        raise ConfigError(f"address={address!r} is invalid: {host!r} does not resolve; "
                          f"{RAY_ADDRESS_ACCEPTED}") from None
    except OSError as exc:
        raise ConfigError(f"address={address!r} is invalid: nothing answers there ({exc.strerror or exc}); "
                          f"{RAY_ADDRESS_ACCEPTED}") from None


def check_private_ray_fits(cfg) -> None:
    """For a private Ray (one CPU slot per CPU of this machine), refuse num_actors that cannot fit before
    starting Ray, which takes seconds and prints its own notices."""
    import torch

    if cfg.address or os.environ.get("RAY_ADDRESS") or not cfg.num_actors:
        return
    cpus, gpus = os.cpu_count() or 1, torch.cuda.device_count()
    want_cpu, want_gpu = cfg.num_actors * cfg.actor_cpus, cfg.num_actors * cfg.actor_gpus
    if want_cpu > cpus + 1e-9 or want_gpu > gpus + 1e-9:
        raise ConfigError(f"num_actors={cfg.num_actors} with actor_cpus={cfg.actor_cpus:g} and actor_gpus="
                          f"{cfg.actor_gpus:g} asks for {want_cpu:g} CPUs and {want_gpu:g} GPUs; a private Ray on "
                          f"this machine has {cpus} CPUs and {gpus} GPUs (pass --address to join a cluster)")
