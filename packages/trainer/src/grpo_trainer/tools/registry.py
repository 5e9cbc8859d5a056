"""The tools of a run by name, and one call from the model's text to its result.

Built in: `python` (runs code in the sandbox, its printed output is the answer) and `calculator`.
Custom tools: every public function of a Python file (verl's `function_tool_path`), loaded as
custom rewards are; each call imports the file again inside the sandbox, so a tool keeps no state
between calls. A call that cannot run (unknown tool, bad arguments, unreadable block) is answered
with what was wrong, as an error the model reads: it never stops the step."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_trainer.tools import calculator
from grpo_trainer.tools.calls import ToolCall
from grpo_trainer.tools.sandbox import Limits, ToolResult, run
from grpo_trainer.tools.schema import ToolDefinitionError, coerce_arguments, function_schema


@dataclass(frozen=True)
class Tool:
    schema: dict[str, Any]
    request: Callable[[dict[str, Any]], dict[str, Any]]  # typed arguments -> the sandbox's request
    limits: Limits | None = None  # this tool's own (a verl tool YAML's); None: the run's

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]


def _python(code: str) -> str:
    """Run Python code and return what it prints (stdout and stderr). Each call starts a fresh
    interpreter: nothing is kept between calls; print the values you need.

    Args:
        code: the program, e.g. "print(sum(range(10)))".
    """
    raise NotImplementedError  # the sandbox runs the code; this only carries the schema


def _file_call(path: Path, function: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda arguments: {
        "kind": "call",
        "module_path": str(path),
        "function": function,
        "arguments": arguments,
    }


BUILTIN: Mapping[str, Tool] = {
    "python": Tool(
        function_schema(_python, "python"), lambda arguments: {"kind": "python", "source": arguments["code"]}
    ),
    "calculator": Tool(
        function_schema(calculator.evaluate, "calculator"), _file_call(Path(calculator.__file__), "evaluate")
    ),
}


def load_function_tools(path: str | Path) -> dict[str, Tool]:
    """Every public function defined in the file at `path`, as a tool named after it. Raises
    ToolDefinitionError naming the file and the function that cannot be a tool."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ToolDefinitionError(f"function_tool_path: no file {path}")
    spec = importlib.util.spec_from_file_location(f"grpo_function_tools_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ToolDefinitionError(f"function_tool_path: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ToolDefinitionError(
            f"function_tool_path: {path} fails to import: {type(exc).__name__}: {exc}"
        ) from exc
    functions = [
        fn
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if not name.startswith("_") and fn.__module__ == module.__name__
    ]
    if not functions:
        raise ToolDefinitionError(f"function_tool_path: {path} defines no public function")
    tools = {}
    for fn in functions:
        try:
            tools[fn.__name__] = Tool(function_schema(fn), _file_call(path, fn.__name__))
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"function_tool_path {path}: {exc}") from exc
    return tools


def call_tool(tools: Mapping[str, Tool], call: ToolCall, limits: Limits) -> ToolResult:
    """The result the model reads for one call."""
    if call.error is not None:
        return ToolResult("error", f"could not read the tool call: {call.error}", 0.0)
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(
            "error", f"no tool named {call.name!r}; the tools are {', '.join(sorted(tools))}", 0.0
        )
    try:
        arguments = coerce_arguments(tool.schema, call.arguments)
    except ValueError as exc:
        return ToolResult("error", f"bad arguments for {call.name}: {exc}", 0.0)
    return run(tool.request(arguments), tool.limits or limits)
