"""Each package is versioned on its own: internal dependencies carry a version range (never a bare
name a registry could answer with somebody else's package), each range admits the version of that
package in this repository, each package's CHANGELOG.md starts at its current version, and its
README states the ranges it needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = sorted([*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("packages/launchers/*/pyproject.toml")])


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version(pyproject: Path) -> Version:
    """The version hatch reads (`[tool.hatch.version] path`)."""
    meta = tomllib.loads(pyproject.read_text())
    path = pyproject.parent / meta["tool"]["hatch"]["version"]["path"]
    (found,) = re.findall(r'^__version__ = "([^"]+)"$', path.read_text(), flags=re.M)
    return Version(found)


PROJECTS = {_normalise(tomllib.loads(p.read_text())["project"]["name"]): p for p in PYPROJECTS}
VERSIONS = {name: _version(path) for name, path in PROJECTS.items()}


def _internal_lines(pyproject: Path) -> list[str]:
    """The requirement lines, as written, that name a package of this repository."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = [*project.get("dependencies", []), *(x for extra in project.get("optional-dependencies", {}).values() for x in extra)]
    return [line for line in lines if _normalise(Requirement(line).name) in PROJECTS]


def _internal_requirements(pyproject: Path) -> list[Requirement]:
    return [Requirement(line) for line in _internal_lines(pyproject)]


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_internal_dependencies_have_a_range_that_admits_this_repository_s_version(name: str) -> None:
    requirements = _internal_requirements(PROJECTS[name])
    for req in requirements:
        assert str(req.specifier), f"{name} needs {req.name} with no version range: a registry could answer it"
        assert req.specifier.contains(VERSIONS[_normalise(req.name)], prereleases=True), (
            f"{name} needs {req}, which excludes {req.name} {VERSIONS[_normalise(req.name)]} of this repository"
        )
        upper = [s for s in req.specifier if s.operator in ("<", "<=", "==", "~=")]
        assert upper, f"{name} needs {req}: give it an upper bound (the next minor version of a 0.x package)"


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_each_package_has_a_changelog_at_its_version_and_a_readme_with_its_ranges(name: str) -> None:
    directory = PROJECTS[name].parent
    changelog = directory / "CHANGELOG.md"
    assert changelog.exists(), f"{changelog.relative_to(ROOT)} is missing"
    headings = re.findall(r"^## (\S+)", changelog.read_text(), flags=re.M)
    assert headings and Version(headings[0]) == VERSIONS[name], (
        f"{changelog.relative_to(ROOT)}: the newest entry is {headings[:1]}, the package is {VERSIONS[name]}"
    )
    readme = (directory / "README.md").read_text()
    assert f"{name} {VERSIONS[name]} (CHANGELOG.md)" in readme, (
        f"{directory.relative_to(ROOT)}/README.md does not state its version {VERSIONS[name]}"
    )
    for line in _internal_lines(PROJECTS[name]):
        assert f"`{line}`" in readme, f"{directory.relative_to(ROOT)}/README.md does not state `{line}`"
