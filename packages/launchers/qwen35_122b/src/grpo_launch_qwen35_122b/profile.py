"""Qwen3.5-122B-A10B (48 layers, 256 routed experts, top-8, ~10B active) on geo3k, 4 nodes: the seed
verl recipe's values (tests/verl_recipes/qwen35_122b_{gpu,npu}.txt), common ones once, then per
device only what differs. Keys are `grpo_config` field names; every deliberate difference from the
recipe is in `recipe_differences` with its reason.

The derivation: docs/INTERNALS.md, `grpo_launch_qwen35_122b.profile`.
"""

from __future__ import annotations

from pathlib import Path

from grpo_launch import DeviceDelta, LaunchProfile
from grpo_launch.profile import LOCAL_LAYERS_ON_GPU, MINDSPEED_OPTIONS

COMMON = {
    "project_name": "grpo-qwen35",
    "experiment_name": "qwen35-122b-a10b-geo3k",
    "total_epochs": 20,
    "test_freq": 10,
    "val_before_train": False,
    "device": {"nnodes": 4},
    "data": {
        "max_prompt_length": 3240,
        "max_response_length": 4096,
        "train_batch_size": 128,
        "filter_overlong_prompts": True,
        "truncation": "right",
    },
    "parallel": {"tp": 2, "etp": 1, "cp": 1, "vpp": None, "sequence_parallel": True},
    "actor": {
        "backend": "megatron",
        "dtype": "bfloat16",
        "gradient_checkpointing": True,
        "lr": 1e-6,
        "ppo_mini_batch_size": 64,
        "ppo_micro_batch_size_per_device": 1,
        "ppo_max_token_len_per_device": 8192,
        "log_prob_max_token_len_per_device": 8192,
        "use_dynamic_bsz": False,
        "log_prob_use_dynamic_bsz": False,
        "use_remove_padding": False,
        "use_kl_loss": False,
        "kl_loss_coef": 0.01,
        "kl_loss_type": "low_var_kl",
        "entropy_coeff": 0.0,
        "megatron": {
            "param_offload": True,
            "grad_offload": True,
            "optimizer_offload": True,
            "optimizer_offload_fraction": 1.0,
            "override_optimizer_config": {
                "overlap_cpu_optimizer_d2h_h2d": True,
                "use_precision_aware_optimizer": True,
                "optimizer_cpu_offload": True,
            },
            "recompute_method": "uniform",
            "recompute_granularity": "full",
            "recompute_num_layers": 1,
            "moe_grouped_gemm": True,
            "moe_permute_fusion": True,
            "moe_token_dispatcher_type": "alltoall",
        },
    },
    "ref": {"megatron": {"param_offload": True}},
    "rollout": {
        "engine": "vllm",
        "dtype": "bfloat16",
        "n": 6,
        "temperature": 1.0,
        "weight_sync_bucket_mb": 4096,
    },
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "checkpoint": {"save_freq": 50, "export_hf": True, "save_contents": ["model", "extra", "optimizer"]},
    "timeouts": {"collective_s": 10800},
}


PROFILE = LaunchProfile(
    launcher="grpo-launch-122b",
    model_id="Qwen/Qwen3.5-122B-A10B",
    dataset="geo3k",
    num_experts=256,
    # The published config.json (no weights): the dry run plans memory from it before a download.
    architecture=Path(__file__).with_name("architecture"),
    common=COMMON,
    devices={
        "gpu": DeviceDelta(
            config={
                "device": {"devices_per_node": 8},
                "parallel": {"pp": 2, "ep": 8},
                "actor": {
                    "log_prob_micro_batch_size_per_device": 1,
                    "megatron": {
                        "moe_router_load_balancing_type": "none",
                        "apply_rope_fusion": False,
                        "transformer_impl": "local",
                    },
                },
                "rollout": {"tensor_parallel_size": 8, "gpu_memory_utilization": 0.66, "max_model_len": 15768},
            },
            recipe_differences={"actor.megatron.transformer_impl": LOCAL_LAYERS_ON_GPU},
        ),
        "npu": DeviceDelta(
            config={
                "device": {"devices_per_node": 16, "expandable_segments": False},
                "parallel": {"pp": 4, "ep": 16},
                "actor": {
                    "log_prob_micro_batch_size_per_device": 4,
                    "megatron": {"attention_backend": "auto", "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001},
                },
                "rollout": {
                    "tensor_parallel_size": 16,
                    "gpu_memory_utilization": 0.6,
                    "max_model_len": 8192,
                    "engine_kwargs": {"mm_processor_cache_gb": 0},
                },
                # As the seed NPU runs: the HF export saves what maps and records skipped keys.
                "checkpoint": {"strict": False},
            },
            # The NPU allocator's garbage_collection_threshold conflicts with expandable segments.
            env={
                "PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:0.8",
                "HCCL_CONNECT_TIMEOUT": "5400",
                "HCCL_BUFFSIZE": "300",
            },
            recipe_differences={
                "actor.megatron.override_transformer_config": MINDSPEED_OPTIONS,
            },
        ),
    },
)
