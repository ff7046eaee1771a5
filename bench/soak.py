"""Soak: a real `rlvitals train` left running, watched from outside for anything that grows.

    python bench/soak.py [--minutes 12] [--verbosity standard] [--env CartPole-v1]

Starts the command-line training (local mode, a budget it will not reach,
its /metrics on a free loopback port), and every `--every` seconds records:
scrape latency of /metrics, the number of exported series, the resident
memory of the run's process tree, and the files and bytes in its run
directory. After `--minutes` it sends SIGTERM and checks the run ended as
`terminated` with its summary written. The figures compare the start (after
a warm-up minute) with the end; the JSON goes to bench/results/soak.json with
machine info. Healthy: flat memory and series, scrape latency unchanged, files
and bytes growing only with the metrics rows (bounded by rows.py's cadence).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

WARM_UP_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(proc: psutil.Process, url: str, run_dir: Path, started: float) -> dict:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode()
    latency = time.perf_counter() - t0
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    tree = [proc, *proc.children(recursive=True)]
    rss = sum(p.memory_info().rss for p in tree if p.is_running())
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    return {"seconds": round(time.monotonic() - started, 1), "scrape_ms": round(1000 * latency, 2),
            "series": series, "rss_bytes": rss, "files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=12.0)
    p.add_argument("--every", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument("--verbosity", default="standard")
    p.add_argument("--env", default="CartPole-v1")
    args = p.parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with tempfile.TemporaryDirectory() as parent:
        run_dir = Path(parent) / "soak"
        cmd = [sys.executable, "-m", "rlvitals.cli", "train", "--env", args.env, "--run-dir", str(run_dir),
               "--total-env-steps", str(10 ** 12), "--verbosity", args.verbosity, "--metrics-port", str(port),
               "--progress", "false"]
        started = time.monotonic()
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc = psutil.Process(child.pid)
        samples: list[dict] = []
        try:
            while time.monotonic() - started < 60 * args.minutes:
                time.sleep(args.every)
                if child.poll() is not None:
                    raise SystemExit(f"the run ended early (exit {child.returncode}): {child.stderr.read()[-2000:]}")
                try:
                    samples.append(sample(proc, url, run_dir, started))
                except OSError as exc:   # not serving yet (start-up) or a failed scrape: recorded, not fatal
                    samples.append({"seconds": round(time.monotonic() - started, 1), "error": str(exc)})
                print(json.dumps(samples[-1]), flush=True)
        finally:
            child.send_signal(signal.SIGTERM)
            out, err = child.communicate(timeout=120)
        summary = json.loads((run_dir / "summary.json").read_text())
    good = [s for s in samples if "error" not in s]
    start = next((s for s in good if s["seconds"] >= WARM_UP_S), good[0])
    end = good[-1]
    figures = {
        "start": start, "end": end,
        "rss_growth_fraction": round(end["rss_bytes"] / start["rss_bytes"] - 1, 4),
        "series_growth": end["series"] - start["series"],
        "scrape_ms_max": max(s["scrape_ms"] for s in good),
        "failed_scrapes": len(samples) - len(good),
        "exit_code": child.returncode, "status": summary.get("status"), "env_steps": summary.get("env_steps"),
        "samples": samples,
    }
    print(f"rss {start['rss_bytes'] / 2**20:.0f} -> {end['rss_bytes'] / 2**20:.0f} MiB, series {start['series']} -> "
          f"{end['series']}, scrape {start['scrape_ms']} -> {end['scrape_ms']} ms (max {figures['scrape_ms_max']}), "
          f"files {start['files']} -> {end['files']}, bytes {start['bytes']} -> {end['bytes']}, "
          f"status {summary.get('status')}, exit {child.returncode}")
    return write_result("soak", {"minutes": args.minutes, "every_s": args.every, "verbosity": args.verbosity,
                                 "env": args.env, "warm_up_s": WARM_UP_S, "pid": os.getpid()}, figures)


if __name__ == "__main__":
    print(main())
