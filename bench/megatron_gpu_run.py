"""Megatron backend on one GPU: GRPO steps end to end, HF export round trip, log-probs vs HF, and
the actor-update throughput / MFU of a larger model.

    PYTHONPATH=packages/trainer/src:packages/config/src:packages/device/src:packages/ckpt/src:packages/trainer/tests/megatron \
        python bench/megatron_gpu_run.py --out $OUT [--phases grpo,mfu] [--mfu-layers 16 ...]

Random-weight Qwen3.5-MoE text models (Gated DeltaNet + gated attention + MoE with shared expert),
TP=PP=EP=1, transformer_impl=local (the GPU machine has no transformer_engine). The rollout engine
is `hf` (transformers generate on a second, HF copy of the policy, synced after every update).
The task: reward = fraction of response tokens with an even token id (0.5 at random init).
Results go to OUT/megatron_gpu_run.json.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from trace_gaps import CUDA_SYNC_CALLS  # this script's folder: run as bench/megatron_gpu_run.py

H200_BF16_DENSE_PEAK = 989e12
RESULTS: dict[str, Any] = {}
PROFILE = False
TRACE_DIR: Path | None = None  # --trace: the profiled update's Chrome trace, gzipped (bench/trace_gaps.py reads it)
# The 35B GPU profile's optimizer settings (Adam on the CPU, its transfers overlapped), for `+cpuopt`.
CPU_OPTIMIZER_KEYS = ("optimizer_offload", "optimizer_offload_fraction", "override_optimizer_config")
# CUDA runtime calls counted in a profiled update: kernel launches, and what blocks the host (the
# runtime's own synchronising calls, as bench/trace_gaps.py counts them, and torch's read-backs).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SYNC_CALLS = (*sorted(CUDA_SYNC_CALLS), "aten::_local_scalar_dense")


def profile_cpu_optimizer() -> dict[str, Any]:
    from grpo_launch_qwen35_35b.profile import COMMON

    megatron = COMMON["actor"]["megatron"]
    return {key: megatron[key] for key in CPU_OPTIMIZER_KEYS}


def megatron_cfg(
    *,
    model_path: str,
    use_kl_loss: bool,
    micro_batch: int,
    seq: int,
    torch_gdn: bool,
    grouped_experts: bool = False,
    fused_permutation: bool = False,
    fused_rope: bool = False,
    attention: str = "auto",
    cpu_optimizer: bool = False,
    transformer_engine: bool = False,
) -> Any:
    from grpo_config.schema import ActorConfig, DataConfig, MegatronConfig, TrainerConfig

    mc = MegatronConfig(
        # +te: TransformerEngine's layers (the GPU machine needs it carried and built: docs/benchmarks.md)
        transformer_impl="transformer_engine" if transformer_engine else "local",
        moe_grouped_gemm=grouped_experts,  # local layers: torch._grouped_mm experts
        moe_permute_fusion=fused_permutation,  # local layers: grpo's gather permutation
        apply_rope_fusion=fused_rope,  # local layers: megatron-core's rotary function compiled
        moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="none",
        attention_backend=attention,  # auto: SDPA; unfused: megatron-core DotProductAttention
        use_distributed_optimizer=True,
        # deterministic_mode makes megatron-core's Gated DeltaNet use its pure-torch chunked delta
        # rule: FLA 0.6's backward refuses Triton < 3.7.1 on Hopper (wrong gradients), and the GPU
        # machine has Triton 3.6.0.
        override_transformer_config={"deterministic_mode": True} if torch_gdn else {},
        **(profile_cpu_optimizer() if cpu_optimizer else {}),
    )
    actor = ActorConfig(
        model_path=model_path,
        backend="megatron",
        lr=2e-5,
        grad_clip=1.0,
        ppo_micro_batch_size_per_device=micro_batch,
        log_prob_micro_batch_size_per_device=micro_batch,
        use_kl_loss=use_kl_loss,
        kl_loss_coef=0.001,
        entropy_coeff=0.0,
        megatron=mc,
    )
    return TrainerConfig(
        actor=actor, data=DataConfig(max_prompt_length=seq // 2, max_response_length=seq // 2)
    )


def hf_log_probs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    with torch.no_grad():
        logits = (
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
        )
        lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1)


def reward(token_ids: list[int]) -> float:
    return sum(1 for t in token_ids if t % 2 == 0) / max(len(token_ids), 1)


def build_batch(prompts: list[list[int]], generations: list[Any], pad: int) -> tuple[Any, torch.Tensor]:
    from grpo_trainer.protocols import PolicyBatch

    rows = [prompts[g.prompt_index] + g.token_ids for g in generations]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, (row, g) in enumerate(zip(rows, generations, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        resp[i, len(prompts[g.prompt_index]) : len(row)] = 1
    return PolicyBatch(input_ids=ids, attention_mask=attn, response_mask=resp), torch.tensor(
        [reward(g.token_ids) for g in generations]
    )


def phase_grpo(out: Path, steps: int) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_tiny import hf_models
    from grpo_trainer.algo import grpo_math
    from grpo_trainer.backends.megatron import MegatronBackend
    from grpo_trainer.protocols import SamplingParams
    from grpo_trainer.rollout.hf_engine import HFRolloutEngine

    work = Path(tempfile.mkdtemp())
    model_path = hf_models.save_random_model(hf_models.qwen35_moe_config(num_hidden_layers=4), work / "hf")
    cfg = megatron_cfg(model_path=str(model_path), use_kl_loss=True, micro_batch=16, seq=256, torch_gdn=True)
    t0 = time.perf_counter()
    backend = MegatronBackend.for_config(cfg, model_path=str(model_path))
    RESULTS["grpo_build_s"] = time.perf_counter() - t0

    # HF export, strict, before training: must equal the input checkpoint exactly.
    source = load_file(str(model_path / "model.safetensors"))
    export_dir = work / "export"
    backend.export_hf(str(export_dir), strict=True)
    exported = {}
    for f in export_dir.glob("*.safetensors"):
        exported.update(load_file(str(f)))
    RESULTS["export_keys_equal"] = sorted(exported) == sorted(source)
    RESULTS["export_max_abs_diff"] = max(
        (exported[k].float() - source[k].float()).abs().max().item() for k in source
    )

    hf = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).cuda()
    engine = HFRolloutEngine(model=hf, eos_token_id=2, pad_token_id=0)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (16,), generator=gen).tolist() for _ in range(16)]
    params = SamplingParams(n=8, temperature=1.0, max_tokens=48, seed=None)
    history = []
    for step in range(steps):
        t_step = time.perf_counter()
        generations = engine.generate(prompts, params)
        t_gen = time.perf_counter() - t_step
        batch, rewards = build_batch(prompts, generations, pad=0)
        groups = [g.prompt_index for g in generations]
        batch.advantages = grpo_math.group_advantages(rewards, groups, norm_by_std=True, eps=1e-6)
        old = backend.log_probs(batch)["log_probs"]
        if step == 0:  # same weights in both: Megatron vs HF log-probs on the sampled responses
            ref_hf = hf_log_probs(hf, batch.input_ids.cuda(), batch.attention_mask.cuda()).cpu()
            mask = batch.response_mask.bool()
            diff = (old - ref_hf).abs()[mask]
            rollout_lp = torch.cat([torch.tensor(g.logprobs) for g in generations])
            RESULTS["logprob_vs_hf"] = {"max_abs": diff.max().item(), "mean_abs": diff.mean().item()}
            RESULTS["logprob_vs_rollout_mean_abs"] = (old[mask] - rollout_lp).abs().mean().item()
        batch.old_log_probs = old
        batch.ref_log_probs = backend.ref_log_probs(batch)
        torch.cuda.synchronize()
        t_upd = time.perf_counter()
        metrics = backend.update(batch)
        torch.cuda.synchronize()
        t_upd = time.perf_counter() - t_upd
        engine.update_weights(backend.named_weights())
        row = {
            "step": step,
            "reward_mean": rewards.mean().item(),
            "gen_s": t_gen,
            "update_s": t_upd,
            "step_s": time.perf_counter() - t_step,
            **{k: metrics[k] for k in ("loss", "pg_loss", "kl_loss", "entropy", "grad_norm", "ppo_kl")},
        }
        history.append(row)
        print(json.dumps(row), flush=True)
    RESULTS["grpo_steps"] = history
    RESULTS["grpo_loss_finite"] = all(math.isfinite(r["loss"]) for r in history)
    state_roundtrip(backend, batch, work)
    del backend, hf, engine
    torch.cuda.empty_cache()


def state_roundtrip(actor: Any, batch: Any, work: Path) -> None:
    """Checkpoint through grpo_ckpt, one more update, load back: log-probs return to the saved ones."""
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.workers.actor_checkpoint import load_actor, save_actor

    before = actor.log_probs(batch)["log_probs"]
    manager = CheckpointManager(work / "ckpt")
    save_actor(manager, 1, actor, contents=("model", "optimizer", "extra"), trainer_state={"step": 1})
    actor.update(batch)
    moved = (actor.log_probs(batch)["log_probs"] - before).abs().max().item()
    load_actor(manager, manager.latest_complete(), actor)
    back = (actor.log_probs(batch)["log_probs"] - before).abs().max().item()
    RESULTS["ckpt_roundtrip"] = {"moved_after_update": moved, "max_abs_after_load": back}


def active_params(config: Any) -> dict[str, float]:
    """Matmul parameters a token passes through (embedding lookup excluded, lm_head included)."""
    h = config.hidden_size
    attn_full = (
        h * config.num_attention_heads * config.head_dim * 2
        + 2 * h * config.num_key_value_heads * config.head_dim
    )
    attn_full += config.num_attention_heads * config.head_dim * h
    kd, vd = (
        config.linear_key_head_dim * config.linear_num_key_heads,
        config.linear_value_head_dim * config.linear_num_value_heads,
    )
    gdn = h * (2 * kd + 2 * vd + 2 * config.linear_num_value_heads) + vd * h
    ffn = (
        3 * h * config.moe_intermediate_size * config.num_experts_per_tok
        + 3 * h * config.shared_expert_intermediate_size
    )
    ffn += h * config.num_experts + h
    full_layers = sum(t == "full_attention" for t in config.layer_types)
    lin_layers = config.num_hidden_layers - full_layers
    return {
        "active": full_layers * attn_full
        + lin_layers * gdn
        + config.num_hidden_layers * ffn
        + h * config.vocab_size,
        "full_layers": full_layers,
        "linear_layers": lin_layers,
    }


def step_flops(config: Any, *, batch: int, seq: int) -> float:
    """Forward+backward FLOPs: 6 * N_active * tokens + causal attention (QK^T, AV) of the full
    attention layers + the chunked delta-rule state updates of the Gated DeltaNet layers."""
    counts = active_params(config)
    tokens = batch * seq
    dense = 6 * counts["active"] * tokens
    attn = (
        3
        * counts["full_layers"]
        * 2
        * 2
        * config.num_attention_heads
        * config.head_dim
        * seq
        * seq
        / 2
        * batch
    )
    gdn_state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    gdn = 3 * counts["linear_layers"] * 4 * gdn_state * tokens
    return dense + attn + gdn


def qwen3_moe_active_params(config: Any) -> float:
    h = config.hidden_size
    attn = (
        2 * h * config.num_attention_heads * config.head_dim
        + 2 * h * config.num_key_value_heads * config.head_dim
    )
    ffn = 3 * h * config.moe_intermediate_size * config.num_experts_per_tok + h * config.num_experts
    return config.num_hidden_layers * (attn + ffn) + h * config.vocab_size


def qwen3_moe_step_flops(config: Any, *, batch: int, seq: int) -> float:
    dense = 6 * qwen3_moe_active_params(config) * batch * seq
    attn = (
        3
        * config.num_hidden_layers
        * 2
        * 2
        * config.num_attention_heads
        * config.head_dim
        * seq
        * seq
        / 2
        * batch
    )
    return dense + attn


def mfu_model(family: str, layers: int, experts: int, topk: int, moe_ffn: int, hidden: int, seq: int) -> Any:
    from grpo_tiny import hf_models

    if family == "qwen3moe":  # Qwen3-30B-A3B layer shape at hidden 2048: 32 heads of 128, 4 kv heads
        return hf_models.qwen3_moe_config(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=hidden // 64,
            num_key_value_heads=max(hidden // 512, 1),
            head_dim=128,
            num_experts=experts,
            num_experts_per_tok=topk,
            moe_intermediate_size=moe_ffn,
            vocab_size=32768,
            max_position_embeddings=seq,
        )
    heads = hidden // 128
    return hf_models.qwen35_moe_config(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 8, 1),
        head_dim=256,
        linear_num_key_heads=heads,
        linear_num_value_heads=2 * heads,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=experts,
        num_experts_per_tok=topk,
        moe_intermediate_size=moe_ffn,
        shared_expert_intermediate_size=moe_ffn,
        vocab_size=32768,
        max_position_embeddings=seq,
    )


def profile_update(backend: Any, batch: Any, top: int = 40) -> dict[str, Any]:
    """Where one update's GPU time goes: kernels by name (device events only, so nothing is
    counted twice), the aten ops that launched them with the Python lines above them, and the
    share of the update's wall time the GPU was busy (low: launch-bound)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], with_stack=True) as prof:
        backend.update(batch, num_mini_batches=1, ppo_epochs=1)
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3
    if TRACE_DIR is not None:
        trace = TRACE_DIR / f"trace_{len(list(TRACE_DIR.glob('trace_*.json.gz')))}.json"
        prof.export_chrome_trace(str(trace))
        subprocess.run(["gzip", "-f", str(trace)], check=True)
    averages = prof.key_averages()
    # A `record_function` range (torch's "Optimizer.step#AdamW.step") is a device event too: its
    # time is that of the kernels inside it, so counting it would count them twice.
    kernels = [
        e
        for e in averages
        if e.device_type == DeviceType.CUDA
        and e.self_device_time_total > 0
        and not getattr(e, "is_user_annotation", False)
        and "#" not in e.key
    ]
    annotations_ms = sum(
        e.self_device_time_total
        for e in averages
        if e.device_type == DeviceType.CUDA and (getattr(e, "is_user_annotation", False) or "#" in e.key)
    ) / 1e3
    kernel_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    ops = [
        e
        for e in prof.key_averages(group_by_stack_n=6)
        if e.device_type == DeviceType.CPU and e.self_device_time_total > 0
    ]
    ops.sort(key=lambda e: e.self_device_time_total, reverse=True)

    def frames(event: Any) -> list[str]:
        return [f for f in (event.stack or []) if "torch/" not in f][:3]

    by_key = {e.key: e for e in averages if e.device_type == DeviceType.CPU}

    def host(names: tuple[str, ...]) -> dict[str, Any]:
        found = [by_key[n] for n in names if n in by_key]
        return {
            "calls": sum(e.count for e in found),
            "host_ms": round(sum(e.self_cpu_time_total for e in found) / 1e3, 2),
            "by_name": {e.key: e.count for e in found},
        }

    return {
        "wall_ms_profiled": wall_ms,
        "kernel_ms": kernel_ms,
        "gpu_busy_share": kernel_ms / wall_ms,
        "annotation_ms_not_counted": annotations_ms,
        "launches": host(LAUNCH_CALLS),
        "syncs": host(SYNC_CALLS),
        "kernels": [
            {"name": e.key[:110], "ms": round(e.self_device_time_total / 1e3, 2), "calls": e.count}
            for e in kernels[:top]
        ],
        "ops": [
            {
                "op": e.key,
                "ms": round(e.self_device_time_total / 1e3, 2),
                "calls": e.count,
                "where": frames(e),
            }
            for e in ops[:top]
        ],
    }


