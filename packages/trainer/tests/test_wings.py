"""The trainer's shape (docs/ARCHITECTURE.md, "The trainer's wings"): no module imports another
wing's private names or modules, the top level stays small, and the step's module stays short.
The wings' layers themselves are import-linter's contract (`hatch run lint`)."""

from __future__ import annotations

import ast
from pathlib import Path

import grpo_trainer

SRC = Path(grpo_trainer.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private_imports(path: Path) -> list[str]:
    """`module: imported name` for each private name or module taken from another wing."""
    here = _module_name(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_trainer"):
            targets = [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [(alias.name, "") for alias in node.names if alias.name.startswith("grpo_trainer")]
        else:
            continue
        for module, name in targets:
            if _wing(module) == _wing(here):
                continue
            private = [part for part in [*module.split(".")[1:], name] if part.startswith("_") and part != "__version__"]
            if private:
                found.append(f"{here}: {module}{'.' + name if name else ''}")
    return found


def test_no_module_imports_a_sibling_wing_s_private_names() -> None:
    offenders = [hit for path in sorted(SRC.rglob("*.py")) for hit in _private_imports(path)]
    assert offenders == []


def test_the_check_sees_a_private_import_across_wings(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "grpo_trainer"
    (fake / "driver").mkdir(parents=True)
    module = fake / "driver" / "x.py"
    module.write_text("from grpo_trainer.rewards._worker import run\nfrom grpo_trainer.driver._own import y\n")
    monkeypatch.setattr(f"{__name__}.SRC", fake)
    assert _private_imports(module) == ["grpo_trainer.driver.x: grpo_trainer.rewards._worker.run"]


def test_the_top_level_holds_at_most_18_modules_and_the_step_450_lines() -> None:
    top = [p.name for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()]
    assert len(top) <= 18, sorted(top)
    assert len((SRC / "trainer.py").read_text().splitlines()) <= 450
