"""grpo_trainer: GRPO on Hugging Face / Megatron policies with HF or vLLM rollout, on Ray.

`train(cfg)` runs a whole job (`cfg` from `grpo_config.load`); a preset (e.g. grpo_launch's
`tiny_preset`) is data handed to it, never imported here. Names load on first use, so importing the
package (as reward worker processes do) does not pull in Ray, transformers or torch.distributed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from grpo_trainer.version import __version__

if TYPE_CHECKING:
    from grpo_trainer.algo.loss import GRPOLoss
    from grpo_trainer.backends import make_backend
    from grpo_trainer.backends.torch_backend import TorchBackend
    from grpo_trainer.driver.metrics import MetricsLogger, plot_metrics, read_metrics
    from grpo_trainer.protocols import (
        Generation,
        PolicyBackend,
        PolicyBatch,
        RolloutEngine,
        SamplingParams,
    )
    from grpo_trainer.rollout import HFRolloutEngine, make_rollout_engine
    from grpo_trainer.trainer import TrainResult, train
    from grpo_trainer.workers.actor import Actor
    from grpo_trainer.workers.group import WorkerError, WorkerGroup, WorkerTimeoutError
    from grpo_trainer.workers.policy_workers import PolicyWorkers

_EXPORTS = {
    "Actor": "grpo_trainer.workers.actor",
    "GRPOLoss": "grpo_trainer.algo.loss",
    "Generation": "grpo_trainer.protocols",
    "HFRolloutEngine": "grpo_trainer.rollout",
    "MetricsLogger": "grpo_trainer.driver.metrics",
    "PolicyBackend": "grpo_trainer.protocols",
    "PolicyBatch": "grpo_trainer.protocols",
    "PolicyWorkers": "grpo_trainer.workers.policy_workers",
    "RolloutEngine": "grpo_trainer.protocols",
    "SamplingParams": "grpo_trainer.protocols",
    "TorchBackend": "grpo_trainer.backends.torch_backend",
    "TrainResult": "grpo_trainer.trainer",
    "WorkerError": "grpo_trainer.workers.group",
    "WorkerGroup": "grpo_trainer.workers.group",
    "WorkerTimeoutError": "grpo_trainer.workers.group",
    "make_backend": "grpo_trainer.backends",
    "make_rollout_engine": "grpo_trainer.rollout",
    "plot_metrics": "grpo_trainer.driver.metrics",
    "read_metrics": "grpo_trainer.driver.metrics",
    "train": "grpo_trainer.trainer",
}

__all__ = [
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grpo_trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
