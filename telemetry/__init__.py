"""Telemetry: the metric catalogue and everything that exports it.

`catalogue` lists every metric (name, type, labels, level, meaning);
`interface` is the one object the rest of rlvitals records through (the
`Telemetry` protocol; a no-op implementation at verbosity `off`);
`recorder` turns per-batch statistics into metric state without touching
Prometheus on the hot path; `collectors` build Prometheus families from that
state and read process, torch and NVML figures at scrape time; `memory`
measures a process's memory in use (what a leak grows, not allocator free lists); `process`
serves /metrics and maintains the file_sd discovery file; `reference` writes
docs/metrics.md from the catalogue, with `rowkeys` saying what a metrics.jsonl
row holds; `bands` reads the healthy ranges the catalogue's help text states;
`invariant_model` says what an invariant is; `invariants_actor`,
`invariants_learner` and `invariants_pipeline` list them by the part whose
data they read, `invariants` puts them in one list with the stages of a
learn step they belong to, `invariant_monitor` judges them per update, and
`attribution` says which Ray actors' batches broke one; `exported` holds what a
scrape reads of the learner's gauges to the values the run computed. `rule_model` says
what a health rule is and `rules` lists them (the invariants' among them);
`health` judges them on a run's rows.

May import: prometheus_client, psutil, numpy, torch, pynvml. Nothing else of
rlvitals: every other part may import telemetry, never the other way round.
"""
