"""Device-specific code lives in grpo_device only.

Every `packages/*/src/**/*.py` and `packages/launchers/*/src/**/*.py` outside grpo_device is parsed
(`ast`, so comments and docstrings never count) and may not contain:
- the string literals "cuda" (also as "cuda:0"), "npu:1", "nccl", "hccl", or the visible-devices
  variable names CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES. A bare "npu" is allowed: like
  "gpu" and "cpu" it is the user-facing name of a device on the command line and in the launchers'
  per-device profiles, not a torch device string (those are built by `grpo_device.torch_device`);
- `torch.cuda` / `torch.npu` (any attribute chain through them), `import torch_npu`,
  `from torch import cuda`, `from torch.cuda import ...`, `.cuda()` / `.npu()` calls.
Use grpo_device instead: `DeviceKind`, `torch_device`, `current_device`, `set_device`,
`comm_backend`, `visible_devices_env`, `torch_device_module`, memory stats, RNG state, ...

One exemption: the `Literal[...]` of accepted device names in grpo_config's schema (`DeviceName`).
grpo_config may not import grpo_device (the layers contract puts them side by side), and a type
annotation cannot be built from `DeviceKind` at runtime and stay a `Literal` for type checkers and
for grpo_config's own type validation. Only that one node is exempt, nothing else in the file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE_PACKAGE = ROOT / "packages" / "device" / "src" / "grpo_device"
SOURCES = sorted(
    path
    for path in {*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("packages/launchers/*/src/**/*.py")}
    if not path.is_relative_to(DEVICE_PACKAGE)
)

DEVICE_STRING = re.compile(r"cuda(?::\d*)?|npu:\d*|nccl|hccl|CUDA_VISIBLE_DEVICES|ASCEND_RT_VISIBLE_DEVICES")
DEVICE_MODULES = {"cuda", "npu"}

EXEMPT_FILE = ROOT / "packages" / "config" / "src" / "grpo_config" / "schema.py"
EXEMPT_ALIAS = "DeviceName"


def _docstring_ids(tree: ast.AST) -> set[int]:
    """Bare string statements: module/class/function docstrings and attribute docstrings."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def exempt_node(tree: ast.AST) -> ast.AST | None:
    """`DeviceName = Literal[...]` in grpo_config's schema: its `Literal[...]` subscript."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and target.id == EXEMPT_ALIAS
            and isinstance(value, ast.Subscript)
            and isinstance(value.value, ast.Name)
            and value.value.id == "Literal"
        ):
            return value
    return None


def _is_torch_device_module(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in DEVICE_MODULES
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )


@dataclass(frozen=True)
class Finding:
    line: int
    what: str


def scan(source: str, *, exempt: ast.AST | None = None, tree: ast.AST | None = None) -> list[Finding]:
    tree = tree or ast.parse(source)
    skipped = _docstring_ids(tree)
    if exempt is not None:
        skipped |= {id(node) for node in ast.walk(exempt)}
    findings: list[tuple[int, int, Finding]] = []

    def found(node: ast.AST, what: str) -> None:
        findings.append((node.lineno, node.col_offset, Finding(node.lineno, what)))  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DEVICE_STRING.fullmatch(node.value):
            found(node, f"string literal {node.value!r}")
        elif _is_torch_device_module(node):
            found(node, f"torch.{node.attr}")  # type: ignore[attr-defined]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in DEVICE_MODULES
            and not _is_torch_device_module(node.func)
        ):
            found(node, f".{node.func.attr}() call")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch_npu" or alias.name.split(".")[:2] in (["torch", "cuda"], ["torch", "npu"]):
                    found(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            names = {alias.name for alias in node.names}
            if (
                parts[0] == "torch_npu"
                or parts[:2] in (["torch", "cuda"], ["torch", "npu"])
                or (node.module == "torch" and names & DEVICE_MODULES)
            ):
                found(node, f"from {node.module} import {', '.join(sorted(names))}")
    return [finding for _, _, finding in sorted(findings, key=lambda item: item[:2])]


def scan_file(path: Path) -> list[Finding]:
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    exempt = exempt_node(tree) if path == EXEMPT_FILE else None
    return scan(source, exempt=exempt, tree=tree)


def test_sources_are_found() -> None:
    relative = {path.relative_to(ROOT).as_posix() for path in SOURCES}
    assert "packages/trainer/src/grpo_trainer/backends/megatron/build.py" in relative
    assert "packages/ckpt/src/grpo_ckpt/rng.py" in relative
    assert not any(name.startswith("packages/device/") for name in relative)


@pytest.mark.parametrize("path", SOURCES, ids=[path.relative_to(ROOT).as_posix() for path in SOURCES])
def test_no_device_literals_outside_grpo_device(path: Path) -> None:
    findings = scan_file(path)
    where = path.relative_to(ROOT).as_posix()
    assert findings == [], "device-specific code outside grpo_device (use grpo_device):\n" + "\n".join(
        f"{where}:{finding.line}: {finding.what}" for finding in findings
    )


def test_the_exemption_is_exactly_the_device_name_literal() -> None:
    tree = ast.parse(EXEMPT_FILE.read_text())
    node = exempt_node(tree)
    assert node is not None, (
        f"{EXEMPT_FILE.relative_to(ROOT)} no longer has `{EXEMPT_ALIAS} = Literal[...]`: update the "
        "exemption in this test (or drop it)"
    )
    assert scan(EXEMPT_FILE.read_text(), tree=tree) != [], "the exempt node holds no device literal: drop it"
    sample = 'DeviceName = Literal["auto", "cuda", "npu", "cpu"]\nOTHER = Literal["cuda"]\n'
    sample_tree = ast.parse(sample)
    assert scan(sample, tree=sample_tree, exempt=exempt_node(sample_tree)) == [Finding(2, "string literal 'cuda'")]


def test_the_scan_ignores_comments_and_docstrings_but_not_code() -> None:
    source = '''
"""Module docstring mentioning "cuda" and torch.cuda.synchronize()."""
import torch  # torch.cuda would be wrong here
from torch.cuda import Stream
import torch_npu


def f(tensor):
    """Docstring: "npu"."""
    name = "cuda"
    other = f"cuda:{0}"
    tensor = tensor.cuda()
    torch.npu.synchronize()
    return torch.device("npu:1"), "hccl", "nccl", "gpu", "cpu", "CUDA_VISIBLE_DEVICES"
'''
    assert [(finding.line, finding.what) for finding in scan(source)] == [
        (4, "from torch.cuda import Stream"),
        (5, "import torch_npu"),
        (10, "string literal 'cuda'"),
        (11, "string literal 'cuda:'"),
        (12, ".cuda() call"),
        (13, "torch.npu"),
        (14, "string literal 'npu:1'"),
        (14, "string literal 'hccl'"),
        (14, "string literal 'nccl'"),
        (14, "string literal 'CUDA_VISIBLE_DEVICES'"),
    ]
