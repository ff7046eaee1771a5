"""The `rlvitals train` parser: one option per config field, grouped, with its default and its docstring.

Everything comes from TrainConfig itself: the groups are its `# --- title ---` section comments,
the help text is each field's docstring, the default is the field's default. A boolean field is a
switch: `--sync` means true, `--no-sync` false, and `--sync VALUE` takes any spelling
`config.coerce` accepts (true/false, yes/no, on/off, 1/0).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
from typing import get_origin

from .config import MODES, VERBOSITY_LEVELS, TrainConfig, field_docs, field_types

ALIASES = {"num_envs": ["--envs-per-actor"]}
"""Second names for config flags, where another name reads better in a given mode."""

SECTION_MARKER = re.compile(r"^\s*# --- (?P<title>.+?) ---\s*$")
"""A section comment in the TrainConfig class body; the fields below it, up to the next one, are its section."""

DESCRIPTION = ("Every config field is an option, grouped as in rlvitals/config.py; a --config YAML file sets the same "
               "fields and options given beside it override the file; --preset NAME (`rlvitals presets` lists them) "
               "sets an env family's settings under both. Boolean options are switches: --sync means true, --no-sync "
               "false, and --sync false or --sync no work too.")


def field_sections(cls: type = TrainConfig) -> dict[str, list[str]]:
    """Section title -> its fields, in the class's order, from the `# --- title ---` comments of the class body."""
    source = inspect.getsource(cls)
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    field_line = {node.target.id: node.lineno for node in body
                  if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    markers = [(number, match["title"]) for number, line in enumerate(source.splitlines(), start=1)
               if (match := SECTION_MARKER.match(line))]
    sections: dict[str, list[str]] = {title: [] for _, title in markers}
    for f in dataclasses.fields(cls):
        above = [title for number, title in markers if number < field_line[f.name]]
        if not above:
            raise ValueError(f"{cls.__name__}.{f.name} stands above every `# --- section ---` comment: "
                             "put it under the section it belongs to")
        sections[above[-1]].append(f.name)
    return {title: names for title, names in sections.items() if names}


def shown_default(value) -> str:
    """A default as it would be typed on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if value == "":
        return "empty"
    return str(value)


class SwitchAction(argparse.Action):
    """A boolean field: `--name` alone is true, `--no-name` false, `--name VALUE` any spelling of true or false."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs):
        self.positive = list(option_strings)
        self.negative = ["--no-" + flag.removeprefix("--") for flag in option_strings]
        super().__init__(self.positive + self.negative, dest, nargs="?", const=None, **kwargs)  # None: no value

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.negative:
            if values is not None:
                parser.error(f"{option_string} takes no value: it means {self.positive[0]}=false; "
                             f"got {option_string} {values}")
            values = "false"
        setattr(namespace, self.dest, "true" if values is None else values)  # config.coerce reads the spelling


class TrainHelpFormatter(argparse.HelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, SwitchAction):  # `--sync [BOOL], --no-sync` rather than a value after both
            return ", ".join([f"{flag} [{action.metavar}]" for flag in action.positive] + action.negative)
        return super()._format_action_invocation(action)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field, in a group per section; help from the docstring, then the default.

    Every option's default is None, so what was given can be told from what was not (flags override a
    config file, and a resume accepts only some).
    """
    docs, types, defaults = field_docs(), field_types(), TrainConfig()
    for title, names in field_sections().items():
        group = parser.add_argument_group(title)
        for name in names:
            shown = shown_default(getattr(defaults, name))
            kwargs = {"dest": name, "default": None,
                      "help": f"{docs.get(name, '')} (default: {shown})".replace("%", "%%").lstrip()}
            if name == "verbosity":
                kwargs["choices"] = VERBOSITY_LEVELS
            if name == "mode":
                kwargs["choices"] = MODES
            if name == "preset":
                kwargs["metavar"] = "NAME"  # checked by the config, whose one line names the presets there are
            if types[name] is bool:
                kwargs.update(action=SwitchAction, metavar="BOOL")
            elif get_origin(types[name]) is dict:
                kwargs["metavar"] = "MAPPING"
            elif "choices" not in kwargs and "metavar" not in kwargs:
                kwargs["metavar"] = {int: "N", float: "X", float | None: "X"}.get(types[name], "VALUE")
            group.add_argument(_flag(name), *ALIASES.get(name, []), **kwargs)


def add_train_parser(sub) -> argparse.ArgumentParser:
    train = sub.add_parser("train", help="train an agent (local or Ray mode)", description=DESCRIPTION,
                           usage="%(prog)s [-h] [--preset NAME] [--config FILE | --resume RUN_DIR] [OPTION ...]",
                           formatter_class=TrainHelpFormatter)
    train.add_argument("--config", metavar="FILE", help="YAML file of config fields; flags override it")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue the run in RUN_DIR from its latest checkpoint (same run id, counters go on); "
                            "options that would make it a different run are refused unless they repeat its value")
    add_config_flags(train)
    return train
