"""The one YAML loader of rlvitals: config files, --env-kwargs, and every run directory's config.yaml.

No anchors or aliases, no duplicate keys, at most NESTING_MAX levels of nesting, and YAML 1.2's scalar
types. A run directory may come from anyone: what it holds is refused in one line, never expanded.
"""

from __future__ import annotations

import re

import yaml

NESTING_MAX = 32
"""Levels of lists and mappings in a config value (env_kwargs): far beyond any constructor's needs, far below
Python's recursion limit, which every reader of a nested value would otherwise meet."""


class AliasRefused(yaml.YAMLError):
    """YAML this loader will not build: an anchor or alias, a duplicate key, or nesting too deep; one line."""


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
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None):
            raise AliasRefused(f"an anchor or alias at line {mark.line + 1}; expected plain field: value "
                                "pairs (anchors and aliases are not accepted)")
        self._depth = getattr(self, "_depth", 0) + 1
        try:  # composing recurses: bounded here, before Python's own limit ends it in a traceback
            if self._depth > NESTING_MAX:
                raise AliasRefused(f"lists and mappings nested more than {NESTING_MAX} levels deep at line "
                                   f"{mark.line + 1}; expected at most {NESTING_MAX}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class names it
                break
            if duplicate:
                raise AliasRefused(f"the key {key!r} appears twice (line {key_node.start_mark.line + 1}); "
                                   "expected each key once")
        return super().construct_mapping(node, deep)


class ConfigDumper(yaml.SafeDumper):
    """Writes config.yaml so that the loader above reads back the same values: a string that either YAML 1.1
    or 1.2 would type (`yes`, `1e-3`) is quoted."""

    yaml_implicit_resolvers = {first: yaml.SafeDumper.yaml_implicit_resolvers.get(first, [])
                               + ConfigLoader.yaml_implicit_resolvers.get(first, [])
                               for first in {*yaml.SafeDumper.yaml_implicit_resolvers,
                                             *ConfigLoader.yaml_implicit_resolvers}}


def dump_yaml(data) -> str:
    return yaml.dump(data, Dumper=ConfigDumper, sort_keys=True)


def parse_yaml(text: str):
    """`text` as the loader above reads it; AliasRefused or another yaml.YAMLError when it cannot."""
    return yaml.load(text, Loader=ConfigLoader)