def phase_mfu(spec: str) -> None:
    """spec: family,layers,experts,topk,moe_ffn,hidden,batch,seq,micro."""
    from grpo_tiny import hf_models
    from grpo_trainer.backends.megatron import MegatronBackend
    from grpo_trainer.protocols import PolicyBatch
    from grpo_trainer.workers.actor import Actor

    family, *numbers = spec.split(",")
    family, *options = family.split("+")  # e.g. qwen3moe+gmm+perm+rope (+unfused: megatron-core attention)
    layers, experts, topk, moe_ffn, hidden, batch, seq, micro = (int(v) for v in numbers)
    config = mfu_model(family, layers, experts, topk, moe_ffn, hidden, seq)
    work = Path(tempfile.mkdtemp())
    model_path = hf_models.save_random_model(config, work / "hf", device="cuda")
    torch.cuda.empty_cache()
    cfg = megatron_cfg(
        model_path=str(model_path),
        use_kl_loss=False,
        micro_batch=micro,
        seq=seq,
        torch_gdn=family != "qwen3moe",
        grouped_experts="gmm" in options,
        fused_permutation="perm" in options,
        fused_rope="rope" in options,
        attention="unfused" if "unfused" in options else "auto",
        cpu_optimizer="cpuopt" in options,
        transformer_engine="te" in options,
    )
    backend = Actor.for_config(cfg, MegatronBackend.for_config(cfg, model_path=str(model_path)))
    ids = torch.randint(3, config.vocab_size, (batch, seq))
    resp = torch.zeros(batch, seq)
    resp[:, seq // 4 :] = 1
    pb = PolicyBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=resp, advantages=torch.randn(batch)
    )
    pb.old_log_probs = backend.log_probs(pb)["log_probs"]
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        metrics = backend.update(pb, num_mini_batches=1, ppo_epochs=1)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step_s = sorted(times[1:])[len(times[1:]) // 2]
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    if PROFILE:
        RESULTS.setdefault("profiles", {})[spec] = profile_update(backend, pb)
    if family == "qwen3moe":
        flops, active = qwen3_moe_step_flops(config, batch=batch, seq=seq), qwen3_moe_active_params(config)
    else:
        flops, active = step_flops(config, batch=batch, seq=seq), active_params(config)["active"]
    total = sum(p.numel() for chunk in backend.backend.model for p in chunk.parameters())
    row = {
        "family": "+".join([family, *options]),
        "layers": layers,
        "hidden": hidden,
        "experts": experts,
        "topk": topk,
        "moe_ffn": moe_ffn,
        "batch": batch,
        "seq": seq,
        "micro_batch": micro,
        "params_total": total,
        "params_active": active,
        "update_s_median": step_s,
        "update_s_all": times,
        "tokens_per_s": batch * seq / step_s,
        "tflops": flops / step_s / 1e12,
        "mfu": flops / step_s / H200_BF16_DENSE_PEAK,
        "peak_mem_gib": peak_gib,
        "loss": metrics["loss"],
    }
    RESULTS.setdefault("mfu", []).append(row)
    print(json.dumps(row), flush=True)
    del backend
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--phases", default="grpo,mfu")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--mfu",
        action="append",
        default=[],
        help="family(qwen3moe|qwen35moe),layers,experts,topk,moe_ffn,hidden,batch,seq,micro (repeatable)",
    )
    parser.add_argument("--profile", action="store_true", help="profile one update of each MFU model")
    parser.add_argument("--trace", action="store_true", help="with --profile: write its Chrome trace to --out")
    args = parser.parse_args()
    global PROFILE, TRACE_DIR
    PROFILE = args.profile
    TRACE_DIR = args.out if args.trace else None
    args.out.mkdir(parents=True, exist_ok=True)
    RESULTS["device"] = torch.cuda.get_device_name()
    jobs: list[tuple[str, Any]] = []
    if "grpo" in args.phases:
        jobs.append(("grpo", lambda: phase_grpo(args.out, args.steps)))
    if "mfu" in args.phases:
        for spec in args.mfu or ["qwen3moe,8,32,8,768,2048,16,2048,4"]:
            jobs.append((f"mfu:{spec}", lambda spec=spec: phase_mfu(spec)))
    for name, job in jobs:
        try:
            job()
        except Exception:  # record and go on to the next phase: device time is scarce
            RESULTS.setdefault("errors", {})[name] = traceback.format_exc()[-4000:]
            traceback.print_exc()
        (args.out / "megatron_gpu_run.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    print(json.dumps({k: v for k, v in RESULTS.items() if k != "errors"}, default=str)[:6000])
    sys.exit(1 if "errors" in RESULTS else 0)


if __name__ == "__main__":
    main()
