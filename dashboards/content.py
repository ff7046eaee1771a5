"""What is on each dashboard: the Overview, Learning diagnostics and Systems dashboards as rows of panels.

Each panel comes from a factory in `panels`, which takes its title, help, unit
and query from the catalogue; a `note` here says what healthy looks like where
the catalogue's help does not. `DASHBOARDS` maps a file name (without `.json`)
to the function that builds the dashboard.
"""

from __future__ import annotations

from .panels import (
    RATE_WINDOW,
    Dashboard,
    Panel,
    Row,
    band,
    fleet,
    gauges,
    heatmap,
    info_table,
    legend,
    metric,
    per_second,
    quantiles,
    rates,
    series,
    stat,
    target,
    trace,
)

RETURN_NOTE = ("Healthy: rises, noisily, then levels off near the best return the env allows; a flat line from the "
               "start points at the learner, a drop after a rise at instability.")
LEARNER_TOTALS = "Learner steps and updates/s"
FLEET_NOTE = ("Healthy: steady, the actors' min, median and max close together; the named slowest actors near the "
              "median. One actor far below the others is slowed down or stalled (the alerts RLActorSlow and "
              "RLActorStalled name it); pick it in the Process variable to see it alone.")


def alerts_firing() -> Panel:
    expr = 'sum(ALERTS{alertstate="firing", run_id=~"$run"}) or vector(0)'
    return stat("Alerts firing", expr, (), "none", "alerts of deploy/prometheus/rules firing now for the selected runs",
                red_at=1, note="Healthy: 0. Open Prometheus's Alerts page (or the annotations on these dashboards) "
                               "for the name and description of each; every rule says what to check.")


INVARIANTS_SHOWN = 10
"""Invariant series a panel draws at most: the broken ones, or the furthest from holding."""


def invariants_broken() -> Panel:
    name = "rlvitals_invariant_broken"
    # One query: each broken invariant by name, or else (no invariant label) the run's count of broken ones.
    expr = f"(max by (run_id, invariant) ({series(name)}) > bool 0 > 0) or sum by (run_id) ({series(name)} > bool 0)"
    return Panel("Invariants broken", (name,), [target(expr, legend(("run_id", "invariant")))],
                 "none", "per run the number of invariants broken, and each broken one by name", width=12,
                 defaults={"min": 0},
                 note="Healthy: 0 for the whole run, and no invariant named. A named line is an invariant whose "
                      "part is at fault (its RLInvariant... alert, docs/invariants.md).")


def invariant_statistics() -> Panel:
    name = "rlvitals_invariant_statistic"
    expr = f"topk({INVARIANTS_SHOWN}, max by (run_id, invariant) ({series(name)}))"
    return Panel("Invariant statistics", (name,), [target(expr, legend(("run_id", "invariant")))], "none",
                 f"the {INVARIANTS_SHOWN} largest statistics (latest value per run and invariant; log scale)",
                 width=12, custom={"scaleDistribution": {"type": "log", "log": 10}},
                 note="Healthy: each below its own limit (docs/invariants.md); exact ones read 0 and are not drawn "
                      "on the log scale.")


def rules_holding() -> Panel:
    name = "rlvitals_rule_held_updates"
    expr = f"topk({INVARIANTS_SHOWN}, max by (run_id, rule) ({series(name)}) >= 0)"
    return Panel("Health rules holding (updates)", (name,), [target(expr, legend(("run_id", "rule")))], "short",
                 f"the {INVARIANTS_SHOWN} rules whose condition has held longest, in learner updates",
                 width=24, defaults={"min": 0},
                 note="Healthy: nothing drawn, or only info rules. A line counts the updates a rule's condition "
                      "has held without a break; the rule's alert fires when it reaches the rule's hold "
                      "(docs/health.md), counted in updates so any machine agrees.")


