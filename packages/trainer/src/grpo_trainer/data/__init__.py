"""verl-format prompt data: reading rows, tokenised prompts, resumable sampling."""

from grpo_trainer.data.dataset import (
    OVERLONG_MODES,
    OverlongPromptError,
    PromptDataset,
    PromptItem,
    datasets_for,
)
from grpo_trainer.data.rows import DataFileError, DataReport, load_rows
from grpo_trainer.data.sampler import ResumableSampler

__all__ = [
    "OVERLONG_MODES",
    "DataFileError",
    "DataReport",
    "OverlongPromptError",
    "PromptDataset",
    "PromptItem",
    "ResumableSampler",
    "datasets_for",
    "load_rows",
]
