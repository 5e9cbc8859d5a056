"""The public surface of grpo_trainer is frozen: changing it is a deliberate edit here."""

from __future__ import annotations

import subprocess
import sys

import grpo_trainer

EXPECTED = [
    "Actor",
    "GRPOLoss",
    "Generation",
    "HFRolloutEngine",
    "MetricsLogger",
    "PolicyBackend",
    "PolicyBatch",
    "PolicyWorkers",
    "RolloutEngine",
    "SamplingParams",
    "TorchBackend",
    "TrainResult",
    "WorkerError",
    "WorkerGroup",
    "WorkerTimeoutError",
    "__version__",
    "make_backend",
    "make_rollout_engine",
    "plot_metrics",
    "read_metrics",
    "train",
]


def test_all_is_frozen_and_every_name_resolves() -> None:
    assert grpo_trainer.__all__ == EXPECTED
    for name in EXPECTED:
        assert getattr(grpo_trainer, name) is not None, name


def test_importing_the_package_stays_light() -> None:
    """Reward worker processes import grpo_trainer; Ray and transformers load only on use."""
    code = "import sys, grpo_trainer; print(sorted(m for m in ('ray', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
