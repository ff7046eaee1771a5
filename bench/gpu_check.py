"""The learner on a CUDA GPU, checked from outside: real `rlvitals train` runs, scraped while they run.

Usage: python bench/gpu_check.py [--seconds S] [--results-dir DIR]

Three runs of CartPole-v1, each a `rlvitals train` subprocess with a /metrics endpoint:
  local          learner and actor in one process, learner on `cuda`, float32
  local-bf16     the same with --mixed-precision (bfloat16 autocast in the learner)
  ray            Ray mode, learner on `cuda`, actors on CPUs
Each is scraped every second while it runs. The result keeps, per run: the GPU and torch-memory
readings seen (NVML and torch.cuda, with their min and max over the scrapes), the actor-learner
log-probability discrepancy at staleness 0 (local runs: how far the GPU learner's recomputed
log-probabilities lie from the CPU actor's), the run's verdicts and its steps/s. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result

HARDWARE = re.compile(r"^(rlvitals_(gpu|torch)_[a-z_]+)\{([^}]*)\} (\S+)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        m = HARDWARE.match(line)
        if m:
            out[f"{m.group(1)}{{{m.group(3)}}}"] = float(m.group(4))
    return out


def one_run(name: str, flags: list[str], seconds: float, root: Path) -> dict:
    port, run_dir = free_port(), root / name
    cmd = [sys.executable, "-m", "rlvitals.cli", "train", "--env", "CartPole-v1", "--device", "cuda",
           "--total-env-steps", "100000000", "--metrics-port", str(port), "--run-dir", str(run_dir),
           "--progress", "false", "--checkpoint-interval", "1000000", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    readings: dict[str, list[float]] = {}
    t0 = time.time()
    while time.time() - t0 < seconds and proc.poll() is None:
        for key, value in scrape(port).items():
            readings.setdefault(key, []).append(value)
        time.sleep(1.0)
    if proc.poll() is None:
        proc.terminate()  # SIGTERM to the run: it ends as `terminated` with its summary written
    out, err = proc.communicate(timeout=120)
    if not (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{name}: the run wrote no metrics.jsonl (exit {proc.returncode}):\n{err[-3000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    fresh = [r["logp_discrepancy"] for r in rows
             if isinstance(r.get("logp_discrepancy"), float) and math.isfinite(r["logp_discrepancy"])]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    verdicts_path = run_dir / "verdicts.json"
    verdicts = json.loads(verdicts_path.read_text()) if verdicts_path.exists() else None
    result = {
        "flags": flags, "exit_code": proc.returncode, "status": summary.get("status"),
        "env_steps": summary.get("env_steps"), "env_steps_per_second": summary.get("env_steps_per_second"),
        "mean_return_last_100": summary.get("mean_return_last_100"), "rows": len(rows),
        "hardware_readings": {k: {"min": min(v), "max": max(v), "n": len(v)} for k, v in sorted(readings.items())},
        "logp_discrepancy_at_staleness_0": {"n": len(fresh), "max": max(fresh) if fresh else None,
                                            "median": sorted(fresh)[len(fresh) // 2] if fresh else None},
        "verdicts": [{k: v.get(k) for k in ("rule", "severity", "component")} for v in verdicts or []],
        "stderr_tail": err[-1500:],
    }
    print(f"{name}: exit {proc.returncode}, {result['env_steps']} steps, {result['env_steps_per_second']} steps/s, "
          f"return {result['mean_return_last_100']}, {len(readings)} hardware series, "
          f"logp discrepancy max {result['logp_discrepancy_at_staleness_0']['max']}, "
          f"verdicts {[v['rule'] for v in result['verdicts']]}", flush=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0, help="seconds each run is left to train (default 40)")
    p.add_argument("--results-dir", default=None)
    p.add_argument("--root", default=None, help="where the runs' archives go (default: a new temporary folder)")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA GPU is visible; this benchmark needs one")
    root = Path(args.root or tempfile.mkdtemp(prefix="gpu_check_"))
    root.mkdir(parents=True, exist_ok=True)
    runs = {
        "local": one_run("local", ["--mode", "local"], args.seconds, root),
        "local-bf16": one_run("local-bf16", ["--mode", "local", "--mixed-precision", "true"], args.seconds, root),
        "ray": one_run("ray", ["--mode", "ray", "--num-actors", "4"], args.seconds + 20, root),
    }
    path = write_result("gpu-check", {"seconds": args.seconds, "env": "CartPole-v1"}, runs, name="gpu_check",
                        results_dir=args.results_dir)
    print(path)


if __name__ == "__main__":
    main()
