"""GRPOLoss: what it composes, how it scales, what it reports (pure tensors, no model)."""

from __future__ import annotations

import pytest
import torch

import grpo_config
from grpo_trainer.algo import grpo_math
from grpo_trainer.algo.loss import METRIC_NAMES, GRPOLoss, LossScale
from grpo_trainer.batching import response_budget
from grpo_trainer.protocols import PolicyBatch


def _loss_from_config(cfg) -> GRPOLoss:
    """The loss as the actor builds it from the config's sections."""
    return GRPOLoss.for_actor(cfg.actor, response_budget=response_budget(cfg))


def _micro(seed: int = 0, rows: int = 4, width: int = 7) -> tuple[PolicyBatch, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, width)
    for r in range(rows):
        start = int(torch.randint(1, 3, (1,), generator=g))
        mask[r, start : start + int(torch.randint(1, width - 2, (1,), generator=g))] = 1
    micro = PolicyBatch(
        input_ids=torch.zeros(rows, width, dtype=torch.long),
        attention_mask=torch.ones(rows, width, dtype=torch.long),
        response_mask=mask,
        advantages=torch.randn(rows, generator=g),
        old_log_probs=-torch.rand(rows, width, generator=g),
        ref_log_probs=-torch.rand(rows, width, generator=g),
    )
    log_probs = (-torch.rand(rows, width, generator=g)).requires_grad_()
    entropy = torch.rand(rows, width, generator=g).requires_grad_()
    return micro, log_probs, entropy


def _loss(mode: str = "token-mean", **kwargs) -> GRPOLoss:
    args = {
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": mode,
        "entropy_coeff": 0.01,
        "kl_coef": 0.05,
        "kl_type": "low_var_kl",
        "loss_scale_factor": 16,
    }
    return GRPOLoss(**{**args, **kwargs})


def _scale(micro: PolicyBatch, dp_size: int = 1) -> LossScale:
    return LossScale.of([micro.response_mask], dp_size=dp_size, all_reduce_sum=lambda t: t)


@pytest.mark.parametrize("mode", grpo_math.LOSS_AGG_MODES)
def test_the_loss_is_policy_loss_plus_kl_minus_entropy_bonus(mode) -> None:
    micro, log_probs, entropy = _micro()
    loss_fn = _loss(mode)
    loss, sums = loss_fn.loss(log_probs=log_probs, entropy=entropy, micro=micro, scale=_scale(micro))
    mask = micro.response_mask
    common = {"loss_agg_mode": mode, "loss_scale_factor": 16}
    pg, pg_metrics = grpo_math.policy_loss(
        log_probs, micro.old_log_probs, micro.advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, **common
    )
    kl = grpo_math.kl_loss(log_probs, micro.ref_log_probs, mask, kind="low_var_kl", **common)
    bonus = grpo_math.aggregate_loss(entropy, mask, mode, loss_scale_factor=16)
    torch.testing.assert_close(loss, pg + 0.05 * kl - 0.01 * bonus)
    metrics = loss_fn.metrics(dict(zip(METRIC_NAMES, sums.tolist(), strict=True)), _scale(micro))
    assert metrics["loss"] == pytest.approx(loss.item())
    assert metrics["pg_loss"] == pytest.approx(pg.item())
    assert metrics["kl_loss"] == pytest.approx(kl.item())
    assert metrics["pg_clipfrac"] == pytest.approx(float(pg_metrics["pg_clipfrac"]))
    assert metrics["entropy"] == pytest.approx(grpo_math.masked_mean(entropy, mask).item())
    assert metrics["kl"] == pytest.approx(grpo_math.masked_mean(log_probs - micro.ref_log_probs, mask).item())
    grad = torch.autograd.grad(loss, [log_probs, entropy])
    assert grad[1].abs().sum() > 0  # the entropy bonus carries a gradient
    assert not grad[0][mask == 0].any()  # nothing flows into prompt or padding positions


def test_dr_grpo_divides_by_the_response_budget_not_the_padded_width() -> None:
    """The same rows padded to another width (micro-batches are cut to their own longest row)
    give the same seq-mean-token-sum-norm loss: the divisor is the constant, not T."""
    micro, log_probs, entropy = _micro(width=7)
    wide = PolicyBatch(
        input_ids=torch.nn.functional.pad(micro.input_ids, (0, 9)),
        attention_mask=torch.nn.functional.pad(micro.attention_mask, (0, 9)),
        response_mask=torch.nn.functional.pad(micro.response_mask, (0, 9)),
        advantages=micro.advantages,
        old_log_probs=torch.nn.functional.pad(micro.old_log_probs, (0, 9)),
        ref_log_probs=torch.nn.functional.pad(micro.ref_log_probs, (0, 9)),
    )
    loss_fn = _loss("seq-mean-token-sum-norm", entropy_coeff=0.0, kl_coef=None)
    narrow, _ = loss_fn.loss(log_probs=log_probs, entropy=entropy, micro=micro, scale=_scale(micro))
    padded, _ = loss_fn.loss(
        log_probs=torch.nn.functional.pad(log_probs, (0, 9)),
        entropy=torch.nn.functional.pad(entropy, (0, 9)),
        micro=wide,
        scale=_scale(wide),
    )
    torch.testing.assert_close(narrow, padded)
    pg, _ = grpo_math.policy_loss(
        log_probs, micro.old_log_probs, micro.advantages, micro.response_mask,
        clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-sum",
    )
    torch.testing.assert_close(narrow, pg / 16)