def overview() -> Dashboard:
    ret = "rlvitals_actor_episode_return"
    return Dashboard("rlvitals-overview", "rlvitals / Overview",
                     "Is the run learning and is data flowing: return, episode length, throughput, staleness, "
                     "queue depth, alerts.", [
        Row("At a glance", [
            stat("Mean return", f"avg by (run_id) ({series(ret, stat='mean')})", (ret,), metric(ret).unit,
                 "mean return of the last 100 episodes (mean over actors)", note=RETURN_NOTE),
            stat("Env steps/s", f"sum by (run_id) (rate({series('rlvitals_actor_env_steps_total')}[{RATE_WINDOW}]))",
                 ("rlvitals_actor_env_steps_total",), per_second("steps"), "agent steps per second, all actors"),
            stat("Learner samples/s",
                 f"sum by (run_id) (rate({series('rlvitals_learner_samples_consumed_total')}[{RATE_WINDOW}]))",
                 ("rlvitals_learner_samples_consumed_total",), per_second("samples"),
                 "samples the learner consumed per second"),
            stat("Network age", f"max by (run_id) ({series('rlvitals_learner_network_age')})",
                 ("rlvitals_learner_network_age",), metric("rlvitals_learner_network_age").unit,
                 "learner optimizer steps so far",
                 note="Healthy: keeps rising while the run lives; frozen means the learner is stuck or starved."),
            stat("Actor restarts", f"sum by (run_id) (increase({series('rlvitals_actor_restarts_total')}[$__range]))",
                 ("rlvitals_actor_restarts_total",), "short", "restarts within the dashboard's time range", red_at=1),
            alerts_firing(),
            info_table("rlvitals_run_info",
                       note="Healthy: a local run is one `local` process; a Ray run one `learner`, one `node` per "
                            "machine and as many `actor`s as it started. Fewer means processes Prometheus cannot "
                            "see (the alert RLComponentDown names them)."),
        ]),
        Row("Learning", [
            band(ret, title="Episode return", note=RETURN_NOTE),
            band("rlvitals_actor_episode_length", title="Episode length",
                 note="Healthy: min and max apart in an env whose episodes should vary, the mean moving the way the "
                      "task rewards (longer for balancing tasks, shorter for reach-the-goal tasks)."),
            gauges("rlvitals_actor_solve_ratio", agg="avg", lo=0, hi=1, title="Solve ratio",
                   note="Healthy: rises toward 1 as the agent learns the task; flat at 0 with rising return means the "
                        "env's success criterion is not what the reward encourages."),
        ]),
        Row("Data flow", [
            rates("rlvitals_actor_env_steps_total", "rlvitals_learner_samples_consumed_total",
                  title="Env steps/s and learner samples/s", width=12, legends=("env steps", "learner samples"),
                  counts="steps"),
            quantiles("rlvitals_learner_sample_staleness_steps", width=12),
            gauges("rlvitals_queue_depth", "rlvitals_queue_capacity", by=("queue",), title="Queue depth", width=12,
                   legends=("depth", "capacity")),
            gauges("rlvitals_learner_rollouts_alive", title="Rollouts held by the learner", width=12),
            gauges("rlvitals_learner_actor_inference_cost_ratio", lo=0, title="Actor inference over its forward pass"),
            gauges("rlvitals_learner_actor_env_step_cost_ratio", lo=0, title="Actor env step over the env's own step"),
            gauges("rlvitals_learner_minibatch_cost_ratio", lo=0, title="Learner minibatch over its net's step"),
            gauges("rlvitals_learner_staleness_batches", "rlvitals_queue_capacity", title="Staleness in batches",
                   legends=("staleness", "queue capacity"), width=12,
                   note="Healthy: staleness at or below the queue capacity; above it, weights do not reach the "
                        "actors."),
            rates("rlvitals_samples_dropped_total", by=("reason",), title="Samples dropped/s", width=12,
                  counts="samples"),
        ]),
    ])


