"""Ray mode when every arriving batch is stale: the run still ends, reports and raises its alert.

The planted bug freezes the weights the actors receive; once the learner is
more than `max_staleness` learner steps ahead, every rollout is dropped and no
update happens. Before, the learner's wait loop dropped them for ever without
returning to the run loop: no row, no stop, no end.
"""

from __future__ import annotations

import pytest
from diagnose import diagnose
from planted_bugs import BY_BUG

pytestmark = pytest.mark.slow


def test_a_run_whose_every_batch_is_stale_ends_at_its_budget_and_says_why(tmp_path):
    bug = BY_BUG["weights_never_republished"]
    # 16 learner steps are one update: from the second update on, every batch is too old.
    found = diagnose(tmp_path / "stale", bug=bug, budget_s=150, stop_on_verdict=False, total_env_steps=200_000,
                     max_staleness=16, num_envs=4, rollout_length=128)
    s = found.summary
    assert s["status"] == "completed" and s["env_steps"] < 200_000, s   # ended by its budget, not by the clock
    dropped = s["samples"]["dropped"]["stale"]
    assert dropped > 0 and s["env_steps"] + dropped >= 200_000
    assert s["samples"]["produced"] == s["samples"]["learned"] + dropped + s["samples"]["in_flight"]
    # Rows kept coming while nothing was learned, and they show the drops.
    stalled = [r for r in found.rows if r.get("dropped_stale", 0) > 0]
    assert len(stalled) >= 2 and stalled[-1]["dropped_stale"] > stalled[0]["dropped_stale"]
    assert "RLSamplesDroppedStale" in {v.rule for v in found.verdicts}
