from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_ckpt.structure import flatten_state, tensor_keys, unflatten_state


def _real_optimizer_and_scheduler() -> tuple[dict, dict]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=10)
    for _ in range(2):
        model(torch.randn(5, 4)).square().sum().backward()
        optimizer.step()
        scheduler.step()
    return optimizer.state_dict(), scheduler.state_dict()


def _assert_same(a: object, b: object) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def test_real_adamw_and_scheduler_state_round_trip_exactly() -> None:
    opt_state, sched_state = _real_optimizer_and_scheduler()
    for state in (opt_state, sched_state):
        skeleton, tensors = flatten_state(state)
        text = json.dumps(skeleton)  # the skeleton is plain JSON
        restored = unflatten_state(json.loads(text), tensors)
        _assert_same(state, restored)
    skeleton, tensors = flatten_state(opt_state)
    assert sorted(tensors) == sorted(f"state.{i}.{k}" for i in range(4) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert tensor_keys(skeleton) == list(tensors)
    assert isinstance(unflatten_state(skeleton, tensors)["param_groups"][0]["betas"], tuple)


def test_keys_and_odd_leaves_are_preserved() -> None:
    state = {0: "int key", "0": torch.ones(1), 1.5: None, True: [1, 2.0, float("nan")], "dt": torch.bfloat16,
             "size": torch.Size([2, 3]), "nested": {"0": torch.zeros(2)}, "t0": {0: torch.ones(3)}}
    skeleton, tensors = flatten_state(state)
    restored = unflatten_state(json.loads(json.dumps(skeleton)), tensors)
    _assert_same({**state, "size": (2, 3)}, restored)


def test_colliding_paths_get_distinct_keys() -> None:
    skeleton, tensors = flatten_state({0: {"a": torch.ones(1)}, "0": {"a": torch.zeros(1)}})
    assert sorted(tensors) == ["0.a", "0.a#2"]
    restored = unflatten_state(skeleton, tensors)
    assert restored[0]["a"].item() == 1 and restored["0"]["a"].item() == 0


def test_unsupported_values_name_their_path() -> None:
    with pytest.raises(ValueError, match=r"builtins.set at state/3/weird"):
        flatten_state({"state": {3: {"weird": {1, 2}}}})
    with pytest.raises(ValueError, match="keys"):
        flatten_state({(1, 2): 3})
    with pytest.raises(ValueError, match="tensor files lack"):
        unflatten_state({"__tensor__": "gone"}, {})
