"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for the module's `train()` runs (one already running is kept)."""
    import ray

    from grpo_trainer.worker_group import ensure_ray

    started = ensure_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()
