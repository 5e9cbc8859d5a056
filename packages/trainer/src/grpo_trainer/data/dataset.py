"""Prompt dataset: verl-format rows tokenised once, at construction, with the tokenizer's chat
template (`add_generation_prompt=True`), then filtered or truncated to `max_prompt_length`.

The derivation: docs/INTERNALS.md, `grpo_trainer.data.dataset`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from grpo_config.schema import DataConfig
from grpo_trainer.data.images import IMAGES_KEY, ImageProblem, row_images, vision_messages
from grpo_trainer.data.rows import DataReport, RawRow, read_raw_rows, row_problem

log = structlog.get_logger()

OverlongMode = Literal["filter", "truncate_left", "truncate_right", "error"]
OVERLONG_MODES: tuple[str, ...] = ("filter", "truncate_left", "truncate_right", "error")


class OverlongPromptError(ValueError):
    """A prompt longer than max_prompt_length in `overlong="error"` mode."""


@dataclass(frozen=True, kw_only=True)
class PromptItem:
    """One usable prompt. `index` is the row's position across the source files (0-based)."""

    prompt_ids: list[int]
    ground_truth: Any
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    index: int
    raw_prompt: list[dict[str, str]] | str
    # PNG bytes of the prompt's images, in placeholder order (empty for a text prompt), and the
    # processor's patch grid of each (t, h, w): what rollout and training rebuild the pixels from.
    images: tuple[bytes, ...] = ()
    image_grid_thw: tuple[tuple[int, int, int], ...] = ()


def _has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


