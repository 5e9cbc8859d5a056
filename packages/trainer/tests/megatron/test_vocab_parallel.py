"""Vocab-parallel log-probs and entropy against a full-vocabulary reference: values and gradients,
in one process and split over 2 gloo ranks (real torch.distributed on CPU)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_trainer.backends.megatron.vocab_parallel import vocab_parallel_log_probs


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_softmax = torch.log_softmax(logits.double(), dim=-1)
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1)
    return log_probs, entropy


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 7, 50, generator=gen) * 4.0
    targets = torch.randint(0, 50, (3, 7), generator=gen)
    weights = torch.randn(3, 7, generator=gen)  # random upstream gradients
    entropy_weights = torch.randn(3, 7, generator=gen)
    return logits, targets, weights, entropy_weights


def test_single_rank_matches_full_softmax_values_and_gradients() -> None:
    logits, targets, w, we = _inputs()
    mine = logits.clone().requires_grad_(True)
    log_probs, entropy = vocab_parallel_log_probs(mine, targets, with_entropy=True)
    ((log_probs * w).sum() + (entropy * we).sum()).backward()

    ref = logits.clone().double().requires_grad_(True)
    ref_lp, ref_ent = _reference(ref, targets)
    ((ref_lp * w).sum() + (ref_ent * we).sum()).backward()

    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.double(), ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine.grad.double(), ref.grad, atol=1e-5, rtol=1e-5)


def test_entropy_is_optional_and_bf16_logits_are_upcast() -> None:
    logits, targets, _, _ = _inputs(1)
    log_probs, entropy = vocab_parallel_log_probs(logits.bfloat16(), targets)
    assert entropy is None and log_probs.dtype == torch.float32
    ref_lp, _ = _reference(logits.bfloat16().float(), targets)
    torch.testing.assert_close(log_probs.double(), ref_lp, atol=1e-5, rtol=1e-5)


def test_metric_only_entropy_has_no_gradient_but_the_same_value() -> None:
    logits, targets, w, _ = _inputs(2)
    mine = logits.clone().requires_grad_(True)
    log_probs, entropy = vocab_parallel_log_probs(mine, targets, with_entropy=True, entropy_grad=False)
    assert not entropy.requires_grad
    (log_probs * w).sum().backward()
    ref = logits.clone().double().requires_grad_(True)
    ref_lp, ref_ent = _reference(ref, targets)
    (ref_lp * w).sum().backward()
    torch.testing.assert_close(entropy.double(), ref_ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine.grad.double(), ref.grad, atol=1e-5, rtol=1e-5)


def test_shape_mismatch_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="must be targets"):
        vocab_parallel_log_probs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        logits, targets, w, we = _inputs()
        shard = logits.shape[-1] // world
        local = logits[..., rank * shard : (rank + 1) * shard].clone().requires_grad_(True)
        log_probs, entropy = vocab_parallel_log_probs(
            local, targets, vocab_start=rank * shard, group=dist.group.WORLD, with_entropy=True
        )
        ((log_probs * w).sum() + (entropy * we).sum()).backward()
        results[rank] = (log_probs.detach(), entropy.detach(), local.grad.clone())
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_gloo_ranks_match_the_full_vocabulary() -> None:
    """The vocabulary (50) is split 25/25 over 2 processes; each computes the same log-probs and
    entropy, and its slice of the gradient, as the unsplit reference."""
    world = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(world, _free_port(), results), nprocs=world, join=True)
        per_rank = dict(results)
    logits, targets, w, we = _inputs()
    ref = logits.clone().double().requires_grad_(True)
    ref_lp, ref_ent = _reference(ref, targets)
    ((ref_lp * w).sum() + (ref_ent * we).sum()).backward()
    for rank in range(world):
        log_probs, entropy, grad = per_rank[rank]
        torch.testing.assert_close(log_probs.double(), ref_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy.double(), ref_ent, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            grad.double(), ref.grad[..., rank * 25 : (rank + 1) * 25], atol=1e-5, rtol=1e-5
        )
