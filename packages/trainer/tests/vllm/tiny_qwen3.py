"""A tiny random-weight Qwen3 and a tokenizer trained on the fly, sized for vLLM's CPU backend
(attention head_dim 32; 16 is rejected). Test code: used by the vLLM tests (this folder's conftest puts
it on sys.path) and `bench/bench_vllm_rollout.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXTS = [f"the quick brown fox {i} jumps over the lazy dog {i * 7 % 13}" for i in range(200)]


def build_tiny_qwen3(
    path: Path | str,
    *,
    seed: int = 0,
    vocab_size: int = 300,
    num_layers: int = 2,
    hidden_size: int = 128,
    tokenizer: Any = None,
) -> tuple[Any, Any]:
    """Save a float32 `Qwen3ForCausalLM` (default hidden 128; head_dim 32, hidden_size / 32 heads)
    and its tokenizer to `path`; returns `(model, tokenizer)`. Without `tokenizer`, a byte-level
    BPE of `vocab_size` is trained on a small corpus. The same seed gives the same weights."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if tokenizer is None:
        tokenizer = _train_tokenizer(vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=max(1, hidden_size // 64),
        head_dim=32,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|pad|>", "<|endoftext|>"], show_progress=False
    )
    core.train_from_iterator(TEXTS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", eos_token="<|endoftext|>")
