"""Ref inherits the actor: every `None` in `RefConfig` is filled from the actor (`parallel` from the
root), so the reference model cannot silently miss an actor setting (the 122B review bug: ref
without use_remove_padding and the bridge settings).

`load` resolves field by field: `ref.parallel.tp=4` keeps the other root parallel sizes, and
`ref.megatron.param_offload=true` keeps every other actor Megatron option (mappings merge by key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from grpo_config.build import build_section, field_types
from grpo_config.coerce import coerce
from grpo_config.errors import ConfigError
from grpo_config.schema import (
    TRAINING_ONLY_MEGATRON,
    MegatronConfig,
    RefConfig,
    RefMegatronConfig,
    TrainerConfig,
)

# RefConfig field -> where its default comes from (the actor, or the root for `parallel`).
INHERITED: Mapping[str, str] = {
    "model_path": "actor.model_path",
    "dtype": "actor.dtype",
    "use_remove_padding": "actor.use_remove_padding",
    "log_prob_micro_batch_size_per_device": "actor.log_prob_micro_batch_size_per_device",
    "log_prob_use_dynamic_bsz": "actor.log_prob_use_dynamic_bsz",
    "log_prob_max_token_len_per_device": "actor.log_prob_max_token_len_per_device",
    "parallel": "parallel",
    "megatron": "actor.megatron",
}

# Ref fields of its own: the torch backend's reference offload is not the actor's (verl's
# ref.fsdp_config.param_offload is independent of actor.fsdp_config.param_offload).
OWN = frozenset({"torch"})


# A ref field whose type is not its source's: the reference model's Megatron section is the
# actor's less what only training reads.
_AS_REF: Mapping[str, Any] = {"megatron": RefMegatronConfig.of_actor}


def _inherited(cfg: TrainerConfig, name: str) -> Any:
    """Ref field `name`'s value when unset: its source's (INHERITED), as the ref field's type."""
    node: Any = cfg
    for part in INHERITED[name].split("."):
        node = getattr(node, part)
    convert = _AS_REF.get(name)
    return convert(node) if convert else node


def resolve_ref(cfg: TrainerConfig) -> TrainerConfig:
    """`cfg` with every unset (`None`) ref field taken from the actor / root parallel."""
    filled = {
        name: _inherited(cfg, name) for name in INHERITED if getattr(cfg.ref, name) is None
    }
    return dataclasses.replace(cfg, ref=dataclasses.replace(cfg.ref, **filled)) if filled else cfg


def _deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _as_mapping(value: Any) -> Any:
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value  # coercion reports it with the key
        return parsed if isinstance(parsed, Mapping) else value
    return value


def build_ref(cfg: TrainerConfig, raw_ref: Mapping[str, Any]) -> TrainerConfig:
    """`cfg` with `ref` built from the user's partial `raw_ref`, sections merged onto the actor's."""
    raw = dict(raw_ref)
    if "megatron" in raw:
        raw["megatron"] = _drop_training_only(raw["megatron"], cfg.actor.megatron)
    for name in ("parallel", "megatron"):
        explicit = _as_mapping(raw.get(name))
        if isinstance(explicit, Mapping):
            raw[name] = _deep_merge(dataclasses.asdict(_inherited(cfg, name)), explicit)
    ref = build_section(RefConfig, raw, "ref")
    return resolve_ref(dataclasses.replace(cfg, ref=ref))


def _drop_training_only(megatron: Any, actor: MegatronConfig) -> Any:
    """`ref.megatron` without the settings only training reads: one equal to the actor's is what the
    reference is built with anyway (verl scripts often restate it); another is refused, one line."""
    given = _as_mapping(megatron)
    if not isinstance(given, Mapping):
        return megatron
    types = field_types(MegatronConfig)
    different = []
    for key in [k for k in TRAINING_ONLY_MEGATRON if k in given]:
        value = coerce(given[key], types[key], path=f"ref.megatron.{key}", build_section=build_section)
        if value != getattr(actor, key):
            different.append(f"ref.megatron.{key}={value}")
    if different:
        key = different[0].partition("=")[0]
        raise ConfigError(
            f"{', '.join(different)}: the reference model is frozen (no optimizer, no gradients, no backward "
            f"pass), so its section has no such setting. Set it on the actor ({key.replace('ref.', 'actor.', 1)}), "
            "or remove it.",
            key=key,
        )
    return {k: v for k, v in given.items() if k not in TRAINING_ONLY_MEGATRON}
