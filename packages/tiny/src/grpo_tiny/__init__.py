"""Tiny random-weight models of the Qwen3.5 MoE family and verifiable tasks, built on the fly (no
download): `model` (text, a tokenizer trained here), `vl_model` (with a one-block vision tower and a
processor), `task` ("repeat 7", scored by the share of the digit), `vl_task` (count the squares).
The launchers' tiny preset runs on them, and every package's tests build their models with them."""

from grpo_tiny.version import __version__

__all__ = ["__version__"]