class PromptDataset:
    """Random-access prompts (`len`, `[i]`) from parquet / jsonl files."""

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        image_key: str = IMAGES_KEY,
        max_prompt_length: int,
        overlong: OverlongMode = "filter",
        apply_chat_template: bool = True,
        processor: Any | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        if overlong not in OVERLONG_MODES:
            raise ValueError(f"unknown overlong mode {overlong!r}; use one of {list(OVERLONG_MODES)}")
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        self.prompt_key = prompt_key
        self.image_key = image_key
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.report = DataReport()
        self.processor = processor
        self.tools = tools  # JSON schemas the chat template lists for the model (multi-turn)
        self._use_template = apply_chat_template and _has_chat_template(tokenizer)
        if apply_chat_template and not self._use_template:
            log.warning(
                "tokenizer has no chat template; prompts are the message contents joined by newlines",
                tokenizer=type(tokenizer).__name__,
            )
        rows, texts, visions = self._render(read_raw_rows(paths), tokenizer)
        text_rows = [i for i, vision in enumerate(visions) if vision is None]
        text_ids = tokenizer([texts[i] for i in text_rows], add_special_tokens=False)["input_ids"] if text_rows else []
        ids: list[Any] = [None] * len(rows)
        for i, prompt_ids in zip(text_rows, text_ids, strict=True):
            ids[i] = prompt_ids
        for i, vision in enumerate(visions):
            if vision is not None:
                ids[i] = vision["prompt_ids"]
        self._items = [
            item
            for row, prompt_ids, vision in zip(rows, ids, visions, strict=True)
            if (item := self._fit(row, prompt_ids, vision))
        ]
        self.report.n_kept = len(self._items)
        log.info("prompt dataset loaded", **{k: v for k, v in vars(self.report).items() if k != "reasons"})
        if self.report.n_malformed:
            log.warning(
                "malformed data rows skipped", count=self.report.n_malformed, examples=self.report.reasons
            )
        if not self._items:
            raise ValueError(f"no usable prompts in {paths!r}: {self.report.summary()}")

    def _render(self, raw_rows: Any, tokenizer: Any) -> tuple[list[RawRow], list[str], list[dict | None]]:
        """Prompt text of every well-formed row, and for a multimodal one its processor outputs
        (bad rows go to the report)."""
        rows: list[RawRow] = []
        texts: list[str] = []
        visions: list[dict | None] = []
        for raw in raw_rows:
            self.report.n_rows += 1
            problem = raw.error
            if problem is None:
                problem = (
                    row_problem(raw.row, prompt_key=self.prompt_key)
                    if isinstance(raw.row, Mapping)
                    else f"row is a {type(raw.row).__name__}, not an object"
                )
            images: list[Any] = []
            if problem is None:
                try:
                    images = row_images(
                        raw.row, prompt_key=self.prompt_key, image_key=self.image_key, base_dir=raw.path and raw.path.parent
                    )
                except ImageProblem as exc:
                    problem = str(exc)
            if problem is None and images and self.processor is None:
                raise ValueError(
                    f"row {raw.index} ({raw.location}) has {len(images)} image(s), but the model has no image "
                    "processor (no preprocessor/processor config at actor.model_path): a text-only model would "
                    "train blind on them. Use the vision-language checkpoint, or remove the rows' images."
                )
            vision = None
            if problem is None:
                try:
                    if images:
                        vision = self._vision_inputs(raw.row[self.prompt_key], images)
                        texts.append(vision["text"])
                    else:
                        texts.append(self._prompt_text(raw.row[self.prompt_key], tokenizer))
                except Exception as exc:  # a template or processor can raise anything (jinja, PIL)
                    problem = f"chat template failed: {type(exc).__name__}: {exc}"
            if problem is not None:
                self.report.add_malformed(index=raw.index, location=raw.location, reason=problem)
                continue
            rows.append(raw)
            visions.append(vision)
        return rows, texts, visions

    def _vision_inputs(self, prompt: Any, images: list[Any]) -> dict[str, Any]:
        """The processor's prompt (vision spans expanded into image tokens) and each image's patch
        grid; the images kept as PNG bytes."""
        import io

        text = self.processor.apply_chat_template(
            vision_messages(prompt), tokenize=False, add_generation_prompt=True, tools=self.tools
        )
        out = self.processor(text=[text], images=images)
        pngs = []
        for image in images:
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            pngs.append(buffer.getvalue())
        grids = tuple(tuple(int(v) for v in grid) for grid in out["image_grid_thw"])
        return {"text": text, "prompt_ids": list(out["input_ids"][0]), "images": tuple(pngs), "grids": grids}

    def _prompt_text(self, prompt: list[dict[str, str]] | str, tokenizer: Any) -> str:
        if isinstance(prompt, str):
            if not self._use_template:
                return prompt
            prompt = [{"role": "user", "content": prompt}]
        if self._use_template:
            text = tokenizer.apply_chat_template(
                [dict(m) for m in prompt], tokenize=False, add_generation_prompt=True, tools=self.tools
            )
            assert isinstance(text, str), type(text)
            return text
        return "\n".join(m["content"] for m in prompt)

    def _fit(self, raw: RawRow, prompt_ids: list[int], vision: dict | None = None) -> PromptItem | None:
        limit = self.max_prompt_length
        if len(prompt_ids) > limit:
            if vision is not None and self.overlong in ("truncate_left", "truncate_right"):
                self.report.n_filtered_overlong += 1  # cutting would cut an image's tokens
                return None
            if self.overlong == "error":
                raise OverlongPromptError(
                    f"row {raw.index} ({raw.location}) has a {len(prompt_ids)}-token prompt, over "
                    f"max_prompt_length={limit}; raise data.max_prompt_length or set "
                    "data.filter_overlong_prompts=true, or data.truncation=left / right"
                )
            if self.overlong == "filter":
                self.report.n_filtered_overlong += 1
                return None
            self.report.n_truncated += 1
            prompt_ids = prompt_ids[-limit:] if self.overlong == "truncate_left" else prompt_ids[:limit]
        row = raw.row
        prompt = row[self.prompt_key]
        return PromptItem(
            prompt_ids=list(prompt_ids),
            ground_truth=row["reward_model"]["ground_truth"],
            data_source=row["data_source"],
            extra_info=dict(row.get("extra_info") or {}),
            index=raw.index,
            raw_prompt=prompt if isinstance(prompt, str) else [dict(m) for m in prompt],
            images=vision["images"] if vision else (),
            image_grid_thw=vision["grids"] if vision else (),
        )

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> PromptItem:
        return self._items[i]


# data.truncation -> PromptDataset's overlong mode (used when data.filter_overlong_prompts=false).
_TRUNCATION: dict[str, OverlongMode] = {"error": "error", "left": "truncate_left", "right": "truncate_right"}


def datasets_for(
    section: DataConfig, tokenizer: Any, processor: Any, *, tools: list[dict[str, Any]] | None = None
) -> tuple[PromptDataset, PromptDataset | None]:
    """The training and (when `data.val_files` is set) validation datasets the `data` section names;
    `tools`: the multi-turn tools' schemas, listed by the chat template in every prompt."""
    if not section.train_files:
        raise ValueError("data.train_files is empty: give at least one parquet/jsonl file")
    args: dict[str, Any] = {
        "prompt_key": section.prompt_key,
        "image_key": section.image_key,
        "max_prompt_length": section.max_prompt_length,
        "overlong": "filter" if section.filter_overlong_prompts else _TRUNCATION[section.truncation],
        "apply_chat_template": section.apply_chat_template,
        "processor": processor,
        "tools": tools,
    }
    train = PromptDataset(section.train_files, tokenizer, **args)
    return train, PromptDataset(section.val_files, tokenizer, **args) if section.val_files else None
