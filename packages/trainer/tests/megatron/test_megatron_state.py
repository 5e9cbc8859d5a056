"""The Adam `step` handling of `backends/megatron/state.py` on a real torch Adam, CPU.

megatron-core's DistributedOptimizer needs CUDA, so a namespace with its `.optimizer` attribute
(the inner torch optimizer) stands in for it here; the state it is given is built the way
megatron-core 0.19's `load_state_dict` builds it without Apex/TE (one `step` tensor shared by
every parameter). The whole round trip on a real DistributedOptimizer is
test_megatron_gpu.py::test_checkpoint_round_trip_restores_weights_and_optimizer.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

from grpo_trainer.backends.megatron.state import _step_tensors_set_aside


def _params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, generator=gen)) for _ in range(3)]


def _step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    optimizer.step()


def test_loaded_adam_steps_like_the_live_one() -> None:
    live_params = _params(0)
    live = torch.optim.Adam(live_params, lr=1e-2)
    _step(live, live_params, seed=1)
    saved = copy.deepcopy(live.state_dict())  # state_dict() hands out the live tensors

    loaded_params = [torch.nn.Parameter(p.detach().clone()) for p in live_params]
    loaded = torch.optim.Adam(loaded_params, lr=1e-2)
    shared_step = torch.tensor(1.0)
    for entry in saved["state"].values():
        entry["step"] = shared_step  # what megatron-core hands torch's load_state_dict
    loaded.load_state_dict(saved)
    assert all(loaded.state[p]["step"] is shared_step for p in loaded_params)

    with _step_tensors_set_aside(SimpleNamespace(optimizer=loaded)):
        # megatron-core's shard loader copies every tensor of the state from the checkpoint,
        # which holds no `step`: there must be none while it runs.
        assert not any("step" in loaded.state[p] for p in loaded_params)
    steps = [loaded.state[p]["step"] for p in loaded_params]
    assert [float(s) for s in steps] == [1.0, 1.0, 1.0]
    assert len({id(s) for s in steps}) == 3

    _step(live, live_params, seed=2)
    _step(loaded, loaded_params, seed=2)
    assert [float(loaded.state[p]["step"]) for p in loaded_params] == [2.0, 2.0, 2.0]
    for ours, theirs in zip(loaded_params, live_params, strict=True):
        assert torch.equal(ours, theirs)


def test_an_optimizer_without_state_is_left_alone() -> None:
    params = _params(3)
    fresh = torch.optim.Adam(params, lr=1e-2)
    with _step_tensors_set_aside(SimpleNamespace(optimizer=fresh)):
        pass
    assert dict(fresh.state) == {}
    with _step_tensors_set_aside(object()):  # no inner optimizer at all
        pass


def test_an_offloaded_optimizer_s_class_setting_is_left_out_of_the_checkpoint_and_taken_back() -> None:
    """With actor.megatron.optimizer_offload, megatron-core's HybridDeviceOptimizer keeps its CPU
    optimizer's class in every param group (seen on the H200: the last save of a 20-step run
    failed with "cannot checkpoint a builtins.type at .../param_groups/0/cpu_optimizer_cls")."""
    from grpo_ckpt.structure import flatten_state
    from grpo_trainer.backends.megatron.state import with_live_classes, without_classes

    live = {
        "optimizer": {
            "state": {0: {"exp_avg": torch.ones(2)}},
            "param_groups": [{"lr": 0.1, "cpu_optimizer_cls": torch.optim.Adam, "params": [0]}],
        },
        "fp32_from_fp16_params": [[torch.zeros(2)]],
    }
    saved = without_classes(live)
    assert "cpu_optimizer_cls" not in saved["optimizer"]["param_groups"][0]
    flatten_state(saved)  # a checkpoint holds it
    restored = with_live_classes(saved, live)
    assert restored["optimizer"]["param_groups"][0]["cpu_optimizer_cls"] is torch.optim.Adam
    assert restored["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert torch.equal(restored["optimizer"]["state"][0]["exp_avg"], torch.ones(2))


class _FreshDistributedOptimizer:
    """Stands in for megatron-core's DistributedOptimizer (CUDA only) as `train()` finds it on a
    resume: built, no step taken, so its `state_dict()` fails (without Apex/TE it asserts one Adam
    step count: seen on the H200). Its inner optimizer's groups hold the offload class setting."""

    def __init__(self) -> None:
        self.optimizer = SimpleNamespace(param_groups=[{"lr": 0.5, "cpu_optimizer_cls": torch.optim.Adam}])
        self.loaded: dict | None = None

    def state_dict(self) -> dict:
        raise AssertionError("steps")

    def load_state_dict(self, state: dict) -> None:
        self.loaded = state


def test_a_fresh_optimizer_loads_without_being_asked_for_its_state_dict() -> None:
    from grpo_trainer.backends.megatron.state import _load_optimizer_state

    fresh = _FreshDistributedOptimizer()
    saved = {"optimizer": {"param_groups": [{"lr": 0.1}]}}
    _load_optimizer_state(fresh, [{"state_dict": saved}])
    assert fresh.loaded == {"optimizer": {"param_groups": [{"lr": 0.1, "cpu_optimizer_cls": torch.optim.Adam}]}}
