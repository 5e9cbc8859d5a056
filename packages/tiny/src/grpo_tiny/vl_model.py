"""A tiny random-weight Qwen3.5-MoE vision-language model and its processor, made on the fly.

The language model is the tiny preset's (`tiny_model.build_model`); beside it, a one-block vision
tower (`Qwen3_5MoeForConditionalGeneration`, Qwen3.5's real checkpoint layout). The processor is
transformers' `Qwen3VLProcessor` (what `AutoProcessor` gives for Qwen3.5) over the tiny tokenizer
with Qwen's vision tokens added: 16-pixel patches, 2x2 merged, so a 64x64 image is 4 image tokens.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from grpo_tiny import model as tiny_model

log = structlog.get_logger()

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH = 16
MERGE = 2
IMAGE_SIDE = 64  # every image is resized to at most IMAGE_SIDE x IMAGE_SIDE pixels
# The tiny template: message text as is, each image part as Qwen's vision span.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)


def build_processor(texts: list[str], *, vocab_size: int):
    """`Qwen3VLProcessor` over a tokenizer trained on `texts` plus Qwen's vision tokens."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tokenizer = tiny_model.build_tokenizer(texts, vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    pixels = {"patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": 2}
    images = Qwen2VLImageProcessor(**pixels, min_pixels=(PATCH * MERGE) ** 2, max_pixels=IMAGE_SIDE * IMAGE_SIDE)
    videos = Qwen3VLVideoProcessor(**pixels)
    return Qwen3VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos, chat_template=CHAT_TEMPLATE)


def build_model(processor):
    """Random-weight `Qwen3_5MoeForConditionalGeneration` (float32, fixed seeds) whose vision
    token ids are the processor's."""
    import torch
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    tokenizer = processor.tokenizer
    text = tiny_model.build_model(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_positions=256,
    )
    vision = {
        "depth": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": 2,
        "out_hidden_size": text.config.hidden_size,
    }
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in zip(
        ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), VISION_TOKENS, strict=True
    )}
    config = Qwen3_5MoeConfig(
        text_config=text.config.to_dict(), vision_config=vision, tie_word_embeddings=False, **ids
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny_model.SEED + 1)
        model = Qwen3_5MoeForConditionalGeneration(config).to(torch.float32)
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def ensure_tiny_vl_model(model_dir: Path, *, texts: list[str], vocab_size: int = 48) -> Path:
    """Build processor + model into `model_dir` unless a complete one is already there."""
    if (model_dir / "config.json").exists() and (model_dir / "processor_config.json").exists():
        return model_dir
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    processor = build_processor(texts, vocab_size=vocab_size)
    model = build_model(processor)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    if model_dir.exists():  # a partial earlier build
        import shutil

        shutil.rmtree(model_dir)
    tmp.replace(model_dir)
    log.info("tiny_vl_model.built", path=str(model_dir), parameters=sum(p.numel() for p in model.parameters()))
    return model_dir
