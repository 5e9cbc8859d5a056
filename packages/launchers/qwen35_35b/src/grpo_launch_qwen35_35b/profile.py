"""Qwen3.5-35B-A3B (40 layers, 256 routed experts, top-8, ~3B active) on geo3k: the seed verl
recipe's values (tests/verl_recipes/qwen35_35b_{gpu,npu}.txt), common ones once, then per device only
what differs. Keys are `grpo_config` field names; every deliberate difference from the recipe is in
`recipe_differences` with its reason.

The derivation: docs/INTERNALS.md, `grpo_launch_qwen35_35b.profile`.
"""

from __future__ import annotations

from pathlib import Path

from grpo_launch import DeviceDelta, LaunchProfile
from grpo_launch.profile import LOCAL_LAYERS_ON_GPU, MINDSPEED_OPTIONS

COMMON = {
    "project_name": "grpo-qwen35",
    "experiment_name": "qwen35-35b-a3b-geo3k",
    "total_epochs": 15,
    "test_freq": 5,
    "val_before_train": False,
    "device": {"nnodes": 1},
    "data": {
        "max_prompt_length": 1024,
        "max_response_length": 2048,
        "train_batch_size": 32,
        "filter_overlong_prompts": True,
        "truncation": "error",
    },
    "parallel": {"tp": 2, "ep": 8, "etp": 1, "cp": 1, "sequence_parallel": True},
    "actor": {
        "backend": "megatron",
        "dtype": "bfloat16",
        "lr": 1e-6,
        "ppo_mini_batch_size": 32,
        "ppo_micro_batch_size_per_device": 1,
        "ppo_max_token_len_per_device": 4096,
        "log_prob_micro_batch_size_per_device": 1,
        "log_prob_max_token_len_per_device": 4096,
        "use_dynamic_bsz": False,
        "log_prob_use_dynamic_bsz": False,
        "use_remove_padding": False,
        "use_kl_loss": True,
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
            "attention_backend": "auto",
            "recompute_method": "uniform",
            "recompute_granularity": "full",
            "recompute_num_layers": 1,
            "moe_grouped_gemm": True,
            "moe_permute_fusion": True,
            "moe_token_dispatcher_type": "alltoall",
            "moe_aux_loss_coeff": 0.01,
            "moe_z_loss_coeff": 0.001,
        },
    },
    # The ref model only computes log-probs: its weights leave the device between uses (the rest of
    # its settings, parallel sizes included, are inherited from the actor).
    "ref": {"megatron": {"param_offload": True}},
    "rollout": {"engine": "vllm", "dtype": "bfloat16", "n": 5, "temperature": 1.0, "tensor_parallel_size": 8},
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "checkpoint": {"save_freq": 20, "export_hf": True},
}


PROFILE = LaunchProfile(
    launcher="grpo-launch-35b",
    model_id="Qwen/Qwen3.5-35B-A3B",
    dataset="geo3k",
    num_experts=256,
    # The published config.json (no weights): the dry run plans memory from it before a download.
    architecture=Path(__file__).with_name("architecture"),
    common=COMMON,
    devices={
        "gpu": DeviceDelta(
            config={
                "device": {"devices_per_node": 8},
                "parallel": {"pp": 1},
                "actor": {"megatron": {"transformer_impl": "local"}},
                "rollout": {"gpu_memory_utilization": 0.6},
            },
            recipe_differences={"actor.megatron.transformer_impl": LOCAL_LAYERS_ON_GPU},
        ),
        "npu": DeviceDelta(
            config={
                "device": {"devices_per_node": 16},
                "parallel": {"pp": 2},
                "rollout": {"gpu_memory_utilization": 0.65, "engine_kwargs": {"mm_processor_cache_gb": 0}},
                # As the seed NPU runs: the HF export saves what maps and records skipped keys
                # in the manifest instead of failing the run.
                "checkpoint": {"strict": False},
            },
            recipe_differences={
                "actor.use_dynamic_bsz": "token-budget micro-batches with pipeline parallelism (pp=2) are "
                "refused: the pipeline schedule needs micro-batches of one row count",
                "actor.log_prob_use_dynamic_bsz": "as actor.use_dynamic_bsz (pp=2)",
                "ref.log_prob_use_dynamic_bsz": "as actor.use_dynamic_bsz (pp=2)",
                "actor.use_remove_padding": "packed rows run on the torch backend only; the Megatron "
                "backend refuses them (its local layers lack a core attention that takes sequence "
                "boundaries, and Qwen3.5's Gated DeltaNet trains packed only on Triton >= 3.7.1)",
                "actor.megatron.override_transformer_config": MINDSPEED_OPTIONS,
            },
        ),
    },
)
