"""Ray mode: the same network, learner and learn step as local mode, with the actors spread over a Ray cluster.

The driver process is the learner (on the GPU when there is one): it never
asks Ray for a CPU, so it cannot wait for one that the actors hold. Actors
are Ray actors that Ray restarts when they die; each keeps up to
`rollouts_in_flight` rollouts requested ahead, so it only idles when the
learner falls that far behind (backpressure, not unbounded memory). New
weights go into the object store once per network age; every actor gets the
same reference. One sidecar per node exports host and GPU vitals.

Modules, one job each:
  connect   joining or starting Ray; does the request fit the cluster
  workers   the bodies of the Ray actors (rollout worker, incarnation ledger, node sidecar)
  fleet     the actors of one run: start-up, discovery files, deaths, restarts, weight publishing
  loops     how rollouts arrive (sync / async sources for `Run.drive`) and `train_ray`
  accounting  every rollout and second of every actor, counted by the actor and checked by the driver
  peers     each actor against its peers, from its counters: the run's verdict names the slow or silent one
  readiness   whether the learner waits while a finished rollout is ready (async mode)
"""

from .connect import check_resources, preflight_ray, start_ray, stop_ray
from .loops import train_ray

__all__ = ["check_resources", "preflight_ray", "start_ray", "stop_ray", "train_ray"]
