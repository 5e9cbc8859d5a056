"""Sleep-mode bookkeeping of `VLLMRolloutEngine` on a platform that has sleep mode (CUDA, NPU).

vLLM sleep mode does not exist on CPU, so `llm` here is a recording stand-in for `vllm.LLM` (the
only fake in these tests); the real engine's CPU behaviour is covered in test_vllm_weight_sync."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.protocols import SamplingParams
from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tuple(tags or ())))
        return True

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        self.calls.append(("rpc", method))
        return [[]]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def _engine(*, sleep_mode: bool = True) -> VLLMRolloutEngine:
    engine = object.__new__(VLLMRolloutEngine)  # skips building a real vllm.LLM
    engine.llm = RecordingLLM()
    engine.sleep_mode = engine.sleep_supported = sleep_mode
    engine.sleep_level = 1
    engine.asleep_tags = set()
    engine.weights_version = 0
    engine.sleep_warned = set()
    engine.vision_language = False
    engine.bucket_bytes = 2**20
    engine.shm_dir = None  # buckets inside the RPC message
    engine.platform = "cuda" if sleep_mode else "cpu"
    return engine


def test_sync_on_a_sleeping_engine_wakes_the_weights_first_and_leaves_the_kv_cache_asleep():
    engine = _engine()
    engine.sleep()
    engine.sleep()  # idempotent
    engine.update_weights([("w", torch.ones(4))])
    assert engine.llm.calls == [
        ("sleep", 1),
        ("wake_up", ("weights",)),
        ("rpc", "grpo_load_weights"),  # one bucket: opens and closes the sync in one call
    ]  # no prefix-cache reset: sleeping dropped it already
    assert engine.asleep_tags == {"kv_cache"}
    with pytest.raises(RuntimeError, match=r"asleep \(\['kv_cache'\]\)"):
        engine.generate([[1, 2]], SamplingParams())
    engine.wake_up()
    assert engine.llm.calls[-1] == ("wake_up", ("kv_cache",)) and not engine.asleep_tags


def test_awake_sync_resets_the_prefix_cache():
    """...and starts a new weights version, under which images are encoded again."""
    engine = _engine()
    engine.update_weights([("w", torch.ones(4))])
    assert engine.llm.calls[-1] == ("reset_prefix_cache",)
    assert engine.weights_version == 1


def test_without_sleep_mode_sleep_and_wake_only_log():
    """rollout.free_cache_engine=false (or a platform without sleep mode): the engine keeps its
    weights and KV cache; sleep and wake do nothing but log."""
    engine = _engine(sleep_mode=False)
    engine.sleep()
    engine.wake_up()
    assert engine.llm.calls == [] and not engine.asleep_tags
