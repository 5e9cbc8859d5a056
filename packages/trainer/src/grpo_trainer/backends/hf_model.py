"""Loading a Hugging Face causal LM for training or rollout, and computing token log-probs."""

from __future__ import annotations

import contextlib

import structlog
import torch

from grpo_trainer.algo.grpo_math import entropy_from_logits

log = structlog.get_logger()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Rows of logits per entropy chunk under actor.entropy_from_logits_with_chunking (verl's 2048).
ENTROPY_CHUNK_ROWS = 2048


def load_causal_lm(
    path: str, *, device: torch.device, trust_remote_code: bool = False, parked: bool = False
) -> torch.nn.Module:
    """Float32 weights (the optimiser's master copy; lower precision comes from autocast) on
    `device` (with `parked`, left on the CPU, kernels chosen for `device`). A vision-language checkpoint (a `vision_config`, as Qwen3.5's) loads whole, vision
    tower included (`AutoModelForImageTextToText`). On CPU, MoE experts run as a loop over the hit
    experts ("eager"): measured 2-3x faster than transformers' grouped GEMM for small models
    when chosen (an earlier environment); with torch 2.13 the grouped GEMM is at par or ahead on
    the tiny model (docs/benchmarks.md, "GRPO trainer"), a switch not made yet."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from grpo_trainer.backends.hf_cpu_kernels import use_own_cpu_kernels
    from grpo_trainer.backends.hf_kernels import (
        segment_packed_sequences_on_cpu,
        use_packed_sdpa,
        use_torch_kernels_on_cpu,
    )

    use_torch_kernels_on_cpu()
    use_own_cpu_kernels()  # the convolution and delta rules (chunk sized to the sequence, generation too)
    segment_packed_sequences_on_cpu()  # actor.use_remove_padding
    use_packed_sdpa()  # likewise
    if not path:
        raise ValueError("actor.model_path is empty: set it to a Hugging Face model directory or hub id")
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    if device.type == "cpu":
        with contextlib.suppress(ValueError, AttributeError):  # models without switchable experts
            model.set_experts_implementation("eager")
    return model if parked else model.to(device)


def linear_attention_kwargs(model: torch.nn.Module, seq_len: int) -> dict[str, int]:
    """Forward kwargs for models with Gated DeltaNet layers (Qwen3.5, Qwen3-Next): transformers'
    torch fallback pads every sequence to its 64-token chunk; a chunk of the next power of two
    >= `seq_len` gives the same result (up to float rounding) for short sequences at a fraction of
    the cost (measured 2x on a whole fwd+bwd of the tiny model at 11 tokens). {} for other models."""
    from grpo_trainer.backends.hf_kernels import chunk_size_for

    config = getattr(model, "config", None)
    if "linear_attention" not in (getattr(config, "layer_types", None) or ()):
        return {}
    return {"chunk_size": chunk_size_for(seq_len)}


def autocast_context(device: torch.device, dtype_name: str) -> contextlib.AbstractContextManager:
    dtype = DTYPES[dtype_name]
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def token_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    with_entropy: bool,
    entropy_grad: bool = True,
    vision: dict[str, torch.Tensor] | None = None,
    packed: bool = False,
    entropy_chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t] | input_ids[:, :t]) at position t, shape [B, T], and the entropy of
    the distribution that predicted position t, same layout; 0 at position 0 and on padding.
    Without `entropy_grad` the entropy is computed outside autograd (no [B, T, vocab] kept).
    `vision`: the batch's pixel inputs (`grpo_trainer.vision.join_rows`), for a vision-language model.
    `packed`: the rows (right-padded) run as one padding-free sequence of sequences
    (`actor.use_remove_padding`); the same numbers up to float rounding, no work on padding.
    `entropy_chunk_rows`: the entropy over that many positions at a time (the same values)."""
    inner = getattr(model, "module", model)  # DDP wraps the HF model
    if packed:
        if vision:
            raise ValueError(
                "packed sequences (actor.use_remove_padding=true) with images: the vision-language "
                "positions are not packed yet; set actor.use_remove_padding=false"
            )
        return _packed_token_log_probs(
            model,
            input_ids,
            attention_mask,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            entropy_chunk_rows=entropy_chunk_rows,
        )
    extra = linear_attention_kwargs(inner, input_ids.shape[1])
    if vision:
        from grpo_trainer.vision import token_types

        extra = {**extra, **vision, "mm_token_type_ids": token_types(input_ids, inner.config)}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra).logits
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    valid = attention_mask[:, 1:].to(log_probs.dtype)  # padding positions read 0, not noise
    zeros = log_probs.new_zeros(log_probs.shape[0], 1)
    log_probs = torch.cat([zeros, log_probs * valid], dim=1)
    if not with_entropy:
        return log_probs, None
    with contextlib.nullcontext() if entropy_grad else torch.no_grad():
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk_rows=entropy_chunk_rows)
    return log_probs, torch.cat([zeros, entropy * valid], dim=1)


