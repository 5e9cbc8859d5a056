"""The GPU install follows the packages, and what a GPU session carries follows the lock.

requirements/gpu.lock is the product's GPU install (docs/INSTALL.md). A dependency a package declares
but the lock lacks fails at the user's first import on a GPU cluster while every CPU test stays green
(mathruler did, 2026-12-06): here each package's declared requirements, and those of the extras the
GPU install selects, must be pinned in the lock inside their declared range. bench/gpu_prepare.sh
carries to the lent GPU machine what bench/gpu_carry.py derives from the lock; here the derivation
must account for every locked package, carry everything the training path's packages declare, and
be what the script fetches."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_carry  # noqa: E402

PYPROJECTS = sorted([*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("packages/launchers/*/pyproject.toml")])
# Extras that are not part of the GPU install: each package's tests, and the Ascend stack.
NOT_GPU_EXTRAS = {"test", "npu"}
# The GPU machine: linux x86_64, CPython 3.12 (gpu.in's compile command).
GPU_ENV = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "python_version": "3.12", "python_full_version": "3.12.3",
           "implementation_name": "cpython"}
# Packages whose declared dependencies the training path imports: never left behind by the carry.
TRAINING_PATH = ("grpo-device", "grpo-config", "grpo-ckpt", "grpo-tiny", "grpo-trainer")


def _project(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text())["project"]


def _gpu_in_packages() -> dict[str, set[str]]:
    """gpu.in's `./packages/...[extras]` lines: folder -> extras."""
    lines = (ROOT / "requirements" / "gpu.in").read_text().splitlines()
    found = {}
    for line in lines:
        if match := re.match(r"^\./(packages/[\w/]+?)(?:\[([\w,\-]+)\])?\s*$", line.strip()):
            found[match[1]] = set(match[2].split(",")) if match[2] else set()
    return found


def _third_party(requirements: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if not r.name.startswith("grpo-") and (r.marker is None or r.marker.evaluate(GPU_ENV))]


def test_gpu_in_names_every_package_with_every_gpu_extra():
    listed = _gpu_in_packages()
    for pyproject in PYPROJECTS:
        folder = str(pyproject.parent.relative_to(ROOT))
        assert folder in listed, f"requirements/gpu.in does not list ./{folder}: its requirements miss the GPU lock"
        extras = set(_project(pyproject).get("optional-dependencies", {})) - NOT_GPU_EXTRAS
        assert listed[folder] == extras, (
            f"gpu.in lists ./{folder} with extras {sorted(listed[folder])}; the GPU install needs {sorted(extras)}"
        )


def _lock_problems(project: dict, lock: dict[str, gpu_carry.Locked]) -> list[str]:
    declared = list(project.get("dependencies", []))
    for extra, reqs in project.get("optional-dependencies", {}).items():
        if extra not in NOT_GPU_EXTRAS:
            declared += reqs
    problems = []
    for req in _third_party(declared):
        locked = lock.get(gpu_carry.normalise(req.name))
        if locked is None:
            problems.append(f"{req} is not in requirements/gpu.lock")
        elif not req.specifier.contains(locked.version, prereleases=True):
            problems.append(f"{req} is locked at {locked.version}, outside its range")
    return problems


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_declared_requirement_is_locked_inside_its_range(pyproject):
    project = _project(pyproject)
    problems = _lock_problems(project, gpu_carry.read_lock())
    assert not problems, f"{project['name']}: " + "; ".join(problems) + " (regenerate: requirements/gpu.in's header)"


def test_the_lock_check_catches_a_missing_and_an_out_of_range_pin(tmp_path):
    """The check above can fail: the lock as it was on 2026-12-06 (no mathruler, pylatexenc or
    wandb), and one pinning structlog below the trainer's range."""
    text = (ROOT / "requirements" / "gpu.lock").read_text()
    for name in ("mathruler", "pylatexenc", "wandb"):
        text = re.sub(rf"(?m)^{name}==.*\n(    #.*\n)*", "", text)
    (tmp_path / "gpu.lock").write_text(text.replace("\nstructlog==", "\nstructlog==23."))
    trainer = _project(ROOT / "packages" / "trainer" / "pyproject.toml")
    problems = _lock_problems(trainer, gpu_carry.read_lock(tmp_path / "gpu.lock"))
    assert problems == [
        "structlog>=24.1 is locked at 23.26.1.0, outside its range",
        "mathruler>=0.1.0 is not in requirements/gpu.lock",
        "pylatexenc>=2.10 is not in requirements/gpu.lock",
        "wandb is not in requirements/gpu.lock",
    ]


