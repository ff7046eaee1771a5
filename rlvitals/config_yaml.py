"""The YAML dialect of config files and --env-kwargs: no anchors or aliases, and YAML 1.2's scalar types."""

from __future__ import annotations

import re

import yaml


class AliasRefused(yaml.YAMLError):
    pass


def _yaml12_resolvers() -> dict:
    """SafeLoader's implicit types, with YAML 1.2's booleans and floats instead of YAML 1.1's.

    YAML 1.1 reads `off`, `no` and `on` as booleans (so `verbosity: off` became False) and wants a dot in
    a float (so `1e-3` stayed a string inside env_kwargs). Here only true/false are booleans, and 1e-3 is
    a number; the fields that take yes/no/on/off read those words themselves (coerce)."""
    bool_tag, float_tag = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
    table = {first: [(tag, rx) for tag, rx in entries if tag not in (bool_tag, float_tag)]
             for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    booleans = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
    floats = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
    for first in "tTfF":
        table.setdefault(first, []).append((bool_tag, booleans))
    for first in "-+.0123456789":
        table.setdefault(first, []).append((float_tag, floats))
    return table


class ConfigLoader(yaml.SafeLoader):
    """A safe loader that refuses anchors and aliases: a config needs none, and nested aliases expand
    exponentially ("billion laughs") when the value is later walked. Scalars are typed as YAML 1.2 types them."""

    yaml_implicit_resolvers = _yaml12_resolvers()

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None):
            mark = self.peek_event().start_mark
            raise AliasRefused(f"an anchor or alias at line {mark.line + 1}; expected plain field: value "
                                "pairs (anchors and aliases are not accepted)")
        return super().compose_node(parent, index)
