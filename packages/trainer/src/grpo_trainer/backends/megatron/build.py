"""Building the Megatron model and optimizer from an HF checkpoint through Megatron-Bridge.

HF path -> `AutoBridge.from_hf_pretrained` -> provider (bridge's mapping of the HF config) ->
our settings from grpo_config (`provider_config`) -> validated `override_transformer_config` ->
`finalize()` -> model parallel groups -> `provide_distributed_model` (HF weights loaded by the
bridge) -> Megatron (distributed) optimizer.

Every device call goes through grpo_device (CUDA with nccl, Ascend NPU with hccl); megatron-core's
forward does not run on CPU, so kind cpu is refused with that reason.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
import torch
import torch.distributed as dist

import grpo_device
from grpo_config.schema import ActorConfig, MegatronConfig, TrainerConfig
from grpo_device import DeviceKind
from grpo_trainer.backends.megatron.grad_norm import use_foreach_grad_norm
from grpo_trainer.backends.megatron.imports import (
    import_auto_bridge,
    import_megatron_stack,
    transformer_engine_available,
)
from grpo_trainer.backends.megatron.language_model_view import (
    open_language_model_bridge,
    vision_language_config,
)
from grpo_trainer.backends.megatron.provider_config import (
    ModelShape,
    ParallelLayout,
    optimizer_settings,
    provider_settings,
    resolve_parallel_layout,
    torch_grouped_experts,
    validate_overrides,
)
from grpo_trainer.backends.megatron.state import sub_optimizers
from grpo_trainer.devices import resolve_device_kind

log = structlog.get_logger()

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(kw_only=True)
class BuiltPolicy:
    bridge: Any
    provider: Any
    model: list[torch.nn.Module]
    layout: ParallelLayout
    # The vision-language checkpoint this model was built from (its HF export goes back into that
    # layout); None for a text-only checkpoint.
    vision_language_source: str | None = None
    # Its image token and multimodal RoPE layout (`vision_tower.VisionLanguage`); None for text.
    vision_language: Any = None


def _accelerator(kind: DeviceKind | str) -> DeviceKind:
    device = grpo_device.parse_device_kind(kind)
    if device is DeviceKind.CPU:
        raise ValueError(
            "actor.backend=megatron needs a GPU or an Ascend NPU: megatron-core's forward does not run "
            "on CPU (its attention and MoE layers allocate on the accelerator); use actor.backend=torch "
            "on CPU"
        )
    return device


def megatron_device(kind: DeviceKind | str) -> torch.device:
    """The accelerator this process's Megatron model lives on (its current device: LOCAL_RANK once
    `init_distributed` ran); refuses cpu."""
    return grpo_device.current_device(_accelerator(kind))


def init_distributed(kind: DeviceKind | str) -> None:
    """One process per device; torchrun / Ray set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT.
    A single process without them becomes world size 1. Selects device LOCAL_RANK and, unless a
    process group exists already, starts one on the kind's backend (nccl on CUDA, hccl on NPU)."""
    device = _accelerator(kind)
    for key, default in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29511"),
    ):
        os.environ.setdefault(key, default)
    if grpo_device.device_count(device) == 0:
        raise grpo_device.DeviceUnavailableError(
            f"the Megatron backend runs on {device.value} but this process sees no such device; check "
            f"{grpo_device.visible_devices_env(device)} and the driver"
        )
    grpo_device.set_device(int(os.environ.get("LOCAL_RANK", "0")), kind=device)
    if not dist.is_initialized():
        dist.init_process_group(backend=grpo_device.comm_backend(device))


def model_shape(provider: Any) -> ModelShape:
    return ModelShape(
        num_layers=provider.num_layers,
        num_attention_heads=provider.num_attention_heads,
        num_query_groups=provider.num_query_groups,
        num_experts=provider.num_moe_experts,
    )