def test_scale_sums_tokens_and_sequences_over_micro_batches_and_ranks() -> None:
    masks = [torch.tensor([[0, 1, 1], [0, 0, 0]]), torch.tensor([[1, 1, 1, 1]])]
    seen = []

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.tolist())
        return t * 2  # a second rank with the same counts

    scale = LossScale.of(masks, dp_size=2, all_reduce_sum=all_reduce)
    assert seen == [[6.0, 2.0]]  # 6 response tokens, 2 sequences with any (the empty one not counted)
    assert scale == LossScale(global_tokens=12, global_seqs=4, dp_size=2)


def test_metrics_average_tokens_globally_and_losses_over_ranks() -> None:
    loss_fn = _loss()
    sums = dict.fromkeys(METRIC_NAMES, 0.0) | {"loss": 3.0, "pg_loss": 2.0, "entropy": 10.0, "kl": 5.0}
    metrics = loss_fn.metrics(sums, LossScale(global_tokens=20, global_seqs=4, dp_size=2))
    assert metrics["loss"] == 1.5 and metrics["pg_loss"] == 1.0
    assert metrics["entropy"] == 0.5 and metrics["kl"] == 0.25
    without_kl = _loss(kl_coef=None).metrics(sums, LossScale(global_tokens=20, global_seqs=4, dp_size=2))
    assert "kl" not in without_kl and "kl_loss" not in without_kl


def test_the_loss_reads_the_actor_settings_and_the_response_budget() -> None:
    cfg = grpo_config.load(
        {
            "actor": {"loss_agg_mode": "seq-mean-token-sum-norm", "entropy_coeff": 0.02, "use_kl_loss": False},
            "data": {"max_response_length": 300},
        }
    )
    loss_fn = _loss_from_config(cfg)
    assert (loss_fn.loss_agg_mode, loss_fn.entropy_coeff, loss_fn.kl_coef) == ("seq-mean-token-sum-norm", 0.02, None)
    assert loss_fn.loss_scale_factor == 300 and not loss_fn.uses_reference and loss_fn.entropy_requires_grad
    assert _loss_from_config(grpo_config.load({"rollout": {"max_tokens": 64}})).loss_scale_factor == 64
    explicit = {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": 1234.0}
    assert _loss_from_config(grpo_config.load({"actor": explicit})).loss_scale_factor == 1234.0
    clipped = _loss_from_config(
        grpo_config.load(
            {
                "actor": {
                    "clip_ratio_low": 0.1,
                    "clip_ratio_high": 0.28,
                    "clip_ratio_c": 2.5,
                    "kl_loss_coef": 0.05,
                    "kl_loss_type": "k1",
                }
            }
        )
    )
    assert (clipped.clip_ratio_low, clipped.clip_ratio_high, clipped.clip_ratio_c) == (0.1, 0.28, 2.5)
    assert (clipped.kl_coef, clipped.kl_type) == (0.05, "k1") and clipped.uses_reference
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        _loss("sum")


def test_a_kl_loss_without_reference_log_probs_is_refused() -> None:
    micro, log_probs, entropy = _micro()
    micro.ref_log_probs = None
    with pytest.raises(ValueError, match="no ref_log_probs"):
        _loss().loss(log_probs=log_probs, entropy=entropy, micro=micro, scale=_scale(micro))


@pytest.mark.parametrize("loss_mode", ["gspo", "cispo"])
def test_the_policy_loss_mode_and_the_rollout_weights_reach_the_policy_term(loss_mode) -> None:
    """actor.policy_loss.loss_mode picks grpo_math's loss; a micro-batch's rollout_is_weights
    multiply it. No entropy or KL term, so the loss is the policy term alone. GSPO's term is the
    sequence mean of token means whatever loss_agg_mode says (verl's definition)."""
    agg = "seq-mean-token-mean" if loss_mode == "gspo" else "token-mean"
    cfg = grpo_config.load(
        {"actor": {"policy_loss": {"loss_mode": loss_mode}, "loss_agg_mode": "token-mean", "use_kl_loss": False}}
    )
    loss_fn = _loss_from_config(cfg)
    assert loss_fn.loss_mode == loss_mode
    micro, log_probs, entropy = _micro(seed=3)
    micro.rollout_is_weights = torch.rand(micro.response_mask.shape, generator=torch.Generator().manual_seed(1))
    loss, _ = loss_fn.loss(log_probs=log_probs, entropy=entropy, micro=micro, scale=_scale(micro))
    expected, _ = grpo_math.policy_loss(
        log_probs,
        micro.old_log_probs,
        micro.advantages,
        micro.response_mask,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        loss_mode=loss_mode,
        is_weights=micro.rollout_is_weights,
        loss_agg_mode=agg,
    )
    unweighted, _ = grpo_math.policy_loss(
        log_probs, micro.old_log_probs, micro.advantages, micro.response_mask,
        clip_ratio_low=0.2, clip_ratio_high=0.2, loss_mode=loss_mode, loss_agg_mode=agg,
    )
    assert loss.item() == pytest.approx(expected.item(), abs=1e-7)
    assert abs(loss.item() - unweighted.item()) > 1e-4
