"""Moving a Megatron policy off the accelerator while the rollout engine uses it, and back.

Megatron-core's DDP keeps parameters and gradients in contiguous buffers (`_ParamAndGradBuffer`),
which know how to park their storage on the CPU (`offload_to_cpu` / `reload_from_cpu`); parameters
outside such a buffer (a reference model without DDP, or DDP without a parameter buffer) move one
by one. The optimizer's fp32 main parameters and Adam moments move too, unless the optimizer
already keeps them on the CPU (`actor.megatron.optimizer_offload`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import grpo_device
from grpo_trainer.backends.megatron.state import sub_optimizers


@dataclass(kw_only=True)
class Offloaded:
    buffers: list[Any] = field(default_factory=list)
    loose_params: list[torch.nn.Parameter] = field(default_factory=list)
    optimizer: Any = None
    weights: bool = True
    grads: bool = True


def _ddp_buffers(chunk: torch.nn.Module) -> list[Any]:
    from megatron.core.distributed import DistributedDataParallel

    if not isinstance(chunk, DistributedDataParallel):
        return []
    return [*chunk.buffers, *chunk.expert_parallel_buffers]


def _optimizer_tensors(optimizer: Any) -> Iterator[tuple[dict[str, Any] | None, str | None, torch.Tensor]]:
    """(state dict, key, tensor) of every Adam moment and (None, None, param) of every main param."""
    for sub in sub_optimizers(optimizer):
        inner = getattr(sub, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                yield None, None, param
                state = inner.state.get(param, {})
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        yield state, key, value


def _move_optimizer(optimizer: Any, device: torch.device) -> None:
    for state, key, tensor in list(_optimizer_tensors(optimizer)):
        if state is None:
            # fp32 model parameters are their own main parameters: views into the DDP buffer,
            # which the buffer's own offload moves (a copy here would detach them from it).
            if tensor._base is None:
                tensor.data = tensor.data.to(device)
        else:
            state[key] = tensor.to(device)


def offload(
    models: list[list[torch.nn.Module]], optimizer: Any | None, *, weights: bool = True, grads: bool = True
) -> Offloaded:
    """Park the `weights` and / or `grads` of `models` (lists of virtual-pipeline chunks) and
    `optimizer` (None: leave it) on the CPU."""
    done = Offloaded(optimizer=optimizer, weights=weights, grads=grads)
    cpu = torch.device("cpu")
    for model in models:
        for chunk in model:
            in_buffer: set[int] = set()
            for buffer in _ddp_buffers(chunk):
                if weights or grads:
                    buffer.offload_to_cpu(move_params=weights and buffer.param_data is not None, move_grads=grads)
                    done.buffers.append(buffer)
                if buffer.param_data is not None:
                    in_buffer.update(id(p) for p in buffer.params)
            for param in chunk.parameters() if weights else ():
                if id(param) not in in_buffer:
                    param.data = param.data.to(cpu)
                    done.loose_params.append(param)
    if optimizer is not None:
        _move_optimizer(optimizer, cpu)
    grpo_device.empty_cache()
    return done


def onload(done: Offloaded, *, device: torch.device) -> None:
    for buffer in done.buffers:
        buffer.reload_from_cpu(move_params=done.weights and buffer.param_data is not None, move_grads=done.grads)
    for param in done.loose_params:
        param.data = param.data.to(device)
    if done.optimizer is not None:
        _move_optimizer(done.optimizer, device)
    grpo_device.synchronize()
