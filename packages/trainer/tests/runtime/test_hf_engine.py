"""HFRolloutEngine on the tiny Qwen3.5-MoE model (real transformers generate, CPU)."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rollout import HFRolloutEngine


def _engine(model, tokenizer, **kwargs) -> HFRolloutEngine:
    return HFRolloutEngine(
        model=model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **kwargs
    )


def _raw_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def test_n_samples_per_prompt_grouped_in_prompt_order(model, tokenizer, prompts) -> None:
    gens = _engine(model, tokenizer).generate(prompts, SamplingParams(n=4, max_tokens=6, seed=0))
    assert [g.prompt_index for g in gens] == [0] * 4 + [1] * 4 + [2] * 4
    for g in gens:
        assert 1 <= len(g.token_ids) <= 6
        assert len(g.logprobs) == len(g.token_ids)
        assert all(0 <= t < len(tokenizer) for t in g.token_ids)
        assert (g.finish_reason == "stop") == (g.token_ids[-1] == tokenizer.eos_token_id)


def test_logprobs_are_the_raw_distribution_whatever_the_sampling_settings(model, tokenizer, prompts) -> None:
    """Left-padded batched generation with temperature/top-p/top-k still reports log_softmax of the
    unprocessed logits, as an unpadded single forward computes them."""
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=20, max_tokens=6, seed=1)
    gens = _engine(model, tokenizer, max_batch_size=4).generate(prompts, params)
    for g in gens:
        expected = _raw_logprobs(model, prompts[g.prompt_index], g.token_ids)
        assert g.logprobs == pytest.approx(expected, abs=1e-4)


def test_same_seed_same_samples_other_seed_other_samples(model, tokenizer, prompts) -> None:
    engine = _engine(model, tokenizer)
    first = engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=5))
    again = engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=5))
    other = engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=6))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]


def test_seeded_generation_leaves_the_global_rng_alone(model, tokenizer, prompts) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    _engine(model, tokenizer).generate(prompts, SamplingParams(n=2, max_tokens=4, seed=9))
    assert torch.equal(torch.rand(3), expected)


def test_greedy_and_top_k_1_pick_the_argmax(model, tokenizer, prompts) -> None:
    engine = _engine(model, tokenizer)
    greedy = engine.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=5))
    top1 = engine.generate(prompts, SamplingParams(n=1, temperature=1.0, top_k=1, max_tokens=5, seed=3))
    for i, prompt in enumerate(prompts):
        ids = list(prompt)
        for _ in range(5):
            with torch.no_grad():
                nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == tokenizer.eos_token_id:
                break
        expected = ids[len(prompt) :]
        assert greedy[2 * i].token_ids == greedy[2 * i + 1].token_ids == expected
        assert top1[i].token_ids == expected


def test_stops_at_eos(model, tokenizer, prompts) -> None:
    """A hook on the real LM head makes EOS overwhelmingly likely from the third new token on."""
    eos = tokenizer.eos_token_id
    calls = {"n": 0}

    def push_eos(module, inputs, output):
        calls["n"] += 1
        if calls["n"] >= 3:  # prefill + 1 decode step, then EOS
            output = output.clone()
            output[..., eos] += 1e4
        return output

    handle = model.lm_head.register_forward_hook(push_eos)
    try:
        gens = _engine(model, tokenizer).generate(prompts, SamplingParams(n=2, max_tokens=8, seed=0))
    finally:
        handle.remove()
    for g in gens:  # a random model may also pick EOS earlier by itself (p ~ 1/48 per token)
        assert g.finish_reason == "stop" and g.token_ids[-1] == eos and len(g.token_ids) <= 3
        assert eos not in g.token_ids[:-1]
    forced = [g for g in gens if len(g.token_ids) == 3]
    assert forced and all(g.logprobs[-1] == pytest.approx(0.0, abs=1e-4) for g in forced)


def test_trim_keeps_eos_and_drops_padding(model, tokenizer) -> None:
    engine = _engine(model, tokenizer)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    g = engine._trim(4, [5, 6, eos, pad, pad], [-1.0, -2.0, -3.0, 0.0, 0.0])
    assert g == Generation(
        prompt_index=4, token_ids=[5, 6, eos], logprobs=[-1.0, -2.0, -3.0], finish_reason="stop"
    )
    g = engine._trim(0, [5, 6], [-1.0, -2.0])
    assert g.finish_reason == "length" and g.token_ids == [5, 6]


def test_update_weights_copies_new_values_and_rejects_unknown_names(model, tokenizer, tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    engine = _engine(model, tokenizer)
    source = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.5)
    engine.update_weights(source.state_dict().items())
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    engine.update_weights(model.state_dict().items())  # its own tensors: nothing to copy
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))])


def test_update_weights_takes_checkpoint_names_into_fused_experts(
    model, tokenizer, tiny_model_dir, tmp_path
) -> None:
    """transformers keeps Qwen3.5-MoE's experts fused in memory; its checkpoint (and
    Megatron-Bridge's export) names each expert. A real saved checkpoint of other weights, fed by
    name, must leave the engine's model equal to that model, fused tensors included."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_(0.0, 0.3)
    source.save_pretrained(tmp_path / "other")
    checkpoint = {}
    for file in (tmp_path / "other").glob("*.safetensors"):
        checkpoint.update(load_file(str(file)))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in checkpoint  # per-expert on disk
    assert "model.layers.0.mlp.experts.gate_up_proj" in dict(model.named_parameters())  # fused in memory

    _engine(model, tokenizer).update_weights(checkpoint.items())
    expected = dict(source.named_parameters())
    for name, tensor in model.named_parameters():
        assert torch.equal(tensor, expected[name]), name

    with pytest.raises(KeyError, match=r"experts\.8\.gate_proj"):  # the model has experts 0..7
        _engine(model, tokenizer).update_weights(
            [("model.layers.0.mlp.experts.8.gate_proj.weight", torch.zeros(64, 128))]
        )
    with pytest.raises(ValueError, match=r"shape \(64, 64\), the rollout model's is \(64, 128\)"):
        _engine(model, tokenizer).update_weights(
            [("model.layers.0.mlp.experts.1.gate_proj.weight", torch.zeros(64, 64))]
        )


def test_rejects_bad_requests(model, tokenizer, prompts) -> None:
    engine = _engine(model, tokenizer)
    with pytest.raises(ValueError, match="n >= 1"):
        engine.generate(prompts, SamplingParams(n=0))
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams(n=1))
