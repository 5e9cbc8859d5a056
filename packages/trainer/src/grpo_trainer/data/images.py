"""Images of verl's multimodal rows: an `images` column holding, per row, a list of
`{"bytes": ..., "path": ...}` structs (what `datasets` and verl's geo3k parquet store), file paths or
raw bytes; the prompt marks where each goes with an `<image>` placeholder.

`row_images` decodes and checks a row's images (every image must decode, and there must be as many
placeholders as images); `vision_messages` turns the placeholders into the `{"type": "image"}`
content parts a processor's chat template expects, as verl's `RLHFDataset` does.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IMAGE_PLACEHOLDER = "<image>"
IMAGES_KEY = "images"


class ImageProblem(ValueError):
    """Why a row's images cannot be used (the row is reported and skipped)."""


def _open(data: bytes, what: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageProblem(f"{what} cannot be decoded ({type(exc).__name__}: {exc})") from None
    return image.convert("RGB")


def decode_image(entry: Any, *, base_dir: Path | None = None, what: str = "image") -> Any:
    """One image entry as an RGB `PIL.Image`: a `{"bytes", "path"}` mapping (bytes first), a path
    (relative ones from `base_dir`, the data file's folder), raw bytes, or a PIL image."""
    from PIL import Image

    if isinstance(entry, Image.Image):
        return entry.convert("RGB")
    if isinstance(entry, bytes | bytearray):
        return _open(bytes(entry), what)
    if isinstance(entry, Mapping):
        if entry.get("bytes"):
            return _open(bytes(entry["bytes"]), what)
        entry = entry.get("path")
    if isinstance(entry, str | Path) and str(entry):
        path = Path(entry)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ImageProblem(f"{what} file {str(path)!r} cannot be read ({exc.strerror})") from None
        return _open(data, what)
    raise ImageProblem(f"{what} is {type(entry).__name__}, not image bytes, a path or a {{bytes, path}} struct")


def placeholder_count(prompt: Any) -> int:
    """How many `<image>` placeholders a prompt (a string or chat messages) holds."""
    if isinstance(prompt, str):
        return prompt.count(IMAGE_PLACEHOLDER)
    return sum(str(m.get("content", "")).count(IMAGE_PLACEHOLDER) for m in prompt if isinstance(m, Mapping))


def row_images(
    row: Mapping[str, Any], *, prompt_key: str, image_key: str = IMAGES_KEY, base_dir: Path | None = None
) -> list[Any]:
    """The decoded images of `row`'s `image_key` column (empty for a text row), checked against its
    placeholders."""
    entries = row.get(image_key)
    if entries is None:
        entries = []
    if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
        raise ImageProblem(f"{image_key!r} must be a list of images, got {type(entries).__name__}")
    images = [decode_image(e, base_dir=base_dir, what=f"{image_key}[{i}]") for i, e in enumerate(entries)]
    marks = placeholder_count(row[prompt_key])
    if marks != len(images):
        raise ImageProblem(
            f"the prompt has {marks} {IMAGE_PLACEHOLDER} placeholder(s) for {len(images)} image(s); each image "
            f"needs one placeholder where it goes"
        )
    return images


def vision_messages(prompt: Any) -> list[dict[str, Any]]:
    """Chat messages whose `<image>` placeholders are `{"type": "image"}` parts between
    `{"type": "text"}` parts (messages without a placeholder keep their string content)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    for message in messages:
        content = message["content"]
        if IMAGE_PLACEHOLDER not in content:
            continue
        parts: list[dict[str, str]] = []
        for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        message["content"] = parts
    return messages


def load_processor(model_path: str, *, trust_remote_code: bool = False) -> Any | None:
    """The model's multimodal processor (`AutoProcessor`: pixels, grids, image tokens), or None for
    a text-only model (no processor or image-processor config in its folder)."""
    folder = Path(model_path)
    configs = ("processor_config.json", "preprocessor_config.json")
    if folder.is_dir() and not any((folder / name).exists() for name in configs):
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):  # a hub id without a processor
        return None
    return processor if getattr(processor, "image_processor", None) is not None else None
