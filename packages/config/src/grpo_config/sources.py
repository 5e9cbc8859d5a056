"""Read the config source and the dotted overrides into one flat `{dotted key: value}` table.

Keys are mapped from verl-style aliases to ours on the way in, so the YAML file and the overrides
may use either spelling. Later overrides win; within one YAML file, one key set twice (for example
through an alias and its target) to different values is an error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from grpo_config.aliases import (
    ALIAS_ONLY_ROOTS,
    all_alias_keys,
    check_bridge_key,
    is_bridge_key,
    resolve_alias,
    special_settings,
)
from grpo_config.coerce import OverrideText, coerce
from grpo_config.errors import ConfigError

_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*")


def read_source(source: str | Path | Mapping[str, Any] | None) -> dict[str, Any]:
    """The top-level mapping of a YAML file, a mapping, or nothing."""
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"Config file '{path}' does not exist; pass the path of a YAML file.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"Config file '{path}' is not valid YAML{where}: {problem}.") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"Config file '{path}' must hold a mapping of keys to values at the top level, "
            f"not a {type(data).__name__}."
        )
    return dict(data)


def parse_override(text: str) -> tuple[str, OverrideText]:
    """`key=value` (hydra's `+key=value` / `++key=value` accepted) -> (key, raw value text)."""
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(
            f"Override {text!r} is not of the form dotted.key=value, e.g. 'actor.lr=1e-6' or "
            f"'checkpoint.strict=false'."
        )
    return key, OverrideText(value.strip())


def flatten(raw: Mapping[Any, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaves of a nested mapping as (dotted key, value); an empty mapping is a leaf."""
    for name, value in raw.items():
        if not isinstance(name, str):
            raise ConfigError(f"Config key {name!r} under '{prefix or '<top>'}' must be a string; quote it.")
        key = f"{prefix}.{name}" if prefix else name
        if isinstance(value, Mapping) and value:
            yield from flatten(value, key)
        else:
            yield key, value


class FlatConfig:
    """Dotted keys (already mapped to ours) -> values, plus how each key was written."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.written_as: dict[str, str] = {}

    def assign(self, key: str, value: Any, *, refuse_conflict: bool) -> None:
        if is_bridge_key(key):
            check_bridge_key(key, coerce(value, bool, path=key, build_section=_no_sections))
            return
        settings = special_settings(key, value)
        if settings is not None:
            for target, setting in settings:
                self.assign(target, setting, refuse_conflict=refuse_conflict)
            return
        target = resolve_alias(key) or key
        root = target.split(".", 1)[0]
        if root in ALIAS_ONLY_ROOTS:
            raise _unknown_alias(key)
        if refuse_conflict and target in self.values and self.values[target] != value:
            raise ConfigError(
                f"Config key '{target}' is set twice with different values: "
                f"{self.values[target]!r} (as '{self.written_as[target]}') and {value!r} (as '{key}'). "
                f"Keep one of them.",
                key=target,
            )
        self._clear_around(target)
        self.values[target] = value
        self.written_as[target] = key

    def _clear_around(self, target: str) -> None:
        """Make room for `target`: drop what it replaces, open up a mapping it goes into."""
        for existing in [k for k in self.values if k.startswith(target + ".")]:
            self._drop(existing)
        parts = target.split(".")
        for cut in range(1, len(parts)):
            ancestor = ".".join(parts[:cut])
            if ancestor not in self.values:
                continue
            value = self.values[ancestor]
            written = self.written_as[ancestor]
            self._drop(ancestor)
            if isinstance(value, str):
                try:
                    value = yaml.safe_load(value)
                except yaml.YAMLError:
                    continue
            if isinstance(value, Mapping):
                for child, child_value in flatten(value, ancestor):
                    self.values[child] = child_value
                    self.written_as[child] = written + child[len(ancestor) :]

    def _drop(self, key: str) -> None:
        del self.values[key]
        del self.written_as[key]

    def nested(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.values.items():
            node = out
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    def written_name(self, key: str) -> str | None:
        """How the user wrote `key` (or the section holding it), when that differs from `key`."""
        parts = key.split(".")
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in self.written_as:
                written = self.written_as[prefix] + key[len(prefix) :]
                return written if written != key else None
        return None


def collect(source: Mapping[str, Any], overrides: Sequence[str]) -> FlatConfig:
    if isinstance(overrides, str | bytes):
        raise ConfigError(
            f"overrides must be a list of 'key=value' strings, not one string ({overrides!r}); "
            f"wrap it in a list."
        )
    flat = FlatConfig()
    for key, value in flatten(source):
        flat.assign(key, value, refuse_conflict=True)
    for text in overrides:
        key, value = parse_override(text)
        flat.assign(key, value, refuse_conflict=False)
    return flat


def _close_alias(key: str) -> str | None:
    """A likely meant verl key: a close last part under the same parent (`ppo_micro_batch_size` ->
    `..._per_gpu`), else the same last part under a near-identical path. Whole keys share long
    prefixes, so comparing them loosely suggests unrelated keys (`trainer.balance_batch` ->
    `trainer.total_epochs`, `rollout.n_agent` -> `rollout.name`)."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in all_alias_keys() if k.rpartition(".")[0] == parent}
    longer = sorted(name for name in siblings if name.startswith(f"{leaf}_"))  # an old name: `x` -> `x_per_gpu`
    if longer:
        return siblings[longer[0]]
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.8)
    if close:
        return siblings[close[0]]
    same_leaf = [k for k in all_alias_keys() if k.rpartition(".")[2] == leaf]  # a typo in the path
    whole = difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.9)
    return whole[0] if whole else None


def _unknown_alias(key: str) -> ConfigError:
    close = _close_alias(key)
    hint = f" Did you mean '{close}'?" if close else ""
    return ConfigError(
        f"Unknown config key '{key}': it is not one of the verl-style keys grpo maps "
        f"(see grpo_config.aliases.ALIASES), and grpo_config has no such key.{hint}",
        key=key,
    )


def _no_sections(cls: type, raw: Mapping[str, Any], path: str) -> Any:
    raise AssertionError(f"no dataclass expected at {path}")
