"""Model and optimizer state of the Megatron policy as one distributed checkpoint that loads at
any parallel layout (megatron-core's `dist_checkpointing`, torch_dist format).

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.state`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

STATE_DIRECTORY = "megatron"  # the Megatron backend's directory in a checkpoint
CONTENTS = "contents.json"
FORMAT = "grpo-megatron-dist/1"
# As Megatron-Bridge builds it for a reshardable checkpoint; without the prefix the optimizer's
# tensors are named the same whether megatron-core chains one optimizer or two (EP > 1).
_METADATA = {
    "distrib_optim_sharding_type": "fully_reshardable",
    "chained_optim_avoid_prefix": True,
    "singleton_local_shards": False,
}


def sub_optimizers(optimizer: Any) -> list[Any]:
    """The optimizers megatron-core chains (one per parameter kind), or `optimizer` alone."""
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def save_policy_state(model: list[torch.nn.Module], optimizer: Any, directory: Path, *, with_optimizer: bool) -> None:
    """Write the model (and the optimizer's) state into the empty `directory`. Collective: every
    rank calls it."""
    from megatron.core import dist_checkpointing

    step = adam_step(optimizer) if with_optimizer else None
    request = _Request(model, optimizer if with_optimizer else None, loading=False)
    dist_checkpointing.save(request.to_storage(), str(directory))
    if torch.distributed.get_rank() == 0:
        contents = {
            "format": FORMAT,
            "optimizer": with_optimizer,
            "adam_step": step,
            "distributed_optimizer": _is_distributed(optimizer),
        }
        (directory / CONTENTS).write_text(json.dumps(contents, indent=2))
    torch.distributed.barrier()


def load_policy_state(model: list[torch.nn.Module], optimizer: Any, directory: Path) -> None:
    """Inverse of `save_policy_state`, at this run's layout. Without saved optimizer state the
    optimizer's fp32 copies follow the loaded weights and its moments start at zero."""
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model

    contents = read_contents(directory)
    with_optimizer = bool(contents["optimizer"])
    if with_optimizer and contents["distributed_optimizer"] != _is_distributed(optimizer):
        raise ValueError(
            f"{directory} holds the state of a {'distributed' if contents['distributed_optimizer'] else 'plain'} "
            "Megatron optimizer, this run builds the other kind: set actor.megatron.use_distributed_optimizer="
            f"{str(contents['distributed_optimizer']).lower()} to resume from it"
        )
    if with_optimizer:
        _prime_fresh_state(optimizer)
    request = _Request(model, optimizer if with_optimizer else None, loading=True)
    # RAISE_ALL: a tensor the model asks for that the checkpoint lacks, or the reverse, is an error.
    loaded = dist_checkpointing.load(request.to_storage(), str(directory), strict="raise_all")
    model_trees, optimizer_tree = request.filled(loaded["tensors"])
    for index, (chunk, tree) in enumerate(zip(unwrap_model(model), model_trees, strict=True)):
        _load_model_chunk(chunk, tree, index)
    if optimizer_tree is None:
        optimizer.reload_model_params()
        return
    _load_optimizer(optimizer, optimizer_tree, step=int(contents["adam_step"] or 0))


def read_contents(directory: Path) -> dict[str, Any]:
    path = Path(directory) / CONTENTS
    contents = json.loads(path.read_text()) if path.is_file() else {}
    if contents.get("format") != FORMAT:
        raise ValueError(
            f"{directory} is not a Megatron state grpo can read ({path.name} says format "
            f"{contents.get('format')!r}, expected {FORMAT!r}); start from the checkpoint's HF export "
            "(actor.model_path=<step>/huggingface checkpoint.resume=none)"
        )
    return contents


def _is_distributed(optimizer: Any) -> bool:
    return any(hasattr(sub, "get_parameter_state_dp_zero") for sub in sub_optimizers(optimizer))


def adam_step(optimizer: Any) -> int:
    """The optimizer's step count (the same for every parameter; 0 before the first step)."""
    steps: set[float] = set()
    for sub in sub_optimizers(optimizer):
        # With optimizer_offload the inner optimizer is megatron-core's HybridDeviceOptimizer, which
        # steps torch Adams of its own (as megatron-core reads its step).
        for inner in getattr(sub.optimizer, "sub_optimizers", None) or [sub.optimizer]:
            if _per_parameter_step(inner):
                # A param group's "step" is what megatron-core's load left there; torch's Adam never reads it.
                steps.update(float(s["step"]) for s in inner.state.values() if "step" in s)
            else:
                steps.update(float(g["step"]) for g in inner.param_groups if g.get("step") is not None)
    if len(steps) > 1:
        raise RuntimeError(f"the optimizer's parameters are at different Adam steps {sorted(steps)}")
    return int(next(iter(steps), 0))


class _Request:
    """The sharded state dicts megatron-core builds for this rank, and the flat list of their
    tensors that goes to storage (keys and offsets are the same at every layout; the nesting is
    not: one model dict per virtual pipeline chunk, one optimizer dict per chained optimizer)."""

    def __init__(self, model: list[torch.nn.Module], optimizer: Any | None, *, loading: bool) -> None:
        from megatron.core.dist_checkpointing.dict_utils import nested_values
        from megatron.core.dist_checkpointing.mapping import ShardedBase
        from megatron.core.utils import unwrap_model

        # Keys of the model itself: the DDP and bf16 wrappers would each add "module.".
        self.model = [chunk.sharded_state_dict(metadata=_METADATA) for chunk in unwrap_model(model)]
        keyed = {f"model{index}": tree for index, tree in enumerate(self.model)}
        self.optimizer = (
            None if optimizer is None else optimizer.sharded_state_dict(keyed, is_loading=loading, metadata=_METADATA)
        )
        self.tensors = [
            value
            for tree in [*self.model, self.optimizer or {}]
            for value in nested_values(tree)
            if isinstance(value, ShardedBase) and not _is_extra_state(value.key)
        ]

    def to_storage(self) -> dict[str, Any]:
        return {"tensors": self.tensors}

    def filled(self, loaded: list[Any]) -> tuple[list[Any], Any]:
        """The model and optimizer trees with each requested piece replaced by its loaded tensor."""
        from megatron.core.dist_checkpointing.dict_utils import dict_list_map_outplace
        from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject

        by_request = {id(request): value for request, value in zip(self.tensors, loaded, strict=True)}

        def fill(value: Any) -> Any:
            if id(value) in by_request:
                return by_request[id(value)]
            return value.unwrap() if isinstance(value, LocalNonpersistentObject) else value

        model = [dict_list_map_outplace(fill, tree) for tree in self.model]
        optimizer = None if self.optimizer is None else dict_list_map_outplace(fill, self.optimizer)
        return model, optimizer


def _is_extra_state(key: str) -> bool:
    # Transformer Engine's FP8 scaling metadata (None in the local spec); not model state we keep.
    return key.endswith("_extra_state")


def _load_model_chunk(chunk: torch.nn.Module, tree: dict[str, Any], index: int) -> None:
    own = {k: v for k, v in tree.items() if not _is_extra_state(k)}
    expected = {k for k, v in chunk.state_dict().items() if isinstance(v, torch.Tensor)}
    missing, unexpected = sorted(expected - set(own)), sorted(set(own) - expected)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match model chunk {index}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    chunk.load_state_dict(own, strict=False)


def _prime_fresh_state(optimizer: Any) -> None:
    """A megatron-core optimizer that has not stepped has no state to describe (its sharded state
    dict asserts one Adam step without Apex/TE): give it zero moments at step 0 first, as its own
    `init_state_fn` would before a load."""
    for sub in sub_optimizers(optimizer):
        inner = sub.optimizer
        if len(inner.state) == 0 and getattr(sub, "init_state_fn", None) is not None:
            sub.init_state_fn(inner, sub.config)
            if _per_parameter_step(inner):
                for entry in inner.state.values():
                    entry["step"] = torch.zeros((), dtype=torch.float32)


def _per_parameter_step(inner: Any) -> bool:
    """torch's Adam keeps `step` per parameter; TE's FusedAdam keeps it per param group."""
    return isinstance(inner, torch.optim.Adam | torch.optim.AdamW)


def _load_optimizer(optimizer: Any, tree: Any, *, step: int) -> None:
    subs = sub_optimizers(optimizer)
    parts = [tree] if len(subs) == 1 else [tree[index] for index in range(len(subs))]
    for sub, part in zip(subs, parts, strict=True):
        _with_step(part, step, per_parameter=_per_parameter_step(sub.optimizer))
        param_state = part.pop("param_state", None)
        part.pop("param_state_sharding_type", None)
        sub.load_state_dict(part)
        if param_state is not None:  # the distributed optimizer's moments and fp32 copies
            with _step_tensors_set_aside(sub):
                sub.load_parameter_state_from_fully_reshardable(param_state)


def _with_step(tree: Any, step: int, *, per_parameter: bool) -> None:
    """Put the saved Adam step into every param group and, for torch's Adam, every parameter's
    state (the optimizer's own state dict carries it there; the stored tensors do not)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "param_groups":
                for group in value:
                    group["step"] = step
            elif key == "state" and per_parameter and isinstance(value, dict):
                for entry in value.values():
                    if isinstance(entry, dict) and "exp_avg" in entry:
                        entry["step"] = torch.tensor(float(step))
            else:
                _with_step(value, step, per_parameter=per_parameter)
    elif isinstance(tree, list):
        for value in tree:
            _with_step(value, step, per_parameter=per_parameter)


@contextmanager
def _step_tensors_set_aside(optimizer: Any) -> Iterator[None]:
    """Two megatron-core (0.19) details of the path without Apex/TE, both seen on the GPU:
    `load_state_dict` puts one `step` tensor object into every parameter's torch Adam state, which
    Adam then increments once per parameter each step (bias correction runs at step 1 + N);
    and the shard loader copies every tensor of a parameter's state from the checkpoint, which
    holds no `step` (KeyError 'step'). The step tensors are held aside while the shards load and
    come back as one copy per parameter."""
    state = getattr(getattr(optimizer, "optimizer", None), "state", None) or {}
    steps = {param: entry.pop("step") for param, entry in state.items() if "step" in entry}
    try:
        yield
    finally:
        for param, step in steps.items():
            state[param]["step"] = step.clone()
