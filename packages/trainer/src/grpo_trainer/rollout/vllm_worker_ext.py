"""Methods mixed into every vLLM worker (`worker_extension_cls`), called by name through
`LLM.collective_rpc`, so no pickled code crosses to the engine process.

A weight sync is `grpo_begin_weight_sync`, one `grpo_load_weight_bucket` per bucket, then
`grpo_finish_weight_sync`. It uses vLLM's in-place layerwise reload: each layer is rebuilt from
checkpoint-format (HF-named) tensors and re-processed (repacking, quantisation) as soon as all of
its tensors have arrived, then copied into the storage the engine already uses. A layer split over
two buckets simply waits for the second one.
"""

from __future__ import annotations

from typing import Any

from grpo_trainer.rollout.vllm_weight_buckets import TensorMeta, read_bucket_file, unpack_bucket


class GRPOWorkerExtension:
    """Mixed into vLLM's `Worker`; `self` is the worker (`model_runner`, `vllm_config`)."""

    def grpo_begin_weight_sync(self: Any) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())
        self._grpo_loaded_names = set()

    def grpo_load_weight_bucket(self: Any, meta: list[TensorMeta], payload: bytes) -> int:
        """Load one bucket sent inside the RPC message; returns how many tensors were accepted."""
        return self._grpo_load(unpack_bucket(meta, payload))

    def grpo_load_weight_file(self: Any, meta: list[TensorMeta], path: str) -> int:
        """Load one bucket from a shared-memory file written by the trainer (mapped, not copied)."""
        return self._grpo_load(read_bucket_file(meta, path))

    def _grpo_load(self: Any, cpu_tensors: list[tuple[str, Any]]) -> int:
        from vllm.config import set_current_vllm_config

        device = self.model_runner.device
        tensors = [(name, tensor.to(device)) for name, tensor in cpu_tensors]
        with set_current_vllm_config(self.vllm_config):
            try:
                loaded = self.model_runner.get_model().load_weights(iter(tensors))
            except Exception as error:  # vLLM's loaders often assert without a message
                shapes = {name: tuple(t.shape) for name, t in tensors[:8]}
                raise RuntimeError(
                    f"weight sync: vLLM could not load {shapes}: {type(error).__name__}: {error}"
                ) from error
        names = {name for name, _ in tensors} if loaded is None else set(loaded)
        self._grpo_loaded_names |= names
        return len(names)

    def grpo_finish_weight_sync(self: Any) -> list[str]:
        """Process layers that are still waiting; returns the model's parameters that no bucket
        loaded (they keep their previous values)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(model, self.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if hasattr(self.model_runner, reset):
                getattr(self.model_runner, reset)()
        missing = {name for name, _ in model.named_parameters()} - self._grpo_loaded_names
        return sorted(missing)