def configure_provider(
    provider: Any, cfg: TrainerConfig, *, megatron: MegatronConfig, seq_length: int
) -> None:
    """Set our settings and the user's overrides on the bridge's provider (before finalize)."""
    from megatron.core.transformer.enums import AttnBackend

    from grpo_trainer.backends.megatron.fusions import install_compiled_rope
    from grpo_trainer.backends.megatron.local_spec import local_block_spec

    valid_fields = {f.name for f in dataclasses.fields(provider)}
    overrides = validate_overrides(megatron.override_transformer_config, valid_fields)
    settings = provider_settings(
        cfg, transformer_engine_available=transformer_engine_available(), megatron=megatron
    )
    settings["attention_backend"] = AttnBackend[settings["attention_backend"]]
    settings["params_dtype"] = _DTYPES[cfg.actor.dtype]
    settings["pipeline_dtype"] = _DTYPES[cfg.actor.dtype]
    settings["seq_length"] = seq_length
    for name, value in {**settings, **overrides}.items():
        setattr(provider, name, value)
    if megatron.transformer_impl == "local":
        if megatron.apply_rope_fusion and install_compiled_rope():
            log.info("megatron.rope_fusion", kernel="megatron-core's rotary function, torch.compile'd on CUDA")
        provider.transformer_layer_spec = partial(
            local_block_spec,
            grouped_experts=torch_grouped_experts(megatron),
            fused_permutation=megatron.moe_permute_fusion,
        )
    if overrides:
        log.info("megatron.override_transformer_config", **{k: repr(v) for k, v in overrides.items()})


def open_bridge(auto_bridge: Any, model_path: str, **kwargs: Any) -> tuple[Any, str | None]:
    """(the bridge over `model_path`, the vision-language checkpoint it reads or None). For a
    vision-language checkpoint (Qwen3.5's real layout) the bridge is a text-only one reading it
    through `language_model_view`, which also maps the vision tower (`vision_tower`)."""
    config = vision_language_config(model_path)
    if config is not None:
        from grpo_trainer.backends.megatron.vision_tower import with_vision_mapping

        bridge = open_language_model_bridge(auto_bridge, model_path, config=config, **kwargs)
        with_vision_mapping(bridge)  # before its provider registers the weight-loading hook
        return bridge, model_path
    return auto_bridge.from_hf_pretrained(model_path, **kwargs), None


def build_policy(
    cfg: TrainerConfig,
    *,
    model_path: str,
    megatron: MegatronConfig | None = None,
    trainable: bool = True,
    kind: DeviceKind | str | None = None,
) -> BuiltPolicy:
    """The Megatron model (list of virtual-pipeline chunks) with HF weights loaded, on the device of
    `kind` (None: `device.kind` of the config, "auto" detected)."""
    device = import_megatron_stack(resolve_device_kind(cfg) if kind is None else kind)
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig

    megatron = megatron or cfg.actor.megatron
    auto_bridge = import_auto_bridge()
    init_distributed(device)
    bridge, vision_language_source = open_bridge(
        auto_bridge,
        model_path,
        torch_dtype=_DTYPES[cfg.actor.dtype],
        trust_remote_code=cfg.actor.trust_remote_code,
    )
    provider = bridge.to_megatron_provider(load_weights=True)
    seq_length = cfg.data.max_prompt_length + cfg.data.max_response_length
    configure_provider(provider, cfg, megatron=megatron, seq_length=seq_length)
    vision_language = None
    if vision_language_source is not None:
        vision_language = add_vision_tower(
            provider, model_path, trainable=trainable and not cfg.actor.freeze_vision_tower
        )
    layout = resolve_parallel_layout(
        cfg.parallel, world_size=dist.get_world_size(), model=model_shape(provider)
    )
    provider.finalize()
    if not parallel_state.model_parallel_is_initialized():
        provider.initialize_model_parallel(seed=cfg.seed)
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=megatron.use_distributed_optimizer,
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        check_for_nan_in_grad=True,
    )
    model = provider.provide_distributed_model(ddp_config=ddp_config, wrap_with_ddp=trainable)
    if vision_language is not None:
        from grpo_trainer.backends.megatron.vision_tower import restore_fp32_buffers

        restore_fp32_buffers(model)
    if not trainable:
        for chunk in model:
            chunk.requires_grad_(False)
            chunk.eval()
    log.info(
        "megatron.model_built",
        model_path=model_path,
        layers=provider.num_layers,
        experts=provider.num_moe_experts,
        transformer_impl=megatron.transformer_impl,
        params=sum(p.numel() for chunk in model for p in chunk.parameters()),
        **dataclasses.asdict(layout),
    )
    return BuiltPolicy(
        bridge=bridge,
        provider=provider,
        model=model,
        layout=layout,
        vision_language_source=vision_language_source,
        vision_language=vision_language,
    )


