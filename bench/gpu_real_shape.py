"""The production path at Qwen3.5-35B-A3B's real layer shapes on one GPU, against vLLM's own generate
(issue 42, items 4 and 5).

    bash bench/gpu_session.sh real=--layers,4,--steps,10      # after the three unpack calls; carry [".rayw"]

One pair per --pairs:
1. `train()` through the production path with the 35B GPU profile's actor, reference, rollout and
   algorithm settings (Megatron actor with its CPU optimizer, offloaded while vLLM is awake; vLLM
   colocated, CUDA graphs as the profile leaves `enforce_eager`, its gpu_memory_utilization, n and
   batch), on one GPU (TP 1, EP 1), on a random-weight checkpoint of the 35B's text shapes (hidden
   2048, 256 experts x FFN 512 top 8 plus the shared expert, attention 16 / 2 heads of 256, Gated
   DeltaNet 16 / 32 heads of 128, vocabulary 248,320) at --layers layers, in Qwen3.5's checkpoint
   layout (a one-layer vision tower vLLM skips), the tiny task's prompts and tokenizer.
2. In the same process once `train()` has freed the GPU: a vLLM engine with the same settings
   (`VLLMRolloutEngine.from_config` of the same config) generating one batch of the same prompts
   with vLLM's own `LLM.generate` and through grpo's adapter, alternating, --raw-runs each.
Printed per pair: per-phase seconds (median of steps 2..), rollout tokens/s in `train()`, raw and
adapter tokens/s, `train()`'s generate time over raw's for the same batch, rewards and grad norms
(finite), the GPU's peak memory in use against the memory plan's (`grpo_launch.memory_plan`).
Results in OUT/gpu_real_shape.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import traceback
from pathlib import Path
from typing import Any

from gpu_production_path import GpuMemoryPeak, phase_medians, rollout_tokens_per_s
from gpu_weight_sync import TEXT, raw_vs_adapter

VISION = {"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}


def write_checkpoint(tiny_model_dir: Path, out_dir: Path, layers: int) -> Path:
    """Random bf16 weights of the 35B's text shapes at `layers` layers, in Qwen3.5's checkpoint layout,
    with the tiny model's tokenizer and special-token ids (built on the GPU: seconds, not minutes)."""
    import torch
    from transformers import AutoConfig, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    tiny = AutoConfig.from_pretrained(tiny_model_dir)
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    text = dict(TEXT, num_hidden_layers=layers, layer_types=types, bos_token_id=tiny.bos_token_id,
                eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id)
    config = Qwen3_5MoeConfig(text_config=text, vision_config=dict(VISION, out_hidden_size=TEXT["hidden_size"]),
                              tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3_5MoeForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    del model
    torch.cuda.empty_cache()
    for path in Path(tiny_model_dir).iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(path, out_dir / path.name)
    return out_dir


def settings(preset: dict[str, Any], model_dir: Path, *, steps: int, response: int) -> list[str]:
    """The 35B GPU profile's sections that shape the update and the rollout, on one GPU."""
    from grpo_launch_qwen35_35b import PROFILE

    profile = PROFILE.config_for("gpu")
    return [
        *(line for key in ("actor", "ref", "rollout", "algorithm") for line in _dotted(key, profile[key])),
        f"actor.model_path={model_dir}",
        "actor.megatron.transformer_impl=local",  # TransformerEngine is not built here (issue 46)
        "parallel.tp=1", "parallel.ep=1", "parallel.sequence_parallel=false",
        "rollout.tensor_parallel_size=1",
        'rollout.engine_kwargs={"language_model_only": true, "gdn_prefill_backend": "triton"}',
        "device.kind=cuda", "device.devices_per_node=1", "device.expandable_segments=true",
        f"data.train_batch_size={profile['data']['train_batch_size']}",
        f"actor.ppo_mini_batch_size={profile['data']['train_batch_size']}",
        f"data.max_response_length={response}",
        f"total_training_steps={steps}",
        "test_freq=-1", "checkpoint.save_freq=-1", "checkpoint.export_hf=false",
        "logging.tensorboard=false", "logging.plot=false",
    ]


def _dotted(prefix: str, value: Any) -> list[str]:
    """A profile section as dotted overrides, one leaf a line (mappings entry by entry)."""
    if isinstance(value, dict):
        return [line for key, inner in value.items() for line in _dotted(f"{prefix}.{key}", inner)]
    return [f"{prefix}={json.dumps(value)}"]


def planned_gib(cfg: Any, model_dir: Path) -> dict[str, Any]:
    """The launchers' memory plan for this config and checkpoint (GiB per phase and part)."""
    try:
        import torch

        from grpo_launch.memory_plan import model_counts, plan_memory

        device = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
        return plan_memory(cfg, model_counts(model_dir), device_bytes=device).to_dict()
    except Exception as exc:  # the plan is a report beside the measurement, never a reason to stop
        return {"error": f"{type(exc).__name__}: {exc}"}


def one_pair(workdir: Path, *, layers: int, steps: int, response: int, raw_runs: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    import grpo_config
    from grpo_launch import tiny_preset
    from grpo_trainer import read_metrics, train
    from grpo_trainer.batching import response_budget
    from grpo_trainer.data import datasets_for
    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    preset = tiny_preset(workdir)
    model_dir = write_checkpoint(Path(preset["actor"]["model_path"]), workdir / "model35b", layers)
    cfg = grpo_config.load(preset, settings(preset, model_dir, steps=steps, response=response))
    with GpuMemoryPeak() as memory:
        result = train(cfg)
    rows = {s: r for s, r in read_metrics(result.metrics_path).items() if "reward/mean" in r}
    later = [r for s, r in rows.items() if s > 1]
    sequences = cfg.data.train_batch_size * cfg.rollout.n
    train_generate_s = statistics.median(r["timing/generate_s"] for r in later)
    summary: dict[str, Any] = {
        "layers": layers,
        "final_step": result.final_step,
        "phase_s_median": phase_medians(later),
        "train_rollout_tokens_per_s": rollout_tokens_per_s(later, sequences),
        "response_length_mean": statistics.fmean(r["response_length/mean"] for r in later),
        "rewards": [r["reward/mean"] for r in rows.values()],
        "grad_norms": [r.get("actor/grad_norm", float("nan")) for r in rows.values()],
        "gpu_memory_peak_mib": memory.peak,
        "memory_plan": planned_gib(cfg, model_dir),
    }
    summary["finite"] = all(math.isfinite(x) for x in summary["rewards"] + summary["grad_norms"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_data, _ = datasets_for(cfg.data, tokenizer, None)
    ids = [list(train_data[i].prompt_ids) for i in range(cfg.data.train_batch_size)]
    engine = VLLMRolloutEngine.from_config(cfg, str(model_dir))
    try:
        raw = raw_vs_adapter(engine, prompts=len(ids), n=cfg.rollout.n, max_tokens=response_budget(cfg),
                             runs=raw_runs, ids=ids)
    finally:
        engine.shutdown()
    summary["raw"] = raw
    summary["train_generate_over_raw"] = round(train_generate_s / statistics.median(raw["raw_s"]), 4)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rewards", "grad_norms")}), flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--response", type=int, default=512, help="data.max_response_length")
    parser.add_argument("--raw-runs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for _ in range(args.pairs):
        try:
            results.append(one_pair(Path(tempfile.mkdtemp()), layers=args.layers, steps=args.steps,
                                    response=args.response, raw_runs=args.raw_runs))
        except Exception:
            results.append({"error": traceback.format_exc()[-8000:]})
            traceback.print_exc()
        (args.out / "gpu_real_shape.json").write_text(json.dumps(results, indent=2, default=str))
    ratios = [r["train_generate_over_raw"] for r in results if "train_generate_over_raw" in r]
    if ratios:
        print(f"REAL SHAPE {args.layers} layers: train() generate / raw vLLM, median of {len(ratios)} pairs: "
              f"{statistics.median(ratios):.3f} (goal <= 1.05)", flush=True)
    raise SystemExit(1 if any("error" in r for r in results) else 0)


if __name__ == "__main__":
    main()
