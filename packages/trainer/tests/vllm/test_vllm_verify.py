"""Sync-check helpers (pure torch + transformers, every env)."""

from __future__ import annotations

import pytest
import torch
from sync_check import (  # this folder's helper (conftest puts it on sys.path)
    SyncReport,
    reference_logprob_fn,
    tolerance_for,
)

from grpo_tiny.hf_models import build_tiny_qwen3


def test_tolerance_follows_the_dtype():
    assert tolerance_for("float32") < tolerance_for(torch.float16) < tolerance_for("bfloat16")
    with pytest.raises(ValueError, match="pass tolerance="):
        tolerance_for(torch.int8)


def test_report_ok_is_the_tolerance_check():
    assert SyncReport(max_abs_diff=1e-4, tolerance=1e-3, num_tokens=3).ok
    bad = SyncReport(max_abs_diff=0.5, tolerance=1e-3, num_tokens=3)
    assert not bad.ok and bad.as_dict()["ok"] is False


def test_reference_logprobs_are_the_models_next_token_logprobs(tmp_path):
    model, _ = build_tiny_qwen3(tmp_path, seed=3)
    prompt, response = [5, 9, 11], [17, 4]
    got = reference_logprob_fn(model)(prompt, response)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
    logp = torch.log_softmax(logits, dim=-1)
    want = [logp[2, 17].item(), logp[3, 4].item()]
    assert got == pytest.approx(want, abs=1e-6)
    assert reference_logprob_fn(model)(prompt, []) == []
