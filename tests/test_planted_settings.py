"""A setting handed to the learner wrong is named at the stage that reads it (tests/planted_settings.py): the
learner's references take the config's declared values (LearnerInvariants.declare), not the learner's copy."""

from __future__ import annotations

import pytest
from diagnose import diagnose
from planted_settings import SETTINGS_BUGS

from rlvitals.telemetry.invariants import BY_NAME


@pytest.mark.parametrize("bug", SETTINGS_BUGS, ids=lambda b: b.name)
def test_a_setting_handed_wrong_is_named_where_it_is_read(bug, tmp_path):
    found = diagnose(tmp_path / bug.name, env=bug.env, bug=bug, budget_s=300)
    assert found.first is not None, found.verdicts
    expected = BY_NAME[bug.invariant]
    assert (found.first.rule, found.first.component) == (expected.rule_name, bug.component), found.verdicts
    assert found.first.first_update <= 10
