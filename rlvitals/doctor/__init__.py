"""`rlvitals doctor`: the probe ladder, reasoned about as a whole pattern, plus Ray and env checks.

- `ladder`: train every probe (actors/probes.py) under a leg's learning settings and check it exactly;
- `patterns`: the table that turns a leg's pass/fail pattern into a component (docs/doctor.md);
- `rayleg`: one Ray actor, asynchronous (weights follow the learner) and synchronous (replays local mode);
- `envcheck`: a user's env stepped by the probe agents;
- `main`: running what was asked, the verdicts and the printed report.
"""

from .ladder import (  # noqa: F401
                     PROBABILITY_TOLERANCE,
                     REFERENCE,
                     VALUE_TOLERANCE,
                     Leg,
                     ProbeResult,
                     check_probe,
                     probe_config,
                     run_ladder,
                     run_probe,
                     user_leg,
)
from .main import DoctorRequest, run_doctor, verdicts_json  # noqa: F401
from .patterns import PATTERNS, infer, render_table  # noqa: F401
