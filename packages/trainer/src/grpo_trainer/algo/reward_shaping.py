"""What is added to a response's score before its advantage, as verl defines it: DAPO's overlong
penalty (`reward.overlong_buffer`) and the KL penalty to the reference policy
(`algorithm.use_kl_in_reward`, with a fixed or adaptive coefficient)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from grpo_config.schema import KLControlConfig
from grpo_trainer.algo.grpo_math import kl_penalty, masked_sum


def overlong_penalty(
    lengths: torch.Tensor, *, budget: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment per response ([B], <= 0): 0 up to `budget - buffer_len`
    tokens, then falling linearly to `-penalty_factor` at `budget` tokens."""
    if not 1 <= buffer_len <= budget:
        raise ValueError(f"the overlong buffer ({buffer_len}) must be between 1 and the budget ({budget})")
    exceed = lengths.to(torch.float64) - (budget - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


class KLController:
    """The KL-in-reward coefficient beta: fixed, or adaptive as verl's `AdaptiveKLController`
    (beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_sequences / horizon after each step)."""

    def __init__(self, cfg: KLControlConfig) -> None:
        self.cfg = cfg
        self.value = float(cfg.kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        if self.cfg.type != "adaptive":
            return
        error = float(np.clip(current_kl / self.cfg.target_kl - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.cfg.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"type": self.cfg.type, "value": self.value}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Take back an adaptive coefficient from a checkpoint of an adaptive run; a fixed one is the
        setting's (a resumed run may change it), and a switch of type starts from `kl_coef`."""
        if state is not None and self.cfg.type == "adaptive" and state.get("type") == "adaptive":
            self.value = float(state["value"])


def kl_reward_penalty(
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kind: str,
    controller: KLController,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's `apply_kl_penalty`, reduced to what GRPO/RLOO read: the per-sequence sum of the
    token penalties `beta * kl_t` ([B], to subtract from the sequence's reward), with beta the
    coefficient before this step's update; then the controller is updated with the batch's KL
    (per-sequence token mean, averaged over sequences). Metrics as verl names them."""
    mask = response_mask.to(old_log_probs.dtype)
    kld = kl_penalty(old_log_probs, ref_log_probs, kind).detach() * mask
    beta = controller.value
    per_seq = masked_sum(kld, mask, dim=-1)
    current_kl = float((per_seq / (mask.sum(dim=-1) + 1e-8)).mean())
    controller.update(current_kl, n_steps=int(old_log_probs.shape[0]))
    return beta * per_seq, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
