"""verl's tool YAML (`rollout.multi_turn.tool_config_path`): the code tools grpo runs from it, under
the YAML's names, schemas and limits, and every entry it cannot run refused by name. Real sandbox
subprocesses; the YAML below is verl's ReTool recipe's (recipe/retool/sandbox_fusion_tool_config.yaml,
verl 5949586^) as a verl user points at it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from grpo_config.schema import MultiTurnConfig
from grpo_trainer.rollout.multi_turn import tools_of
from grpo_trainer.tools.calls import ToolCall
from grpo_trainer.tools.registry import call_tool
from grpo_trainer.tools.sandbox import Limits
from grpo_trainer.tools.schema import ToolDefinitionError
from grpo_trainer.tools.verl_yaml import load_verl_tools

RUN_LIMITS = Limits(timeout_s=20.0, memory_mb=2048)

RETOOL_YAML = """\
tools:
  - class_name: "recipe.retool.retool.CustomSandboxFusionTool"
    config:
      sandbox_fusion_url: "http://localhost:8080/run_code"
      num_workers: 128
      enable_global_rate_limit: true
      rate_limit: 128
      default_timeout: 1
      default_language: "python"
      memory_limit_mb: 1024
      type: native

    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""


def write(tmp_path: Path, text: str, name: str = "tools.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def code_call(tools, code: str):
    return call_tool(tools, ToolCall("code_interpreter", {"code": code}), RUN_LIMITS)


def test_retool_s_yaml_runs_its_code_tool_with_its_own_limits(tmp_path) -> None:
    tools = load_verl_tools(write(tmp_path, RETOOL_YAML), RUN_LIMITS)
    assert list(tools) == ["code_interpreter"]
    tool = tools["code_interpreter"]
    assert tool.schema["function"]["description"] == "A tool for executing code."
    assert (tool.limits.timeout_s, tool.limits.memory_mb) == (1, 1024)  # the entry's, not the run's
    # ReTool's reading of the code: the ```python block, its last line printed when an expression.
    assert code_call(tools, "Let me compute.\n```python\nx = 6 * 7\nx\n```").text == "42"
    assert code_call(tools, "print(1)\ny = 2").text == "1"  # a statement is left as it is
    assert code_call(tools, "for i in range(2):\n    i").text == ""  # an indented line too
    hung = code_call(tools, "while True: pass")
    assert hung.status == "timeout" and hung.seconds < 5  # default_timeout: 1, not the run's 20 s


def test_verl_s_sandbox_fusion_tool_without_a_schema_is_its_code_interpreter(tmp_path) -> None:
    path = write(
        tmp_path,
        """
        tools:
          - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
            config: {type: native}
        """,
    )
    tools = load_verl_tools(path, RUN_LIMITS)
    assert tools["code_interpreter"].limits is None  # the run's limits
    assert code_call(tools, "print(2 ** 10)").text == "1024"
    assert code_call(tools, "2 ** 10").text == ""  # verl's own class prints nothing it is not told to


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}",
            "class verl.tools.gsm8k_tool.Gsm8kTool is a verl tool class grpo does not run",
        ),
        (
            "class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config: {type: mcp}",
            "config.type must be native",
        ),
        (
            "class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n"
            "    config: {type: native, default_language: cpp}",
            "default_language='cpp': grpo's sandbox runs Python only",
        ),
        (
            "class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n"
            "    config: {type: native, run_timeout: 3}",
            "unknown config key(s) run_timeout",
        ),
        (
            "class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n"
            "    config: {type: native}\n"
            "    tool_schema: {type: function, function: {name: run, parameters: {properties: "
            "{code: {type: string}, language: {type: string}}}}}",
            "parameters ['code', 'language']",
        ),
        (
            "class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config: {type: native}\n"
            "    tool_schema: code_interpreter",
            "tool_schema needs type: function and function.name",
        ),
        (
            "class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config: [native]",
            "config must be a mapping",
        ),
    ],
    ids=["other-class", "type", "language", "config-key", "schema", "schema-not-a-mapping", "config-a-list"],
)
def test_an_entry_grpo_cannot_run_as_written_is_refused_by_file_and_index(tmp_path, entry, message) -> None:
    path = write(tmp_path, f"tools:\n  - {entry}\n")
    with pytest.raises(ToolDefinitionError) as error:
        load_verl_tools(path, RUN_LIMITS)
    assert str(error.value).startswith(f"tool_config_path {path}, tools[0]: ")
    assert message in str(error.value)


def test_an_unreadable_file_or_a_clash_of_names_is_refused(tmp_path) -> None:
    with pytest.raises(ToolDefinitionError, match="cannot be read"):
        load_verl_tools(tmp_path / "missing.yaml", RUN_LIMITS)
    with pytest.raises(ToolDefinitionError, match="has no `tools:` list"):
        load_verl_tools(write(tmp_path, "tool: []\n"), RUN_LIMITS)
    yaml_path = write(tmp_path, RETOOL_YAML)
    functions = write(
        tmp_path, "def code_interpreter(code: str) -> str:\n    '''Runs code.'''\n    return code\n", "f.py"
    )
    section = MultiTurnConfig(
        enable=True, tools=["python"], tool_config_path=str(yaml_path), function_tool_path=str(functions)
    )
    with pytest.raises(
        ToolDefinitionError,
        match=re.escape(
            f"function_tool_path {functions} defines code_interpreter, a tool name tool_config_path"
        ),
    ):
        tools_of(section)
    both = tools_of(MultiTurnConfig(enable=True, tools=["python"], tool_config_path=str(yaml_path)))
    assert sorted(both) == ["code_interpreter", "python"]