def learning() -> Dashboard:
    layer_note = ("Healthy: every layer in the same range and steady; one layer far from the others is where to look.")
    return Dashboard("rlvitals-learning", "rlvitals / Learning diagnostics",
                     "Where a learning bug lives: policy entropy and KL, the value function's fit, the distributions "
                     "it learns from, the updates it makes, and per-layer health (debug level).", [
        Row("Policy", [
            gauges("rlvitals_learner_relative_entropy_ratio", lo=0, hi=1, title="Relative policy entropy"),
            gauges("rlvitals_learner_entropy_change_nats", title="Entropy change per action dimension"),
            gauges("rlvitals_learner_entropy_bounded", lo=0, hi=1, title="Entropy has a maximum (discrete policy)",
                   note="Healthy: constant for a run, 1 for discrete actions and 0 for a Gaussian policy: it says "
                        "which entropy panel to read (relative entropy for 1, the change per dimension for 0)."),
            gauges("rlvitals_learner_kl_divergence_nats", title="KL(behaviour || learner)"),
            gauges("rlvitals_learner_clip_fraction_ratio", lo=0, hi=1, title="PPO clip fraction"),
        ]),
        Row("Value function", [
            gauges("rlvitals_learner_residual_variance_ratio", lo=0, title="Residual variance"),
            gauges("rlvitals_learner_terminal_correlation", "rlvitals_learner_penultimate_terminal_correlation",
                   lo=-1, hi=1, title="Terminal correlations", legends=("terminal", "penultimate")),
            band("rlvitals_learner_value", title="Value predictions"),
            band("rlvitals_learner_value_target", title="Value targets"),
            band("rlvitals_learner_advantage", title="Advantages"),
            band("rlvitals_learner_reward", title="Rewards",
                 note="Healthy: exactly the range the env is documented to give, the mean rising as the agent learns."),
            gauges("rlvitals_learner_value_target_scale_ratio", lo=0, title="Value targets against the reward scale"),
            gauges("rlvitals_learner_reward_scale", title="Reward scale",
                   note="Healthy: steps up to the largest reward the env gives early on, then stays flat."),
            gauges("rlvitals_learner_reward_divisor", title="Reward divisor (reward scaling)",
                   note="Healthy: 1 with reward scaling off; with it on, settles after the first batches."),
            gauges("rlvitals_learner_observation_normalizer", by=("stat",), title="Observation normaliser",
                   note="Healthy: abs_mean 0 and std 1 with normalisation off; with it on, settle early and drift "
                        "slowly."),
            gauges("rlvitals_learner_observation_normalizer_samples", title="Observation normaliser samples",
                   note="Healthy: 0 with normalisation off; with it on, rises by every batch's samples."),
        ]),
        Row("Consistency", [
            gauges("rlvitals_learner_logp_discrepancy_nats", "rlvitals_learner_logp_discrepancy_shifted_nats",
                   title="Actor-learner log-prob discrepancy", legends=("same step", "neighbour step"), width=12,
                   note="Healthy: `same step` reads 0 on every batch of staleness 0, whatever `neighbour step` does."),
            gauges("rlvitals_learner_head_gradient_norm", by=("head",), log=True, title="Gradient norm per head",
                   width=12),
            gauges("rlvitals_learner_actor_weights_mismatch_ratio", title="Weights that acted vs their stamped age",
                   width=12, note="Healthy: 0 on every batch; above, actors act with other weights than they report."),
            gauges("rlvitals_learner_behaviour_record_discrepancy_nats", title="Actors' record against itself",
                   width=12, note="Healthy: 0 on every batch, at any staleness."),
            gauges("rlvitals_learner_gradient_mismatch_ratio", log=True, title="Gradient of this minibatch's loss?",
                   width=12, note="Healthy: rounding (1e-7, 1e-2 in bfloat16); of order 1, gradients accumulate."),
            gauges("rlvitals_learner_loss_direction", by=("term",), title="Loss direction per term", width=12,
                   note="Healthy: every term at or above 0 (policy about 1, value the value coefficient, entropy "
                        "the entropy coefficient); below 0 is a sign error in that loss term."),
        ]),
        Row("Invariants", [invariants_broken(), invariant_statistics(), rules_holding()]),
        Row("Distributions", [
            heatmap("rlvitals_learner_value_target_distribution", width=12,
                    note="Healthy: mass inside +-r_max / (1 - gamma) for the env's reward scale, drifting slowly as "
                         "returns improve."),
            heatmap("rlvitals_learner_advantage_distribution", width=12,
                    note="Healthy: centred near zero once the value net has caught up, spread on the reward's "
                         "scale; a centre that stays shifted means the advantage calculation is wrong."),
            heatmap("rlvitals_learner_sample_staleness_steps", width=12),
            trace("rlvitals_learner_value_trace", width=12),
        ]),
        Row("Updates", [
            gauges("rlvitals_learner_update_step", by=("stat",), log=True, title="Update step size"),
            gauges("rlvitals_learner_gradient", by=("stat",), log=True, title="Gradient statistics",
                   note="Healthy: norm and mean-square steady or slowly falling, no spikes of orders of magnitude; "
                        "abs-max well above the root of the mean-square."),
            gauges("rlvitals_learner_gradient_noise_scale", log=True,
                   note="Healthy: a long-run average of the same order as the batch size; far below it, smaller "
                        "batches would learn as well."),
            gauges("rlvitals_learner_loss", by=("part",), title="Losses"),
            gauges("rlvitals_learner_training_intensity"),
            rates("rlvitals_learner_samples_learned_total", title="Sample-gradient passes/s", counts="samples",
                  note="Healthy: steady at about epochs x learner samples/s."),
        ]),
        Row("Layers", [
            gauges("rlvitals_learner_layer_weight_rms", by=("layer",), width=12),
            gauges("rlvitals_learner_layer_gradient_rms", by=("layer",), log=True, width=12, note=layer_note),
            gauges("rlvitals_learner_layer_activation_std", by=("layer",), width=12, note=layer_note),
            gauges("rlvitals_learner_layer_dead_ratio", by=("layer",), lo=0, hi=1, width=12, title="Dead units"),
            gauges("rlvitals_learner_recurrent_state_rms", width=12, title="Recurrent state RMS",
                   note="Recurrent policies only. Healthy: steady and well away from 0; near 0 after training the core "
                        "carries nothing forward."),
            gauges("rlvitals_learner_recurrent_gate_saturated_ratio", lo=0, hi=1, width=12,
                   title="Saturated recurrent gates", note="Healthy: well below 0.5."),
        ]),
    ])


