"""Importing Megatron-Bridge lazily, with or without transformer_engine (grpo_ckpt's
`import_megatron_bridge` handles the one unguarded TE import of Megatron-Bridge 0.6)."""

from __future__ import annotations

import importlib.util
from typing import Any


class MegatronUnavailableError(ImportError):
    """megatron-core / Megatron-Bridge cannot be imported here."""


def megatron_available() -> bool:
    """True when megatron-core and Megatron-Bridge are installed (does not import them)."""
    return (
        importlib.util.find_spec("megatron") is not None
        and importlib.util.find_spec("megatron.bridge") is not None
    )


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def import_auto_bridge() -> Any:
    """Return `megatron.bridge.AutoBridge`."""
    if not megatron_available():
        raise MegatronUnavailableError(
            "actor.backend=megatron needs megatron-core and Megatron-Bridge; run inside the `megatron` "
            "hatch env (`hatch run megatron:...`) or `pip install --no-deps megatron-bridge==0.6.2 "
            "megatron-core==0.19.2` plus their import-time deps (see packages/ckpt/README.md)"
        )
    from grpo_ckpt import import_megatron_bridge

    return import_megatron_bridge().AutoBridge