def add_vision_tower(provider: Any, model_path: str, *, trainable: bool) -> Any:
    """Give the model to be built transformers' vision tower of the checkpoint at `model_path` and
    the multimodal RoPE (`vision_tower`); returns the `VisionLanguage` the forward reads. Call
    before `provide_distributed_model`, on a provider of a bridge from `open_bridge`."""
    from grpo_trainer.backends.megatron.vision_tower import VisionLanguage, attach_hook

    config = vision_language_config(model_path)
    if config is None:
        raise ValueError(f"{model_path} is not a vision-language checkpoint the Megatron backend knows")
    vision_language = VisionLanguage.from_config(config)
    # Before the bridge's own hook, which loads the HF weights (the tower's included).
    provider.register_pre_wrap_hook(attach_hook(model_path, vision_language, trainable=trainable), prepend=True)
    return vision_language


def build_optimizer(actor: ActorConfig, model: list[torch.nn.Module]) -> Any:
    """Megatron Adam (distributed over data parallel ranks when configured), optionally with part
    or all of its state and update on the CPU; the gradient norm of its clipping on the device
    (`grad_norm`)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    megatron = actor.megatron
    settings = optimizer_settings(actor)
    settings["params_dtype"] = _DTYPES[actor.dtype]
    valid = {f.name for f in dataclasses.fields(OptimizerConfig)}
    validate_overrides(megatron.override_optimizer_config, valid, setting="override_optimizer_config")
    optimizer = get_megatron_optimizer(OptimizerConfig(**settings), model)
    use_foreach_grad_norm()
    fused = use_fused_torch_adam(optimizer)
    if fused:
        log.info("megatron.optimizer_fused_adam", param_groups=fused)
    return optimizer


def use_fused_torch_adam(optimizer: Any) -> int:
    """Without transformer_engine or apex megatron-core steps with `torch.optim.AdamW` in its
    default multi-tensor ("foreach") form; its single fused kernel does the same update with
    fewer passes over the fp32 state (measured on the H200: docs/benchmarks.md). Switched on for
    the parameter groups whose tensors are all on CUDA (the CPU-offloaded optimizer is another
    class); returns how many groups were switched."""
    switched = 0
    for chained in sub_optimizers(optimizer):
        inner = getattr(chained, "optimizer", None)
        if type(inner) not in (torch.optim.Adam, torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            if group.get("fused") or not all(p.device.type == DeviceKind.CUDA and p.is_floating_point() for p in group["params"]):
                continue
            group["fused"], group["foreach"] = True, False
            switched += 1
    return switched


def wire_model_config(model: list[torch.nn.Module], optimizer: Any) -> None:
    """What Megatron's own training loop sets on the model config before the first step: gradient
    sync hooks for the schedules and the loss scale for fp16."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    config = get_model_config(model[0])
    config.no_sync_func = [chunk.no_sync for chunk in model] if len(model) > 1 else model[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    if optimizer is not None:
        config.grad_scale_func = optimizer.scale_loss
