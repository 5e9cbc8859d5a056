"""Build the frozen dataclasses from nested mappings, refusing unknown keys with a suggestion."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from grpo_config.aliases import all_alias_keys
from grpo_config.coerce import coerce
from grpo_config.errors import ConfigError
from grpo_config.schema import TrainerConfig


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _section_type(tp: Any) -> type | None:
    """The dataclass behind a field type (`X` or `X | None`), if any."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if found else None
    return None


@functools.cache
def schema_keys(cls: type = TrainerConfig, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the schema, sections and leaves."""
    keys: list[str] = []
    for name, tp in field_types(cls).items():
        key = join(prefix, name)
        keys.append(key)
        section = _section_type(tp)
        if section is not None:
            keys.extend(schema_keys(section, key))
    return tuple(keys)


def unknown_key_error(path: str, name: str, siblings: list[str]) -> ConfigError:
    key = join(path, name)
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        guess = join(path, close[0])
    else:
        # The same name under a near-identical path (a typo in the path). Whole keys compared loosely
        # suggest the section the key is in, or a sibling sharing its prefix ('algorithm.gamma' ->
        # 'algorithm', 'algorithm.adv_eps').
        same_name = [k for k in (*schema_keys(), *all_alias_keys()) if k.rpartition(".")[2] == name]
        whole = difflib.get_close_matches(key, same_name, n=1, cutoff=0.8)
        guess = whole[0] if whole else None
    where = f"under '{path}'" if path else "at the top level"
    hint = f"Did you mean '{guess}'?" if guess else f"Valid keys {where}: {', '.join(siblings)}."
    return ConfigError(f"Unknown config key '{key}'. {hint}", key=key)


def build_section(cls: type, raw: Mapping[str, Any], path: str) -> Any:
    """An instance of dataclass `cls` from `raw`; missing keys keep their defaults."""
    types_by_name = field_types(cls)
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in types_by_name:
            raise unknown_key_error(path, str(name), list(types_by_name))
        kwargs[name] = coerce(value, types_by_name[name], path=join(path, name), build_section=build_section)
    return cls(**kwargs)
