"""Rollout correction against references written here, element by element in float64, from verl's
`rollout_corr_helper` definitions: truncated IS weights (token, sequence, batch-normalised), their
statistics, rejection masks (every scope and statistic), and the mismatch diagnostics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_config.rejection import parse_rejection
from grpo_config.schema import RolloutCorrectionConfig
from grpo_trainer.algo.rollout_correction import (
    RolloutCorrection,
    importance_weights,
    mismatch_metrics,
    rejection_mask,
)

P = "rollout_corr/"


def _batch(seed: int = 0, rows: int = 6, width: int = 9, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    old = torch.rand(rows, width, generator=g, dtype=torch.float64) * -4
    rollout = old + torch.randn(rows, width, generator=g, dtype=torch.float64) * spread
    mask = torch.zeros(rows, width, dtype=torch.float64)
    for i in range(rows):
        mask[i, 2 : 3 + (i * 2) % (width - 2)] = 1  # a prompt of 2, responses of different lengths
    return old, rollout, mask


def _tokens(mask, i):
    return [t for t in range(mask.shape[1]) if mask[i, t] > 0]


def _valid(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in _tokens(mask, i)]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("normalize", [False, True])
def test_truncated_weights_and_their_statistics(level, normalize) -> None:
    old, rollout, mask = _batch()
    cap = 1.5
    weights, metrics = importance_weights(old, rollout, mask, level=level, threshold=cap, batch_normalize=normalize)
    rows = old.shape[0]
    raw = np.zeros(old.shape)
    seq_log = [sum(float(old[i, t] - rollout[i, t]) for t in _tokens(mask, i)) for i in range(rows)]
    for i, t in _valid(mask):
        log_w = float(old[i, t] - rollout[i, t]) if level == "token" else seq_log[i]
        raw[i, t] = math.exp(max(min(log_w, 20), -20))
    truncated = np.minimum(raw, cap)
    valid = _valid(mask)
    if normalize:
        if level == "token":
            factor = sum(truncated[i, t] for i, t in valid) / len(valid)
        else:
            factor = np.mean([np.mean([truncated[i, t] for t in _tokens(mask, i)]) for i in range(rows)])
        truncated = truncated / factor
        assert metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(factor, abs=1e-6)
    np.testing.assert_allclose(weights.numpy(), truncated, atol=1e-6)
    assert not weights.requires_grad
    # verl's definitions: mean / max / min / std / ESS / per-sequence statistics of the applied
    # (truncated, before batch normalisation) weights; the high / low fractions of the raw ones.
    w = [raw[i, t] for i, t in valid]
    applied = [min(x, cap) for x in w]
    assert metrics[P + "rollout_is_mean"] == pytest.approx(np.mean(applied), abs=1e-6)
    if level == "token":
        assert metrics[P + "rollout_is_max"] == pytest.approx(max(applied), abs=1e-6)
        assert metrics[P + "rollout_is_min"] == pytest.approx(min(applied), abs=1e-6)
        assert metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(np.mean([x > cap for x in w]))
        assert metrics[P + "rollout_is_ratio_fraction_low"] == pytest.approx(np.mean([x < 1 / cap for x in w]))
    else:
        assert metrics[P + "rollout_is_max"] == pytest.approx(math.exp(max(seq_log)), abs=1e-6)
        assert metrics[P + "rollout_is_min"] == pytest.approx(math.exp(min(seq_log)), abs=1e-6)
        assert metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(np.mean([s > math.log(cap) for s in seq_log]))
    assert metrics[P + "rollout_is_std"] == pytest.approx(np.std(applied), abs=1e-6)
    normed = [b / (np.mean(applied) + 1e-8) for b in applied]
    assert metrics[P + "rollout_is_eff_sample_size"] == pytest.approx(1 / np.mean(np.square(normed)), abs=1e-7)
    per_seq = [np.mean([min(raw[i, t], cap) for t in _tokens(mask, i)]) for i in range(rows)]
    raw_per_seq = [np.mean([raw[i, t] for t in _tokens(mask, i)]) for i in range(rows)]
    assert metrics[P + "rollout_is_seq_mean"] == pytest.approx(np.mean(per_seq), abs=1e-6)
    assert metrics[P + "rollout_is_seq_max_deviation"] == pytest.approx(max(abs(q - 1) for q in per_seq), abs=1e-6)
    assert metrics[P + "rollout_is_seq_std"] == pytest.approx(np.std(per_seq, ddof=1), abs=1e-6)
    assert metrics[P + "rollout_is_seq_max"] == pytest.approx(max(per_seq), abs=1e-6)
    assert metrics[P + "rollout_is_seq_min"] == pytest.approx(min(per_seq), abs=1e-6)
    assert metrics[P + "rollout_is_seq_fraction_high"] == pytest.approx(np.mean([q > cap for q in raw_per_seq]))
    assert metrics[P + "rollout_is_seq_fraction_low"] == pytest.approx(np.mean([q < 1 / cap for q in raw_per_seq]))
    # The cap binds somewhere, or the test would not test truncation.
    assert (raw > cap).any()


def _stat(lr: float, kind: str) -> float:
    return {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1 - lr}[kind]


def _reference_keep(old, rollout, mask, option: str, lower: float | None, upper: float) -> np.ndarray:
    scope, kind = option.rsplit("_", 1)
    keep = np.ones(old.shape, dtype=bool)
    for i in range(old.shape[0]):
        tokens = _tokens(mask, i)
        stats = {t: _stat(float(old[i, t] - rollout[i, t]), kind) for t in tokens}
        for t in tokens:
            if scope == "token":
                value = stats[t]
            elif scope == "seq_sum":
                value = sum(stats.values())
            elif scope == "seq_mean":
                value = sum(stats.values()) / len(tokens)
            else:
                value = max(stats.values())
            ok = math.log(lower) <= value <= math.log(upper) if kind == "k1" else value <= upper
            if scope == "token":
                keep[i, t] = ok
            else:
                keep[i, :] &= ok
    return keep


@pytest.mark.parametrize(
    "option,threshold,lower,upper",
    [
        ("token_k1", "2.0", 0.5, 2.0),
        ("token_k1", "0.8_1.5", 0.8, 1.5),
        ("token_k2", "0.02", None, 0.02),
        ("token_k3", "0.02", None, 0.02),
        ("seq_sum_k1", "0.5_2.0", 0.5, 2.0),
        ("seq_sum_k2", "0.1", None, 0.1),
        ("seq_sum_k3", "0.1", None, 0.1),
        ("seq_mean_k1", "1.2", 1 / 1.2, 1.2),
        ("seq_mean_k2", "0.03", None, 0.03),
        ("seq_mean_k3", "0.03", None, 0.03),
        ("seq_max_k2", "0.1", None, 0.1),
        ("seq_max_k3", "0.1", None, 0.1),
    ],
)
def test_each_rejection_option_masks_as_its_definition(option, threshold, lower, upper) -> None:
    old, rollout, mask = _batch(seed=1)
    options = parse_rejection(option, threshold)
    assert (options[0].lower, options[0].upper) == (pytest.approx(lower) if lower else None, pytest.approx(upper))
    new_mask, metrics = rejection_mask(old, rollout, mask, options)
    keep = _reference_keep(old, rollout, mask, option, lower, upper)
    np.testing.assert_array_equal(new_mask.numpy(), mask.numpy() * keep)
    valid = _valid(mask)
    rejected = [not keep[i, t] for i, t in valid]
    assert 0 < sum(rejected) < len(valid), "the threshold should reject some tokens, not all"
    assert metrics[P + "rollout_rs_masked_fraction"] == pytest.approx(np.mean(rejected), abs=1e-6)
    assert metrics[P + f"rollout_rs_{option}_masked_fraction"] == pytest.approx(np.mean(rejected), abs=1e-6)
    seqs = [any(not keep[i, t] for t in _tokens(mask, i)) for i in range(mask.shape[0])]
    assert metrics[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(np.mean(seqs), abs=1e-6)


def test_several_options_must_all_pass_and_thresholds_pair_up() -> None:
    old, rollout, mask = _batch(seed=2)
    options = parse_rejection("token_k1, seq_max_k2", "1.5,0.05")
    new_mask, _ = rejection_mask(old, rollout, mask, options)
    keep = _reference_keep(old, rollout, mask, "token_k1", 1 / 1.5, 1.5) & _reference_keep(
        old, rollout, mask, "seq_max_k2", None, 0.05
    )
    np.testing.assert_array_equal(new_mask.numpy(), mask.numpy() * keep)


@pytest.mark.parametrize(
    "options,thresholds,message",
    [
        ("token_k4", "2", "unknown rollout_rs option"),
        ("token_k1", None, "must be given"),
        ("token_k1,seq_mean_k2", "2,3,4", "3 values for 2 options"),
        ("seq_max_k2", "0.5_2", "one upper threshold"),
        ("token_k1", "2_0.5", "lower <= upper"),
        ("token_k1", "-1", "must be positive"),
        ("token_k1", "abc", "not a number"),
    ],
)
def test_bad_rejection_settings_are_refused(options, thresholds, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rejection(options, thresholds)


def test_mismatch_diagnostics_match_their_definitions() -> None:
    old, rollout, mask = _batch(seed=3)
    got = mismatch_metrics(old, rollout, mask)
    rows = range(old.shape[0])
    old_mean = [np.mean([float(old[i, t]) for t in _tokens(mask, i)]) for i in rows]
    roll_mean = [np.mean([float(rollout[i, t]) for t in _tokens(mask, i)]) for i in rows]
    gap = [r - o for r, o in zip(roll_mean, old_mean, strict=True)]
    lrs = [float(old[i, t] - rollout[i, t]) for i, t in _valid(mask)]
    seq_lr = [sum(float(old[i, t] - rollout[i, t]) for t in _tokens(mask, i)) for i in rows]
    expected = {
        "training_ppl": np.mean(np.exp(-np.array(old_mean))),
        "training_log_ppl": -np.mean(old_mean),
        "rollout_ppl": np.mean(np.exp(-np.array(roll_mean))),
        "rollout_log_ppl": -np.mean(roll_mean),
        "kl": np.mean([-x for x in lrs]),
        "k3_kl": np.mean([math.exp(x) - x - 1 for x in lrs]),
        "log_ppl_diff": np.mean(gap),
        "log_ppl_abs_diff": np.mean(np.abs(gap)),
        "log_ppl_diff_max": max(gap),
        "log_ppl_diff_min": min(gap),
        "ppl_ratio": np.mean(np.exp(gap)),
        "chi2_token": np.mean([math.exp(x) ** 2 for x in lrs]) - 1,
        "chi2_seq": np.mean([math.exp(2 * s) for s in seq_lr]) - 1,
        "max_abs_log_prob_diff": max(abs(x) for x in lrs),
    }
    for name, value in expected.items():
        assert got[P + name] == pytest.approx(value, abs=1e-6), name


def test_correction_applies_weights_and_mask_from_the_config() -> None:
    old, rollout, mask = _batch(seed=4)
    off = RolloutCorrection(RolloutCorrectionConfig())
    assert not off.enabled
    settings = RolloutCorrectionConfig(
        rollout_is="sequence",
        rollout_is_threshold=3.0,
        rollout_is_batch_normalize=True,
        rollout_rs="token_k2",
        rollout_rs_threshold=0.05,
    )
    fix = RolloutCorrection(settings).apply(old, rollout, mask)
    expected_weights, _ = importance_weights(old, rollout, mask, level="sequence", threshold=3.0, batch_normalize=True)
    plain, _ = importance_weights(old, rollout, mask, level="sequence", threshold=3.0)
    assert not torch.allclose(expected_weights, plain)
    expected_mask, _ = rejection_mask(old, rollout, mask, parse_rejection("token_k2", 0.05))
    assert torch.equal(fix.is_weights, expected_weights)
    assert torch.equal(fix.response_mask, expected_mask)
    assert P + "rollout_is_mean" in fix.metrics and P + "rollout_rs_masked_fraction" in fix.metrics


def test_an_icepop_band_from_the_config_zeroes_the_weights_outside_it() -> None:
    """rollout_is_threshold="lower_upper" (verl's IcePop), as a user writes it in an override:
    token weights inside [lower, upper] stay, those outside become 0 and are counted."""
    import grpo_config

    cfg = grpo_config.load(
        None, ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0.5_2"]
    )
    assert cfg.algorithm.rollout_correction.rollout_is_threshold == "0.5_2"  # a band, not PEP 515's 0.52
    old, rollout, mask = _batch(seed=4)
    fix = RolloutCorrection(cfg.algorithm.rollout_correction).apply(old, rollout, mask)
    raw = torch.exp(old - rollout)
    inside = (raw >= 0.5) & (raw <= 2.0) & (mask > 0)
    torch.testing.assert_close(fix.is_weights, torch.where(inside, raw, torch.zeros_like(raw)))
    outside = ((~inside) & (mask > 0)).sum() / mask.sum()
    assert 0 < outside < 1 and fix.metrics[P + "rollout_is_oob_ratio"] == pytest.approx(float(outside))
    with pytest.raises(grpo_config.ConfigError, match="the lower bound is above the upper one"):
        grpo_config.load(None, ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=3_1"])


VERL_CASES = Path(__file__).resolve().parents[3] / "tests" / "data" / "verl_rollout_corr" / "cases.json"


def _verl_cases() -> list[dict]:
    return json.loads(VERL_CASES.read_text())["cases"]


@pytest.mark.parametrize(
    "case",
    _verl_cases(),
    ids=lambda c: f"{c['rollout_is']}-{c['rollout_is_threshold']}-norm{c['rollout_is_batch_normalize']}",
)
def test_weights_and_diagnostics_equal_verl_s_helper(case: dict) -> None:
    """Against values verl's own `compute_rollout_correction_weights` (1dda039b9) returned for the
    same float64 log-probs (tests/data/verl_rollout_corr: TIS caps, IcePop bands, batch
    normalisation, a one-token and an all-padding row): the weights and every diagnostic within
    1e-9, none missing and none extra."""
    inputs = json.loads(VERL_CASES.read_text())["inputs"]
    old = torch.tensor(inputs["old_log_probs"], dtype=torch.float64)
    rollout = torch.tensor(inputs["rollout_log_probs"], dtype=torch.float64)
    mask = torch.tensor(inputs["response_mask"], dtype=torch.float64)
    weights, metrics = importance_weights(
        old,
        rollout,
        mask,
        level=case["rollout_is"],
        threshold=case["rollout_is_threshold"],
        batch_normalize=case["rollout_is_batch_normalize"],
    )
    np.testing.assert_allclose(weights.numpy(), np.array(case["weights"]), rtol=0, atol=1e-9)
    ours = {name.removeprefix(P): value for name, value in metrics.items()}
    assert set(ours) == set(case["metrics"])
    for name, expected in case["metrics"].items():
        assert ours[name] == pytest.approx(expected, abs=1e-9, rel=1e-9), name
