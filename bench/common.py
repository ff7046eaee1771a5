"""Shared plumbing for the benchmark scripts: machine description and result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    import torch

    from rlvitals.archive import code_version, package_versions

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    packages = package_versions()
    for name in ("ale-py",):  # optional extras the archive's list leaves out
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "platform": platform.platform(), "packages": packages, "code_version": code_version()}


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def write_result(scenario: str, config: dict, figures: dict, name: str | None = None,
                 results_dir: str | Path | None = None) -> Path:
    """Write `<results_dir or bench/results>/<name or scenario>.json` and return its path."""
    folder = Path(results_dir) if results_dir else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    payload = {"scenario": scenario, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": config,
               "code_version": machine["code_version"], "machine": machine, "figures": figures}
    path = folder / f"{name or scenario}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
