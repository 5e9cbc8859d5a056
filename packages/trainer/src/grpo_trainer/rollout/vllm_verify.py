"""Checking a weight sync: the engine's log-probs against the policy's (an HF causal LM) on the
same tokens. Pure torch, no vLLM import."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

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
