"""Vision inputs of a prompt, built once by the model's image processor and carried with the
prompt's responses: `pixel_values` ([patches, channels x temporal x patch x patch]) and
`image_grid_thw` ([images, 3]), what Qwen3.5's vision tower reads. One function builds them, one
joins the rows of a micro-batch (the model takes every image of the batch in row order)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch

# {"pixel_values", "image_grid_thw"} tensors, and "images": the PNG bytes they came from (what an
# engine that runs its own processor, vLLM, takes).
VisionInputs = dict[str, Any]


def pixel_inputs(image_processor: Any, images: Sequence[bytes]) -> VisionInputs | None:
    """The processor's pixel values and patch grids of `images` (PNG bytes, in prompt order);
    None for a prompt without images."""
    if not images:
        return None
    from PIL import Image

    decoded = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    out = image_processor(images=decoded, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"], "images": tuple(images)}


def decoded_images(vision: VisionInputs) -> list[Any]:
    """The prompt's images as RGB PIL images."""
    from PIL import Image

    return [Image.open(io.BytesIO(data)).convert("RGB") for data in vision["images"]]


def join_rows(rows: Sequence[VisionInputs | None] | None) -> VisionInputs:
    """Model keyword arguments for a batch whose rows carry `rows` (their images concatenated in
    row order); {} when no row has images."""
    present = [r for r in rows or () if r is not None]
    if not present:
        return {}
    return {key: torch.cat([r[key] for r in present]) for key in ("pixel_values", "image_grid_thw")}


def placeholder_ids(config: Any) -> list[int]:
    """The vision placeholder token ids of a model config (image, video, vision start / end) that
    are in its vocabulary: what a response never holds. [] for a text model."""
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    ids = {i for name in names if isinstance(i := getattr(config, name, None), int)}
    return sorted(i for i in ids if vocab is None or 0 <= i < vocab)


def token_types(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """Qwen3.5's `mm_token_type_ids` (1 on image tokens, 2 on video tokens, 0 elsewhere), which its
    multimodal RoPE reads; derived from the ids as the processor does."""
    types = torch.zeros_like(input_ids)
    types[input_ids == config.image_token_id] = 1
    video = getattr(config, "video_token_id", None)
    if video is not None:
        types[input_ids == video] = 2
    return types
