"""Set-up of the cross-package tests (grpo_trainer's own tests have the same two fixtures)."""

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


@pytest.fixture(scope="session")
def short_calculator_turns() -> list[str]:
    """Overrides of the multi-turn end-to-end tests: the calculator on a tiny model primed to call it
    (`grpo_tiny.model.prime_tool_calls`), short prompts and responses, two steps' worth of data, and a
    learning rate small enough that the priming holds for both steps."""
    return [
        "data.train_batch_size=8",
        "data.max_prompt_length=24",
        "data.max_response_length=128",
        "actor.ppo_mini_batch_size=8",
        "actor.lr=1e-6",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.tools=[calculator]",
        "rollout.multi_turn.max_assistant_turns=3",
        "rollout.multi_turn.max_tool_response_length=8",
    ]
