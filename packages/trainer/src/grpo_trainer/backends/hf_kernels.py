"""CPU tensors take transformers' PyTorch path for the Gated DeltaNet kernels (Qwen3.5).

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.hf_kernels`.
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


def _wrap_in_modules(names: tuple[str, ...], mark: str, wrap: Callable[[str, Callable[..., Any]], Any]) -> list[str]:
    """Replace each function `names` of the modules above that `mark` does not flag yet by
    `wrap(name, function)` (None: leave it); returns the names replaced."""
    wrapped: list[str] = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in names:
            function = getattr(module, name, None)
            if function is None or getattr(function, mark, False):
                continue
            replacement = wrap(name, function)
            if replacement is not None:
                setattr(module, name, replacement)
                wrapped.append(f"{module_name}.{name}")
    return wrapped


def use_torch_kernels_on_cpu() -> list[str]:
    """Wrap the functions of the modules above that have a PyTorch reference (`__wrapped__`);
    returns the names wrapped by this call."""

    def by_device(name: str, function: Callable[..., Any]) -> Callable[..., Any] | None:
        reference = getattr(function, "__wrapped__", None)
        return None if reference is None else _by_device(function, reference)

    return _wrap_in_modules(FUNCTIONS, _MARK, by_device)


_SEGMENTED = "__grpo_segmented__"
CONV = "causal_conv1d_fn"
RECURRENT_RULE = "torch_recurrent_gated_delta_rule"
PACKED_KWARGS = ("cu_seqlens", "cu_seq_lens_q")


def packed_boundaries(kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The sequence boundaries a packed call carries (the first of `PACKED_KWARGS` set), or None."""
    return next((kwargs[name] for name in PACKED_KWARGS if kwargs.get(name) is not None), None)


def _pop_boundaries(kwargs: dict[str, Any]) -> torch.Tensor | None:
    bounds = packed_boundaries(kwargs)
    for name in PACKED_KWARGS:
        kwargs.pop(name, None)
    return bounds


class _Layout:
    """Where each token of a packed row sits once its sequences are stacked as right-padded rows
    [sequences, longest]: the kernels then run one batched call instead of one per sequence."""

    def __init__(self, bounds: torch.Tensor, device: torch.device) -> None:
        bounds = bounds.to(device=device, dtype=torch.long)
        starts = bounds[:-1]
        lengths = bounds[1:] - starts
        self.count, self.longest = len(lengths), int(lengths.max())
        self.row = torch.repeat_interleave(torch.arange(self.count, device=device), lengths)
        self.column = torch.arange(int(bounds[-1]), device=device) - starts[self.row]

    def to_rows(self, packed: torch.Tensor, dim: int) -> torch.Tensor:
        """[1, ..., tokens (at dim), ...] -> [sequences, ..., longest, ...]; zeros after each sequence."""
        moved = packed.movedim(dim, 0)[:, 0]  # [tokens, ...]
        rows = moved.new_zeros((self.count, self.longest, *moved.shape[1:]))
        rows[self.row, self.column] = moved
        return rows.movedim(1, dim)

    def to_packed(self, rows: torch.Tensor, dim: int) -> torch.Tensor:
        return rows.movedim(dim, 1)[self.row, self.column].unsqueeze(0).movedim(1, dim)


def _by_segment(function: Callable[..., Any], run_stacked: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, but a CPU call with packed rows (`PACKED_KWARGS`) goes to
    `run_stacked(function, layout, first, *args, **kwargs)` with the boundaries taken out."""

    @functools.wraps(function)
    def call(first: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        bounds = _pop_boundaries(kwargs) if first.device.type == "cpu" else None
        if bounds is None:
            return function(first, *args, **kwargs)
        return run_stacked(function, _Layout(bounds, first.device), first, *args, **kwargs)

    setattr(call, _SEGMENTED, True)
    setattr(call, _MARK, True)
    return call


def _conv_stacked(conv: Callable[..., Any], layout: _Layout, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    # [1, channels, tokens]: each sequence in a row of its own, so the causal window starts
    # afresh in each (the zeros after a sequence only reach positions that are dropped).
    return layout.to_packed(conv(layout.to_rows(hidden_states, 2), *args, **kwargs), 2)


def _rule_stacked(
    rule: Callable[..., Any], layout: _Layout, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any
) -> Any:
    # [1, tokens, heads, dim] (g, beta: [1, tokens, heads]) -> one row per sequence. After a
    # sequence's end key = 0, beta = 0 and g = 0 leave its state as it was (no decay, no
    # write), so each row's final state is its sequence's; initial states are per sequence.
    tokens = query.shape[1]
    rows = {
        name: layout.to_rows(v, 1) if isinstance(v, torch.Tensor) and v.dim() > 1 and v.shape[1] == tokens else v
        for name, v in kwargs.items()
    }
    out, final = rule(layout.to_rows(query, 1), layout.to_rows(key, 1), layout.to_rows(value, 1), **rows)
    return layout.to_packed(out, 1), final


def segment_packed_sequences_on_cpu() -> list[str]:
    """Wrap the modules' causal convolution and delta rules so that CPU calls with packed rows
    (`cu_seqlens` or `cu_seq_lens_q`) keep the sequences apart. Call last (after
    `hf_cpu_kernels.use_own_cpu_kernels`, whose delta rule then sizes its chunk to the longest
    sequence). Returns the names wrapped by this call; idempotent."""
    return _wrap_in_modules(
        (CONV, CHUNKED_RULE, RECURRENT_RULE),
        _SEGMENTED,
        lambda name, function: _by_segment(function, _conv_stacked if name == CONV else _rule_stacked),
    )


_PACKED_SDPA = "__grpo_packed_sdpa__"


def _packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor, **kwargs: Any) -> Any:
    """SDPA attention for one packed row ([1, heads, tokens, dim], boundaries `bounds`): the
    sequences stacked as right-padded rows and attended causally in one batched call, so no
    [tokens, tokens] mask is built and no sequence sees another."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = _Layout(bounds, query.device)
    rows = [layout.to_rows(t, 2) for t in (query, key, value)]
    out, weights = sdpa_attention_forward(module, *rows, None, **kwargs)
    return layout.to_packed(out, 1), weights  # out: [sequences, longest, heads, dim]


def use_packed_sdpa() -> bool:
    """transformers' "sdpa" attention, extended: a call that carries sequence boundaries
    (`cu_seq_lens_q`, one packed row, no mask) runs `_packed_sdpa`; every other call is the stock
    function. transformers' own SDPA ignores the boundaries and would attend across sequences.
    Decided per call (not by switching the model's attention), so a recompute under activation
    checkpointing takes the same path. Returns False when installed already."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    current = AttentionInterface._global_mapping["sdpa"]
    if getattr(current, _PACKED_SDPA, False):
        return False

    @functools.wraps(sdpa_attention_forward)
    def sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        bounds = kwargs.get("cu_seq_lens_q")
        if bounds is None or attention_mask is not None or query.shape[0] != 1:
            return current(module, query, key, value, attention_mask, *args, **kwargs)
        for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            kwargs.pop(name, None)
        if args:
            raise TypeError(f"packed SDPA takes its options by keyword, got {len(args)} positional")
        return _packed_sdpa(module, query, key, value, bounds, **kwargs)

    setattr(sdpa, _PACKED_SDPA, True)
    AttentionInterface.register("sdpa", sdpa)
    return True
