"""Packed (padding-free) rows against padded rows on the torch backend's forward, CPU, tiny model.

The same code the torch backend runs (`hf_model.token_log_probs`, padded or `packed=True`) on the
tiny preset's random-weight Qwen3.5-MoE, for micro-batches drawn from two length distributions:
the tiny task's (prompts 3-8 tokens, responses 1-8) and a geo3k-like one (text prompts ~N(180, 50)
tokens, responses log-normal with median 280 and a tail to the 1024-token budget, as RL on
geometry QA produces). Prints tokens computed, and seconds per micro-batch for the log-prob
(no-grad) and update (forward + backward) passes, padded / packed side by side.

    hatch run python bench/packing_tiny.py [--rows 8] [--micro-batches 4] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from grpo_launch.presets.tiny import tiny_preset
from grpo_trainer.backends.hf_model import load_causal_lm, token_log_probs
from grpo_trainer.batching import pad_rows


def lengths(kind: str, rows: int, gen: torch.Generator) -> list[tuple[int, int]]:
    if kind == "tiny":
        prompts = torch.randint(3, 9, (rows,), generator=gen)
        responses = torch.randint(1, 9, (rows,), generator=gen)
    else:
        prompts = (torch.randn(rows, generator=gen) * 50 + 180).clamp(60, 400).long()
        responses = torch.exp(torch.randn(rows, generator=gen) * 0.8 + torch.log(torch.tensor(280.0)))
        responses = responses.clamp(16, 1024).long()
    return list(zip(prompts.tolist(), responses.tolist(), strict=True))


def micro_batch(pairs: list[tuple[int, int]], vocab: int, gen: torch.Generator):
    prompts = [torch.randint(3, vocab, (p,), generator=gen).tolist() for p, _ in pairs]
    responses = [torch.randint(3, vocab, (r,), generator=gen).tolist() for _, r in pairs]
    return pad_rows(prompts, responses, pad_token_id=0)


def log_probs(model, batch, packed: bool, outputs: dict) -> None:
    with torch.no_grad():
        outputs[packed] = token_log_probs(model, batch.input_ids, batch.attention_mask, with_entropy=False, packed=packed)[0]


def forward_backward(model, batch, packed: bool) -> None:
    model.zero_grad(set_to_none=True)
    out, _ = token_log_probs(model, batch.input_ids, batch.attention_mask, with_entropy=False, packed=packed)
    (out * batch.response_mask).sum().backward()


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = tiny_preset(Path(tempfile.mkdtemp(prefix="packing_")))
    model = load_causal_lm(cfg["actor"]["model_path"], device=torch.device("cpu"))
    vocab = model.config.vocab_size
    print(f"tiny Qwen3.5-MoE, CPU, {args.threads} thread(s); {args.micro_batches} micro-batches of {args.rows} rows each")
    print(f"{'lengths':10} {'tokens':>8} {'padded':>8} {'saved':>6}  {'log-prob s':>17}  {'fwd+bwd s':>17}  max diff")
    for kind in ("tiny", "geo3k-like"):
        gen = torch.Generator().manual_seed(0)
        real = padded = 0
        lp = {False: 0.0, True: 0.0}
        fb = {False: 0.0, True: 0.0}
        worst = 0.0
        for _ in range(args.micro_batches):
            batch = micro_batch(lengths(kind, args.rows, gen), vocab, gen)
            real += int(batch.attention_mask.sum())
            padded += batch.attention_mask.numel()
            outputs = {}
            for packed in (False, True):
                lp[packed] += timed(partial(log_probs, model, batch, packed, outputs), args.repeats)
                fb[packed] += timed(partial(forward_backward, model, batch, packed), args.repeats)
            worst = max(worst, float((outputs[True] - outputs[False]).abs().max()))
        n = args.micro_batches
        print(
            f"{kind:10} {real:>8} {padded:>8} {1 - real / padded:>6.0%}  "
            f"{lp[False] / n:>7.3f} / {lp[True] / n:<7.3f}  {fb[False] / n:>7.3f} / {fb[True] / n:<7.3f}  {worst:.1e}"
        )
    print("(seconds per micro-batch, padded / packed; max diff: packed vs padded log-probs)")


if __name__ == "__main__":
    main()
