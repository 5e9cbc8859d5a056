"""Images of verl's multimodal rows: every stored form decodes, an undecodable image or a
placeholder count that differs from the image count is a problem the dataset reports, and
placeholders become the image parts a processor's chat template reads. Real PNG bytes, real files."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from grpo_trainer.data.images import (
    ImageProblem,
    decode_image,
    placeholder_count,
    row_images,
    vision_messages,
)


def _png(colour: tuple[int, int, int], size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_stored_form_decodes_to_rgb(tmp_path: Path) -> None:
    red = _png((255, 0, 0))
    (tmp_path / "red.png").write_bytes(red)
    forms = [
        red,
        {"bytes": red, "path": "ignored.png"},
        {"bytes": None, "path": "red.png"},
        "red.png",
        str(tmp_path / "red.png"),
        Image.open(io.BytesIO(red)).convert("L"),
    ]
    for form in forms:
        image = decode_image(form, base_dir=tmp_path)
        assert image.mode == "RGB" and image.size == (8, 8)
        assert image.getpixel((0, 0)) in ((255, 0, 0), (76, 76, 76))  # the grey one stays grey


@pytest.mark.parametrize(
    "entry,message",
    [
        (b"not a png", r"images\[0\] cannot be decoded"),
        ({"bytes": b"\x89PNG\r\n\x1a\n broken", "path": None}, "cannot be decoded"),
        ({"bytes": None, "path": "missing.png"}, "cannot be read"),
        (42, "not image bytes"),
    ],
)
def test_a_bad_image_is_a_problem_that_names_it(tmp_path: Path, entry, message) -> None:
    row = {"prompt": [{"role": "user", "content": "<image> how many?"}], "images": [entry]}
    with pytest.raises(ImageProblem, match=message):
        row_images(row, prompt_key="prompt", base_dir=tmp_path)


def test_placeholders_must_match_the_images() -> None:
    two = [_png((0, 0, 255)), _png((0, 255, 0))]
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "<image> and <image>: same?"}]
    assert placeholder_count(prompt) == 2 and placeholder_count("no image") == 0
    assert [im.getpixel((0, 0)) for im in row_images({"prompt": prompt, "images": two}, prompt_key="prompt")] == [
        (0, 0, 255),
        (0, 255, 0),
    ]
    with pytest.raises(ImageProblem, match=r"1 <image> placeholder\(s\) for 2 image\(s\)"):
        row_images({"prompt": "<image> what?", "images": two}, prompt_key="prompt")
    with pytest.raises(ImageProblem, match=r"2 <image> placeholder\(s\) for 0 image\(s\)"):
        row_images({"prompt": prompt}, prompt_key="prompt")
    assert row_images({"prompt": "text only"}, prompt_key="prompt") == []


def test_placeholders_become_image_parts_in_place() -> None:
    messages = vision_messages(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "look <image> then <image>"}]
    )
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1]["content"] == [
        {"type": "text", "text": "look "},
        {"type": "image"},
        {"type": "text", "text": " then "},
        {"type": "image"},
    ]
    assert vision_messages("<image>count") == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "count"}]}
    ]
