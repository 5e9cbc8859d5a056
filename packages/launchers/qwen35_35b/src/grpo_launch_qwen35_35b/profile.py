"""Qwen3.5-35B-A3B (40 layers, 256 routed experts, top-8, ~3B active) on geo3k: the values every
device shares, then per device only what differs. Keys are `grpo_config` field names.

Why these values:
- lengths 1024 prompt / 2048 response, batch 512 prompts x n=5, mini-batch 128: geo3k has ~2.1k
  training problems, so an epoch is 4 steps and 15 epochs are 60 steps; save every 20, test every 5.
- lr 1e-6, KL as a loss (low_var_kl, 0.01), no entropy bonus: the usual GRPO recipe for this size.
- use_remove_padding False: Qwen3.5's Gated DeltaNet layers do not support packed (THD) sequences in
  Megatron-Core, so batches stay padded (BSHD); dynamic batch sizes need THD and stay off too. The
  ref model inherits both, with the parallel sizes and Megatron settings (grpo_config resolves
  every unset `ref.*` from the actor).
- MoE: alltoall token dispatcher on both devices, grouped GEMM, a small aux loss; full recompute of
  one layer per chunk; the optimizer state offloaded to the CPU so vLLM fits beside the actor.
"""

from __future__ import annotations

from grpo_launch import DeviceDelta, LaunchProfile

COMMON = {
    "project_name": "grpo-qwen35",
    "experiment_name": "qwen35-35b-a3b-geo3k",
    "total_epochs": 15,
    "test_freq": 5,
    "device": {"nnodes": 1},
    "data": {"max_prompt_length": 1024, "max_response_length": 2048, "train_batch_size": 512},
    # Both devices use TP2 EP8 without context or expert-tensor parallelism; PP and the world differ.
    "parallel": {"tp": 2, "ep": 8, "etp": 1, "cp": 1, "sequence_parallel": True},
    "actor": {
        "backend": "megatron",
        "lr": 1e-6,
        "ppo_mini_batch_size": 128,
        "ppo_micro_batch_size_per_device": 2,
        "log_prob_micro_batch_size_per_device": 8,
        "use_dynamic_bsz": False,
        "use_remove_padding": False,
        "use_kl_loss": True,
        "kl_loss_coef": 0.01,
        "kl_loss_type": "low_var_kl",
        "entropy_coeff": 0.0,
        "megatron": {
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
    # The ref model only computes log-probs: its weights leave the device between uses (the rest of
    # its settings are inherited from the actor).
    "ref": {"megatron": {"param_offload": True}},
    "rollout": {"engine": "vllm", "n": 5, "temperature": 1.0, "gpu_memory_utilization": 0.6},
    "checkpoint": {"save_freq": 20},
}

PROFILE = LaunchProfile(
    launcher="grpo-launch-35b",
    model_id="Qwen/Qwen3.5-35B-A3B",
    dataset="geo3k",
    num_experts=256,
    common=COMMON,
    devices={
        "gpu": DeviceDelta(
            config={
                "device": {"devices_per_node": 8},
                "parallel": {"pp": 1},
                "rollout": {"tensor_parallel_size": 8},
            },
        ),
        "npu": DeviceDelta(
            config={
                "device": {"devices_per_node": 16},
                "parallel": {"pp": 2},
                "rollout": {"tensor_parallel_size": 8},
                # As the seed NPU runs: the HF export saves what maps and records skipped keys
                # in the manifest instead of failing the run.
                "checkpoint": {"strict": False},
            },
        ),
    },
)
