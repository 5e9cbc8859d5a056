"""Turn YAML values and override strings into values of a dataclass field's declared type.

A value given as text (an override, or a quoted YAML scalar such as PyYAML's `1e-6`, which YAML 1.1
reads as a string) is parsed according to the field type; a value that already has a YAML type is
type-checked. Nested dataclasses are built by `grpo_config.build`, passed in as `build_section`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

import yaml

from grpo_config.errors import ConfigError

_TRUE = frozenset({"true", "1", "yes", "y", "on"})
_FALSE = frozenset({"false", "0", "no", "n", "off"})
_NULL = frozenset({"null", "none", "~"})

BuildSection = Callable[[type, Mapping[str, Any], str], Any]


class OverrideText(str):
    """The raw text right of `=` in a dotted override (an untyped field parses it as YAML)."""


def _unquoted(value: Any) -> Any:
    """Hydra's quoted string: an override's text wholly in matching quotes is the text inside them
    (`key=\\"none\\"` in a shell script reaches Hydra, and us, as `"none"`)."""
    if isinstance(value, OverrideText) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return OverrideText(value[1:-1])
    return value


def type_name(tp: Any) -> str:
    """A short human name for a field type, used in error messages."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        names = " or ".join(type_name(a) for a in arms)
        return f"{names} or null" if len(arms) < len(typing.get_args(tp)) else names
    if origin is list:
        (item,) = typing.get_args(tp)
        return f"a list of {type_name(item)}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__} section)"
    return getattr(tp, "__name__", str(tp))


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})" if not isinstance(value, OverrideText) else repr(str(value))


def _wrong_type(value: Any, tp: Any, path: str, hint: str = "") -> ConfigError:
    return ConfigError(
        f"Config key '{path}' has value {_shown(value)} but expects {type_name(tp)}.{hint}", key=path
    )


def _parse_yaml_text(text: str, tp: Any, path: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(
            f"Config key '{path}' has value {text!r}, which is not valid YAML ({problem}); "
            f"it expects {type_name(tp)}, e.g. '[a, b]' for a list or '{{k: v}}' for a mapping.",
            key=path,
        ) from None


def coerce(value: Any, tp: Any, *, path: str, build_section: BuildSection) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return _untyped(value, path)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, path=path, build_section=build_section)
    if origin is Literal:
        return _coerce_literal(value, tp, path=path)
    if origin is list:
        return _coerce_list(value, tp, path=path, build_section=build_section)
    if origin is dict:
        return _coerce_dict(value, tp, path=path, build_section=build_section)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, str):
            value = _parse_yaml_text(value, tp, path)
        if not isinstance(value, Mapping):
            raise _wrong_type(value, tp, path)
        return build_section(tp, value, path)
    if tp is bool:
        return _coerce_bool(value, path=path)
    if tp is int:
        return _coerce_int(value, path=path)
    if tp is float:
        return _coerce_float(value, path=path)
    if tp is str:
        value = _unquoted(value)
        if isinstance(value, str):
            return str(value)
        raise _wrong_type(value, tp, path, " Quote it in YAML to make it a string.")
    raise AssertionError(f"grpo_config: unsupported field type {tp!r} at {path}")


def _untyped(value: Any, path: str) -> Any:
    """An untyped value as Hydra gives it: override text parsed as YAML, also where a dotted
    override put it inside a mapping (`engine_kwargs.vllm.x=8` gives the int 8, not the text)."""
    if isinstance(value, OverrideText):
        return _parse_yaml_text(value, Any, path)
    if isinstance(value, Mapping):
        return {key: _untyped(item, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_untyped(item, f"{path}[{i}]") for i, item in enumerate(value)]
    return value


def _coerce_union(value: Any, tp: Any, *, path: str, build_section: BuildSection) -> Any:
    arms = typing.get_args(tp)
    if type(None) in arms and (value is None or (isinstance(value, str) and value.lower() in _NULL)):
        return None
    last_error: ConfigError | None = None
    for arm in arms:
        if arm is type(None):
            continue
        try:
            return coerce(value, arm, path=path, build_section=build_section)
        except ConfigError as exc:
            # A problem inside a nested section is the real error; a mismatch of this arm is not.
            if exc.key != path:
                raise
            last_error = exc
    assert last_error is not None
    if len(arms) == 2 and typing.get_origin(arms[0]) is Literal:
        raise ConfigError(f"{last_error} Use null to leave it unset.", key=path)
    raise _wrong_type(value, tp, path)


def _coerce_literal(value: Any, tp: Any, *, path: str) -> Any:
    allowed = typing.get_args(tp)
    value = _unquoted(value)
    for option in allowed:
        same_kind = type(value) is type(option) or (isinstance(value, str) and isinstance(option, str))
        if same_kind and value == option:
            return option
    raise ConfigError(
        f"Config key '{path}' has value {_shown(value)}, which is not allowed; "
        f"allowed values: {', '.join(repr(a) for a in allowed)}.",
        key=path,
    )


def _coerce_list(value: Any, tp: Any, *, path: str, build_section: BuildSection) -> list[Any]:
    (item_type,) = typing.get_args(tp)
    if isinstance(value, str):
        # "[a, b]" is YAML flow; a bare scalar is a one-element list (`data.train_files=/x.parquet`).
        value = _parse_yaml_text(value, tp, path) if value.lstrip().startswith("[") else [value]
    if not isinstance(value, list | tuple):
        raise _wrong_type(value, tp, path, " Write it as '[a, b]'.")
    return [
        coerce(item, item_type, path=f"{path}[{i}]", build_section=build_section)
        for i, item in enumerate(value)
    ]


def _coerce_dict(value: Any, tp: Any, *, path: str, build_section: BuildSection) -> dict[str, Any]:
    key_type, value_type = typing.get_args(tp)
    assert key_type is str, f"grpo_config: only str-keyed mappings are supported ({path})"
    if isinstance(value, str):
        value = _parse_yaml_text(value, tp, path)
    if not isinstance(value, Mapping):
        raise _wrong_type(value, tp, path, " Write it as '{key: value}'.")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ConfigError(f"Config key '{path}' has a non-string key {key!r}; quote it.", key=path)
        out[key] = coerce(item, value_type, path=f"{path}.{key}", build_section=build_section)
    return out


def _coerce_bool(value: Any, *, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise _wrong_type(value, bool, path, " Use true or false.")


def _coerce_int(value: Any, *, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    raise _wrong_type(value, int, path, " Use a whole number such as 8.")


def _coerce_float(value: Any, *, path: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    # "0.5_2" is no number here (Python and YAML read 0.52): a `float | str` setting takes it as text,
    # e.g. IcePop's "lower_upper" band.
    if isinstance(value, str) and "_" not in value:
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise _wrong_type(value, float, path, " Use a number such as 0.5 or 1e-6.")
