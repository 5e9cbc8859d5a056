"""The built-in visual task of the `tiny-vl` preset (data_source "grpo/tiny_vl"): count the squares.

Each row's image (64x64 PNG, in verl's `images` column as `{"bytes", "path"}`) holds 1 to 4
coloured squares on a grey ground; the prompt is `<image>` and a question, the ground truth the
count. The score is the tiny task's (`tiny_task.score`): the share of the response's non-blank
characters that are the right digit, dense enough for a random-weight model to be rewarded.
"""

from __future__ import annotations

import io
import random
from typing import Any

from grpo_tiny import task as tiny_task

DATA_SOURCE = "grpo/tiny_vl"
SIDE = 64
SQUARE = 12
COLOURS = ((220, 40, 40), (40, 160, 60), (40, 80, 220), (230, 200, 40))
QUESTIONS = ("how many squares", "count the squares", "squares")
SCORE_FN = tiny_task.SCORE_FN  # the share of the right digit


def draw(count: int, rng: random.Random) -> bytes:
    """PNG bytes of `count` non-overlapping squares at random places, in random colours."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE), (128, 128, 128))
    pen = ImageDraw.Draw(image)
    cells = rng.sample([(x, y) for x in range(0, SIDE, SIDE // 4) for y in range(0, SIDE, SIDE // 4)], count)
    for x, y in cells:
        pen.rectangle((x + 2, y + 2, x + 2 + SQUARE - 1, y + 2 + SQUARE - 1), fill=rng.choice(COLOURS))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def make_rows(*, count: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`count` verl-format multimodal rows."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        squares = rng.randint(1, 4)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"<image>{rng.choice(QUESTIONS)}"}],
                "images": [{"bytes": draw(squares, rng), "path": None}],
                "ability": "count",
                "reward_model": {"style": "rule", "ground_truth": str(squares)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def corpus() -> list[str]:
    """Text the tiny tokenizer is trained on: the questions and the answers."""
    return [*QUESTIONS, *tiny_task.corpus()]
