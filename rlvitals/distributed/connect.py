"""Connecting to Ray: join the cluster the config names or start a private one, and check a request fits."""

from __future__ import annotations

import os

from ..config import ConfigError, TrainConfig, parse_resources

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
            raise ConfigError(f"address={address!r} is invalid: no Ray cluster accepted the connection "
                              f"({first[:160]}); expected `auto`, host:port of a running cluster, and "
                              "RAY_AUTH_MODE/RAY_AUTH_TOKEN as that cluster uses them") from None
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
