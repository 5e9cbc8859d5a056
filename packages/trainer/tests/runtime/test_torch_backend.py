"""The torch backend under `Actor` on the tiny Qwen3.5-MoE model: one update against an independent
reference loop (plain torch, verl's formulas written out, the whole batch in one forward), log-probs,
micro-batching and gradient accumulation, data parallelism over gloo (two real processes), KL
reference, warmup, skipped steps, state round trip."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import grpo_config
from grpo_trainer.backends.torch_backend import TorchBackend
from grpo_trainer.batching import micro_batches, pad_rows, plan_micro_batches, take_rows
from grpo_trainer.protocols import PolicyBatch
from grpo_trainer.workers.actor import Actor

CPU = torch.device("cpu")
MAX_RESPONSE = 6


def _cfg(model_dir: Path, data: dict | None = None, **actor):
    base = {
        "model_path": str(model_dir),
        "dtype": "float32",
        "lr": 1e-2,
        "weight_decay": 0.0,
        "ppo_mini_batch_size": 1,
        "ppo_micro_batch_size_per_device": 1,
        "log_prob_micro_batch_size_per_device": 8,
    }
    return grpo_config.load(
        {
            "actor": {**base, **actor},
            "rollout": {"engine": "hf", "n": 8},
            "data": {"max_response_length": MAX_RESPONSE, **(data or {})},
        }
    )


def _actor(model_dir: Path, data: dict | None = None, **actor) -> Actor:
    cfg = _cfg(model_dir, data, **actor)
    return Actor.for_config(cfg, TorchBackend.for_config(cfg, device=CPU))


def _batch(seed: int = 0, rows: int = 8) -> PolicyBatch:
    gen = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(3, 40, (int(torch.randint(2, 5, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(rows)
    ]
    responses = [
        torch.randint(2, 40, (int(torch.randint(1, MAX_RESPONSE + 1, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(rows)
    ]
    batch = pad_rows(prompts, responses, pad_token_id=0)
    batch.advantages = torch.randn(rows, generator=gen)
    return batch


def _prepare(actor: Actor, batch: PolicyBatch) -> PolicyBatch:
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    batch.ref_log_probs = actor.log_probs(batch, ref=True)["log_probs"]
    return batch


def _capture_grads(actor: Actor) -> dict[str, torch.Tensor]:
    """Filled with the gradients the optimiser is about to apply (after accumulation and the DDP
    all-reduce). Gradients, not updated weights, are compared: Adam's first step is about
    lr * sign(grad), which turns rounding noise on near-zero gradients into lr-sized differences."""
    backend = actor.backend
    grads: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in backend.module.named_parameters()}

    def hook(optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                grads[names[id(p)]] = p.grad.clone() if p.grad is not None else torch.zeros_like(p)

    backend.optimizer.register_step_pre_hook(hook)
    return grads


def _params(actor: Actor) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in actor.backend.module.state_dict().items()}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=1e-4, msg=key)


# -- the independent reference ---------------------------------------------------------------------
def _reference_step(model_dir: Path, batch: PolicyBatch, *, mode: str, kl_coef: float, entropy_coeff: float):
    """The loss and gradient of one GRPO update on the whole batch, written from verl's definitions
    with nothing from grpo_trainer: dual-clip PPO (clip 0.2/0.2, c=3), low_var_kl, entropy bonus,
    aggregation `mode` over response tokens; Dr. GRPO divides token sums by the response budget."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.set_experts_implementation("eager")
    model.train()
    ids, attn = batch.input_ids, batch.attention_mask
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = batch.response_mask[:, 1:]
    old, ref = batch.old_log_probs[:, 1:], batch.ref_log_probs[:, 1:]
    adv = batch.advantages[:, None]

    ratio = torch.exp(logp - old)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * 3.0), pg)
    log_ratio = ref - logp
    kl = (torch.exp(log_ratio) - log_ratio - 1).clamp(-10, 10)

    def agg(x: torch.Tensor) -> torch.Tensor:
        if mode == "token-mean":
            return (x * mask).sum() / mask.sum()
        if mode == "seq-mean-token-mean":
            return ((x * mask).sum(-1) / mask.sum(-1)).mean()
        assert mode == "seq-mean-token-sum-norm"
        return ((x * mask).sum(-1) / MAX_RESPONSE).mean()

    loss = agg(pg) + kl_coef * agg(kl) - entropy_coeff * agg(entropy)
    loss.backward()
    grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}
    return float(loss.detach()), grads


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_one_update_equals_an_independent_reference_loop(tiny_model_dir, mode) -> None:
    """Micro-batches of 3 rows (uneven: 3+3+2, each cut to its own width) through the backend, the
    loss object and the actor give the loss and gradient of the reference on the whole batch."""
    actor = _actor(
        tiny_model_dir,
        data={"train_batch_size": 3},  # 3 prompts x n=8: micro-batches of 3 pass the config's checks
        loss_agg_mode=mode,
        ppo_mini_batch_size=3,
        ppo_micro_batch_size_per_device=3,
        kl_loss_coef=0.1,
        entropy_coeff=0.01,
        grad_clip=1e9,  # the captured gradients are the unclipped ones
    )
    batch = _batch(seed=3)
    gen = torch.Generator().manual_seed(7)
    current = actor.log_probs(batch)["log_probs"]
    noise = lambda: 0.3 * torch.randn(current.shape, generator=gen) * batch.response_mask  # noqa: E731
    batch.old_log_probs = current + noise()  # ratios away from 1: clipping and dual clip engage
    batch.ref_log_probs = current + noise()
    grads = _capture_grads(actor)
    metrics = actor.update_mini_batch(batch)

    loss, reference_grads = _reference_step(tiny_model_dir, batch, mode=mode, kl_coef=0.1, entropy_coeff=0.01)
    print(f"\n{mode}: loss ours {metrics['loss']:.6f} reference {loss:.6f}")
    assert metrics["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    assert reference_grads.keys() == grads.keys()
    assert sum(float(g.abs().sum()) for g in grads.values()) > 0
    _assert_close(grads, reference_grads, atol=1e-5)


def _count_micro_batches(actor: Actor) -> list[int]:
    counts: list[int] = []
    forward = actor.backend.log_probs

    def counting(micros, **kwargs):
        counts.append(len(micros))
        return forward(micros, **kwargs)

    actor.backend.log_probs = counting
    return counts


def _count_update_micro_batches(actor: Actor) -> list[int]:
    counts: list[int] = []
    forward_backward = actor.backend.forward_backward

    def counting(micros, loss_fn):
        counts.append(len(micros))
        return forward_backward(micros, loss_fn)

    actor.backend.forward_backward = counting
    return counts


def test_log_probs_match_an_unpadded_forward_whatever_the_micro_batch(tiny_model_dir) -> None:
    """By rows (log_prob_micro_batch_size_per_device) or under a token budget
    (log_prob_use_dynamic_bsz, log_prob_max_token_len_per_device; the reference model's own
    settings when given): other micro-batches, the same log-probs."""
    batch = _batch()
    small = _actor(tiny_model_dir, log_prob_micro_batch_size_per_device=1)
    dynamic = _actor(
        tiny_model_dir,
        log_prob_micro_batch_size_per_device=8,
        log_prob_use_dynamic_bsz=True,
        log_prob_max_token_len_per_device=20,
    )
    small_counts, dynamic_counts = _count_micro_batches(small), _count_micro_batches(dynamic)
    out = small.log_probs(batch, with_entropy=True)
    assert torch.allclose(out["log_probs"], dynamic.log_probs(batch)["log_probs"], atol=1e-5)
    assert torch.allclose(out["log_probs"], dynamic.log_probs(batch, ref=True)["log_probs"], atol=1e-5)
    budget = len(micro_batches(batch, micro_batch_size=8, max_tokens=20))
    assert small_counts == [8] and dynamic_counts == [budget, budget] and 1 < budget < 8
    ref_rows = _actor(tiny_model_dir, log_prob_micro_batch_size_per_device=8, log_prob_use_dynamic_bsz=True)
    ref_rows.ref = dataclasses.replace(ref_rows.ref, log_prob_use_dynamic_bsz=False, log_prob_micro_batch_size_per_device=2)
    ref_counts = _count_micro_batches(ref_rows)
    ref_rows.log_probs(batch, ref=True)
    assert ref_counts == [4]  # the reference model's own setting: 8 rows in micro-batches of 2
    for row in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row : row + 1, :n]
        with torch.no_grad():
            logits = small.backend.module(input_ids=ids).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        torch.testing.assert_close(out["log_probs"][row, 1:n], expected, atol=1e-5, rtol=1e-4)
        assert out["log_probs"][row, 0] == 0 and not out["log_probs"][row, n:].any()
        probs = torch.softmax(logits, -1)
        entropy = -(probs * torch.log(probs)).sum(-1)
        torch.testing.assert_close(out["entropy"][row, 1:n], entropy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_one_update_is_the_same_for_any_micro_batching(tiny_model_dir, mode) -> None:
    """Gradient accumulation over micro-batches (by count or by a token budget) must give the
    gradient of the whole mini-batch: the gradients and the logged loss agree. Dr. GRPO's divisor
    is a constant, so micro-batches cut to different widths agree too."""
    results, micro_batch_counts = [], []
    for actor_kwargs in (
        {"ppo_micro_batch_size_per_device": 8},
        {"ppo_micro_batch_size_per_device": 1},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_device": 16},
    ):
        actor = _actor(tiny_model_dir, loss_agg_mode=mode, **actor_kwargs)
        before = _params(actor)
        grads = _capture_grads(actor)
        counts = _count_update_micro_batches(actor)
        metrics = actor.update_mini_batch(_prepare(actor, _batch()))
        results.append((grads, metrics))
        micro_batch_counts.append(counts[0])
    assert any(not torch.equal(before[k], v) for k, v in _params(actor).items())
    assert sum(float(g.abs().sum()) for g in results[0][0].values()) > 0
    # ppo_micro_batch_size_per_device / use_dynamic_bsz + ppo_max_token_len_per_device cut the 8 rows.
    assert micro_batch_counts[:2] == [1, 8] and 1 < micro_batch_counts[2] < 8
    for grads, metrics in results[1:]:
        _assert_close(results[0][0], grads, atol=1e-6)
        assert metrics["pg_loss"] == pytest.approx(results[0][1]["pg_loss"], abs=1e-5)
        assert metrics["grad_norm"] == pytest.approx(results[0][1]["grad_norm"], rel=1e-4)


def test_kl_to_the_frozen_reference_grows_as_the_policy_moves(tiny_model_dir) -> None:
    actor = _actor(tiny_model_dir, kl_loss_coef=0.1)
    batch = _prepare(actor, _batch())
    assert torch.allclose(batch.old_log_probs, batch.ref_log_probs)
    first = actor.update_mini_batch(batch)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # measured before the step
    second = actor.update_mini_batch(batch)
    assert second["kl"] != 0.0 and second["kl_loss"] > 0.0
    assert torch.equal(actor.log_probs(batch, ref=True)["log_probs"], batch.ref_log_probs)  # frozen


def test_without_kl_no_reference_is_built_or_needed(tiny_model_dir) -> None:
    actor = _actor(tiny_model_dir, use_kl_loss=False)
    assert actor.backend.ref_module is None
    batch = _batch()
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    metrics = actor.update_mini_batch(batch)
    assert "kl" not in metrics and "kl_loss" not in metrics
    with pytest.raises(ValueError, match=r"only built when actor\.use_kl_loss or algorithm\.use_kl_in_reward"):
        actor.log_probs(batch, ref=True)


def test_kl_in_the_reward_alone_builds_the_reference_but_no_kl_loss(tiny_model_dir) -> None:
    cfg = _cfg(tiny_model_dir, use_kl_loss=False)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, use_kl_in_reward=True))
    actor = Actor.for_config(cfg, TorchBackend.for_config(cfg, device=CPU))
    assert actor.backend.ref_module is not None and not actor.loss.uses_reference
    batch = _batch()
    ref = actor.log_probs(batch, ref=True)["log_probs"]
    torch.testing.assert_close(ref, actor.log_probs(batch)["log_probs"])  # the policy's start


