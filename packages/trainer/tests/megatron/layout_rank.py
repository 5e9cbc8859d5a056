"""One rank of a layout run (started by `cpu_ranks.run_ranks`): the Megatron backend as `train()`
builds it (`MegatronBackend.for_config(cfg)` under `Actor`, from an HF checkpoint through Megatron-Bridge),
at the spec's parallel sizes, in float32 on the CPU over gloo. In order:
1. the HF-named weights the backend pushes to a rollout engine (`named_weights`), compared on this
   rank with the reference run's (world size 1) when one is given;
2. log-probs of this data-parallel rank's rows;
3. one optimizer step through `Actor.update_mini_batch` (the loss and grad norm it reports);
4. the weights after that step, compared likewise, and log-probs under them;
5. the strict HF export (`export_hf`, Megatron-Bridge `save_hf_weights`) into `out/export`;
6. with "checkpoint": a checkpoint as the workers save it (`actor_checkpoint.save_actor`), then a
   second update. With "resume": only the load of such a checkpoint (`load_actor`, at this run's
   layout) and the second update.
Writes `out/rank{R}.json` (numbers) and `out/rank{R}.pt` (tensors); the reference run also writes
its weights (`out/weights_{before,after}.pt`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import cpu_ranks
import torch

ROWS, SEQ, VOCAB = 8, 32, 512


def layout_batch(rows: int = ROWS, seq: int = SEQ, *, seed: int = 0) -> Any:
    """Right-padded rows of random tokens, the second half of each a response with an advantage."""
    from grpo_trainer.protocols import PolicyBatch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, seq), generator=gen)
    lengths = torch.randint(seq // 2 + 2, seq + 1, (rows,), generator=gen)
    attention = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    response = attention.float()
    response[:, : seq // 2] = 0
    return PolicyBatch(
        input_ids=ids * attention,
        attention_mask=attention,
        response_mask=response,
        advantages=torch.randn(rows, generator=gen),
    )


def vision_language_batch(model_path: str, scratch: Path, rows: int = ROWS) -> Any:
    """The tiny-vl task's prompts (each with its image, through the checkpoint's processor) and a
    three-token answer, right-padded; images of two sizes so the patch grids differ."""
    from transformers import AutoProcessor

    from grpo_tiny import task as tiny_task
    from grpo_tiny import vl_task as tiny_vl_task
    from grpo_trainer.data import PromptDataset
    from grpo_trainer.protocols import PolicyBatch
    from grpo_trainer.vision import pixel_inputs

    processor = AutoProcessor.from_pretrained(model_path)
    tiny_task.write_parquet(tiny_vl_task.make_rows(count=rows, seed=5, split="train"), scratch / "rows.parquet")
    data = PromptDataset([scratch / "rows.parquet"], processor.tokenizer, processor=processor, max_prompt_length=64)
    answer = processor.tokenizer("\\boxed{3}", add_special_tokens=False)["input_ids"][:3]
    prompts = [data[i].prompt_ids + answer for i in range(rows)]
    width = max(map(len, prompts)) + 2
    ids = torch.zeros(rows, width, dtype=torch.long)
    response = torch.zeros(rows, width)
    for i, row in enumerate(prompts):
        ids[i, : len(row)] = torch.tensor(row)
        response[i, len(row) - len(answer) : len(row)] = 1
    attention = (torch.arange(width)[None] < torch.tensor([len(r) for r in prompts])[:, None]).long()
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attention,
        response_mask=response,
        advantages=torch.randn(rows, generator=torch.Generator().manual_seed(0)),
        vision=[pixel_inputs(processor.image_processor, data[i].images) for i in range(rows)],
    )


def layout_config(spec: dict[str, Any]) -> Any:
    from grpo_config.schema import (
        ActorConfig,
        DataConfig,
        DeviceConfig,
        MegatronConfig,
        ParallelConfig,
        TrainerConfig,
    )

    par = spec["parallel"]
    megatron = MegatronConfig(
        transformer_impl="local",
        moe_grouped_gemm=spec.get("grouped_experts", False),
        moe_permute_fusion=False,
        apply_rope_fusion=False,
        moe_token_dispatcher_type=spec.get("dispatcher", "alltoall"),  # the launchers' profiles: alltoall
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        use_distributed_optimizer=spec.get("distributed_optimizer", False),
        # megatron-core's torch Gated DeltaNet (FLA's kernels are Triton: no CPU).
        override_transformer_config={"deterministic_mode": True, **spec.get("overrides", {})},
        # Adam's first step moves each weight by lr * g / (|g| + eps): with the default eps an element
        # whose gradient is ~1e-8 turns a rounding difference into a 5e-5 weight difference (seen at
        # TP2). A larger eps keeps the step proportional to such small gradients (docs/LAYOUTS.md).
        override_optimizer_config={"adam_eps": 1e-3},
        **spec.get("megatron", {}),
    )
    actor = ActorConfig(
        model_path=spec["model_path"],
        backend="megatron",
        dtype=spec.get("dtype", "float32"),
        lr=1e-3,
        ppo_micro_batch_size_per_device=2,
        log_prob_micro_batch_size_per_device=2,
        use_kl_loss=False,
        megatron=megatron,
    )
    return TrainerConfig(
        actor=actor,
        data=DataConfig(max_prompt_length=64, max_response_length=SEQ // 2),
        device=DeviceConfig(kind="cpu"),
        parallel=ParallelConfig(
            tp=par.get("tp", 1),
            pp=par.get("pp", 1),
            vpp=par.get("vpp"),
            ep=par.get("ep", 1),
            etp=par.get("etp", 1),
            cp=par.get("cp", 1),
            sequence_parallel=par.get("tp", 1) > 1,
        ),
    )


def _rows_of(batch: Any, dp_rank: int, dp_size: int) -> Any:
    from grpo_trainer.batching import take_rows

    per = batch.input_ids.shape[0] // dp_size
    return take_rows(batch, list(range(dp_rank * per, (dp_rank + 1) * per)))


def _weights(backend: Any) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in backend.named_weights()}


def _compare(ours: dict[str, torch.Tensor], reference_file: Path) -> dict[str, Any]:
    theirs = torch.load(reference_file)
    common = sorted(set(ours) & set(theirs))
    diffs = {n: float((ours[n].double() - theirs[n].double()).abs().max()) for n in common if ours[n].shape == theirs[n].shape}
    return {
        "missing": sorted(set(theirs) - set(ours)),
        "unexpected": sorted(set(ours) - set(theirs)),
        "shape_mismatch": [n for n in common if ours[n].shape != theirs[n].shape],
        "max_abs_diff": max(diffs.values(), default=0.0),
        "bitwise_equal": all(torch.equal(ours[n], theirs[n]) for n in common if n in diffs),
        "count": len(ours),
    }


def _first_update(
    spec: dict[str, Any], backend: Any, actor: Any, batch: Any, result: dict, tensors: dict, *, out: Path,
    reference: Path | None, rank: int
) -> None:
    before = _weights(backend)
    if reference is None and rank == 0:
        torch.save(before, out / "weights_before.pt")
    elif reference is not None:
        result["weights_before"] = _compare(before, reference / "weights_before.pt")

    log_probs = actor.log_probs(batch)["log_probs"]
    tensors["log_probs"] = log_probs
    metrics = actor.update_mini_batch(dataclasses.replace(batch, old_log_probs=log_probs), lr=1e-3)
    result["metrics"] = metrics

    after = _weights(backend)
    if reference is None and rank == 0:
        torch.save(after, out / "weights_after.pt")
    elif reference is not None:
        result["weights_after"] = _compare(after, reference / "weights_after.pt")
    tensors["log_probs_after"] = actor.log_probs(batch)["log_probs"]

    report = backend.export_hf(str(out / "export"), strict=True)
    if report is not None:
        result["export"] = report.to_manifest()
    if spec.get("checkpoint"):
        _save(actor, out / "ckpt", spec.get("save_contents", ["model", "optimizer", "extra"]))
        _second_update(actor, batch, result, tensors)


def _save(actor: Any, root: Path, contents: list[str]) -> None:
    """As `PolicyWorker.save_checkpoint` saves (`contents`: checkpoint.save_contents), through grpo_ckpt."""
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.workers.actor_checkpoint import save_actor

    save_actor(CheckpointManager(root), 1, actor, contents=contents, trainer_state={"global_step": 1})


def _second_update(actor: Any, batch: Any, result: dict, tensors: dict) -> None:
    log_probs = actor.log_probs(batch)["log_probs"]
    tensors["log_probs_second"] = log_probs
    result["metrics_second"] = actor.update_mini_batch(dataclasses.replace(batch, old_log_probs=log_probs), lr=1e-3)
    tensors["weights_second"] = _weights(actor.backend)


def _resume(spec: dict[str, Any], actor: Any, batch: Any, result: dict, tensors: dict) -> None:
    """Load the checkpoint another run saved after its first update (as `PolicyWorker.load_checkpoint`
    does), then its second update; a refusal is recorded, not raised."""
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.workers.actor_checkpoint import load_actor

    path = Path(spec["resume"])
    try:
        load_actor(CheckpointManager(path.parent), path, actor)
    except ValueError as exc:
        result["refused"] = str(exc)
        return
    from grpo_trainer.backends.megatron.state import adam_step

    result["adam_step_after_load"] = adam_step(actor.backend.optimizer)
    _second_update(actor, batch, result, tensors)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    reference = Path(spec["reference"]) if spec.get("reference") else None
    cpu_ranks.apply_cpu_patches()
    rank, _ = cpu_ranks.init_rank()
    torch.manual_seed(0)
    from megatron.core import parallel_state as mpu

    from grpo_trainer.backends.megatron import MegatronBackend
    from grpo_trainer.workers.actor import Actor

    cfg = layout_config(spec)
    backend = MegatronBackend.for_config(cfg)
    actor = Actor.for_config(cfg, backend)
    result: dict[str, Any] = {
        "rank": rank,
        "dp_rank": backend.dp_rank,
        "dp_size": backend.dp_size,
        "tp_rank": mpu.get_tensor_model_parallel_rank(),
        "pp_rank": mpu.get_pipeline_model_parallel_rank(),
        "ep_rank": mpu.get_expert_model_parallel_rank(),
    }
    tensors: dict[str, Any] = {}

    if spec.get("vision_language"):
        scratch = out / f"rank{rank}_data"
        scratch.mkdir(exist_ok=True)
        full = vision_language_batch(spec["model_path"], scratch)
    else:
        full = layout_batch()
    batch = _rows_of(full, backend.dp_rank, backend.dp_size)
    if spec.get("resume"):
        _resume(spec, actor, batch, result, tensors)
    else:
        _first_update(spec, backend, actor, batch, result, tensors, out=out, reference=reference, rank=rank)
    torch.save(tensors, out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()

