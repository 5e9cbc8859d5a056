"""`--config FILE`: a run's settings in YAML, the format `from-verl` writes (grpo or verl-style keys,
nested) or a whole `--dry-run` output (its `config:` section is read; the other sections describe a
launch and are derived again). The file's settings go over the launcher profile's, the command
line's `key=value` overrides over the file's. A mistake in the file is reported at its line and
column."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_config.aliases import resolve_alias
from grpo_launch.errors import LaunchError

# The top-level keys of a `--dry-run` document; `config` holds the settings.
_DRY_RUN_SECTIONS = frozenset({"launch", "world", "memory_plan", "environment", "config"})


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    overrides: list[str]  # the file's leaves as `dotted.key=value`, in file order
    positions: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # dotted key -> (line, column), 1-based

    overridden: frozenset[str] = frozenset()  # keys the command line sets again

    def without(self, keys: set[str]) -> ConfigFile:
        """The same file, not blamed for `keys` (set again on the command line)."""
        overridden = frozenset(keys | {resolve_alias(k) or k for k in keys})
        return ConfigFile(
            path=self.path, overrides=self.overrides, positions=self.positions, overridden=overridden
        )

    def where(self, key: str | None) -> str | None:
        """`FILE:LINE:COLUMN` of `key` (or of the section that holds it) when the file sets it."""
        if key is None or key in self.overridden:
            return None
        parts = key.split(".")
        for cut in range(len(parts), 0, -1):
            position = self.positions.get(".".join(parts[:cut]))
            if position is not None:
                return f"{self.path}:{position[0]}:{position[1]}"
        return None

    def blame(self, exc: ValueError) -> str | None:
        """Where in the file the error comes from: its key's position, or for a problem between
        several settings, the position of each setting of the file the message names."""
        key = getattr(exc, "key", None)
        if key is not None:
            return self.where(key)
        text = str(exc)
        named = [k for k in self.overrides_keys() if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", text)]
        places = [f"{self.where(k)} ({k})" for k in named if self.where(k)]
        return ", ".join(places) or None

    def overrides_keys(self) -> list[str]:
        return [o.partition("=")[0] for o in self.overrides]


def read_config_file(path: Path) -> ConfigFile:
    """The settings of `path`, refused with a `LaunchError` naming the line when it is not a
    mapping of settings."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LaunchError(
            f"--config {path}: no such file. Write one with `hatch run from-verl SCRIPT > {path}` or save "
            "a `--dry-run` output."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchError(f"--config {path}: cannot be read ({exc}).") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise LaunchError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}.") from None
    if root is None:
        return ConfigFile(path=path, overrides=[])
    if not isinstance(root, yaml.MappingNode):
        raise LaunchError(f"{path}:1:1: --config takes a mapping of settings (key: value), not a {root.tag}.")
    top = {_scalar(k) for k, _ in root.value}
    if {"launch", "config"} <= top <= _DRY_RUN_SECTIONS:
        root = next(v for k, v in root.value if _scalar(k) == "config")
        if not isinstance(root, yaml.MappingNode):
            raise LaunchError(f"{path}: the dry-run document's `config:` is not a mapping.")
    out = ConfigFile(path=path, overrides=[])
    _leaves(root, "", out)
    return out


def _scalar(node: yaml.Node) -> Any:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _leaves(node: yaml.MappingNode, prefix: str, out: ConfigFile) -> None:
    for key_node, value_node in node.value:
        name = _scalar(key_node)
        line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
        if not isinstance(name, str) or not name:
            raise LaunchError(
                f"{out.path}:{line}:{column}: a setting's name must be a plain word, got {name!r}."
            )
        key = f"{prefix}.{name}" if prefix else name
        out.positions[key] = (line, column)
        target = resolve_alias(key)
        if target:
            out.positions.setdefault(target, (line, column))
        if isinstance(value_node, yaml.MappingNode) and value_node.value:
            _leaves(value_node, key, out)
            continue
        value = yaml.safe_load(yaml.serialize(value_node))
        out.overrides.append(f"{key}={_as_text(value)}")


def _as_text(value: Any) -> str:
    """`value` as override text that YAML reads back as the same value (strings that would read as
    numbers or booleans come quoted)."""
    dumped = yaml.safe_dump(value, default_flow_style=True, width=2**31 - 1)
    return dumped.strip().removesuffix("...").strip()