def test_lr_warms_up_linearly_per_training_step(tiny_model_dir) -> None:
    """As verl's scheduler: one warmup step per training step (`Actor.update`), the rate constant
    over its mini-batches and epochs."""
    actor = _actor(tiny_model_dir, lr=1e-3, lr_warmup_steps=4)
    batch = _prepare(actor, _batch(rows=4))
    seen: list[float] = []
    actor.backend.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(optimizer.param_groups[0]["lr"])
    )
    lrs = [actor.update(batch, num_mini_batches=2, ppo_epochs=2)["lr"] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert seen == pytest.approx([lr for lr in lrs for _ in range(4)])  # 2 mini-batches x 2 epochs
    assert actor.schedule.steps_done == 5


def test_non_finite_gradient_skips_the_step_and_the_schedule(tiny_model_dir) -> None:
    actor = _actor(tiny_model_dir, lr_warmup_steps=4)
    batch = _prepare(actor, _batch())
    batch.advantages = torch.full_like(batch.advantages, float("nan"))
    before = _params(actor)
    metrics = actor.update(batch, num_mini_batches=2, ppo_epochs=1)
    assert metrics["step_skipped"] == 1.0
    assert actor.schedule.steps_done == 0  # warmup counts training steps that stepped
    _assert_close(before, _params(actor), atol=0)


def test_state_dict_round_trip_continues_identically(tiny_model_dir, tmp_path) -> None:
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.workers.actor_checkpoint import load_actor, save_actor

    a = _actor(tiny_model_dir, lr_warmup_steps=3)
    batch = _prepare(a, _batch())
    a.update(batch, num_mini_batches=1, ppo_epochs=1)
    b = _actor(tiny_model_dir, lr_warmup_steps=3)
    manager = CheckpointManager(tmp_path)
    step_dir = save_actor(manager, 1, a, contents=("model", "optimizer", "extra"), trainer_state={"global_step": 1})
    load_actor(manager, step_dir, b)
    assert b.schedule.steps_done == 1
    first = a.update(batch, num_mini_batches=1, ppo_epochs=1)
    second = b.update(batch, num_mini_batches=1, ppo_epochs=1)
    assert first["lr"] == second["lr"]
    _assert_close(_params(a), _params(b), atol=0)  # same process, same order: bit-identical
    assert dict(a.backend.named_weights()).keys() == a.backend.module.state_dict().keys()


def _ddp_rank(rank: int, model_dir: str, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        actor = _actor(Path(model_dir), ppo_micro_batch_size_per_device=2)
        grads = _capture_grads(actor)
        mine = take_rows(_batch(), list(range(rank * 4, rank * 4 + 4)))
        metrics = actor.update_mini_batch(_prepare(actor, mine))
        if rank == 0:
            torch.save({"grads": grads, "params": _params(actor), "metrics": metrics}, out)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_take_the_same_step_as_one_process(tiny_model_dir, tmp_path) -> None:
    """DDP over gloo in two real processes, each with half of the mini-batch: the loss scaling
    across ranks makes the step equal to one process updating on the whole mini-batch."""
    from grpo_trainer.workers.policy_worker import free_port

    out = tmp_path / "rank0.pt"
    mp.start_processes(
        _ddp_rank,
        args=(str(tiny_model_dir), free_port(), str(out)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    single = _actor(tiny_model_dir, ppo_micro_batch_size_per_device=8)
    grads = _capture_grads(single)
    metrics = single.update_mini_batch(_prepare(single, _batch()))
    saved = torch.load(out)
    _assert_close(saved["grads"], grads, atol=1e-6)
    assert saved["metrics"]["pg_loss"] == pytest.approx(metrics["pg_loss"], abs=1e-5)
    assert saved["metrics"]["entropy"] == pytest.approx(metrics["entropy"], abs=1e-5)
    assert os.path.getsize(out) > 0


def _dynamic_rank(rank: int, model_dir: str, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        actor = _actor(Path(model_dir), use_dynamic_bsz=True, ppo_max_token_len_per_device=16)
        rows = _batch(seed=rank, rows=4)  # other rows, other lengths on each rank
        alone = len(micro_batches(rows, micro_batch_size=1, max_tokens=16))
        agreed = len(actor._micro_batches(rows, size=1, max_tokens=16, packed=False))
        metrics = actor.update_mini_batch(_prepare(actor, rows))
        torch.save({"alone": alone, "agreed": agreed, "loss": metrics["loss"]}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_ranks_with_a_token_budget_agree_on_one_micro_batch_count(tiny_model_dir, tmp_path) -> None:
    """Two gloo ranks whose rows pack into different numbers of micro-batches under the same token
    budget run the same number (the larger), as the model's collectives need."""
    from grpo_trainer.workers.policy_worker import free_port

    out = tmp_path / "counts"
    mp.start_processes(
        _dynamic_rank, args=(str(tiny_model_dir), free_port(), str(out)), nprocs=2, join=True, start_method="spawn"
    )
    ranks = [torch.load(f"{out}.{rank}") for rank in range(2)]
    assert ranks[0]["alone"] != ranks[1]["alone"]
    assert ranks[0]["agreed"] == ranks[1]["agreed"] == max(r["alone"] for r in ranks)
    assert ranks[0]["loss"] == pytest.approx(ranks[1]["loss"])


# -- settings and their effect -------------------------------------------------------------------
def test_grad_clip_bounds_the_applied_gradient_norm(tiny_model_dir) -> None:
    """actor.grad_clip: the optimizer receives gradients of norm grad_clip; the logged grad_norm is
    the norm before clipping (as verl logs it)."""
    actor = _actor(tiny_model_dir, grad_clip=1e-3, use_kl_loss=False)
    batch = _batch(seed=5)
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    grads = _capture_grads(actor)
    metrics = actor.update_mini_batch(batch)
    applied = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    assert metrics["grad_norm"] > 1e-2
    assert float(applied) == pytest.approx(1e-3, rel=1e-3)


def test_weight_decay_shrinks_the_weights_when_the_loss_has_no_gradient(tiny_model_dir) -> None:
    """actor.weight_decay (decoupled, AdamW): with zero advantages and no KL the loss gradient is 0,
    so one step multiplies every weight by 1 - lr * weight_decay."""
    actor = _actor(tiny_model_dir, weight_decay=0.5, lr=1e-2, use_kl_loss=False)
    batch = _batch(seed=6)
    batch.advantages = torch.zeros_like(batch.advantages)
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    before = _params(actor)
    actor.update_mini_batch(batch)
    after = _params(actor)
    name = "model.embed_tokens.weight"
    torch.testing.assert_close(after[name], before[name] * (1 - 1e-2 * 0.5), atol=1e-7, rtol=1e-6)


def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients(tiny_model_dir) -> None:
    plain, checkpointed = _actor(tiny_model_dir), _actor(tiny_model_dir, gradient_checkpointing=True)
    def on(actor: Actor) -> bool:
        module = actor.backend.module
        if hasattr(module, "is_activation_checkpointing"):
            return module.is_activation_checkpointing
        return module.is_gradient_checkpointing

    assert on(checkpointed) and not on(plain)
    batch = _prepare(plain, _batch(seed=7))
    grads_plain, grads_checkpointed = _capture_grads(plain), _capture_grads(checkpointed)
    plain.update_mini_batch(batch)
    checkpointed.update_mini_batch(batch)
    _assert_close(grads_plain, grads_checkpointed, atol=1e-6)


def test_ppo_epochs_pass_over_every_mini_batch_again(tiny_model_dir) -> None:
    actor = _actor(tiny_model_dir)
    batch = _prepare(actor, _batch(seed=8))
    steps: list[int] = []
    actor.backend.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    actor.update(batch, num_mini_batches=2, ppo_epochs=3)
    assert len(steps) == 2 * 3


def test_the_reference_model_is_ref_model_path_in_ref_dtype(tiny_model_dir, tmp_path) -> None:
    """ref.model_path loads another checkpoint as the frozen reference; ref.dtype is the precision
    its log-probs are computed in (here float32 while the actor computes in bfloat16)."""
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)
    other.save_pretrained(tmp_path / "ref")
    cfg = grpo_config.load(
        {
            **grpo_config.to_dict(_cfg(tiny_model_dir, dtype="bfloat16")),
            "ref": {"model_path": str(tmp_path / "ref"), "dtype": "float32"},
        }
    )
    actor = Actor.for_config(cfg, TorchBackend.for_config(cfg, device=CPU))
    batch = _batch(seed=9)
    policy = actor.log_probs(batch)["log_probs"]
    ref = actor.log_probs(batch, ref=True)["log_probs"]
    row = 0
    n = int(batch.attention_mask[row].sum())
    ids = batch.input_ids[row : row + 1, :n]
    with torch.no_grad():
        logits = other(input_ids=ids).logits[0, :-1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(ref[row, 1:n], expected, atol=1e-5, rtol=1e-5)  # float32, the other weights
    assert (policy[row, 1:n] - expected).abs().max() > 1e-2


def test_packed_rows_give_the_padded_log_probs_entropy_and_gradients(tiny_model_dir, monkeypatch) -> None:
    """actor.use_remove_padding (and the reference's, inherited): every micro-batch runs as one
    padding-free row of sequences, the attention layers through `hf_kernels.use_packed_sdpa`.
    Same log-probs, entropy and gradients as the padded rows, with activation checkpointing too
    (its recompute takes the packed path again); without the sequence boundaries the Gated
    DeltaNet layers would run across them."""
    from grpo_trainer.backends import hf_kernels

    padded = _actor(tiny_model_dir, ppo_micro_batch_size_per_device=8, kl_loss_coef=0.1)
    packed = _actor(tiny_model_dir, ppo_micro_batch_size_per_device=8, kl_loss_coef=0.1, use_remove_padding=True)
    checkpointed = _actor(
        tiny_model_dir, ppo_micro_batch_size_per_device=8, kl_loss_coef=0.1, use_remove_padding=True,
        gradient_checkpointing=True,
    )
    assert packed.backend._packed and packed.backend._ref_packed and not padded.backend._packed
    batch = _batch(seed=3)
    calls: list[tuple[int, ...]] = []
    original = hf_kernels._packed_sdpa

    def counting(module, query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(hf_kernels, "_packed_sdpa", counting)
    out, out_packed = padded.log_probs(batch, with_entropy=True), packed.log_probs(batch, with_entropy=True)
    # one call per full-attention layer, on one row of every sequence's tokens
    assert calls and all(shape[0] == 1 and shape[2] == int(batch.attention_mask.sum()) for shape in calls)
    assert packed.backend.module.config._attn_implementation == "sdpa"
    torch.testing.assert_close(out_packed["log_probs"], out["log_probs"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_packed["entropy"], out["entropy"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        packed.log_probs(batch, ref=True)["log_probs"], padded.log_probs(batch, ref=True)["log_probs"], atol=1e-5, rtol=1e-4
    )
    grads, grads_packed, grads_checkpointed = _capture_grads(padded), _capture_grads(packed), _capture_grads(checkpointed)
    metrics = padded.update_mini_batch(_prepare(padded, batch))
    metrics_packed = packed.update_mini_batch(_prepare(packed, _batch(seed=3)))
    calls.clear()
    checkpointed.update_mini_batch(_prepare(checkpointed, _batch(seed=3)))
    forward_calls = len(calls)
    _assert_close(grads, grads_packed, atol=1e-6)
    _assert_close(grads, grads_checkpointed, atol=1e-6)
    assert metrics_packed["pg_loss"] == pytest.approx(metrics["pg_loss"], abs=1e-6)
    assert forward_calls > 0

    # The boundaries matter: one packed row without them is another computation.
    valid = batch.attention_mask.bool()
    tokens = batch.input_ids[valid][None, :]
    positions = (torch.cumsum(valid, 1) - 1)[valid][None, :]
    with torch.no_grad():
        leaked = packed.backend.module(input_ids=tokens, position_ids=positions, use_cache=False).logits[0, :-1]
    flat = torch.log_softmax(leaked.float(), -1).gather(-1, tokens[0, 1:, None]).squeeze(-1)
    second_row = slice(int(valid[0].sum()), int(valid[0].sum() + valid[1].sum()) - 1)
    assert (flat[second_row] - out["log_probs"][1, 1 : int(valid[1].sum())]).abs().max() > 1e-3


def test_packed_rows_must_be_right_padded_and_empty_rows_read_zero(tiny_model_dir) -> None:
    from grpo_trainer.backends.hf_model import token_log_probs

    actor = _actor(tiny_model_dir)
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    with pytest.raises(ValueError, match="right-padded"):
        token_log_probs(actor.backend.module, ids, torch.tensor([[0, 1, 1], [1, 1, 1]]), with_entropy=False, packed=True)
    mask = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 1, 0]])
    with torch.no_grad():
        packed, entropy = token_log_probs(actor.backend.module, ids[[1, 0, 1]], mask, with_entropy=True, packed=True)
        padded, _ = token_log_probs(actor.backend.module, ids[[1, 0, 1]], mask, with_entropy=True)
        nothing, _ = token_log_probs(actor.backend.module, ids[:1], torch.zeros(1, 3, dtype=torch.long), with_entropy=False, packed=True)
    assert not packed[1].any() and not entropy[1].any() and not nothing.any()
    torch.testing.assert_close(packed[[0, 2]], padded[[0, 2]] * mask[[0, 2]], atol=1e-5, rtol=1e-4)


def test_packed_rows_fill_a_token_budget_with_their_own_tokens(tiny_model_dir) -> None:
    """With use_remove_padding a token budget (log_prob_use_dynamic_bsz / use_dynamic_bsz) holds
    the rows' own tokens, as verl's remove-padding budget: fewer, fuller micro-batches."""
    settings = {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_device": 24,
                "use_dynamic_bsz": True, "ppo_max_token_len_per_device": 24, "ppo_mini_batch_size": 1}
    padded, packed = _actor(tiny_model_dir, **settings), _actor(tiny_model_dir, use_remove_padding=True, **settings)
    batch = _batch(seed=5)
    counts = {name: (_count_micro_batches(actor), _count_update_micro_batches(actor)) for name, actor in
              (("padded", padded), ("packed", packed))}
    out = padded.log_probs(batch)["log_probs"]
    torch.testing.assert_close(packed.log_probs(batch)["log_probs"], out, atol=1e-5, rtol=1e-4)
    padded.update_mini_batch(_prepare(padded, batch))
    packed.update_mini_batch(_prepare(packed, _batch(seed=5)))
    lengths = batch.attention_mask.sum(1).tolist()
    assert counts["packed"][0][0] == len(plan_micro_batches(lengths, micro_batch_size=8, max_tokens=24, packed=True))
    assert counts["packed"][0][0] < counts["padded"][0][0]
    assert counts["packed"][1][0] < counts["padded"][1][0]


def test_packed_rows_with_gated_deltanet_are_refused_off_the_cpu(tiny_model_dir) -> None:
    """Only the CPU path of packed Gated DeltaNet layers is verified; elsewhere the backend stops at
    start. The "meta" device stands in for a GPU here (none on this machine)."""
    cfg = _cfg(tiny_model_dir, use_remove_padding=True)
    with pytest.raises(ValueError, match="Gated DeltaNet layers on meta: how the device's kernels"):
        TorchBackend.for_config(cfg, device=torch.device("meta"))


def test_adamw_is_torchs_fused_kernel_also_after_loading_another_runs_checkpoint(tiny_model_dir) -> None:
    """The CPU (and CUDA) optimizer is torch's fused AdamW. A checkpoint's param groups carry the
    saving run's kernel choice (here the multi-tensor one); the load applies this run's instead,
    and the next update equals the per-tensor AdamW's up to float rounding."""
    a = _actor(tiny_model_dir)
    assert all(g["fused"] and not g["foreach"] for g in a.backend.optimizer.param_groups)
    batch = _prepare(a, _batch())
    a.update(batch, num_mini_batches=1, ppo_epochs=1)
    state = copy.deepcopy({**a.backend.state_dict(), "scheduler": a.schedule.state_dict()})
    for group in state["optimizer"]["param_groups"]:
        group["fused"], group["foreach"] = None, True
    fused, plain = _actor(tiny_model_dir), _actor(tiny_model_dir)
    fused.backend.load_state_dict(copy.deepcopy({"model": state["model"], "optimizer": state["optimizer"]}))
    fused.schedule.load_state_dict(state["scheduler"])
    assert all(g["fused"] and g["foreach"] is None for g in fused.backend.optimizer.param_groups)
    plain.backend.optimizer = torch.optim.AdamW(plain.backend.module.parameters(), lr=1e-3, foreach=False)
    plain.backend.optimizer.load_state_dict(
        {**state["optimizer"], "param_groups": [{**g, "fused": None, "foreach": False} for g in state["optimizer"]["param_groups"]]}
    )
    plain.backend.module.load_state_dict(state["model"])
    plain.schedule.load_state_dict(state["scheduler"])
    fused.update(batch, num_mini_batches=1, ppo_epochs=1)
    plain.update(batch, num_mini_batches=1, ppo_epochs=1)
    _assert_close(_params(fused), _params(plain), atol=1e-6)
    assert not torch.equal(_params(fused)["model.embed_tokens.weight"], state["model"]["model.embed_tokens.weight"])


@pytest.mark.parametrize("packed", [False, True])
def test_entropy_from_logits_with_chunking_gives_the_same_entropy_a_chunk_at_a_time(
    tiny_model_dir, monkeypatch, packed
) -> None:
    """actor.entropy_from_logits_with_chunking (verl's key): the entropy is computed over
    ENTROPY_CHUNK_ROWS positions at a time (3 here, so a micro-batch takes several chunks), padded
    and packed; the values and the entropy bonus's gradients are those of the whole softmax."""
    from grpo_trainer.algo import grpo_math
    from grpo_trainer.backends import hf_model, torch_backend

    monkeypatch.setattr(torch_backend, "ENTROPY_CHUNK_ROWS", 3)
    sizes: list[int] = []
    original = grpo_math.entropy_from_logits

    def counting(logits, *, chunk_rows=None):
        sizes.append(logits.shape[-2] if logits.dim() > 1 else 1)
        return original(logits, chunk_rows=chunk_rows)

    monkeypatch.setattr(hf_model, "entropy_from_logits", counting)
    monkeypatch.setattr(grpo_math, "entropy_from_logits", counting)
    settings = {"ppo_micro_batch_size_per_device": 8, "entropy_coeff": 0.01, "use_remove_padding": packed}
    whole = _actor(tiny_model_dir, **settings)
    chunked = _actor(tiny_model_dir, **settings, entropy_from_logits_with_chunking=True)
    batch = _batch(seed=5)
    expected = whole.log_probs(batch, with_entropy=True)["entropy"]
    sizes.clear()
    got = chunked.log_probs(batch, with_entropy=True)["entropy"]
    assert max(sizes[1:]) <= 3 and len(sizes) > 2  # the outer call, then its chunks of <= 3 positions
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    grads, grads_chunked = _capture_grads(whole), _capture_grads(chunked)
    whole.update_mini_batch(_prepare(whole, batch))
    chunked.update_mini_batch(_prepare(chunked, _batch(seed=5)))
    _assert_close(grads, grads_chunked, atol=1e-6)


def _cfg_with(model_dir: Path, *overrides: str):
    cfg = _cfg(model_dir)
    return grpo_config.load(grpo_config.to_dict(cfg), list(overrides))


def test_a_parked_reference_moves_to_the_device_only_for_its_own_pass(tiny_model_dir, monkeypatch) -> None:
    """`ref.torch.param_offload` (verl's ref.fsdp_config.param_offload): the reference loads onto the
    CPU and goes to the policy's device for its log-prob pass only, with the same log-probs as an
    unparked one; the policy's offload around a rollout leaves it where it is. On this CPU-only
    machine the device is the CPU, so the moves are recorded (a spy on `Module.to`);
    `test_offload_frees_the_device_on_cuda` measures the memory on a GPU."""
    moves: list[str] = []
    real_to = torch.nn.Module.to

    def spy(module, *args, **kwargs):
        if getattr(module, "_grpo_ref", False):
            moves.append(str(args[0] if args else kwargs.get("device")))
        return real_to(module, *args, **kwargs)

    parked = TorchBackend.for_config(_cfg_with(tiny_model_dir, "ref.torch.param_offload=true"), device=CPU)
    plain = TorchBackend.for_config(_cfg(tiny_model_dir), device=CPU)
    assert all(p.device == CPU for p in parked.ref_module.parameters())
    parked.ref_module._grpo_ref = True
    monkeypatch.setattr(torch.nn.Module, "to", spy)
    batch = _batch()
    micros = [take_rows(batch, range(8))]
    got = parked.log_probs(micros, ref=True, with_entropy=False)
    assert moves == ["cpu", "cpu"]  # onto the policy's device (here the CPU), then back to the host
    torch.testing.assert_close(got, plain.log_probs(micros, ref=True, with_entropy=False))
    moves.clear()
    parked.offload(weights=True, grads=True, optimizer=True)
    parked.onload()
    assert moves == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="measures CUDA memory (run by bench/gpu_session.sh tests)")
def test_offload_frees_the_device_on_cuda(tiny_model_dir) -> None:
    """`actor.torch.param_offload` / `optimizer_offload` and a parked reference, in device memory:
    after an update the offload frees at least the weights and the Adam moments, the onload brings
    the same log-probs back, and a parked reference never holds device memory between passes."""
    from grpo_trainer.backends import delta_rule

    cuda = torch.device("cuda")
    if problem := delta_rule.backward_problem(delta_rule.facts(cuda), torch_delta_rule=False):
        pytest.skip(problem)  # the tiny model's Gated DeltaNet cannot train on this machine's kernels
    cfg = _cfg_with(
        tiny_model_dir,
        "rollout.engine=vllm",  # the offload frees the device for it (the hf engine generates with the policy)
        "actor.torch.param_offload=true",
        "actor.torch.optimizer_offload=true",
        "ref.torch.param_offload=true",
    )
    before_build = torch.cuda.memory_allocated()
    actor = Actor.for_config(cfg, TorchBackend.for_config(cfg, device=cuda))
    weights = sum(p.numel() * p.element_size() for p in actor.backend.module.parameters())
    assert torch.cuda.memory_allocated() - before_build < 1.5 * weights  # one copy: the reference waits on the CPU
    batch = _prepare(actor, _batch())
    actor.update_mini_batch(batch)
    expected = actor.log_probs(batch)["log_probs"]
    held = torch.cuda.memory_allocated()
    actor.backend.offload(weights=True, grads=True, optimizer=True)
    assert held - torch.cuda.memory_allocated() >= 3 * weights  # weights and two Adam moments
    actor.backend.onload()
    torch.testing.assert_close(actor.log_probs(batch)["log_probs"], expected)
