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

from common import spread, write_result  # noqa: E402

from rlvitals.archive import RunArchive  # noqa: E402
from rlvitals.config import TrainConfig  # noqa: E402
from rlvitals.telemetry.process import ProcessTelemetry  # noqa: E402
from rlvitals.training import train_local  # noqa: E402

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


def measure(repeats: int, steps: int, env: str = "CartPole-v1", overrides: dict | None = None) -> dict:
    """Figures of the telemetry-overhead benchmark (also run by `bench/harness.py telemetry-overhead`)."""
    throughput = {level: [] for level in LEVELS}
    scrape = None
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for level in (LEVELS if rep % 2 == 0 else LEVELS[::-1]):
                sps, telemetry = one_run(level, steps, tmp, f"r{rep}", env, overrides)
                throughput[level].append(sps)
                if telemetry is not None:
                    if level == "standard" and scrape is None:
                        scrape = scrape_latency(telemetry)
                    telemetry.stop()
                print(f"repeat {rep} {level:8s} {sps:,.0f} steps/s", flush=True)
    ratios = {level: [t / o for t, o in zip(throughput[level], throughput["off"])] for level in LEVELS[1:]}
    figures = {
        "env_steps_per_second": {level: spread(v) for level, v in throughput.items()},
        "throughput_loss_vs_off": {level: 1 - statistics.median(r) for level, r in ratios.items()},
        "ratio_to_off_per_repeat": ratios,
        "standard_scrape": scrape,
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    figures = measure(args.repeats, args.steps)
    scrape = figures["standard_scrape"]
    for level, loss in figures["throughput_loss_vs_off"].items():
        print(f"{level:8s} throughput loss vs off: {100 * loss:+.2f}%")
    print(f"standard scrape: {scrape}")
    print(write_result("telemetry_overhead", {"env": "CartPole-v1", "mode": "local", "steps": args.steps,
                                              "repeats": args.repeats}, figures))


if __name__ == "__main__":
    main()
