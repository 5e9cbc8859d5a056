"""Qwen3.5-122B-A10B (48 layers, 256 routed experts, top-8, ~10B active) on geo3k, 4 nodes: the
values every device shares, then per device only what differs. Keys are `grpo_config` field names.

Why these values:
- lengths, batch (512 prompts x n=5, mini-batch 128), lr 1e-6, KL loss (low_var_kl, 0.01), save
  every 20 / test every 5 over 15 epochs: the same geo3k recipe as the 35B launcher.
- micro-batch 1 for the update (the activations of a 10B-active model), 8 for log-probs; the NPU
  profile lowers log-probs to 4 to fit beside vLLM in 64 GB.
- use_remove_padding False and dynamic batch sizes off: Qwen3.5's Gated DeltaNet layers have no
  packed-sequence (THD) support in Megatron-Core. The ref model inherits this with the parallel sizes
  and Megatron settings (grpo_config resolves every unset `ref.*` from the actor: the 122B review
  bug, a ref without use_remove_padding / bridge settings, cannot recur).
- parameters and optimizer state offloaded between phases so the colocated vLLM engine fits.
- GPU: no router load balancing and no RoPE fusion. NPU: no expandable segments, because its
  allocator uses garbage_collection_threshold, which conflicts with them.
"""

from __future__ import annotations

from grpo_launch import DeviceDelta, LaunchProfile

COMMON = {
    "project_name": "grpo-qwen35",
    "experiment_name": "qwen35-122b-a10b-geo3k",
    "total_epochs": 15,
    "test_freq": 5,
    "device": {"nnodes": 4},
    "data": {"max_prompt_length": 1024, "max_response_length": 2048, "train_batch_size": 512},
    # Both devices use TP2 without context or expert-tensor parallelism; PP, EP and the world differ.
    "parallel": {"tp": 2, "etp": 1, "cp": 1, "sequence_parallel": True},
    "actor": {
        "backend": "megatron",
        "lr": 1e-6,
        "ppo_mini_batch_size": 128,
        "ppo_micro_batch_size_per_device": 1,
        "log_prob_micro_batch_size_per_device": 8,
        "use_dynamic_bsz": False,
        "use_remove_padding": False,
        "use_kl_loss": True,
        "kl_loss_coef": 0.01,
        "kl_loss_type": "low_var_kl",
        "entropy_coeff": 0.0,
        "megatron": {
            "param_offload": True,
            "optimizer_offload": True,
            "optimizer_offload_fraction": 1.0,
            "recompute_method": "uniform",
            "recompute_granularity": "full",
            "recompute_num_layers": 1,
            "moe_grouped_gemm": True,
            "moe_token_dispatcher_type": "alltoall",
            "moe_aux_loss_coeff": 0.001,
        },
    },
    "rollout": {"engine": "vllm", "n": 5, "temperature": 1.0, "gpu_memory_utilization": 0.6},
    "checkpoint": {"save_freq": 20},
}

PROFILE = LaunchProfile(
    launcher="grpo-launch-122b",
    model_id="Qwen/Qwen3.5-122B-A10B",
    dataset="geo3k",
    num_experts=256,
    common=COMMON,
    devices={
        "gpu": DeviceDelta(
            config={
                "device": {"devices_per_node": 8},
                "parallel": {"pp": 2, "ep": 8},
                "rollout": {"tensor_parallel_size": 8},
                "actor": {"megatron": {"moe_router_load_balancing_type": "none", "apply_rope_fusion": False}},
            },
        ),
        "npu": DeviceDelta(
            config={
                "device": {"devices_per_node": 16, "expandable_segments": False},
                "parallel": {"pp": 4, "ep": 16},
                "rollout": {"tensor_parallel_size": 16},
                "actor": {"log_prob_micro_batch_size_per_device": 4},
                "checkpoint": {"strict": False},
            },
            env={
                "PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:0.8",
                "HCCL_CONNECT_TIMEOUT": "5400",
                "HCCL_BUFFSIZE": "300",
            },
        ),
    },
)
