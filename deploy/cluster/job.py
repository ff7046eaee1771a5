"""Entrypoint of a run on a Ray cluster: bring up workers for the actors, then become `rlvitals train`.

deploy/cluster/submit.sh submits this file as a Ray job, which Ray starts on the head node, next to
the GPU (it asks for the head's `learner` resource):

    python deploy/cluster/job.py --run-dir ~/runs/NAME [rlvitals train flags...]

1. The flags are checked exactly as `rlvitals train` checks them; a bad one ends the job at once
   with the same one-line message (and no worker is started for it).
2. With --num-actors N it asks Ray's autoscaler for N actor-sized bundles (`request_resources`)
   and waits, at most RLVITALS_SCALE_TIMEOUT seconds (default 1800: a new cloud worker installs
   the project first), until the cluster holds them.
3. It withdraws the request (running actors keep their workers busy; once the run ends, idle
   workers are stopped after the cluster's idle_timeout_minutes) and execs
   `rlvitals train --mode ray --address auto --metrics-host node --actor-resources actor=1 ...`
   with the flags given (which override these defaults).
"""

from __future__ import annotations

import os
import signal
import sys
import time

# Where a cluster run differs from a local one: join the cluster this job runs in, serve /metrics on
# the node's address (Prometheus on the head scrapes every node), and put actors only on nodes that
# advertise the `actor` resource (the CPU workers of deploy/cluster-*.yaml).
# (`--mode` is left out when resuming: a resumed run keeps its own.)
CLUSTER_DEFAULTS = ["--address", "auto", "--metrics-host", "node", "--actor-resources", "actor=1",
                    "--progress", "false"]


def config_from(argv: list[str]):
    """The TrainConfig `rlvitals train ARGV` would run, or SystemExit(2) with its one-line error."""
    from rlvitals.cli import UsageError, build_parser, resume_config, train_config_from_args
    from rlvitals.config import ConfigError

    try:
        args = build_parser().parse_args(["train", *argv])
        return resume_config(args)[0] if args.resume else train_config_from_args(args)
    except (UsageError, ConfigError) as exc:
        print(f"rlvitals: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def scale_for(cfg, timeout: float) -> None:
    """Ask the autoscaler for the actors' resources and wait until the cluster has them."""
    import ray
    from ray.autoscaler.sdk import request_resources

    from rlvitals.config import ConfigError, parse_resources
    from rlvitals.distributed import check_resources

    bundle = {"CPU": cfg.actor_cpus, **parse_resources(cfg.actor_resources)}
    if cfg.actor_gpus:
        bundle["GPU"] = cfg.actor_gpus
    bundle = {name: amount for name, amount in bundle.items() if amount}
    ray.init(address=cfg.address, configure_logging=False, log_to_driver=False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `ray job stop` while waiting: withdraw below
    try:
        request_resources(bundles=[bundle] * cfg.num_actors)
        start = last = time.monotonic()
        print(f"job: asked the autoscaler for {cfg.num_actors} x {bundle}", flush=True)
        while True:
            try:
                check_resources(cfg)
                break
            except ConfigError as exc:
                waited = time.monotonic() - start
                if waited > timeout:
                    print(f"rlvitals: error: the cluster did not grow to hold the actors within {timeout:g} s: {exc}",
                          file=sys.stderr)
                    raise SystemExit(1) from None
                if time.monotonic() - last >= 30:
                    print(f"job: waiting for workers ({waited:.0f} s): {exc}", flush=True)
                    last = time.monotonic()
            time.sleep(2)
        print(f"job: the cluster holds the actors after {time.monotonic() - start:.0f} s", flush=True)
    finally:
        request_resources(bundles=[])  # nothing stays requested after this job
        ray.shutdown()


def main(argv: list[str]) -> None:
    resume = any(arg == "--resume" or arg.startswith("--resume=") for arg in argv)
    argv = CLUSTER_DEFAULTS + ([] if resume else ["--mode", "ray"]) + argv
    cfg = config_from(argv)
    if cfg is not None and cfg.num_actors:
        scale_for(cfg, float(os.environ.get("RLVITALS_SCALE_TIMEOUT", "1800")))
    rlvitals = os.path.join(os.path.dirname(sys.executable), "rlvitals")
    sys.stdout.flush()
    os.execv(rlvitals, [rlvitals, "train", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
