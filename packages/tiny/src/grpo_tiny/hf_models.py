"""Random-weight HF checkpoints of the Qwen families the Megatron backend supports (Qwen3.5-MoE text,
Qwen3-MoE, Qwen3 dense), shrunk and written to a directory: no download. `build_tiny_qwen3`: a
float32 Qwen3 with a tokenizer trained on the fly, sized for vLLM's CPU backend (head_dim 32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def qwen35_moe_config(**overrides: Any) -> Any:
    """Qwen3.5-MoE text shape (hybrid: 3 Gated DeltaNet layers then 1 gated attention layer),
    shrunk. Head dims stay >= 64 (vLLM CPU and the FLA kernels want them)."""
    from transformers import Qwen3_5MoeTextConfig

    layers = overrides.pop("num_hidden_layers", 4)
    values: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 256,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "layer_types": [
            ("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(layers)
        ],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    values.update(overrides)
    return Qwen3_5MoeTextConfig(**values)


def qwen3_moe_config(**overrides: Any) -> Any:
    from transformers import Qwen3MoeConfig

    values: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    values.update(overrides)
    return Qwen3MoeConfig(**values)


def qwen3_dense_config(**overrides: Any) -> Any:
    from transformers import Qwen3Config

    values: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    values.update(overrides)
    return Qwen3Config(**values)


def save_random_model(
    config: Any, path: Path, *, seed: int = 0, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"
) -> Path:
    """Write a random-weight causal LM for `config` (safetensors + config.json) to `path`
    (`device="cuda"` initialises large models much faster)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Norm weights at random values too, so a wrong zero-centring shows up in comparisons.
            if param.dim() == 1 and "norm" in name:
                param.normal_(mean=0.0 if _zero_centred(config, name) else 1.0, std=0.1)
    model.save_pretrained(path)
    return path


def _zero_centred(config: Any, name: str) -> bool:
    return config.model_type.startswith("qwen3_5") and "linear_attn.norm" not in name


# The vLLM tests' model: vLLM on CPU rejects attention head_dim < 32.
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
