"""Checking a weight sync in the tests: greedy-decode in the engine, then compare the engine's
log-probs of those tokens with the policy's (an HF causal LM, a function or HF-named tensors).
No vLLM import: the engine is handed in."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from grpo_trainer.protocols import SamplingParams

# Max abs log-prob difference accepted between engine and policy, by the engine's dtype. The two
# run different kernels (fused attention, other reduction orders), so the bound follows the
# dtype's precision; a wrong or missing tensor gives differences of order 0.1 to 10.
DTYPE_TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-3,
    torch.float16: 2e-2,
    torch.bfloat16: 5e-2,
}


@dataclass(frozen=True, kw_only=True)
class SyncReport:
    max_abs_diff: float
    tolerance: float
    num_tokens: int

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def as_dict(self) -> dict[str, float | int | bool]:
        return {**asdict(self), "ok": self.ok}


ReferenceLogprobs = Callable[[Sequence[int], Sequence[int]], Sequence[float]]


def tolerance_for(dtype: torch.dtype | str) -> float:
    resolved = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if resolved not in DTYPE_TOLERANCE:
        raise ValueError(f"no sync tolerance for dtype {dtype!r}: pass tolerance= explicitly")
    return DTYPE_TOLERANCE[resolved]


def reference_logprob_fn(model: torch.nn.Module) -> Callable[[Sequence[int], Sequence[int]], list[float]]:
    """log p(response[i] | prompt, response[:i]) under `model`, computed in float32 from its logits."""

    @torch.no_grad()
    def logprobs(prompt_token_ids: Sequence[int], response_token_ids: Sequence[int]) -> list[float]:
        if not response_token_ids:
            return []
        device = next(model.parameters()).device
        ids = torch.tensor([[*prompt_token_ids, *response_token_ids]], device=device)
        logits = model(input_ids=ids).logits[0, len(prompt_token_ids) - 1 : -1].float()
        targets = ids[0, len(prompt_token_ids) :]
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0].cpu().tolist()

    return logprobs


def verify_sync(
    engine,
    reference: ReferenceLogprobs | torch.nn.Module | Mapping[str, torch.Tensor],
    *,
    prompt_token_ids: Sequence[int],
    num_tokens: int = 16,
    dtype: torch.dtype | str | None = None,
    tolerance: float | None = None,
) -> SyncReport:
    """Greedy-decode `num_tokens` from `prompt_token_ids` in `engine` (a VLLMRolloutEngine) and
    compare its log-probs with `reference`'s: a function (prompt ids, response ids) -> log-probs,
    an HF causal LM, or HF-named tensors (loaded into a CPU copy of the engine's architecture).
    The tolerance defaults per dtype."""
    if isinstance(reference, Mapping):
        reference = model_from_tensors(engine.model_path, reference)
    fn = reference_logprob_fn(reference) if isinstance(reference, torch.nn.Module) else reference
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=num_tokens)
    generation = engine.generate([list(prompt_token_ids)], greedy)[0]
    expected = torch.tensor(list(fn(prompt_token_ids, generation.token_ids)), dtype=torch.float64)
    actual = torch.tensor(generation.logprobs, dtype=torch.float64)
    if expected.shape != actual.shape:
        raise ValueError(f"reference returned {expected.numel()} log-probs for {actual.numel()} tokens")
    max_diff = float((expected - actual).abs().max()) if actual.numel() else 0.0
    limit = tolerance if tolerance is not None else tolerance_for(dtype or engine.dtype)
    return SyncReport(max_abs_diff=max_diff, tolerance=limit, num_tokens=actual.numel())


def model_from_tensors(model_path: str, tensors: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """A CPU copy of `model_path`'s architecture holding `tensors` (HF names; a tied lm_head may
    be missing)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_trainer.backends.hf_kernels import use_torch_kernels_on_cpu

    use_torch_kernels_on_cpu()
    config = AutoConfig.from_pretrained(model_path)
    first = next(iter(tensors.values()))
    model = AutoModelForCausalLM.from_config(config, dtype=first.dtype)
    missing, unexpected = model.load_state_dict(dict(tensors), strict=False)
    if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
        raise ValueError(f"reference tensors do not fit {model_path}: missing={missing} unexpected={unexpected}")
    if missing:
        model.tie_weights()
    return model.eval()
