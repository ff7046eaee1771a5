"""Where each millisecond of a learner update goes, and of an actor's collect.

Usage: python bench/learner_profile.py [--shapes pong cartpole] [--updates 20] [--warmup 3]
                                       [--device auto|cpu|cuda] [--mixed-precision] [--cudnn-benchmark]
                                       [--channels-last] [--actor] [--trace DIR] [--results-dir DIR] [--name N]

Learner: the real `PPOLearner` (built from a TrainConfig as a run builds it) learning, update after
update, from a synthetic rollout of the run's shape: Pong-shaped (uint8 [T+1, N, 4, 84, 84], 6
actions, 16 envs x 128 steps, 4 minibatches: the shape of issue 22's Ray runs) or CartPole-shaped (the
config's defaults). The behaviour columns come from the network itself acting on the observations, so
every diagnostic (the staleness-0 consistency check included) costs what it costs in a run. Three
passes over the same updates:
  timed      wall ms per update, and the learner's own phase split (host clock: on a GPU, kernels
             launched in one phase may finish in a later one);
  synced     (CUDA only) the same with the device waited for at each phase boundary: the honest split;
  profiled   torch.profiler over the updates (CPU activities, CUDA kernels when there is a GPU): the
             top operators by self time, the host time spent in no operator (Python and glue), and on a
             GPU the kernel-busy time against the wall time (the rest, the host gap, is the GPU idling
             on Python, launches and syncs).
Actor (--actor): one actor's `EnvRunner.collect` as a Ray actor runs it (same runner, CPU network):
ms per collect split into env stepping, inference and packing (the rest), plus pickling and
unpickling the rollout (what Ray does to ship it, the learner's `wait` on a full queue).

Writes <results-dir>/learner-profile_<device>.json (machine and code version as every bench result)
and, with --trace, chrome traces to open in chrome://tracing or Perfetto.
"""

from __future__ import annotations

import argparse
import copy
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from gymnasium import spaces

from common import write_result
from rlvitals.actors.rollout import Rollout
from rlvitals.config import TrainConfig
from rlvitals.parts import make_learner, make_network, resolve_device, seed_everything

PHASES = ("transfer", "targets", "forward_backward", "optimizer", "statistics")
SHAPES = {
    # Issue 22's Ray runs: 16 envs x 128 steps per actor rollout, 4 minibatches, lr 2.5e-4.
    "pong": {"env": "ALE/Pong-v5", "obs": spaces.Box(0, 255, (4, 84, 84), np.uint8), "actions": spaces.Discrete(6),
             "cfg": {"num_envs": 16, "rollout_length": 128, "num_minibatches": 4, "learning_rate": 2.5e-4}},
    # The config's defaults (32 envs x 128 steps, 8 minibatches).
    "cartpole": {"env": "CartPole-v1", "obs": spaces.Box(-np.inf, np.inf, (4,), np.float32),
                 "actions": spaces.Discrete(2), "cfg": {}},
}


def config(shape: str, args) -> TrainConfig:
    return TrainConfig(env=SHAPES[shape]["env"], device=args.device, mixed_precision=args.mixed_precision,
                       verbosity="standard", progress=False, **SHAPES[shape]["cfg"]).validate()


