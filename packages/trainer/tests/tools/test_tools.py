"""Tools the model calls (issue 45's groundwork): the sandbox's limits as this machine enforces them,
the two chat-template call formats, schemas from plain functions, and one call end to end. Real
subprocesses throughout; nothing here needs Ray or a model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Literal

import pytest

from grpo_trainer.tools.calls import ToolCall, parse_tool_calls
from grpo_trainer.tools.registry import BUILTIN, call_tool, load_function_tools
from grpo_trainer.tools.sandbox import Limits, enforced, run
from grpo_trainer.tools.schema import ToolDefinitionError, coerce_arguments, function_schema

FAST = Limits(timeout_s=5.0, memory_mb=512)


def python(code: str, limits: Limits = FAST):
    return run({"kind": "python", "source": textwrap.dedent(code)}, limits)


def test_printed_output_is_the_answer_and_an_exception_its_last_line() -> None:
    assert python("print(sum(range(10)))").text == "45"
    result = python("x = 1\nraise KeyError('nope')")
    assert (result.status, result.text) == ("error", "KeyError: 'nope'")


def test_a_hung_tool_is_killed_at_its_timeout_with_its_children() -> None:
    result = python(
        """
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("started", flush=True)
        time.sleep(60)
    """,
        Limits(timeout_s=1.5, memory_mb=512),
    )
    assert result.status == "timeout"
    assert result.seconds < 5
    assert "timed out after 1.5 s; output so far:\nstarted" in result.text


def test_memory_cpu_and_network_limits_hold_where_the_os_enforces_them() -> None:
    took = enforced()
    if not took["memory"]:
        pytest.skip("RLIMIT_AS is not enforced here")
    assert python("b = bytearray(2 * 1024**3)").text == "MemoryError: the tool's memory limit was reached"
    spin = python("while True: pass", Limits(timeout_s=20.0, cpu_s=1))
    assert spin.status == "error" and "CPU-time limit" in spin.text and spin.seconds < 10
    if took["network"]:
        # a network namespace of its own: not even the machine's loopback is there
        blocked = python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)")
        assert (blocked.status, blocked.text) == ("error", "OSError: [Errno 101] Network is unreachable")


def test_output_is_cut_at_its_budget_and_says_how_much_was_cut() -> None:
    result = python("print('x' * 5000)", Limits(timeout_s=5.0, max_output_bytes=100))
    assert result.truncated and result.text.startswith("x" * 100)
    assert result.text.endswith("[cut: 4901 more bytes]")


def test_the_trainers_environment_does_not_reach_the_tool(monkeypatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    assert python("import os; print(os.environ.get('WANDB_API_KEY'))").text == "None"


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        (
            "I will look.\n<tool_call>\n<function=calculator>\n<parameter=expression>\n(3 + 4) * 2\n</parameter>\n"
            "</function>\n</tool_call>",
            "qwen3_xml",
            [ToolCall("calculator", {"expression": "(3 + 4) * 2"})],
        ),
        (
            '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call> and '
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2**8\\"}"}</tool_call>',
            "hermes",
            [ToolCall("python", {"code": "print(1)"}), ToolCall("calculator", {"expression": "2**8"})],
        ),
        ("no call here", "hermes", []),
    ],
)
def test_tool_calls_are_read_in_the_templates_formats(text: str, fmt, expected: list[ToolCall]) -> None:
    assert parse_tool_calls(text, fmt) == expected


def test_a_malformed_block_is_a_call_with_its_error_beside_the_good_ones() -> None:
    text = '<tool_call>{"name": "python", "arguments": {</tool_call><tool_call>{"name": "x"}</tool_call>'
    bad, good = parse_tool_calls(text, "hermes")
    assert bad.error is not None and bad.error.startswith("the call is not JSON")
    assert good == ToolCall("x", {})
    (xml,) = parse_tool_calls(
        "<tool_call><function=f>stray<parameter=a>1</parameter></function></tool_call>", "qwen3_xml"
    )
    assert xml.name == "f" and "text outside <parameter=...> tags: 'stray'" in xml.error


def lookup(
    city: str, year: int, units: Literal["metric", "imperial"] = "metric", tags: list[str] | None = None
) -> str:
    """Look up a city's population.

    Args:
        city: the city's English name.
        year (int): a year from 1900 on.
    """
    return f"{city} {year} {units} {tags}"


def test_a_functions_schema_comes_from_its_signature_and_docstring() -> None:
    schema = function_schema(lookup)["function"]
    assert schema["description"] == "Look up a city's population."
    assert schema["parameters"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's English name."},
            "year": {"type": "integer", "description": "a year from 1900 on."},
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["city", "year"],
    }


def test_arguments_are_typed_from_text_and_wrong_ones_said() -> None:
    schema = function_schema(lookup)
    assert coerce_arguments(schema, {"city": "Oslo", "year": "1950", "tags": '["a"]'}) == {
        "city": "Oslo",
        "year": 1950,
        "tags": ["a"],
    }
    for arguments, message in [
        ({"city": "Oslo"}, "missing argument(s) year"),
        ({"city": "Oslo", "year": 1950, "country": "NO"}, "unknown argument(s) country"),
        ({"city": "Oslo", "year": "soon"}, "argument 'year' must be integer, got 'soon'"),
        ({"city": "Oslo", "year": 1950, "units": "kelvin"}, "must be one of ['metric', 'imperial']"),
    ]:
        with pytest.raises(
            ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
        ):
            coerce_arguments(schema, arguments)


def test_a_function_that_cannot_be_a_tool_is_refused_when_loaded(tmp_path: Path) -> None:
    def untyped(x):
        """Does x."""

    with pytest.raises(ToolDefinitionError, match="parameter 'x' has no type hint"):
        function_schema(untyped)
    path = tmp_path / "tools.py"
    path.write_text("def nodoc(x: int) -> int:\n    return x\n")
    with pytest.raises(ToolDefinitionError, match=r"tools.py: tool 'nodoc' has no docstring"):
        load_function_tools(path)


def test_calls_from_the_models_text_to_the_answer_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "my_tools.py"
    path.write_text(
        textwrap.dedent('''
        import json

        def population(city: str, year: int = 2020) -> dict:
            """A city's population in a year."""
            print("this goes nowhere the model reads")
            return {"city": city, "year": year, "people": 700000}
    ''')
    )
    tools = {**BUILTIN, **load_function_tools(path)}
    text = (
        "<tool_call>\n<function=population>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n2 ** 10 / 4\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n__import__('os')\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=search>\n</function>\n</tool_call>"
    )
    results = [call_tool(tools, call, FAST) for call in parse_tool_calls(text, "qwen3_xml")]
    population, power, escape, unknown = results
    assert population.status == "ok"
    assert json.loads(population.text.splitlines()[-1]) == {"city": "Oslo", "year": 2020, "people": 700000}
    assert (power.status, power.text) == ("ok", "256")
    assert escape.status == "error" and "not allowed in an expression" in escape.text
    assert unknown.status == "error" and unknown.text.startswith(
        "no tool named 'search'; the tools are calculator"
    )


def test_a_tool_that_cannot_start_is_an_error_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_trainer.tools import sandbox

    monkeypatch.setattr(sandbox, "_jail_command", lambda: ["/nonexistent/python-for-tools"])
    result = python("print(1)")
    assert result.status == "error" and result.text.startswith("the tool could not start: ")
