"""CPU tensors take transformers' PyTorch path for the Gated DeltaNet kernels (Qwen3.5).

transformers < 5.20 binds `chunk_gated_delta_rule` & co. to flash-linear-attention's Triton kernels
whenever FLA imports, whatever the device; Triton has no CPU driver, so a Qwen3.5 forward on the CPU
fails ("0 active drivers") in an environment that holds FLA, as the one with megatron-core must
(its GatedDeltaNet does not build without FLA). Newer transformers checks the device itself.
`use_torch_kernels_on_cpu()` wraps each such function so that CPU inputs go to its PyTorch
reference and other devices keep the kernel transformers chose. Idempotent; a no-op where nothing
was bound to another implementation.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

MODULES = (
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_next.modeling_qwen3_next",
)
FUNCTIONS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)
_MARK = "__grpo_torch_on_cpu__"


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    return next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)


def _by_device(chosen: Callable[..., Any], reference: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(chosen)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        tensor = _first_tensor(args, kwargs)
        if tensor is not None and tensor.device.type == "cpu":
            if kwargs.get("cu_seqlens") is not None:
                raise ValueError(
                    "packed sequences on the CPU: the PyTorch Gated DeltaNet path cannot keep them apart"
                )
            return reference(*args, **kwargs)
        return chosen(*args, **kwargs)

    setattr(dispatch, _MARK, True)
    dispatch.__wrapped__ = reference  # type: ignore[attr-defined]  # as transformers' own wrapper
    return dispatch


def use_torch_kernels_on_cpu() -> list[str]:
    """Wrap the functions of the modules above that have a PyTorch reference (`__wrapped__`);
    returns the names wrapped by this call."""
    wrapped: list[str] = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in FUNCTIONS:
            function = getattr(module, name, None)
            reference = getattr(function, "__wrapped__", None)
            if function is None or reference is None or getattr(function, _MARK, False):
                continue
            setattr(module, name, _by_device(function, reference))
            wrapped.append(f"{module_name}.{name}")
    return wrapped
