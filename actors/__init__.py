"""Actors: everything that steps environments.

`envs` builds gymnasium vector envs (`env_contract`: autoreset mode set explicitly, `atari`: ALE ids), `probes`
registers the probe environments, `agents` holds the probe agents, `runner`
collects rollouts stamped with the network age that produced them, and
`rollout` defines what travels from actors to the learner. `witness` records raw env output below the
runner (`space_check` counts observations outside their space, `time_limit` probes each sub-env's TimeLimit);
`boundary`, `episode_witness` and `streams` judge, from it and the rollout, what the learner gets, the
episodes reported and the independence of the env streams; `inference_cost` times the policy network's bare
forward pass, the reference of the runner's inference phase, and `acting_check` reruns the network on stored
observations against the behaviour parameters recorded there.

May import: numpy, torch, gymnasium. Never telemetry, the learner or the
wiring in `rlvitals`: a rollout carries what the actors measured (episodes,
timings) and the wiring records it; a policy is handed in as an object with
`act(obs)` and `age` (and, for the cost reference, `forward(obs)`), so the same runner serves local and
Ray modes.
"""