def test_the_carry_accounts_for_every_locked_package_once():
    plan = gpu_carry.plan()
    lock = gpu_carry.read_lock()
    classes = [set(plan.carried), set(plan.on_machine), set(plan.not_carried), set(plan.unreachable)]
    assert sum(map(len, classes)) == len(lock) and set().union(*classes) == set(lock)
    assert not plan.unreachable, f"locked but required by nothing gpu.in asks for: {sorted(plan.unreachable)}"
    assert all(version == lock[name].version for name, version in plan.carried.items())
    assert {"vllm", "ray", "megatron-core", "megatron-bridge", "mathruler", "pylatexenc"} <= set(plan.carried)


def test_what_the_training_path_declares_is_never_left_behind():
    plan = gpu_carry.plan()
    for pyproject in PYPROJECTS:
        project = _project(pyproject)
        if project["name"] in TRAINING_PATH:
            for req in _third_party(project.get("dependencies", [])):
                name = gpu_carry.normalise(req.name)
                assert name in plan.carried or name in plan.on_machine, (
                    f"{project['name']} declares {req.name}, which bench/gpu_carry.py does not carry: "
                    f"{plan.not_carried.get(name)}"
                )


def test_a_new_dependency_is_carried_and_a_stale_exclusion_refused():
    """A package gpu.in's roots start requiring is carried with its own requirements (unless the
    machine has them); a NOT_CARRIED name the lock no longer holds stops the plan."""
    lock = gpu_carry.read_lock()
    lock["newgrader"] = gpu_carry.Locked("1.0", frozenset({"grpo-trainer"}))
    lock["newgrader-core"] = gpu_carry.Locked("2.0", frozenset({"newgrader"}))
    lock["numpy"] = gpu_carry.Locked(lock["numpy"].version, lock["numpy"].required_by | {"newgrader"})
    plan = gpu_carry.plan(lock)
    assert plan.carried["newgrader"] == "1.0" and plan.carried["newgrader-core"] == "2.0"
    assert "numpy" in plan.on_machine
    del lock["wandb"]
    with pytest.raises(ValueError, match="wandb"):
        gpu_carry.plan(lock)


def test_gpu_prepare_fetches_exactly_the_plan():
    fetched = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_prepare.sh")], env={**os.environ, "DRY_RUN": "1"},
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")
    plan = gpu_carry.plan()
    expected = [f"fetch {plan.kind(name)} {name}=={version}" for name, version in plan.carried.items()]
    assert [line for line in fetched if line] == expected
    scripts = {name: (ROOT / "bench" / name).read_text() for name in ("gpu_prepare.sh", "gpu_session.sh")}
    folders = {name: re.findall(r"for d in ((?:\.\w+ ?)+); do", text) for name, text in scripts.items()}
    assert set(folders["gpu_prepare.sh"]) == {".vx1 .vx2 .whl .whl2 .whl3 .rayw"} == set(folders["gpu_session.sh"])


def _wheel(folder: Path, dist: str, module: str) -> None:
    """A minimal pure-Python wheel holding `module` (a dotted path under a shared top-level folder)."""
    import zipfile

    info = f"{dist}-1.0.dist-info"
    files = {
        f"{module.replace('.', '/')}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{dist}-1.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


def test_gpu_unpack_keeps_a_shared_top_level_folder_whole(tmp_path):
    """megatron-core and megatron-bridge both install into megatron/ and travel in different folders;
    `pip --target --upgrade` alone replaces the folder a first call installed (2026-12-07 on the GPU:
    `No module named 'megatron.core'`). Unpacked one folder a call, both halves must stay."""
    _wheel(tmp_path / ".whl2", "ns_core", "ns.core")
    _wheel(tmp_path / ".whl3", "ns_bridge", "ns.bridge")
    site = tmp_path / "site"
    env = {**os.environ, "SITE": str(site), "SITE_FLA": str(tmp_path / "fla"), "PYTHON": sys.executable}
    for folder in (".whl2", ".whl3"):
        subprocess.run(["bash", str(ROOT / "bench" / "gpu_unpack.sh"), str(tmp_path / folder)],
                       env=env, check=True, capture_output=True, text=True)
    assert sorted(p.name for p in (site / "ns").iterdir()) == ["bridge", "core"]
