"""Tool calls read from a model's text, in the format of its chat template.

`qwen3_xml` (Qwen3.5's and Qwen3-Coder's templates; vLLM's `qwen3_coder` parser):
    <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
values are text, turned into the schema's type by `schema.coerce_arguments`.
`hermes` (Qwen2.5 / Qwen3 and verl's default `multi_turn.format`):
    <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
A block that does not parse is kept as a `ToolCall` with `error` set: the model is told what was
wrong with it (a counted bad call), the rest of its calls still run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

Format = Literal["qwen3_xml", "hermes"]
FORMATS: tuple[str, ...] = ("qwen3_xml", "hermes")

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the block could not be read; name may be empty then


def parse_tool_calls(text: str, fmt: Format) -> list[ToolCall]:
    """Every `<tool_call>` block of `text`, in order."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; known: {', '.join(FORMATS)}")
    read = _read_xml if fmt == "qwen3_xml" else _read_hermes
    return [read(match.group(1)) for match in _BLOCK.finditer(text)]


def _read_xml(body: str) -> ToolCall:
    match = _FUNCTION.match(body)
    if match is None:
        return ToolCall("", error="expected <function=NAME>...</function> inside <tool_call>")
    name, inner = match.group(1).strip(), match.group(2)
    arguments: dict[str, Any] = {}
    for key, value in _PARAMETER.findall(inner):
        key = key.strip()
        if key in arguments:
            return ToolCall(name, error=f"parameter {key!r} given twice")
        arguments[key] = value
    leftover = _PARAMETER.sub("", inner).strip()
    if leftover:
        return ToolCall(name, error=f"text outside <parameter=...> tags: {leftover[:80]!r}")
    return ToolCall(name, arguments)


def _read_hermes(body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the call is not JSON: {exc.msg} at character {exc.pos}")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall("", error='expected {"name": ..., "arguments": {...}}')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(value["name"], error="arguments is a string that is not JSON")
    if not isinstance(arguments, dict):
        return ToolCall(value["name"], error="arguments must be an object")
    return ToolCall(value["name"], arguments)
