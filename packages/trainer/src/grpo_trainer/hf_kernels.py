"""CPU tensors take transformers' PyTorch path for the Gated DeltaNet kernels (Qwen3.5).

transformers < 5.20 binds `chunk_gated_delta_rule` & co. to flash-linear-attention's Triton kernels
whenever FLA imports, whatever the device; Triton has no CPU driver, so a Qwen3.5 forward on the CPU
fails ("0 active drivers") in an environment that holds FLA, as the one with megatron-core must
(its GatedDeltaNet does not build without FLA). Newer transformers checks the device itself.
`use_torch_kernels_on_cpu()` wraps each such function so that CPU inputs go to its PyTorch
reference and other devices keep the kernel transformers chose. Idempotent; a no-op where nothing
was bound to another implementation.

`segment_packed_sequences_on_cpu()` lets packed rows (`actor.use_remove_padding`: several sequences in
one row, their boundaries in `cu_seqlens` / `cu_seq_lens_q`) through the PyTorch causal convolution
and delta rules on the CPU, which otherwise would run across the boundaries: each sequence is run on
its own and the outputs joined.

`size_delta_rule_chunks_on_cpu()` then makes the PyTorch chunked delta rule's CPU calls that name no
`chunk_size` use `chunk_size_for(sequence length)` instead of its fixed 64-token chunk: the
generation prefill (transformers' `generate` refuses a `chunk_size` argument), and any other caller.
"""

from __future__ import annotations

import functools
import importlib
import itertools
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
_SIZED = "__grpo_sized_chunks__"
CHUNKED_RULE = "torch_chunk_gated_delta_rule"


def chunk_size_for(seq_len: int) -> int:
    """The delta rule's chunk for a sequence of `seq_len` tokens: the next power of two >= it, from 8
    to transformers' 64. The torch fallback pads every sequence to a multiple of its chunk; the same
    result (up to float rounding) for short sequences at a fraction of the cost (measured 2x on a
    whole fwd+bwd of the tiny model at 11 tokens, 3x on a 3-token generation prefill)."""
    chunk = 8
    while chunk < min(seq_len, 64):
        chunk *= 2
    return chunk


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


def _sized_on_cpu(rule: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(rule)
    def call(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if query.device.type == "cpu" and "chunk_size" not in kwargs:
            kwargs["chunk_size"] = chunk_size_for(query.shape[1])  # query: [batch, seq, heads, dim]
        return rule(query, *args, **kwargs)

    setattr(call, _SIZED, True)
    # Wrapped after the device dispatch (or over a rule that was never bound to a GPU kernel):
    # a later `use_torch_kernels_on_cpu` must not wrap it again around its reference.
    setattr(call, _MARK, True)
    return call


def size_delta_rule_chunks_on_cpu() -> list[str]:
    """Wrap the modules' chunked delta rule so that CPU calls without a `chunk_size` get
    `chunk_size_for(seq_len)`. Call after `use_torch_kernels_on_cpu` (this wrapper goes outside
    it). Returns the names wrapped by this call; idempotent."""
    wrapped: list[str] = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        rule = getattr(module, CHUNKED_RULE, None)
        if rule is None or getattr(rule, _SIZED, False):
            continue
        setattr(module, CHUNKED_RULE, _sized_on_cpu(rule))
        wrapped.append(f"{module_name}.{CHUNKED_RULE}")
    return wrapped


_SEGMENTED = "__grpo_segmented__"
CONV = "causal_conv1d_fn"
RECURRENT_RULE = "torch_recurrent_gated_delta_rule"
PACKED_KWARGS = ("cu_seqlens", "cu_seq_lens_q")


def _pop_boundaries(kwargs: dict[str, Any]) -> list[int] | None:
    found = [kwargs.pop(name) for name in PACKED_KWARGS if name in kwargs]
    found = [value for value in found if value is not None]
    return [int(x) for x in found[0].tolist()] if found else None


def _conv_by_segment(conv: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(conv)
    def call(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if hidden_states.device.type != "cpu":
            return conv(hidden_states, *args, **kwargs)
        bounds = _pop_boundaries(kwargs)
        if bounds is None:
            return conv(hidden_states, *args, **kwargs)
        # [1, channels, tokens]: the convolution's window starts afresh in each sequence
        parts = [conv(hidden_states[..., a:b], *args, **kwargs) for a, b in itertools.pairwise(bounds)]
        return torch.cat(parts, dim=-1)

    setattr(call, _SEGMENTED, True)
    setattr(call, _MARK, True)
    return call


def _rule_by_segment(rule: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(rule)
    def call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> Any:
        if query.device.type != "cpu":
            return rule(query, key, value, **kwargs)
        bounds = _pop_boundaries(kwargs)
        if bounds is None:
            return rule(query, key, value, **kwargs)
        # [1, tokens, heads, dim] (g, beta: [1, tokens, heads]); the state starts from each
        # sequence's own initial state (none: zeros) and each sequence's final state is returned.
        initial = kwargs.pop("initial_state", None)
        tokens = query.shape[1]
        outputs, states = [], []
        for index, (a, b) in enumerate(itertools.pairwise(bounds)):
            pieces = {
                name: v[:, a:b] if isinstance(v, torch.Tensor) and v.dim() > 1 and v.shape[1] == tokens else v
                for name, v in kwargs.items()
            }
            state = initial[index : index + 1] if initial is not None else None
            out, final = rule(query[:, a:b], key[:, a:b], value[:, a:b], initial_state=state, **pieces)
            outputs.append(out)
            states.append(final)
        final_states = torch.cat(states, dim=0) if all(s is not None for s in states) else None
        return torch.cat(outputs, dim=1), final_states

    setattr(call, _SEGMENTED, True)
    setattr(call, _MARK, True)
    return call


def segment_packed_sequences_on_cpu() -> list[str]:
    """Wrap the modules' causal convolution and delta rules so that CPU calls with packed rows
    (`cu_seqlens` or `cu_seq_lens_q`) run each sequence on its own. Call last (after
    `size_delta_rule_chunks_on_cpu`: each sequence then gets a chunk of its own size). Returns the
    names wrapped by this call; idempotent."""
    wrapped: list[str] = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, wrap in ((CONV, _conv_by_segment), (CHUNKED_RULE, _rule_by_segment), (RECURRENT_RULE, _rule_by_segment)):
            function = getattr(module, name, None)
            if function is None or getattr(function, _SEGMENTED, False):
                continue
            setattr(module, name, wrap(function))
            wrapped.append(f"{module_name}.{name}")
    return wrapped
