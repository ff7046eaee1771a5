"""Learner: the network, the return estimators, the PPO/V-trace update and its diagnostics.

`networks` builds an actor-critic from the env's spaces, `returns` holds the
discounting, GAE and V-trace math, `ppo` the loss and the update loop
(`transfer`, `phases` and `step_sums` its batch transfer, its timing and its
running sums; `flat_gradients` the gradients as views of one buffer; `adam`
the optimizer it and its cost reference build),
`diagnostics` the per-batch statistics that localise learning bugs,
`invariants` the learner's invariant statistics against references.

May import: torch, numpy, gymnasium spaces, and `rlvitals.actors.rollout`
(the data it consumes). Never the wiring in `rlvitals` or the Ray code.
"""
