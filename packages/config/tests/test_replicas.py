"""The rollout replica layout: replica r of tensor-parallel size k on ranks r*k .. r*k+k-1."""

from __future__ import annotations

import pytest

from grpo_config import RolloutReplicas, load


def test_replicas_are_consecutive_ranks() -> None:
    layout = RolloutReplicas(world_size=16, tensor_parallel_size=8)
    assert layout.count == 2
    assert [layout.replica_of(rank) for rank in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert list(layout.ranks_of(1)) == list(range(8, 16)) and layout.leader(1) == 8
    assert layout.describe() == ["0-7", "8-15"]
    assert RolloutReplicas(world_size=2, tensor_parallel_size=1).describe() == ["0", "1"]


def test_a_size_that_does_not_divide_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size=3 must divide the world size 8"):
        RolloutReplicas(world_size=8, tensor_parallel_size=3)


def test_the_layout_of_a_config_and_the_hf_engine_s_one_replica_per_rank() -> None:
    vllm = load(None, ["device.devices_per_node=8", "rollout.engine=vllm", "rollout.tensor_parallel_size=4"])
    assert RolloutReplicas.for_config(vllm).describe() == ["0-3", "4-7"]
    hf = load(None, ["device.devices_per_node=2", "rollout.engine=hf"])
    assert RolloutReplicas.for_config(hf).count == 2
