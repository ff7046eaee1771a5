"""docs/presets.md, written from the presets themselves: `python -m rlvitals.presets` (--check: is it current?)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from . import PRESETS, SOURCES, family_hint, yaml_value

DEFAULT_OUTPUT = Path(str(resources.files("rlvitals.docs"))) / "presets.md"
"""docs/presets.md, found through the import system (the data package `rlvitals.docs`), checkout or wheel alike."""

INTRO = """\
# Presets

rlvitals's defaults are tuned on CartPole-v1. A preset is a complete set of learning settings for one family
of envs (published ones for MuJoCo, Atari and Box2D), each value with its source, applied with `--preset NAME`:

```bash
rlvitals presets                                    # one line per preset: family, envs it fits, where it comes from
rlvitals presets mujoco                             # every field: value and source, as a config file
rlvitals train --preset mujoco --env Hopper-v5      # the preset, then the flags
rlvitals train --preset mujoco --config my.yaml --learning-rate 1e-4
rlvitals presets mujoco > my.yaml                   # a starting point to edit; it sets `preset: mujoco` too
```

Values stack field by field: **flags > `--config` file > preset > defaults**. The preset is the flag's
`--preset` when one is given, else the config file's `preset:` field. A run's `config.yaml` records the preset
it started from (`preset: mujoco`; empty for none), so `rlvitals runs DIR --filter preset=mujoco` finds its
runs, and a run dir written before presets existed loads with no preset. `--resume` keeps the run's preset
(another one is refused, as any change that would make it a different run).

From Python, `rlvitals.train(preset="mujoco", env="Hopper-v5")` stacks the same way (keywords are the flags).
A `TrainConfig` passed in does not know which of its fields were given: those at their defaults take the
preset's values (`rlvitals.train(TrainConfig(preset="mujoco", env="Hopper-v5"))` trains with the preset), and a
field meant to keep its default value under a preset is passed as a keyword.

When a run's env belongs to a family with a preset of its own and neither `--preset` nor `--config` was
given, `rlvitals train` says so in one line on stderr before it trains:

```
rlvitals: HINT
```

None for a classic-control env (the defaults are its preset) or an env of no known family. The family is
read from the env's registered spec: the module of its entry point (`gymnasium.envs.mujoco`,
`gymnasium.envs.box2d`, `ale_py`, `gymnasium.envs.classic_control`), not from a list of env ids. A preset
name that does not exist is one line naming it and the presets there are, exit code 2, nothing written.

A preset sets the learning settings, the family's reference env and the published budget
(`total_env_steps`); never where or how the run goes (mode, Ray, telemetry, run directory).
The envs of a family install as an extra of rlvitals, named beside each preset below.

The MuJoCo preset steps one env, so a local run alternates between stepping it and learning. With two cores
or more, `--mode ray --num-actors 1` steps the env in an actor process while the learner learns: on this
project's 2-core machine 1.84x Stable-Baselines3's env steps per second on HalfCheetah-v5 with the same
settings, against 1.15x in one process (bench/README.md). The learning is then not quite the same: a rollout
may come from weights an update or two old (`rollouts_in_flight`), which the V-trace targets and PPO's ratio to
the stored behaviour probabilities correct; local mode stays serial and deterministic. How every preset does
against the published returns is in bench/README.md (`bench/baselines.py`).

This page is written by `python -m rlvitals.presets` from `rlvitals/presets/catalogue.py`; edit that, not this.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    out = [INTRO.replace("HINT", family_hint("HalfCheetah-v5") or ""),
           "| preset | family | fits | install | settings |", "| --- | --- | --- | --- | --- |"]
    for preset in PRESETS.values():
        install = f"`pip install '{preset.install}'`" if preset.install else "built into gymnasium"
        out.append(f"| [`{preset.name}`](#{preset.name}) | {preset.family} | {_cell(preset.fits)} | {install} | "
                   f"{_cell(preset.origin)} |")
    for preset in PRESETS.values():
        out += ["", f"## {preset.name}", "",
                f"{preset.family} envs: {preset.fits}. From {preset.origin}. "
                f"Envs whose entry point is in {', '.join(f'`{m}`' for m in preset.entry_modules)} belong here.",
                "", "| field | value | source |", "| --- | --- | --- |"]
        out += [f"| `{field}` | `{yaml_value(setting.value)}` | {_cell(setting.source)} |"
                for field, setting in preset.settings.items()]
    out += ["", "## Sources", ""]
    out += [f"- **[{key}]** {text}" for key, text in SOURCES.items()]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvitals.presets",
                                     description="Write docs/presets.md from the presets.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help=f"file to write (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    path, text = Path(args.output), render()
    if args.check:
        if (path.read_text() if path.is_file() else None) != text:
            print(f"{path} is stale: run `python -m rlvitals.presets` to regenerate it", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0
