"""vLLM rollout benchmark: our `VLLMRolloutEngine` against calling `vllm.LLM.generate` directly.

1. Rollout tokens/s: the same token-id prompts and the same `vllm.SamplingParams` (n samples,
   sampled-token logprobs, seeded so both paths generate the same tokens), alternating our
   `generate` and a direct `LLM.generate` on the SAME engine in this process (which goes first
   alternates too). Overhead ratio = median over rounds of direct tokens/s / ours (goal <= 1.05).
   On a shared CPU the engine's own speed drifts between calls, so the adapter's cost is also
   measured exactly: time inside our `generate` but outside its `LLM.generate` call.
2. Weight sync: `update_weights(policy.named_parameters())` (in place, bucketed) against putting
   the same weights in through the disk: `save_pretrained` + vLLM's in-place `reload_weights`
   from that directory, and a whole new engine built from disk.

Run: `hatch run bench-vllm` (CPU, tiny random Qwen3) or with `--layers/--hidden` for a larger model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

# The tiny random Qwen3 builder is test code: it lives with the vLLM tests.


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sync-repeats", type=int, default=9)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--model-path", default=None, help="an HF checkpoint instead of the tiny random Qwen3"
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--skip-engine-reload", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from grpo_tiny.hf_models import build_tiny_qwen3
    from grpo_trainer.protocols import SamplingParams
    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    workdir = Path(tempfile.mkdtemp(prefix="bench_vllm_"))
    if args.model_path:
        model_path = args.model_path
        policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, args.dtype))
    else:
        model_path = str(workdir / "model")
        policy, _ = build_tiny_qwen3(model_path, seed=0, num_layers=args.layers, hidden_size=args.hidden)
    engine_kwargs = {
        "model_path": model_path,
        "dtype": args.dtype,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": True,
        "max_model_len": 512,
        "weight_sync_bucket_mb": args.bucket_mb,
    }
    if not torch.cuda.is_available():
        engine_kwargs["kv_cache_memory_bytes"] = 512 * 2**20
    start = time.perf_counter()
    engine = VLLMRolloutEngine(**engine_kwargs)
    engine_init_s = time.perf_counter() - start

    vocab = policy.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(2, vocab, (int(torch.randint(8, 33, (1,), generator=g)),), generator=g).tolist()
        for _ in range(args.prompts)
    ]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=1234)
    # The exact requests `generate` sends, for the direct baseline.
    direct_params = [
        engine.vllm_sampling_params(params, seed=params.seed + i * params.n) for i in range(len(prompts))
    ]
    direct_requests = [{"prompt_token_ids": p} for p in prompts]

    def ours() -> int:
        return sum(len(gen.token_ids) for gen in engine.generate(prompts, params))

    def direct() -> int:
        outs = engine.llm.generate(direct_requests, direct_params, use_tqdm=False)
        return sum(len(s.token_ids) for o in outs for s in o.outputs)

    ours(), direct()  # warm-up
    inner_s: list[float] = []
    llm_generate = engine.llm.generate

    def timed_llm_generate(*a, **k):
        start = time.perf_counter()
        try:
            return llm_generate(*a, **k)
        finally:
            inner_s.append(time.perf_counter() - start)

    engine.llm.generate = timed_llm_generate  # ours calls it; direct() holds the original
    ratios, tps_ours, tps_direct, adapter = [], [], [], []
    for round_index in range(args.rounds):
        order = ((ours, tps_ours), (direct, tps_direct))
        for fn, sink in order if round_index % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            tokens = fn()
            elapsed = time.perf_counter() - start
            sink.append(tokens / elapsed)
            if fn is ours:
                adapter.append(elapsed / inner_s[-1])
        ratios.append(tps_direct[-1] / tps_ours[-1])
    engine.llm.generate = llm_generate
    assert ours() == direct(), "seeded paths generated different token counts"

    ckpt = workdir / "synced"

    def sync() -> None:
        engine.update_weights(policy.named_parameters())

    def through_disk() -> None:
        policy.save_pretrained(ckpt)
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(ckpt)})
        engine.llm.reset_prefix_cache()

    sync(), through_disk()  # warm-up: first calls set up vLLM's reload bookkeeping
    sync_times, disk_times = [], []
    for _ in range(args.sync_repeats):  # interleaved, so load drift hits both alike
        for fn, sink in ((sync, sync_times), (through_disk, disk_times)):
            start = time.perf_counter()
            fn()
            sink.append(time.perf_counter() - start)
    sync_s, disk_reload_s = statistics.median(sync_times), statistics.median(disk_times)
    engine_reload_s = None
    if not args.skip_engine_reload:
        engine.shutdown()
        del engine
        start = time.perf_counter()
        VLLMRolloutEngine(**{**engine_kwargs, "model_path": str(ckpt)}).shutdown()
        engine_reload_s = time.perf_counter() - start

    results = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "model": args.model_path or f"random Qwen3, {args.layers} layers, hidden {args.hidden}",
        "parameters": sum(p.numel() for p in policy.parameters()),
        "dtype": args.dtype,
        "prompts": args.prompts,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "engine_init_s": round(engine_init_s, 1),
        "tokens_per_s_ours": round(statistics.median(tps_ours), 1),
        "tokens_per_s_direct": round(statistics.median(tps_direct), 1),
        "overhead_ratio": round(statistics.median(ratios), 4),
        "overhead_ratio_per_round": [round(r, 3) for r in ratios],
        "adapter_time_ratio": round(statistics.median(adapter), 5),
        "weight_sync_s": round(sync_s, 4),
        "save_and_reload_weights_from_disk_s": round(disk_reload_s, 4),
        "disk_reload_over_sync": round(disk_reload_s / sync_s, 1),
        "new_engine_from_disk_s": None if engine_reload_s is None else round(engine_reload_s, 1),
        "new_engine_over_sync": None if engine_reload_s is None else round(engine_reload_s / sync_s, 1),
    }
    print(json.dumps(results, indent=2))
    print(
        f"overhead ratio (direct / ours tokens/s, median of {args.rounds} rounds): "
        f"{results['overhead_ratio']:.3f}  (goal <= 1.05); adapter time ratio {results['adapter_time_ratio']:.4f}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this module
    main()
