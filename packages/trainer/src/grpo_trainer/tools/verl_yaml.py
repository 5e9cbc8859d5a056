"""verl's tool YAML (`rollout.multi_turn.tool_config_path`): the entries whose tool class grpo runs
itself, under the YAML's names, schemas and limits.

verl instantiates each entry's `class_name`, a Python BaseTool subclass. grpo runs no verl code: it
takes the classes whose behaviour it has (`KNOWN`, both run code in grpo's sandbox as the `python`
tool does) and refuses any other by name, so a tool the model is told about answers as the YAML's
author expects. What each setting of an entry does here: docs/TOOLS.md."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from grpo_trainer.tools.registry import Tool
from grpo_trainer.tools.sandbox import Limits
from grpo_trainer.tools.schema import ToolDefinitionError

log = structlog.get_logger()

SANDBOX_FUSION = "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
RETOOL = "recipe.retool.retool.CustomSandboxFusionTool"

# verl's default schema of its code tool, used where an entry gives none.
_CODE_INTERPRETER = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}
# Settings of verl's sandbox-fusion service: grpo runs the code in a local subprocess instead
# (docs/TOOLS.md), so these have nothing to act on; they are logged, not applied.
_SERVICE_KEYS = ("sandbox_fusion_url", "num_workers", "enable_global_rate_limit", "rate_limit")
_LIMIT_KEYS = {"default_timeout": "timeout_s", "memory_limit_mb": "memory_mb"}
_MARKDOWN_PYTHON = re.compile(r"```python(.*?)```", re.DOTALL)


def load_verl_tools(path: str | Path, limits: Limits) -> dict[str, Tool]:
    """The tools of verl's tool YAML at `path`, by the names their schemas give; `limits` are the
    run's (rollout.multi_turn.tool_*), which an entry's default_timeout / memory_limit_mb replace for
    that tool. Raises ToolDefinitionError naming the file, the entry and what to change."""
    import yaml

    path = Path(path)
    where = f"tool_config_path {path}"
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ToolDefinitionError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ToolDefinitionError(f"{where}: is not YAML: {exc}") from exc
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolDefinitionError(
            f"{where}: has no `tools:` list (verl's format: tools: [{{class_name, config, tool_schema}}])"
        )
    tools: dict[str, Tool] = {}
    for index, entry in enumerate(entries):
        tool = _entry_tool(entry, limits, f"{where}, tools[{index}]")
        if tool.name in tools:
            raise ToolDefinitionError(f"{where}: two tools are named {tool.name!r}; each name must be unique")
        tools[tool.name] = tool
    return tools


def _entry_tool(entry: Any, limits: Limits, where: str) -> Tool:
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ToolDefinitionError(f"{where}: an entry needs class_name, config and tool_schema")
    unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
    if unknown:
        raise ToolDefinitionError(
            f"{where}: unknown key(s) {', '.join(unknown)} (verl reads class_name, config, tool_schema)"
        )
    cls = entry["class_name"]
    if cls not in KNOWN:
        raise ToolDefinitionError(
            f"{where}: class {cls} is a verl tool class grpo does not run (grpo runs no verl code; from a tool "
            f"YAML it runs {' and '.join(KNOWN)}, in its own sandbox). Write the tool as a plain Python "
            "function and give its file as rollout.multi_turn.function_tool_path (docs/TOOLS.md)."
        )
    if not isinstance(entry.get("config") or {}, dict):
        raise ToolDefinitionError(f"{where}: config must be a mapping (type: native, ...)")
    config = dict(entry.get("config") or {})
    if config.pop("type", None) != "native":
        raise ToolDefinitionError(f"{where}: config.type must be native (verl's only tool type)")
    language = config.pop("default_language", "python")
    if language != "python":
        raise ToolDefinitionError(f"{where}: default_language={language!r}: grpo's sandbox runs Python only")
    unused = {key: config.pop(key) for key in _SERVICE_KEYS if key in config}
    own = {_LIMIT_KEYS[key]: config.pop(key) for key in list(config) if key in _LIMIT_KEYS}
    if config:
        raise ToolDefinitionError(
            f"{where}: unknown config key(s) {', '.join(sorted(config))} for {cls}; grpo reads "
            f"{', '.join(['type', 'default_language', *_LIMIT_KEYS, *_SERVICE_KEYS])}"
        )
    schema = entry.get("tool_schema") or _CODE_INTERPRETER
    _check_code_schema(schema, where)
    if unused:
        log.info(
            "verl tool: runs in grpo's local sandbox, the service settings have nothing to act on",
            tool=schema["function"]["name"],
            settings=unused,
        )
    return Tool(schema, KNOWN[cls], limits=replace(limits, **own) if own else None)


def _check_code_schema(schema: Any, where: str) -> None:
    """A code tool's schema: a function whose one argument is `code`, a string."""
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or schema.get("type") != "function" or not function.get("name"):
        raise ToolDefinitionError(f"{where}: tool_schema needs type: function and function.name")
    parameters = function.get("parameters") or {}
    properties = (parameters.get("properties") if isinstance(parameters, dict) else None) or {}
    code = properties.get("code") if isinstance(properties, dict) else None
    if set(properties) != {"code"} or not isinstance(code, dict) or code.get("type") != "string":
        raise ToolDefinitionError(
            f"{where}: tool_schema of {function['name']} has parameters {sorted(properties)}; grpo's code tool "
            "takes one, `code` (a string)"
        )


def _run_code(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "python", "source": arguments["code"]}


def _retool_code(arguments: dict[str, Any]) -> dict[str, Any]:
    """verl's ReTool recipe: the code of a ```python block when the model wrote one, and its last
    line printed when it is an expression (ReTool wraps any last line, a statement too)."""
    code = arguments["code"]
    block = _MARKDOWN_PYTHON.search(code)
    if block:
        code = block.group(1).strip()
    lines = code.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=None)
    if last is not None and not lines[last].startswith((" ", "\t", "print")) and _is_expression(lines[last]):
        lines[last] = f"print({lines[last]})"
    return {"kind": "python", "source": "\n".join(lines)}


def _is_expression(line: str) -> bool:
    try:
        ast.parse(line, mode="eval")
    except SyntaxError:
        return False
    return True


KNOWN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    SANDBOX_FUSION: _run_code,
    RETOOL: _retool_code,
}
