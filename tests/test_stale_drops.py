"""Ray mode when every arriving batch is stale: the run still ends, reports and raises its alert.

The planted bug freezes the weights the actors receive; once the learner is
more than `max_staleness` learner steps ahead, every rollout is dropped and no
update happens. Before, the learner's wait loop dropped them for ever without
returning to the run loop: no row, no stop, no end.

Rows of a stalled run come by the clock (rlvitals.rows.IDLE_SECONDS), the end by
the step budget: no budget is long enough for two rows on every machine, so one
run waits for the rows and the alert (and is stopped then), another runs to its
budget. The time bounds only fail a hung run.
"""

from __future__ import annotations

import pytest
from diagnose import diagnose
from planted_bugs import BY_BUG

pytestmark = pytest.mark.slow

BUG = BY_BUG["weights_never_republished"]
# 16 learner steps are one update: from the second update on, every batch is too old.
STALE = {"max_staleness": 16, "num_envs": 4, "rollout_length": 128}
HUNG_S = 600


def stalled(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("dropped_stale", 0) > 0]


def alerted(verdicts) -> bool:
    return "RLSamplesDroppedStale" in {v.rule for v in verdicts}


@pytest.mark.extended   # 20 s; the suite keeps the stale run that writes its rows and raises its alert
def test_a_run_whose_every_batch_is_stale_ends_at_its_budget(tmp_path):
    budget = 20_000
    found = diagnose(tmp_path / "stale", bug=BUG, budget_s=HUNG_S, stop_on_verdict=False, total_env_steps=budget,
                     **STALE)
    s = found.summary
    assert s["status"] == "completed" and s["env_steps"] < budget, s   # ended by its budget, not by the clock
    dropped = s["samples"]["dropped"]["stale"]
    assert dropped > 0 and s["env_steps"] + dropped >= budget
    assert s["samples"]["produced"] == s["samples"]["learned"] + dropped + s["samples"]["in_flight"]
    assert stalled(found.rows), "the last row shows the drops"


def test_a_run_whose_every_batch_is_stale_keeps_writing_rows_and_says_why(tmp_path):
    def seen(rows, loud) -> bool:  # rows kept coming while nothing was learned, and the alert fired
        return len(stalled(rows)) >= 3 and alerted(loud)

    found = diagnose(tmp_path / "stale", bug=BUG, budget_s=HUNG_S, stop_on_verdict=False,
                     total_env_steps=10**12, until=seen, **STALE)
    rows = stalled(found.rows)
    assert len(rows) >= 3, f"{len(rows)} rows with drops in {HUNG_S} s: {found.summary}"
    assert rows[-1]["dropped_stale"] > rows[0]["dropped_stale"]
    assert len({r["updates"] for r in rows}) < len(rows), "stalled rows repeat the update number"
    assert alerted(found.verdicts)
    s = found.summary
    assert s["samples"]["produced"] == s["samples"]["learned"] + s["samples"]["dropped"]["stale"] \
        + s["samples"]["in_flight"]
