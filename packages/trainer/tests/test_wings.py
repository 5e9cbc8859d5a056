"""The trainer's shape (docs/ARCHITECTURE.md, "The trainer's wings"): no module imports another
wing's private names or modules, the top level stays small, and the step's module stays short.
The wings' layers themselves are import-linter's contract (`hatch run lint`)."""

from __future__ import annotations

import ast
from pathlib import Path

import grpo_trainer
from grpo_config.schema import TrainerConfig

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


# Components built from the sections they read (`for_config` picks them from the root config once).
SECTION_BUILT = (
    "grpo_trainer.workers.actor:Actor",
    "grpo_trainer.workers.rollout_memory:RolloutMemory",
    "grpo_trainer.workers.rollout_memory:OffloadPlan",
    "grpo_trainer.backends.torch_backend:TorchBackend",
    "grpo_trainer.backends.megatron.backend:MegatronBackend",
    "grpo_trainer.algo.loss:GRPOLoss",
    "grpo_trainer.algo.lr_schedule:LRSchedule",
    "grpo_trainer.rollout.hf_engine:HFRolloutEngine",
    "grpo_trainer.rollout.vllm_engine:VLLMRolloutEngine",
)


def _root_config_parameters(cls: type) -> list[str]:
    """Parameters of `cls`'s constructor typed with the root `TrainerConfig`."""
    import inspect

    return [
        name
        for name, param in inspect.signature(cls.__init__).parameters.items()
        if "TrainerConfig" in str(param.annotation)
    ]


def test_components_are_built_from_their_own_config_sections() -> None:
    import importlib

    offenders = {}
    for spec in SECTION_BUILT:
        module, name = spec.split(":")
        if found := _root_config_parameters(getattr(importlib.import_module(module), name)):
            offenders[spec] = found
    assert offenders == {}


def test_the_section_check_sees_a_root_config_parameter() -> None:
    class Takes:
        def __init__(self, cfg: TrainerConfig, *, size: int) -> None: ...

    assert _root_config_parameters(Takes) == ["cfg"]