PACKED_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3")


def _packed_token_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    with_entropy: bool,
    entropy_grad: bool,
    entropy_chunk_rows: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_log_probs` of right-padded rows run as one packed row: each sequence's positions start
    at 0, no attention mask is built, and the boundaries go as `cu_seq_lens_q` to the attention
    layers (SDPA: `hf_kernels.use_packed_sdpa`; flash-attention takes them itself) and to the Gated
    DeltaNet layers (`hf_kernels` on CPU). Empty rows read 0."""
    config = getattr(model, "module", model).config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if config._attn_implementation not in PACKED_ATTENTION:
        raise ValueError(
            f"packed rows need attention that takes sequence boundaries ({', '.join(PACKED_ATTENTION)}), "
            f"the model runs {config._attn_implementation!r}; set actor.use_remove_padding=false"
        )
    if getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None):
        raise ValueError("packed rows with sliding-window attention are not supported; set actor.use_remove_padding=false")
    valid = attention_mask.bool()
    lengths = valid.sum(dim=1)
    if not torch.equal(valid, torch.arange(valid.shape[1], device=valid.device)[None, :] < lengths[:, None]):
        raise ValueError("packed sequences need right-padded rows (every row's tokens first)")
    zeros = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if not valid.any():
        return zeros, zeros.clone() if with_entropy else None
    tokens = input_ids[valid][None, :]  # [1, N], row after row (empty rows hold none)
    positions = (torch.cumsum(valid, dim=1) - 1)[valid][None, :]
    sizes = lengths[lengths > 0]
    bounds = torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)]).to(torch.int32)
    longest = int(sizes.max())
    no_masks = {kind: None for kind in (getattr(text, "layer_types", None) or ("full_attention",))}
    logits = model(
        input_ids=tokens,
        position_ids=positions,
        attention_mask=no_masks,
        use_cache=False,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=longest,
        max_length_k=longest,
    ).logits[0, :-1].float()  # logits[p] predicts tokens[p + 1]
    first = torch.zeros(tokens.shape[1], dtype=torch.bool, device=tokens.device)
    first[bounds[:-1].long()] = True  # a sequence's first token has no prediction in its sequence
    predicted = ~first[1:]
    flat = torch.log_softmax(logits, dim=-1).gather(-1, tokens[0, 1:, None]).squeeze(-1) * predicted
    log_probs = zeros.to(flat.dtype).masked_scatter(valid, torch.cat([flat.new_zeros(1), flat]))
    if not with_entropy:
        return log_probs, None
    with contextlib.nullcontext() if entropy_grad else torch.no_grad():
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), chunk_rows=entropy_chunk_rows)
        entropy = entropy * predicted
        return log_probs, zeros.to(entropy.dtype).masked_scatter(valid, torch.cat([entropy.new_zeros(1), entropy]))
