"""Planted faults in the env, the actor's witness, the preprocessing
and the counting at the lowest level: each breaks one stage's output given its
own inputs (issue 31), planted from outside the product code."""

from __future__ import annotations

from planted_bug import PlantedBug

ENV_STAGE_BUGS: tuple[PlantedBug, ...] = ()
