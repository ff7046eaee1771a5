"""What a metrics.jsonl row holds, for the metric reference (docs/metrics.md) and the test that holds it to
what a real run writes (tests/test_reference_keys.py).

A row holds the `source` key of every catalogue metric that has one (unless its `not_in_rows` says why not),
the keys below that no metric exports, and at debug the learner's per-layer statistics. Verbosity decides
what is exported, not what is recorded: only the per-layer keys depend on it.
"""

from __future__ import annotations

from itertools import product

from .catalogue import METRICS, Metric
from .invariants import INVARIANTS, RESUME_INVARIANTS

ROW_ONLY_KEYS = {
    "mean_return_last_100": "mean return of the last 100 episodes (the progress line's figure)",
    "actor_env_steps": "env steps the actors delivered, batches dropped as stale included",
    "wall_seconds": "training seconds since the run started, resumes included (read from the clock)",
    "nonfinite": "1 when the batch held NaN or inf and was not learned from, else 0",
    "nonfinite_samples": "samples of the batch not learned from for that reason",
    "loss_finite": "1 when every minibatch loss of the update was finite",
    "grads_finite": "1 when every gradient of the update was finite",
    "params_finite": "1 when the weights after the update are finite",
    "actors_slow_named": "which Ray actors are far slower than their peers: actor index, pid, speed and the median "
                         "(text; rlvitals/distributed/peers.py)",
    "actors_silent": "Ray actors that delivered nothing while their peers delivered many rollouts "
                     "(rlvitals/distributed/peers.py)",
    "actors_silent_named": "which: actor index, pid, and the rollouts their peers delivered since their last (text)",
}
ROW_ONLY_KEYS.update({inv.names_key: f"which processes' evidence broke invariant {inv.name}: each actor (index, pid) "
                                     "with its count of batches over the limit, or the worst process (text; "
                                     "telemetry/attribution.py)" for inv in INVARIANTS if inv.names_key})
"""Row keys that no metric exports, with what they hold."""

OCCASIONAL_KEYS = {
    "inv_actor_accounting": "Ray mode only: the actors' own counters travel on their rollouts",
    "inv_memory_per_sample": "once the run has seen 32 updates' worth of memory readings",
    "inv_learner_waits_while_ready": "Ray async mode only, on updates whose wait began with a rollout ready",
    "actors_slow_named": "Ray mode only, while an actor is far slower than its peers",
    "actors_silent": "Ray mode only",
    "actors_silent_named": "Ray mode only, while an actor is silent among its peers",
    "inv_env_time_limit": "envs built with gymnasium's TimeLimit in a sync vector env, on updates with a "
                          "time-limit decision (actors/time_limit.py)",
    "inv_observation_statistics_recomputed": "with normalize_observations on",
    "inv_initial_state_as_stored": "recurrent policies only (recurrent_size > 0), on batches at staleness 0",
    "inv_state_reset_at_episode_starts": "recurrent policies only (recurrent_size > 0), on batches at staleness 0",
    "inv_sequence_replay_recomputed": "recurrent policies only (recurrent_size > 0), on batches at staleness 0",
    "inv_weight_loads_per_published_version": "Ray mode only: the actors count their weight loads",
    "recurrent_state_rms": "debug verbosity, recurrent policies only",
    "recurrent_gate_saturated_ratio": "debug verbosity, recurrent policies only",
    "inv_reward_scaling_recomputed": "with normalize_rewards on",
    "inv_running_returns_recomputed": "with normalize_rewards on",
    "actor_inference_cost_ratio": "where the policy has a forward pass (not the probe agents), not in Ray's "
                                  "synchronous batches (they join several actors' rollouts)",
    "actor_env_step_cost_ratio": "not in Ray's synchronous batches (they join several actors' rollouts), nor where a "
                                 "copy of the env cannot be built and stepped",
    "learner_minibatch_cost_ratio": "where a learner runs (not the probe agents)",
    "inv_exported_as_computed": "where the metrics are exported (verbosity minimal and up), from the second update",
    **{inv.statistic: "in the first row after a resume (from a checkpoint that carries its state's fingerprint)"
       for inv in RESUME_INVARIANTS},
}
OCCASIONAL_KEYS.update({inv.names_key: "Ray mode only, once some process broke the invariant"
                        for inv in INVARIANTS if inv.names_key})
"""Keys a row holds only in some runs, with when."""

LEARNER_ONLY_KEYS = ("nonfinite", "nonfinite_samples", "loss_finite", "grads_finite", "params_finite")
"""Statistics of the learner, absent where none runs (the `random` and `fixed` probe agents)."""

PER_LAYER_KEYS = {
    "layer_weight_rms/": "rlvitals_learner_layer_weight_rms",
    "layer_gradient_rms/": "rlvitals_learner_layer_gradient_rms",
    "layer_activation_std/": "rlvitals_learner_layer_activation_std",
    "layer_dead_ratio/": "rlvitals_learner_layer_dead_ratio",
}
"""At debug, one key per network layer (`<prefix><layer>`) for each per-layer metric."""


def source_keys(metric: Metric) -> list[str]:
    """The row keys of a metric's `source`, one per combination of its labels' values."""
    if not metric.source:
        return []
    if not metric.labels:
        return [metric.source]
    combos = product(*(metric.label_values[label] for label in metric.labels))
    return [metric.source.format(**dict(zip(metric.labels, combo, strict=True))) for combo in combos]


def row_keys(level: str) -> tuple[set[str], set[str]]:
    """(keys, prefixes) a row may hold at `level`: exact keys, and the per-layer prefixes at debug."""
    keys = {key for m in METRICS if not m.not_in_rows for key in source_keys(m)} | set(ROW_ONLY_KEYS)
    return keys, set(PER_LAYER_KEYS) if level == "debug" else set()


def render_section() -> list[str]:
    """The page's metrics.jsonl section."""
    out = [
        "## metrics.jsonl",
        "",
        "Each run also records rows in `<run_dir>/metrics.jsonl` (when: docs/architecture.md). A row holds, "
        "where defined (an undefined value is left out, never written as 0):",
        "",
        "- the **metrics.jsonl key** of every metric on this page that names one, at every verbosity, `off` "
        "included: the level decides what is exported, not what is recorded;",
        "- these keys, which no metric exports:",
        "",
        "| key | holds |",
        "|---|---|",
    ]
    out += [f"| `{key}` | {text} |" for key, text in ROW_ONLY_KEYS.items()]
    out += [
        "",
        "- at `debug` only, one key per network layer for each per-layer metric: "
        + ", ".join(f"`{prefix}<layer>` ({name})" for prefix, name in PER_LAYER_KEYS.items()) + ".",
        "",
        ", ".join(f"`{k}`" for k in LEARNER_ONLY_KEYS) + " and the learner's other per-batch statistics "
        "(losses, `kl`, ...) are there only where a learner runs: not for the `random` and `fixed` probe agents.",
        "",
        "Some invariant statistics are there only in some runs: "
        + "; ".join(f"`{k}`: {when}" for k, when in OCCASIONAL_KEYS.items()) + ".",
        "",
    ]
    return out
