"""Presets per env family: `rlvitals train --preset NAME`, `rlvitals presets [NAME]`, and the family hint.

A preset is one more layer of config values, under the config file and the flags (config.build_config): the
defaults, then the preset, then `--config FILE`, then flags. `rlvitals presets NAME` prints one as a config file
(field: value, its source as a comment), so what it shows can be saved, edited and passed to `--config`.

Which family an env belongs to is read from its registered spec (the module of its entry point), never from a
list of env ids, so every env gymnasium or ale-py registers in a family is recognised, and an env of the user's
own is recognised only where it says it lives in one of those modules.
"""

from __future__ import annotations

import yaml

from ..config_error import ConfigError
from ..config_yaml import ConfigDumper
from .catalogue import PRESETS, SOURCES
from .model import Preset, Setting

__all__ = ["PRESETS", "SOURCES", "Preset", "Setting", "family_hint", "family_preset", "listing", "preset_named",
           "preset_values", "show"]

DEFAULT_PRESET = "classic"
"""The preset whose values are TrainConfig's defaults: a run given no preset trains with it."""

COMMENT_COLUMN = 36
"""Where `rlvitals presets NAME` starts a value's source comment, so the values read as one column."""


def preset_named(name: str) -> Preset:
    """The preset called `name`; ConfigError naming it and the accepted names when there is none."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} is invalid: expected one of {', '.join(PRESETS)} "
                          "(`rlvitals presets` lists them), or none for the defaults")
    return PRESETS[name]


def preset_values(name: str | None) -> dict:
    """The layer of config values `name` sets; none for no name (None or empty)."""
    return preset_named(name).values() if name else {}


# ------------------------------------------------------------------------------------------- the env's family
def _entry_module(spec) -> str:
    """The module of a spec's entry point: `gymnasium.envs.mujoco.hopper_v5` for `...hopper_v5:HopperEnv`."""
    entry = spec.entry_point
    name = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
    return name.partition(":")[0]


def family_preset(env: str) -> Preset | None:
    """The preset of the family `env` belongs to, read from its registered spec; None when it belongs to none
    (or is not registered). A `module:EnvId` id imports its module first, as the run itself does."""
    import gymnasium as gym

    from rlvitals.actors.envs import EnvError, resolve_env_id

    try:
        spec = gym.spec(resolve_env_id(env))
    except (EnvError, gym.error.Error):
        return None
    module = _entry_module(spec)
    for preset in PRESETS.values():
        if any(module == root or module.startswith(root + ".") for root in preset.entry_modules):
            return preset
    return None


def family_hint(env: str) -> str | None:
    """The line for a run of `env` given neither a preset nor a config file, when its family has a preset other
    than the defaults': which preset fits it. None for an env the defaults are for, or of no known family."""
    preset = family_preset(env)
    if preset is None or preset.name == DEFAULT_PRESET:
        return None
    article = "an" if preset.family[0].lower() in "aeiou" else "a"
    return (f"{env} is {article} {preset.family} env: `--preset {preset.name}` has settings published for "
            f"{preset.family} envs ({preset.origin}); training with the classic-control defaults, tuned on "
            "CartPole-v1")


# --------------------------------------------------------------------------------------------- what is shown
def yaml_value(value) -> str:
    """A value on one line, as a config file would hold it (flow style: `[64, 64]`, `{key: 0.0}`)."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.dump(value, Dumper=ConfigDumper, default_flow_style=True, width=10_000)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def listing() -> str:
    """`rlvitals presets`: a header, then one line per preset: name, family, the envs it fits, its origin."""
    rows = [("preset", "family", "fits", "settings")]
    rows += [(p.name, p.family, p.fits, p.origin) for p in PRESETS.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[3]])
                     for row in rows)


def show(name: str) -> str:
    """`rlvitals presets NAME`: every field with its value and source, as a config file `--config` reads."""
    preset = preset_named(name)
    install = f"pip install '{preset.install}'" if preset.install else "built into gymnasium"
    lines = [f"# rlvitals preset {preset.name}: {preset.family} envs, {preset.fits}; {install}",
             f"# From {preset.origin}.",
             f"# rlvitals train --preset {preset.name} [--env ENV]; saved as a file, rlvitals train --config FILE.",
             "# A config file and flags override any field below.",
             f"preset: {preset.name}"]
    for field, setting in preset.settings.items():
        lines.append(f"{field}: {yaml_value(setting.value)}".ljust(COMMENT_COLUMN - 1) + f" # {setting.source}")
    lines.append("# Sources:")
    lines += [f"#   [{key}] {SOURCES[key]}" for key in preset.cited()]
    return "\n".join(lines)
