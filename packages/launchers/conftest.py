"""Set-up of the launcher packages' tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _torch_kernels_for_cpu_tensors() -> None:
    """The tiny preset's tests build Hugging Face Qwen3.5 models directly too: CPU tensors take
    transformers' PyTorch Gated DeltaNet path even where FLA is installed (`grpo_trainer.backends.hf_kernels`)."""
    from grpo_trainer.backends.hf_kernels import use_torch_kernels_on_cpu

    use_torch_kernels_on_cpu()
