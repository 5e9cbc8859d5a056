"""TorchBackend on the tiny Qwen3.5-MoE model: log-probs, micro-batching and gradient accumulation,
data parallelism over gloo (two real processes), KL reference, warmup, state round trip."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import grpo_config
from grpo_trainer.backends.torch_backend import TorchBackend
from grpo_trainer.protocols import PolicyBatch
from grpo_trainer.step_batch import pad_rows, take_rows

CPU = torch.device("cpu")


def _cfg(model_dir: Path, **actor):
    base = {
        "model_path": str(model_dir),
        "dtype": "float32",
        "lr": 1e-2,
        "weight_decay": 0.0,
        "ppo_mini_batch_size": 1,
        "ppo_micro_batch_size_per_device": 1,
        "log_prob_micro_batch_size_per_device": 8,
    }
    return grpo_config.load({"actor": {**base, **actor}, "rollout": {"engine": "hf", "n": 8}})


def _batch(seed: int = 0, rows: int = 8) -> PolicyBatch:
    gen = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(3, 40, (int(torch.randint(2, 5, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(rows)
    ]
    responses = [
        torch.randint(2, 40, (int(torch.randint(1, 7, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(rows)
    ]
    batch = pad_rows(prompts, responses, pad_token_id=0)
    batch.advantages = torch.randn(rows, generator=gen)
    return batch


def _prepare(backend: TorchBackend, batch: PolicyBatch) -> PolicyBatch:
    batch.old_log_probs = backend.log_probs(batch)["log_probs"]
    batch.ref_log_probs = backend.ref_log_probs(batch)
    return batch


def _capture_grads(backend: TorchBackend) -> dict[str, torch.Tensor]:
    """Filled with the gradients the optimiser is about to apply (after accumulation and the DDP
    all-reduce). Gradients, not updated weights, are compared: Adam's first step is about
    lr * sign(grad), which turns rounding noise on near-zero gradients into lr-sized differences."""
    grads: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in backend.module.named_parameters()}

    def hook(optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                grads[names[id(p)]] = p.grad.clone() if p.grad is not None else torch.zeros_like(p)

    backend.optimizer.register_step_pre_hook(hook)
    return grads


def _params(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in backend.module.state_dict().items()}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=1e-4, msg=key)


def test_log_probs_match_an_unpadded_forward_whatever_the_micro_batch(tiny_model_dir) -> None:
    batch = _batch()
    small = TorchBackend(_cfg(tiny_model_dir, log_prob_micro_batch_size_per_device=1), device=CPU)
    dynamic = TorchBackend(
        _cfg(tiny_model_dir, use_dynamic_bsz=True, ppo_max_token_len_per_device=20), device=CPU
    )
    out = small.log_probs(batch, with_entropy=True)
    assert torch.allclose(out["log_probs"], dynamic.log_probs(batch)["log_probs"], atol=1e-5)
    for row in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row : row + 1, :n]
        with torch.no_grad():
            logits = small.module(input_ids=ids).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        torch.testing.assert_close(out["log_probs"][row, 1:n], expected, atol=1e-5, rtol=1e-4)
        assert out["log_probs"][row, 0] == 0 and not out["log_probs"][row, n:].any()
        probs = torch.softmax(logits, -1)
        entropy = -(probs * torch.log(probs)).sum(-1)
        torch.testing.assert_close(out["entropy"][row, 1:n], entropy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_one_update_is_the_same_for_any_micro_batching(tiny_model_dir, mode) -> None:
    """Gradient accumulation over micro-batches (by count or by a token budget) must give the
    gradient of the whole mini-batch: the parameters after one step agree."""
    results = []
    for actor in (
        {"ppo_micro_batch_size_per_device": 8},
        {"ppo_micro_batch_size_per_device": 1},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_device": 16},
    ):
        backend = TorchBackend(_cfg(tiny_model_dir, loss_agg_mode=mode, **actor), device=CPU)
        before = _params(backend)
        grads = _capture_grads(backend)
        metrics = backend.update(_prepare(backend, _batch()))
        results.append((grads, metrics))
    assert any(not torch.equal(before[k], v) for k, v in _params(backend).items())
    assert sum(float(g.abs().sum()) for g in results[0][0].values()) > 0
    for grads, metrics in results[1:]:
        _assert_close(results[0][0], grads, atol=1e-6)
        assert metrics["pg_loss"] == pytest.approx(results[0][1]["pg_loss"], abs=1e-5)
        assert metrics["grad_norm"] == pytest.approx(results[0][1]["grad_norm"], rel=1e-4)


def test_kl_to_the_frozen_reference_grows_as_the_policy_moves(tiny_model_dir) -> None:
    backend = TorchBackend(_cfg(tiny_model_dir, kl_loss_coef=0.1), device=CPU)
    batch = _prepare(backend, _batch())
    assert torch.allclose(batch.old_log_probs, batch.ref_log_probs)
    first = backend.update(batch)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # measured before the step
    second = backend.update(batch)
    assert second["kl"] != 0.0 and second["kl_loss"] > 0.0
    assert torch.equal(backend.ref_log_probs(batch), batch.ref_log_probs)  # reference is frozen


def test_lr_warms_up_linearly(tiny_model_dir) -> None:
    backend = TorchBackend(_cfg(tiny_model_dir, lr=1e-3, lr_warmup_steps=4), device=CPU)
    batch = _prepare(backend, _batch(rows=2))
    lrs = [backend.update(batch)["lr"] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def test_non_finite_gradient_skips_the_step(tiny_model_dir) -> None:
    backend = TorchBackend(_cfg(tiny_model_dir), device=CPU)
    batch = _prepare(backend, _batch())
    batch.advantages = torch.full_like(batch.advantages, float("nan"))
    before = _params(backend)
    metrics = backend.update(batch)
    assert metrics["step_skipped"] == 1.0
    _assert_close(before, _params(backend), atol=0)


def test_state_dict_round_trip_continues_identically(tiny_model_dir) -> None:
    a = TorchBackend(_cfg(tiny_model_dir, lr_warmup_steps=3), device=CPU)
    batch = _prepare(a, _batch())
    a.update(batch)
    b = TorchBackend(_cfg(tiny_model_dir, lr_warmup_steps=3), device=CPU)
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # as if from disk: no shared tensors
    a.update(batch)
    b.update(batch)
    _assert_close(_params(a), _params(b), atol=0)  # same process, same order: bit-identical
    assert dict(a.named_weights()).keys() == a.module.state_dict().keys()


def _ddp_rank(rank: int, model_dir: str, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        backend = TorchBackend(_cfg(Path(model_dir), ppo_micro_batch_size_per_device=2), device=CPU)
        grads = _capture_grads(backend)
        mine = take_rows(_batch(), list(range(rank * 4, rank * 4 + 4)))
        metrics = backend.update(_prepare(backend, mine))
        if rank == 0:
            torch.save({"grads": grads, "params": _params(backend), "metrics": metrics}, out)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_take_the_same_step_as_one_process(tiny_model_dir, tmp_path) -> None:
    """DDP over gloo in two real processes, each with half of the mini-batch: the loss scaling
    across ranks makes the step equal to one process updating on the whole mini-batch."""
    from grpo_trainer.worker import free_port

    out = tmp_path / "rank0.pt"
    mp.start_processes(
        _ddp_rank,
        args=(str(tiny_model_dir), free_port(), str(out)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    single = TorchBackend(_cfg(tiny_model_dir, ppo_micro_batch_size_per_device=8), device=CPU)
    grads = _capture_grads(single)
    metrics = single.update(_prepare(single, _batch()))
    saved = torch.load(out)
    _assert_close(saved["grads"], grads, atol=1e-6)
    assert saved["metrics"]["pg_loss"] == pytest.approx(metrics["pg_loss"], abs=1e-5)
    assert saved["metrics"]["entropy"] == pytest.approx(metrics["entropy"], abs=1e-5)
    assert os.path.getsize(out) > 0
