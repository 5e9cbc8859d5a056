"""The Adam `step` handling of `backends/megatron/state.py` on a real torch Adam, CPU.

Namespaces with the `.optimizer` attribute (the inner torch optimizer) stand in for megatron-core's
optimizers here; the state they are given is built the way megatron-core 0.19's `load_state_dict`
builds it without Apex/TE (one `step` tensor shared by every parameter). The whole save and load on
real ones, at other layouts too: test_layouts.py (CPU ranks) and test_megatron_gpu.py (GPU).
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


def test_the_saved_adam_step_goes_where_each_optimizer_reads_it() -> None:
    """The stored tensors hold no step: torch's Adam reads it per parameter, megatron-core's
    distributed optimizer (without Apex/TE) and TE's FusedAdam from the param groups."""
    from grpo_trainer.backends.megatron.state import _with_step

    tree = {
        "optimizer": {
            "state": {0: {"exp_avg": torch.ones(2)}, 1: {"exp_avg": torch.ones(2), "step": torch.tensor(0.0)}},
            "param_groups": [{"lr": 0.1, "step": 0}, {"lr": 0.2}],
        },
        "fp32_from_fp16_params": [[torch.zeros(2)]],
    }
    _with_step(tree, 7, per_parameter=True)
    assert [float(e["step"]) for e in tree["optimizer"]["state"].values()] == [7.0, 7.0]
    assert tree["optimizer"]["state"][0]["step"] is not tree["optimizer"]["state"][1]["step"]
    assert [g["step"] for g in tree["optimizer"]["param_groups"]] == [7, 7]
    fused = {"optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}, "param_groups": [{"lr": 0.1}]}}
    _with_step(fused, 7, per_parameter=False)
    assert "step" not in fused["optimizer"]["state"][0] and fused["optimizer"]["param_groups"][0]["step"] == 7


def test_a_fresh_optimizer_is_primed_with_zero_moments_at_step_zero() -> None:
    """megatron-core cannot describe an optimizer that never stepped (its state dict asserts one
    step count): it gets its own `init_state_fn`'s zero moments and step 0 before a load."""
    from grpo_trainer.backends.megatron.state import _prime_fresh_state, adam_step

    params = _params(4)
    inner = torch.optim.Adam(params, lr=1e-2)

    def init_state_fn(opt: torch.optim.Optimizer, config: object) -> None:
        for p in params:
            opt.state[p]["exp_avg"] = torch.zeros_like(p)
            opt.state[p]["exp_avg_sq"] = torch.zeros_like(p)

    fresh = SimpleNamespace(optimizer=inner, init_state_fn=init_state_fn, config=None)
    assert adam_step(fresh) == 0
    _prime_fresh_state(SimpleNamespace(chained_optimizers=[fresh]))
    assert all(float(inner.state[p]["step"]) == 0.0 and not inner.state[p]["exp_avg"].any() for p in params)
    _step(inner, params, seed=5)
    assert adam_step(fresh) == 1
    _prime_fresh_state(fresh)  # a stepped optimizer is left alone
    assert adam_step(fresh) == 1
    # megatron-core's load leaves the loaded step in torch Adam's param groups, where it stays (seen
    # as steps [1, 2] at the save after a resumed step, tests/test_launcher_layouts.py).
    inner.param_groups[0]["step"] = 1
    _step(inner, params, seed=6)
    assert adam_step(fresh) == 2
