"""What the health rules cost a run: the monitor's time per metrics row, against an update's time.

    python bench/health_cost.py RUN_DIR [RUN_DIR ...]

Replays each recorded run's rows through a HealthMonitor (every rule, the
default 1 s grid) and reports CPU seconds per row and per evaluation next to
the run's own seconds per update (wall_seconds / updates), as JSON in
bench/results/health_cost.json with machine info.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

from rlvitals.telemetry.health import HealthMonitor, read_rows

RESULTS = Path(__file__).resolve().parent / "results" / "health_cost.json"


def measure(run_dir: str, repeats: int = 5) -> dict:
    rows = read_rows(Path(run_dir) / "metrics.jsonl")
    best = float("inf")
    for _ in range(repeats):  # the best of a few replays: the machine is shared
        monitor = HealthMonitor()
        start = time.process_time()
        for row in rows:
            monitor(row)
        monitor.finish()
        best = min(best, time.process_time() - start)
    last = rows[-1]
    per_update = last["wall_seconds"] / max(1, last["updates"])
    per_row = best / len(rows)
    return {"run": str(run_dir), "rows": len(rows), "run_seconds": last["wall_seconds"],
            "evaluations": len(rows), "monitor_cpu_seconds": round(best, 4),
            "cpu_seconds_per_row": per_row, "seconds_per_update": per_update,
            "share_of_update": per_row / per_update}


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python bench/health_cost.py RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        return 2
    results = [measure(d) for d in argv]
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "load_average": os.getloadavg(), "python": platform.python_version()},
           "runs": results}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    for r in results:
        print(f"{r['run']}: {r['rows']} rows, {r['cpu_seconds_per_row'] * 1e3:.3f} ms CPU per row, "
              f"{r['share_of_update']:.3%} of an update's {r['seconds_per_update'] * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
