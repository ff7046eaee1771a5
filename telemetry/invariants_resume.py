"""The invariants of a resume: a resumed run starts from exactly the state its checkpoint was saved from.

A checkpoint carries, beside the state, a fingerprint of that state taken from the live objects at the moment
it was saved (rlvitals/resume_check.py); a resume takes the same fingerprint of the objects it rebuilt and
compares, owner by owner, before the first batch. Saving the wrong thing and loading part of it back both show.
"""

from __future__ import annotations

from .invariant_model import Invariant

_HOW = ("Each part is a float64 sum of values and of squares (with counters and a digest of the random "
        "generators' states): the same state gives the same numbers exactly, on the same device and in the "
        "same order. The limit 1e-9 (relative) leaves room only for a device move's rounding. Measured once, "
        "on the first update after a resume from a checkpoint that carries the fingerprint (the statistic is "
        "absent from other runs).")

RESUME_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "resumed_weights_as_saved", "resume", "learner", 1e-9, 1,
        "The resumed run does not start from the weights and counters its checkpoint was saved with",
        "After the resume, the network's parameters, its age, the learner's and the run's counters, its running "
        "scales or the random generators' states differ from what they were when the checkpoint was written: "
        "the checkpoint saved something other than the live state, or the resume loaded part of it, into the "
        "wrong place, or another checkpoint's. The run goes on from another point than it says.",
        "The checkpoint is written from the live objects and the fingerprint taken from the same objects at the "
        "same moment; restoring loads every tensor and counter back exactly. " + _HOW),
    Invariant(
        "resumed_optimizer_as_saved", "resume", "optimizer", 1e-9, 1,
        "The resumed optimizer does not hold the state it was saved with",
        "After the resume, the optimizer's state (Adam's moment estimates and step counts) or its "
        "hyperparameters differ from what they were when the checkpoint was written: the moments restart from "
        "zero (a state not saved or not loaded), belong to other parameters, or the settings changed. Every "
        "step after the resume is then not the step the saved run would have taken.",
        "The optimizer's state_dict is saved from the live optimizer and load_state_dict puts every tensor back "
        "(cast to its parameter's dtype, exact for float32). " + _HOW),
    Invariant(
        "resumed_preprocessing_as_saved", "resume", "preprocessing", 1e-9, 1,
        "The resumed run does not hold the preprocessing statistics it was saved with",
        "After the resume, the running observation statistics (the network's normaliser buffers) or the reward "
        "scaling's running statistics differ from what they were when the checkpoint was written: they restart "
        "from their initial values or come from elsewhere, so the resumed policy sees its observations on "
        "another scale than the one it learned on.",
        "The normalisers' statistics are saved with the network and the learner's state and loaded back exactly. "
        + _HOW),
)
