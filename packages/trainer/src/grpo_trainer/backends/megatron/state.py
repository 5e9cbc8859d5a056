"""Model and optimizer state of the Megatron policy as plain nested dicts of tensors, for
`grpo_ckpt.CheckpointManager` (which stores tensors with safetensors and the structure as JSON).

Each rank's dict holds its own tensor-/pipeline-/expert-parallel shard of the model. The
distributed optimizer's sharded Adam state is gathered to data-parallel rank 0
(`get_parameter_state_dp_zero`) and scattered back on load, so a checkpoint loads at the same
TP/PP/EP sizes with any data-parallel size.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def sub_optimizers(optimizer: Any) -> list[Any]:
    """The optimizers megatron-core chains (one per parameter kind), or `optimizer` alone."""
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def _is_distributed(optimizer: Any) -> bool:
    return hasattr(optimizer, "get_parameter_state_dp_zero")


def _model_state(model: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for index, chunk in enumerate(model):
        for name, value in chunk.state_dict().items():
            if isinstance(value, torch.Tensor):  # `_extra_state` entries are None or bytes
                state[f"chunk{index}.{name}"] = value.detach()
    return state


def policy_state(model: list[torch.nn.Module], optimizer: Any) -> dict[str, Any]:
    """{"model": ..., "optimizer": ...}. Collective when the optimizer is distributed (every
    data-parallel rank must call it)."""
    optimizers = []
    for sub in sub_optimizers(optimizer):
        entry: dict[str, Any] = {"state_dict": without_classes(sub.state_dict())}
        if _is_distributed(sub):
            entry["param_state"] = _encode_param_state(
                sub.get_parameter_state_dp_zero(return_on_all_ranks=True)
            )
        optimizers.append(entry)
    return {"model": _model_state(model), "optimizer": {"optimizers": optimizers}}


def load_policy_state(model: list[torch.nn.Module], optimizer: Any, state: dict[str, Any]) -> None:
    """Inverse of `policy_state`."""
    model_state = state["model"]
    for index, chunk in enumerate(model):
        prefix = f"chunk{index}."
        own = {k[len(prefix) :]: v for k, v in model_state.items() if k.startswith(prefix)}
        # Megatron's DDP wrapper returns nothing from load_state_dict: compare the keys here.
        expected = {k for k, v in chunk.state_dict().items() if isinstance(v, torch.Tensor)}
        missing, unexpected = sorted(expected - set(own)), sorted(set(own) - expected)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match model chunk {index}: missing {missing[:5]}, unexpected {unexpected[:5]}"
                " (was it saved with other tensor/pipeline/expert parallel sizes?)"
            )
        chunk.load_state_dict(own, strict=False)
    if "optimizer" not in state:
        optimizer.reload_model_params()  # the fp32 main copies follow the loaded weights
    else:
        _load_optimizer_state(optimizer, state["optimizer"]["optimizers"])


def _load_optimizer_state(optimizer: Any, entries: list[dict[str, Any]]) -> None:
    subs = sub_optimizers(optimizer)
    if len(entries) != len(subs):
        raise ValueError(f"checkpoint has {len(entries)} optimizer parts, the model has {len(subs)}")
    for sub, entry in zip(subs, entries, strict=True):
        sub.load_state_dict(with_live_classes(entry["state_dict"], _live_classes(sub)))
        if "param_state" in entry:
            with _step_tensors_set_aside(sub):
                sub.load_parameter_state_from_dp_zero(_decode_param_state(entry["param_state"]))


def without_classes(tree: Any) -> Any:
    """`tree` without the dict entries whose value is a class: with `optimizer_offload`,
    megatron-core's HybridDeviceOptimizer keeps `cpu_optimizer_cls` (torch's Adam class) in each
    param group, which a checkpoint cannot hold. It is a setting, not state."""
    if isinstance(tree, dict):
        return {k: without_classes(v) for k, v in tree.items() if not isinstance(v, type)}
    if isinstance(tree, list | tuple):
        return type(tree)(without_classes(v) for v in tree)
    return tree


def _live_classes(optimizer: Any) -> dict[str, Any]:
    """The class-valued settings of `optimizer`'s param groups, laid out as in its state dict
    (["optimizer"]["param_groups"][i]), read from the live groups: a fresh megatron-core
    DistributedOptimizer cannot give its state dict before its first step without Apex/TE (it
    asserts one Adam step count; seen on the GPU when `train()` resumed from a checkpoint)."""
    groups = getattr(optimizer, "optimizer", optimizer).param_groups
    return {"optimizer": {"param_groups": [{k: v for k, v in g.items() if isinstance(v, type)} for g in groups]}}


def with_live_classes(saved: Any, live: Any) -> Any:
    """`saved` with the classes `without_classes` left out taken back from the live optimizer's
    state dict, at the same places."""
    if isinstance(saved, dict) and isinstance(live, dict):
        merged = {k: with_live_classes(v, live.get(k)) for k, v in saved.items()}
        merged.update({k: v for k, v in live.items() if isinstance(v, type) and k not in saved})
        return merged
    if isinstance(saved, list | tuple) and isinstance(live, list | tuple) and len(saved) == len(live):
        return type(saved)(with_live_classes(a, b) for a, b in zip(saved, live, strict=True))
    return saved


@contextmanager
def _step_tensors_set_aside(optimizer: Any) -> Iterator[None]:
    """Two megatron-core (0.19) details of the path without Apex/TE, both seen on the GPU:
    `load_state_dict` puts one `step` tensor object into every parameter's torch Adam state, which
    Adam then increments once per parameter each step (bias correction runs at step 1 + N);
    and `load_parameter_state_from_dp_zero` asks the saved shards for a `step` they never held
    (KeyError 'step'). The step tensors are held aside while the shards load and come back as one
    copy per parameter."""
    state = getattr(getattr(optimizer, "optimizer", None), "state", None) or {}
    steps = {param: entry.pop("step") for param, entry in state.items() if "step" in entry}
    try:
        yield
    finally:
        for param, step in steps.items():
            state[param]["step"] = step.clone()


# Megatron keys the gathered Adam state by buffer index and a (param dtype, grad dtype) tuple:
# stored as a list of {"dtypes": [names], "tensors": {...}} so that JSON can hold the structure.
def _encode_param_state(param_state: dict[Any, Any]) -> dict[str, Any]:
    buffers = []
    for index in sorted(k for k in param_state if isinstance(k, int)):
        for dtypes, tensors in param_state[index].items():
            names = [
                str(d).removeprefix("torch.") for d in (dtypes if isinstance(dtypes, tuple) else (dtypes,))
            ]
            buffers.append({"index": index, "dtypes": names, "tensors": tensors})
    return {"buckets_coalesced": bool(param_state.get("buckets_coalesced", True)), "buffers": buffers}


def _decode_param_state(encoded: dict[str, Any]) -> dict[Any, Any]:
    state: dict[Any, Any] = {"buckets_coalesced": encoded["buckets_coalesced"]}
    for entry in encoded["buffers"]:
        dtypes = tuple(getattr(torch, name) for name in entry["dtypes"])
        key = dtypes if len(dtypes) > 1 else dtypes[0]
        tensors = {k: (int(v) if k == "numel_unpadded" else v) for k, v in entry["tensors"].items()}
        state.setdefault(int(entry["index"]), {})[key] = tensors
    return state
