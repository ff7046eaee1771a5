"""Healthy recurrent runs must stay quiet (issue 32): the masked-velocity CartPole with its bench settings
(bench/configs/cartpole_novelocity_lstm.yaml) and the memory probe, each at the standard verbosity, several seeds,
never stopped early. Writes every warning-or-worse verdict (a false alarm) and the return reached.

Usage: python bench/healthy_recurrent.py [--seeds N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

RUNS = [("rlvitals/CartPoleNoVelocity-v1", {"config": str(BENCH / "configs" / "cartpole_novelocity_lstm.yaml")}),
        ("rlvitals/MemoryProbe-v0", {"recurrent_size": 16, "num_envs": 8, "rollout_length": 32,
                                     "num_minibatches": 4, "total_env_steps": 30_000})]


def main() -> None:
    from common import machine_info
    from rlvitals.api import train
    from rlvitals.config import build_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--out", default=str(BENCH / "results" / "healthy_recurrent.json"))
    args = p.parse_args()
    results = []
    for env, fields in RUNS:
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "run"
                cfg = build_config(fields["config"], {}) if "config" in fields else None
                chosen = {**({k: v for k, v in cfg.to_dict().items() if k not in ("run_dir",)} if cfg else {}),
                          **{k: v for k, v in fields.items() if k != "config"}, "env": env, "seed": seed,
                          "progress": False, "verbosity": "standard", "run_dir": str(run_dir)}
                started = time.perf_counter()
                summary = train(**chosen)
                loud = [v for v in json.loads((run_dir / "verdicts.json").read_text()) if v["severity"] != "info"]
            results.append({"env": env, "seed": seed, "env_steps": summary["env_steps"],
                            "mean_return_last_100": summary["mean_return_last_100"],
                            "seconds": round(time.perf_counter() - started, 1), "loud": loud,
                            "invariants_broken": summary["judgement"]["invariants_broken"]})
            print(json.dumps(results[-1])[:300], flush=True)
    out = {"scenario": "healthy_recurrent", "command": " ".join(sys.argv), "machine": machine_info(),
           "result": {"runs": results, "false_alarms": sum(len(r["loud"]) for r in results)}}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"false alarms: {out['result']['false_alarms']} over {len(results)} runs; {args.out}")


if __name__ == "__main__":
    main()