def systems() -> Dashboard:
    phase_note = "Healthy: the shares stay steady over the run; compute phases dominate, waiting is a small share."
    gpu_note = "Healthy: steady, well inside the card's limits; compare GPUs of the same node."
    return Dashboard("rlvitals-systems", "rlvitals / Systems",
                     "Per-component throughput and phase timings, queues and transport, memory of every process, "
                     "torch and NVML memory, GPU vitals, restarts and dropped samples.", [
        Row("Throughput", [
            fleet("rlvitals_actor_env_steps_total", title="Env steps/s across actors", counts="steps",
                  note=FLEET_NOTE),
            fleet("rlvitals_actor_episodes_total", title="Episodes/s across actors", counts="episodes",
                  note="Healthy: steady, the actors close together; a falling rate at steady env steps/s means "
                       "episodes got longer."),
            rates("rlvitals_learner_samples_consumed_total", "rlvitals_learner_samples_learned_total",
                  title="Learner samples/s", legends=("consumed", "learned"), counts="samples"),
            rates("rlvitals_learner_steps_total", "rlvitals_learner_updates_total", title=LEARNER_TOTALS,
                  legends=("optimizer steps", "updates"), unit=per_second(""),  # the legend says which is which
                  note="Healthy: both steady; steps/s = updates/s x epochs x minibatches."),
        ]),
        Row("Phase timings", [
            rates("rlvitals_learner_phase_seconds_total", by=("phase",), title="Learner time by phase", stack=True,
                  width=12, note=phase_note),
            rates("rlvitals_actor_phase_seconds_total", by=("phase",), agg="avg", title="Actor time by phase",
                  stack=True, width=12, note=phase_note),
            gauges("rlvitals_learner_actors_slow", "rlvitals_learner_actors_silent", legends=("slow", "silent"),
                   title="Ray actors slower than their peers, or silent (the driver's counts)",
                   width=12, note="Healthy: 0. The driver's view of the fleet outlier rules: the run's verdicts "
                                  "RLActorSlowerThanPeers and RLActorSilentAmongPeers name them (verdicts.json); "
                                  "Prometheus's RLActorSlow and RLActorStalled name them by instance and node."),
        ]),
        Row("Queues and transport", [
            gauges("rlvitals_queue_depth", "rlvitals_queue_capacity", by=("queue",), title="Queue depth and capacity",
                   legends=("depth", "capacity")),
            rates("rlvitals_samples_dropped_total", by=("reason",), title="Samples dropped/s", counts="samples"),
            rates("rlvitals_actor_restarts_total", title="Actor restarts/s", counts="restarts"),
            fleet("rlvitals_actor_network_age", own=False, also=("rlvitals_learner_network_age",),
                  also_legends=("learner network",), title="Network age: actors and learner",
                  note="Healthy: the actors' min, median and max follow the learner's network age a few steps "
                       "behind, close together; an actor far below the others acts with old weights."),
            rates("rlvitals_weight_publishes_total", title="Weight publishes/s", counts="publishes",
                  note="Healthy: steady, about one per learner update."),
            rates("rlvitals_weight_publish_bytes_total", title="Weight bytes published/s",
                  note="Healthy: publishes/s x model size, a small fraction of the network's bandwidth."),
        ]),
        Row("Memory and CPU", [
            fleet("rlvitals_process_resident_memory_bytes", worst="topk", sidecars=True, width=12,
                  note="Healthy: every process flat after warm-up, the actors close together; one actor climbing "
                       "away from the others leaks."),
            fleet("rlvitals_process_cpu_seconds_total", worst="bottomk", sidecars=True, width=12,
                  title="Process CPU (cores busy)", unit="count:cores",
                  note="Healthy: actors near one core each, the learner busy; a process at 0 is stuck."),
            fleet("rlvitals_node_memory_used_bytes", of="node", worst="topk",
                  also=("rlvitals_node_memory_total_bytes",), also_legends=("total (largest machine)",),
                  title="Machine memory", width=12,
                  note="Healthy: every machine's use well below its total."),
            fleet("rlvitals_node_cpu_utilization_ratio", of="node", worst="topk", lo=0, hi=1, width=12,
                  title="Machine CPU utilisation",
                  note="Healthy: high while training (the cores are used) with throughput to match."),
        ]),
        Row("GPU", [
            # Per kind of process (the largest of a fleet): the learner's GPU is the one that matters.
            gauges("rlvitals_torch_memory_allocated_bytes", "rlvitals_torch_memory_reserved_bytes",
                   "rlvitals_torch_memory_peak_allocated_bytes", "rlvitals_torch_memory_peak_reserved_bytes",
                   per=("run_id", "component"), by=("device",), title="Torch CUDA memory", width=12,
                   legends=("allocated", "reserved", "peak allocated", "peak reserved"),
                   note="Healthy: allocated flat after warm-up, reserved not far above it, peaks well below the "
                        "GPU's memory; lines are the largest process of each kind (learner, actors)."),
            fleet("rlvitals_gpu_memory_used_bytes", of="node", worst="topk", keep=("gpu",),
                  also=("rlvitals_gpu_memory_total_bytes",), also_legends=("total (largest GPU)",),
                  title="GPU memory (NVML)", width=12, note="Healthy: used flat after warm-up and well below total."),
            fleet("rlvitals_gpu_utilization_ratio", of="node", worst="bottomk", keep=("gpu",), lo=0, hi=1,
                  title="GPU utilisation", note="Healthy: high and steady on the learner's GPU."),
            fleet("rlvitals_gpu_temperature_celsius", of="node", worst="topk", keep=("gpu",), note=gpu_note),
            fleet("rlvitals_gpu_power_watts", of="node", worst="topk", keep=("gpu",), note=gpu_note),
            fleet("rlvitals_gpu_fan_ratio", of="node", worst="topk", keep=("gpu",), lo=0, hi=1, note=gpu_note),
        ]),
    ])


DASHBOARDS = {"overview": overview, "learning": learning, "systems": systems}
