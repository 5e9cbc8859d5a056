"""Set-up of grpo_trainer's tests (the cross-package tests under tests/ have the same two fixtures)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _torch_kernels_for_cpu_tensors() -> None:
    """Tests build Hugging Face Qwen3.5 models directly too, not only through `load_causal_lm`: CPU
    tensors take transformers' PyTorch Gated DeltaNet path even where FLA is installed
    (`grpo_trainer.backends.hf_kernels`)."""
    from grpo_trainer.backends.hf_kernels import use_torch_kernels_on_cpu

    use_torch_kernels_on_cpu()


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for the module's Ray workers (one already running is kept)."""
    from grpo_trainer.workers.group import ensure_ray, shutdown_ray

    started = ensure_ray(num_cpus=2)
    yield
    if started:
        shutdown_ray()  # and its reaper
