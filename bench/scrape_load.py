"""Metrics under load: 50 concurrent scrapers for 10 s against a training run's /metrics.

Alternates quiet and loaded 10-second windows (quiet, load, quiet, load, quiet)
and compares the run's env-step rate in each loaded window with the mean of
the quiet windows around it. Scrapers loop as fast as they are answered.

Usage: python bench/scrape_load.py [--scrapers 50] [--window 10]
Target (issue 8): every request answered; training throughput drops by less than 5% under load.
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import spread, write_result

STEPS = re.compile(rb"^rlvitals_actor_env_steps_total (\S+)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_steps(url: str) -> float:
    with urllib.request.urlopen(url, timeout=30) as r:
        return float(STEPS.search(r.read()).group(1))


def load(url: str, scrapers: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    ok, failed, latencies = [0] * scrapers, [0] * scrapers, [[] for _ in range(scrapers)]

    def scrape(i):
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    r.read()
                ok[i] += 1
                latencies[i].append(time.perf_counter() - t0)
            except OSError:
                failed[i] += 1

    threads = [threading.Thread(target=scrape, args=(i,)) for i in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(x for row in latencies for x in row)
    return {"answered": sum(ok), "failed": sum(failed), "scrapers_answered": sum(1 for n in ok if n),
            "latency_median_ms": 1000 * statistics.median(lat) if lat else None,
            "latency_max_ms": 1000 * lat[-1] if lat else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "rlvitals.cli", "train", "--total-env-steps", "100000000",
                                 "--metrics-port", str(port), "--verbosity", "standard", "--progress", "false",
                                 "--run-dir", f"{tmp}/run"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if env_steps(url) > 0:
                        break
                except (OSError, AttributeError):
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the training run never answered on /metrics")
                time.sleep(0.5)
            time.sleep(3)  # warm-up
            rates, loads, kinds = [], [], ["quiet", "load", "quiet", "load", "quiet"]
            for kind in kinds:
                t0, s0 = time.monotonic(), env_steps(url)
                if kind == "load":
                    loads.append(load(url, args.scrapers, args.window))
                else:
                    time.sleep(args.window)
                s1, t1 = env_steps(url), time.monotonic()
                rates.append((s1 - s0) / (t1 - t0))
                print(f"{kind:5s} window: {rates[-1]:,.0f} env steps/s", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    ratios = [rates[i] / ((rates[i - 1] + rates[i + 1]) / 2) for i in (1, 3)]
    figures = {"env_steps_per_second": {k: rates[i] for i, k in enumerate(["quiet1", "load1", "quiet2", "load2",
                                                                        "quiet3"])},
               "throughput_drop_under_load": 1 - statistics.mean(ratios), "per_window_ratio": ratios,
               "load": loads, "scrapers": args.scrapers, "window_seconds": args.window,
               "answered_per_second": spread([x["answered"] / args.window for x in loads])}
    print(f"throughput drop under load: {100 * figures['throughput_drop_under_load']:.2f}%; load: {loads}")
    print(write_result("scrape_load", {"env": "CartPole-v1", "mode": "local", "verbosity": "standard"}, figures))


if __name__ == "__main__":
    main()
