"""Telemetry cost: CartPole local-mode throughput at each verbosity level against `off`.

Levels are interleaved within each repeat (same seed, same work) so drift of a
shared machine hits them alike; the figure is the median over repeats of the
per-repeat ratio level/off. Also times scrapes of a `standard` endpoint.

Usage: python bench/telemetry_overhead.py [--repeats 5] [--steps 100000]
Targets (issue 3): loss under 1% at minimal, 2% at standard, 10% at debug; scrape under 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import spread, write_result
from rlvitals.archive import RunArchive
from rlvitals.config import TrainConfig
from rlvitals.telemetry.process import ProcessTelemetry
from rlvitals.training import train_local

LEVELS = ("off", "minimal", "standard", "debug")


def one_run(level: str, steps: int, parent: str, tag: str, env: str = "CartPole-v1",
            overrides: dict | None = None) -> tuple[float, ProcessTelemetry | None]:
    cfg = TrainConfig(**{"env": env, "seed": 0, "total_env_steps": steps, "verbosity": level, "progress": False,
                         "run_dir": f"{parent}/{tag}-{level}", **(overrides or {})}).validate()
    archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["bench"])
    telemetry = None
    if level != "off":
        telemetry = ProcessTelemetry.start("local", level, run_info={"run_id": tag, "env": cfg.env,
                                                                      "algorithm": "ppo", "mode": "local",
                                                                      "code_version": "bench"})
    try:
        summary = train_local(cfg, archive, telemetry)
    finally:
        archive.close()
    return summary["env_steps_per_second"], telemetry


def scrape_latency(telemetry: ProcessTelemetry, count: int = 200) -> dict:
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        with urllib.request.urlopen(telemetry.url, timeout=5) as resp:
            body = resp.read()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"median_ms": 1000 * statistics.median(times), "p99_ms": 1000 * times[int(0.99 * len(times)) - 1],
            "max_ms": 1000 * times[-1], "bytes": len(body), "scrapes": count}


def _fresh_process_run(level: str, steps: int, parent: str, tag: str, env: str, overrides: dict | None) -> float:
    sps, telemetry = one_run(level, steps, parent, tag, env, overrides)
    if telemetry is not None:
        telemetry.stop()
    return sps


def measure(repeats: int, steps: int, env: str = "CartPole-v1", overrides: dict | None = None) -> dict:
    """Figures of the telemetry-overhead benchmark (also run by `bench/harness.py telemetry-overhead`).

    Every run gets a fresh process: runs in one process slow each other down in ways
    (allocator state, warm caches, first-call costs) that swamp a 1% effect.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    throughput = {level: [] for level in LEVELS}
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for level in (LEVELS if rep % 2 == 0 else LEVELS[::-1]):
                with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                    sps = pool.submit(_fresh_process_run, level, steps, tmp, f"r{rep}", env, overrides).result()
                throughput[level].append(sps)
                print(f"repeat {rep} {level:8s} {sps:,.0f} steps/s", flush=True)
        _, telemetry = one_run("standard", steps // 4, tmp, "scrape", env, overrides)
        scrape = scrape_latency(telemetry)  # of an endpoint holding a real run's metrics
        telemetry.stop()
    # Every repeat ran every level once, so each level's list pairs up with "off" one to one.
    ratios = {level: [t / o for t, o in zip(throughput[level], throughput["off"], strict=True)]
              for level in LEVELS[1:]}
    figures = {
        "env_steps_per_second": {level: spread(v) for level, v in throughput.items()},
        "throughput_loss_vs_off": {level: 1 - statistics.median(r) for level, r in ratios.items()},
        "ratio_to_off_per_repeat": ratios,
        "standard_scrape": scrape,
    }
    return figures


def cost_per_batch(iterations: int = 15) -> dict:
    """Telemetry's own cost per batch, timed directly: low-noise where end-to-end throughput is not.

    Same rollout, same starting weights, levels interleaved: the learner's extra
    work at each level (value trace, per-layer statistics, histograms) plus the
    recorder's calls, as a fraction of an `off` batch (collect + learn).
    """
    import torch

    from rlvitals.actors.runner import EnvRunner
    from rlvitals.telemetry.recorder import Recorder
    from rlvitals.training import make_learner, make_network, seed_everything

    cfg = TrainConfig().validate()
    seed_everything(0, cfg.torch_threads)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    t0 = time.perf_counter()
    rollout = runner.collect(net, cfg.rollout_length)
    collect_s = time.perf_counter() - t0
    setups = {}
    for level in LEVELS:
        recorder = Recorder(level, "local") if level != "off" else None
        holder = type("T", (), {"wants_value_trace": recorder is not None and recorder.wants_value_trace,
                                "wants_debug": recorder is not None and recorder.wants_debug})()
        setups[level] = (make_learner(cfg, net, torch.device("cpu"), holder if recorder else None), recorder)
    times = {level: [] for level in LEVELS}
    recording = {level: [] for level in LEVELS}
    for _ in range(iterations):
        for level in LEVELS:
            learner, recorder = setups[level]
            net.load_state_dict(start)
            learner.optimizer.state.clear()
            t0 = time.perf_counter()
            stats = learner.learn(rollout)
            t1 = time.perf_counter()
            if recorder is not None:
                recorder.record_rollout(rollout)
                recorder.record_learn(stats)
            times[level].append(t1 - t0)
            recording[level].append(time.perf_counter() - t1)
    median = {level: statistics.median(v) for level, v in times.items()}
    record = {level: statistics.median(v) for level, v in recording.items()}
    batch_off = median["off"] + collect_s
    # Only `debug` changes the learner's work (value trace, layer statistics, histograms); below it
    # the learner computes exactly what it computes at `off`, so the cost is the recorder's calls.
    extra = {level: record[level] + (median[level] - median["off"] if level == "debug" else 0.0)
             for level in LEVELS[1:]}
    return {"batch_seconds_off": batch_off, "recorder_seconds_per_batch": {k: record[k] for k in LEVELS[1:]},
            "learn_seconds_per_batch": median,
            "extra_seconds_per_batch": extra,
            "cost_fraction_of_batch": {level: extra[level] / batch_off for level in LEVELS[1:]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    figures = measure(args.repeats, args.steps)
    figures["direct_cost"] = cost_per_batch()
    for level, frac in figures["direct_cost"]["cost_fraction_of_batch"].items():
        print(f"{level:8s} telemetry cost per batch (timed directly): {100 * frac:+.2f}% of an `off` batch")
    scrape = figures["standard_scrape"]
    for level, loss in figures["throughput_loss_vs_off"].items():
        print(f"{level:8s} throughput loss vs off: {100 * loss:+.2f}%")
    print(f"standard scrape: {scrape}")
    print(write_result("telemetry_overhead", {"env": "CartPole-v1", "mode": "local", "steps": args.steps,
                                              "repeats": args.repeats}, figures))


if __name__ == "__main__":
    main()
