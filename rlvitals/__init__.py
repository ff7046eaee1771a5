"""rlvitals: the wiring that belongs to neither actors nor learner.

Config, command line, run archive and the run loops live here and may import
every other part (`rlvitals.actors`, `rlvitals.learner`, `rlvitals.telemetry`).
"""

__version__ = "0.1.0"
