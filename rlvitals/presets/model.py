"""What a preset is: a name, the env family it is for, and its settings, each value with the source it comes from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

CITATION = re.compile(r"\[([A-Za-z][\w. ]*)\]")
"""A source's key in brackets, `[CleanRL]`; a bracketed interval such as `[-1, 1]` is none."""


@dataclass(frozen=True)
class Setting:
    """One config field's value in a preset, and where that value comes from."""

    value: Any
    """The value, as a config file would hold it (a tuple for hidden_sizes, a dict for env_kwargs)."""
    source: str
    """Where the value comes from: `[KEY] what the source says`, KEY one of SOURCES' keys, so a reader can check it."""


@dataclass(frozen=True)
class Preset:
    """A complete set of learning settings for one env family, applied by `rlvitals train --preset NAME`."""

    name: str
    """What `--preset` takes."""
    family: str
    """The env family, as a person names it (`MuJoCo`, `classic control`)."""
    fits: str
    """The envs it is for, as examples; which envs belong to the family is read from their specs (entry_modules)."""
    origin: str
    """Where its settings come from as a whole, in a few words (the hint line and the listing show it)."""
    entry_modules: tuple[str, ...]
    """Modules whose envs belong to the family: an env belongs when its registered entry point is in one of these
    modules or below them (`gymnasium.envs.mujoco` holds `gymnasium.envs.mujoco.hopper_v5:HopperEnv`)."""
    install: str
    """The extra that installs the family's envs (`rlvitals[mujoco]`); empty when gymnasium has them built in."""
    settings: dict[str, Setting]
    """Config field -> its value and source, in the order TrainConfig lists the fields."""

    def values(self) -> dict[str, Any]:
        """The settings as a layer of config values (field -> value), the way build_config reads a config file."""
        return {name: setting.value for name, setting in self.settings.items()}

    def cited(self) -> list[str]:
        """The keys of SOURCES that its settings cite, in the order they first appear."""
        keys: list[str] = []
        for setting in self.settings.values():
            keys += [key for key in CITATION.findall(setting.source) if key not in keys]
        return keys
