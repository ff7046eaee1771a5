"""Planted faults in the learner's stages: the distribution, what the
returns hand to the loss, the gradient, the clip and the optimizer's step: each breaks one stage's output given its
own inputs (issue 31), planted from outside the product code."""

from __future__ import annotations

from planted_bug import PlantedBug

LEARNER_STAGE_BUGS: tuple[PlantedBug, ...] = ()
