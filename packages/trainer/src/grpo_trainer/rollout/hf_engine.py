"""Rollout with transformers `generate` on the policy's own HF model (colocated) or a copy.

Log-probabilities returned are those of the *unprocessed* distribution: `log_softmax` of the
model's raw logits at temperature 1, before temperature, top-k and top-p reshape it for sampling
(vLLM's default "raw_logprobs"). That is the quantity the policy backend recomputes as
`old_log_probs`, so the two can be compared directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import structlog
import torch
from transformers import GenerationConfig

from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rollout.hf_weight_names import checkpoint_target
from grpo_trainer.vision import VisionInputs, join_rows, placeholder_ids, token_types

log = structlog.get_logger()


class HFRolloutEngine:
    """`RolloutEngine` over a `transformers` causal LM.

    `model` is used in place (pass the policy's module to share weights: `update_weights` then only
    copies tensors that are not already the model's own). Prompts are left-padded and generated in
    chunks of at most `max_batch_size` sequences. `autocast_dtype` runs generation under autocast.
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        eos_token_id: int | list[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        self.model = model
        self.eos_token_ids = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.autocast_dtype = autocast_dtype
        self._noted: set[str] = set()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        vision: Sequence[VisionInputs | None] | None = None,
    ) -> list[Generation]:
        """`vision[i]`: prompt i's pixel inputs (`grpo_trainer.vision`), for a vision-language model."""
        if vision is not None and len(vision) != len(prompts):
            raise ValueError(f"{len(vision)} vision inputs for {len(prompts)} prompts")
        if params.n < 1 or params.max_tokens < 1:
            raise ValueError(
                f"need n >= 1 and max_tokens >= 1, got n={params.n}, max_tokens={params.max_tokens}"
            )
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        expanded = [(i, list(p)) for i, p in enumerate(prompts) for _ in range(params.n)]
        results: list[Generation] = []
        seed_rng = contextlib.nullcontext()
        if params.seed is not None:
            seed_rng = torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device])
        with seed_rng:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for start in range(0, len(expanded), self.max_batch_size):
                results += self._generate_chunk(expanded[start : start + self.max_batch_size], params, vision)
        return results

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sample = params.temperature > 0
        eos = sorted(self.eos_token_ids)
        common: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": self.pad_token_id,
            "do_sample": sample,
            "use_cache": True,
            "output_logits": True,
            "return_dict_in_generate": True,
        }
        vision_tokens = self._vision_token_ids()
        if vision_tokens:
            # A response never holds image or video placeholders: the model would look for pixels
            # for them. Suppressed in sampling; the log-probs reported stay the raw ones.
            common["suppress_tokens"] = vision_tokens
        if not sample:
            return GenerationConfig(**common)
        return GenerationConfig(
            **common,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,  # 0 disables (HF's default would be 50)
        )

    def _vision_token_ids(self) -> list[int]:
        config = getattr(self.model, "config", None)
        return placeholder_ids(config) if config is not None else []

    # Inference mode, not only no_grad: no version counters or view tracking on the decode loop's
    # many small tensors (generate of 64 x 8 tokens on the tiny model, CPU: 108 -> 100 ms). Only
    # Python lists leave it (ids, log-probs), so no inference tensor reaches a training pass.
    @torch.inference_mode()
    def _generate_chunk(
        self,
        chunk: list[tuple[int, list[int]]],
        params: SamplingParams,
        vision: Sequence[VisionInputs | None] | None = None,
    ) -> list[Generation]:
        device = self.device
        width = max(len(p) for _, p in chunk)
        input_ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (_, prompt) in enumerate(chunk):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        pixels = join_rows([vision[i] for i, _ in chunk] if vision is not None else None)
        if pixels:
            config = getattr(self.model, "config", None)
            pixels = {k: v.to(device) for k, v in pixels.items()}
            pixels["mm_token_type_ids"] = token_types(input_ids, config).to(device)
        was_training = self.model.training
        self.model.eval()
        autocast = (
            torch.autocast(device_type=device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        try:
            with autocast:
                out = self.model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    generation_config=self._generation_config(params),
                    **pixels,
                )
        finally:
            self.model.train(was_training)
        new_tokens = out.sequences[:, width:].cpu()
        if new_tokens.shape[1] == 0:
            return [Generation(prompt_index=i, token_ids=[], logprobs=[]) for i, _ in chunk]
        logits = torch.stack(out.logits, dim=1).float()  # [B, new, V], raw (unprocessed)
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(
            -1, new_tokens.to(logits.device).unsqueeze(-1)
        )
        token_logprobs = token_logprobs.squeeze(-1).cpu()
        return [
            self._trim(prompt_index, new_tokens[row].tolist(), token_logprobs[row].tolist())
            for row, (prompt_index, _) in enumerate(chunk)
        ]

    def _trim(self, prompt_index: int, ids: list[int], logprobs: list[float]) -> Generation:
        """Cut after the first EOS (kept: the policy learns to stop); the rest is padding."""
        for pos, token in enumerate(ids):
            if token in self.eos_token_ids:
                return Generation(
                    prompt_index=prompt_index,
                    token_ids=ids[: pos + 1],
                    logprobs=logprobs[: pos + 1],
                    finish_reason="stop",
                )
        return Generation(prompt_index=prompt_index, token_ids=ids, logprobs=logprobs, finish_reason="length")

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the model: the model's own names, or checkpoint names
        (per-expert tensors, as Megatron-Bridge exports them) for models that fuse their experts
        (`hf_weight_names`). Tensors that already are the model's storage (the colocated,
        shared-model case) are skipped. An unknown name raises KeyError, a wrong shape ValueError."""
        own = dict(self.model.named_parameters())
        own.update(dict(self.model.named_buffers()))
        copied = 0
        for name, tensor in named_tensors:
            target = checkpoint_target(name, own)
            if target is None:
                raise KeyError(f"update_weights: the rollout model has no tensor named {name!r}")
            if target.data_ptr() == tensor.data_ptr():
                continue
            if target.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                    f"the rollout model's is {tuple(target.shape)}"
                )
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            copied += 1
        if copied:
            log.debug("hf_rollout.update_weights", copied=copied)

    def sleep(self) -> None:
        self._note_noop("sleep")

    def wake_up(self) -> None:
        self._note_noop("wake_up")

    def _note_noop(self, what: str) -> None:
        if what not in self._noted:  # once per engine: these run every step
            self._noted.add(what)
            log.info(f"hf_rollout.{what}", note="no-op: the HF engine keeps no KV cache between calls")
