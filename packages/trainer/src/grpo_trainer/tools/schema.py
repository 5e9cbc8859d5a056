"""A plain Python function as a tool: its JSON schema (OpenAI / chat-template `tools` form) from its
signature and docstring, and the model's arguments checked and typed against that schema before a
call. A parameter without a type hint, or of a type JSON cannot carry, is refused when the tool is
loaded, not when the model first calls it."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolDefinitionError(ValueError):
    """A function that cannot be offered to the model as a tool; the message says why."""


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is typing.Literal:
        values = typing.get_args(hint)
        return {"type": _SCALARS.get(type(values[0]), "string"), "enum": list(values)}
    if origin in (list, tuple) or hint in (list, tuple):
        args = typing.get_args(hint)
        return {"type": "array", **({"items": _json_type(args[0], where)} if args else {})}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return _json_type(inner[0], where)
    raise ToolDefinitionError(
        f"{where}: type {hint!r} has no JSON schema type (use str, int, float, bool, "
        "list, dict, Literal or Optional of one)"
    )


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and the `Args:` section's per-parameter text."""
    doc = inspect.cleandoc(doc or "")
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if section:
        for line in section.group(1).splitlines():
            if match := re.match(r"\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)", line):
                params[match.group(1)] = match.group(2).strip()
    return description, params


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """`{"type": "function", "function": {"name", "description", "parameters"}}` for `fn`."""
    name = name or fn.__name__
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {name!r}: its type hints do not resolve: {exc}") from exc
    description, documented = _docstring_parts(fn.__doc__ or "")
    if not description:
        raise ToolDefinitionError(
            f"tool {name!r} has no docstring: the model needs its first line to know what it does"
        )
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        where = f"tool {name!r}, parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(f"{where}: only named parameters can be given by the model")
        if param.name not in hints:
            raise ToolDefinitionError(f"{where} has no type hint: the JSON schema needs one")
        properties[param.name] = _json_type(hints[param.name], where)
        if param.name in documented:
            properties[param.name]["description"] = documented[param.name]
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def coerce_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` checked against the tool's schema and given its types (text values of the XML
    format become numbers, booleans, lists ...). Raises ValueError with what the model got wrong."""
    parameters = schema["function"]["parameters"]
    properties: dict[str, Any] = parameters["properties"]
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise ValueError(
            f"unknown argument(s) {', '.join(unknown)}; the tool takes {', '.join(properties) or 'none'}"
        )
    missing = [key for key in parameters["required"] if key not in arguments]
    if missing:
        raise ValueError(f"missing argument(s) {', '.join(missing)}")
    return {key: _coerce(properties[key], value, key) for key, value in arguments.items()}


def _coerce(prop: dict[str, Any], value: Any, key: str) -> Any:
    kind = prop.get("type")
    if isinstance(value, str) and kind != "string":
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if kind == "boolean" and value.strip().lower() in ("true", "false"):
                value = value.strip().lower() == "true"
    checks = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "array": list,
        "object": dict,
    }
    expected = checks.get(kind)
    if kind in ("number", "integer") and isinstance(value, bool):  # bool is an int to Python, not to JSON
        expected = ()
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if expected is not None and not isinstance(value, expected):
        raise ValueError(f"argument {key!r} must be {kind}, got {value!r}")
    if "enum" in prop and value not in prop["enum"]:
        raise ValueError(f"argument {key!r} must be one of {prop['enum']}, got {value!r}")
    return value