def synthetic_rollout(net, obs_space, T: int, N: int, seed: int) -> Rollout:
    """A rollout of the run's shape: random observations, actions drawn by the network itself (a CPU copy)."""
    g = torch.Generator().manual_seed(seed)
    if obs_space.dtype == np.uint8:
        obs = torch.randint(0, 256, (T + 1, N, *obs_space.shape), generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn((T + 1, N, *obs_space.shape), generator=g)
    actor = copy.deepcopy(net).cpu()
    with torch.no_grad():
        actions, params, logp = actor.act(obs[:T].reshape(T * N, *obs_space.shape))
    rewards = torch.zeros(T, N)
    scored = torch.rand(T, N, generator=g) < 0.02             # Pong: a point every ~50 frames, +1 or -1
    rewards[scored] = torch.where(torch.rand(T, N, generator=g) < 0.5, -1.0, 1.0)[scored]
    terminated = torch.rand(T, N, generator=g) < 1e-3
    valid = torch.ones(T, N, dtype=torch.bool)
    valid[1:] &= ~terminated[:-1]                            # NEXT_STEP autoreset: the step after an end is a reset
    return Rollout(obs=obs, actions=actions.reshape(T, N, *actions.shape[1:]), rewards=rewards,
                   terminated=terminated, truncated=torch.zeros(T, N, dtype=torch.bool), valid=valid,
                   behaviour_params=params.reshape(T, N, -1), behaviour_logp=logp.reshape(T, N), policy_age=0,
                   valid_count=int(valid.sum()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def learn_updates(learner, rollout: Rollout, n: int) -> tuple[list[float], dict[str, list[float]]]:
    """n updates from the rollout (always on-policy, as a batch of the learner's own age): wall ms, phase ms."""
    walls, phases = [], {p: [] for p in PHASES}
    for _ in range(n):
        rollout.policy_age = learner.net.age
        _sync(learner.device)
        t0 = time.perf_counter()
        stats = learner.learn(rollout)
        _sync(learner.device)
        walls.append(1e3 * (time.perf_counter() - t0))
        for p in PHASES:
            phases[p].append(1e3 * stats[f"time_{p}"])
    return walls, phases


def per_update(walls: list[float], phases: dict[str, list[float]]) -> dict:
    return {"wall_ms_median": statistics.median(walls), "wall_ms_mean": statistics.fmean(walls),
            "phase_ms_mean": {p: round(statistics.fmean(v), 3) for p, v in phases.items()},
            "phase_share": {p: round(sum(v) / sum(walls), 4) for p, v in phases.items()}}


def _self_device_us(avg) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(avg, name):
            return float(getattr(avg, name))
    return 0.0


def top_ops(averages, n: int, device: bool) -> list[dict]:
    key = _self_device_us if device else (lambda a: float(a.self_cpu_time_total))
    ranked = sorted(averages, key=key, reverse=True)[:n]
    return [{"op": a.key, "calls": a.count, "self_ms": round(key(a) / 1e3, 3)} for a in ranked]


def profile(fn, device: torch.device, n: int, trace: Path | None, top: int) -> dict:
    """torch.profiler over n calls of fn(): top operators, and on CUDA kernel-busy vs wall time."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        _sync(device)
        t0 = time.perf_counter()
        for i in range(n):
            with record_function(f"call_{i}"):
                fn()
        _sync(device)
        wall_ms = 1e3 * (time.perf_counter() - t0) / n
    everything = prof.key_averages()
    # The self time of each call's own scope is host time inside no operator: Python, the interpreter, glue.
    outside_ops_ms = sum(a.self_cpu_time_total for a in everything if a.key.startswith("call_")) / 1e3 / n
    averages = [a for a in everything if not a.key.startswith("call_")]
    out = {"calls": n, "wall_ms_per_call": round(wall_ms, 3), "host_outside_ops_ms_per_call": round(outside_ops_ms, 3),
           "top_cpu_ops": top_ops(averages, top, False)}
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / n
        out.update(top_cuda_ops=top_ops(averages, top, True), kernels_per_call=len(kernels) / n,
                   gpu_busy_ms_per_call=round(busy_ms, 3), host_gap_ms_per_call=round(wall_ms - busy_ms, 3),
                   gpu_busy_share=round(busy_ms / wall_ms, 4))
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    return out


def learner_profile(shape: str, args) -> dict:
    cfg = config(shape, args)
    seed_everything(0, cfg.torch_threads)
    device = resolve_device(cfg)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    net = make_network(cfg, SHAPES[shape]["obs"], SHAPES[shape]["actions"])
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    learner = make_learner(cfg, net, device)
    rollout = synthetic_rollout(learner.net, SHAPES[shape]["obs"], cfg.rollout_length, cfg.num_envs, seed=1)
    learn_updates(learner, rollout, args.warmup)
    result = {"config": {k: getattr(cfg, k) for k in ("env", "num_envs", "rollout_length", "update_epochs",
                                                       "num_minibatches", "mixed_precision", "image_network")},
              "samples_per_update": cfg.num_envs * cfg.rollout_length,
              "timed": per_update(*learn_updates(learner, rollout, args.updates))}
    if device.type == "cuda":
        learner.sync_phases = True
        result["synced"] = per_update(*learn_updates(learner, rollout, args.updates))
        learner.sync_phases = False

    def one_update():
        rollout.policy_age = learner.net.age
        learner.learn(rollout)

    trace = args.trace / f"learner-{shape}-{device.type}.json" if args.trace else None
    result["profiled"] = profile(one_update, device, max(1, args.updates // 4), trace, args.top)
    return result


def actor_profile(shape: str, args) -> dict:
    """One actor's collect, as a Ray actor runs it: CPU network, the real env."""
    from rlvitals.actors.runner import EnvRunner
    from rlvitals.env_preflight import atari_options
    from rlvitals.parts import make_agent, return_discount

    cfg = TrainConfig(**{**config(shape, args).to_dict(), "device": "cpu", "hidden_sizes": (64, 64)}).validate()
    seed_everything(0, cfg.torch_threads)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0, atari_options=atari_options(cfg, threads=1),
                       return_discount=return_discount(cfg), env_kwargs=cfg.env_kwargs)
    try:
        net = make_network(cfg, runner.obs_space, runner.action_space)
        agent = make_agent(cfg, runner, net)
        runner.collect(agent, cfg.rollout_length)  # warm-up: first resets, lazy inits
        rows = []
        for _ in range(args.collects):
            t0 = time.perf_counter()
            rollout = runner.collect(agent, cfg.rollout_length)
            wall = time.perf_counter() - t0
            t1 = time.perf_counter()
            blob = pickle.dumps(rollout, protocol=5)
            t2 = time.perf_counter()
            pickle.loads(blob)
            t3 = time.perf_counter()
            env_s, inf_s = rollout.timings.get("env_step", 0.0), rollout.timings.get("inference", 0.0)
            rows.append({"wall": wall, "env_step": env_s, "inference": inf_s, "packing": wall - env_s - inf_s,
                         "pickle": t2 - t1, "unpickle": t3 - t2, "bytes": len(blob)})
        trace = args.trace / f"actor-{shape}.json" if args.trace else None
        profiled = profile(lambda: runner.collect(agent, cfg.rollout_length), torch.device("cpu"), 1, trace,
                           args.top)
    finally:
        runner.close()
    steps = cfg.num_envs * cfg.rollout_length
    mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
    return {"config": {"env": cfg.env, "num_envs": cfg.num_envs, "rollout_length": cfg.rollout_length},
            "collects": len(rows), "ms_per_collect": round(1e3 * mean["wall"], 3),
            "env_steps_per_second": round(steps / mean["wall"], 1),
            "split_ms": {k: round(1e3 * mean[k], 3) for k in ("env_step", "inference", "packing")},
            "split_share": {k: round(mean[k] / mean["wall"], 4) for k in ("env_step", "inference", "packing")},
            "ship_ms": {"pickle": round(1e3 * mean["pickle"], 3), "unpickle": round(1e3 * mean["unpickle"], 3)},
            "rollout_bytes": int(mean["bytes"]), "profiled": profiled}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["pong", "cartpole"])
    parser.add_argument("--updates", type=int, default=20, help="updates per pass (profiled: a quarter)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--mixed-precision", action="store_true", help="bfloat16 autocast (CUDA only)")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--channels-last", action="store_true", help="the network in channels_last memory format")
    parser.add_argument("--actor", action="store_true", help="also profile one actor's collect per shape")
    parser.add_argument("--collects", type=int, default=3)
    parser.add_argument("--top", type=int, default=15, help="operators listed per ranking")
    parser.add_argument("--trace", type=Path, default=None, help="folder for chrome traces")
    parser.add_argument("--results-dir", default=None)
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    for flag in ("updates", "warmup", "collects", "top"):
        if getattr(args, flag) < 1 and not (flag == "warmup" and args.warmup == 0):
            print(f"--{flag} must be at least 1, got {getattr(args, flag)}", file=sys.stderr)
            return 2
    figures = {"learner": {}, "actor": {}}
    for shape in args.shapes:
        figures["learner"][shape] = learn = learner_profile(shape, args)
        print(f"learner {shape}: {learn['timed']['wall_ms_median']:.1f} ms/update "
              f"({learn['samples_per_update']} samples), phases {learn['timed']['phase_ms_mean']}")
        if args.actor:
            figures["actor"][shape] = act = actor_profile(shape, args)
            print(f"actor {shape}: {act['ms_per_collect']:.1f} ms/collect, split {act['split_share']}, "
                  f"pickle+unpickle {act['ship_ms']}")
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    settings = {k: getattr(args, k) for k in ("shapes", "updates", "warmup", "device", "mixed_precision",
                                              "cudnn_benchmark", "channels_last", "actor", "collects")}
    settings["measured_on"] = device
    print(write_result("learner-profile", settings, figures, name=args.name or f"learner-profile_{device}",
                       results_dir=args.results_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
