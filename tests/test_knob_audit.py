"""The knob audit: every leaf of the config schema is either read, with the tests that show its
effect, or refused, with the value grpo cannot honour and the reason `grpo_config.load` gives.

A new setting fails this test until it is entered here: with the test that shows what it does, or
with the refusal a user gets when they set it. A setting that is accepted and ignored cannot pass.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from functools import cache
from pathlib import Path

import pytest

from grpo_config import ConfigError, load, schema

ROOT = Path(__file__).resolve().parents[1]
TRAINER = "packages/trainer/tests"
TINY_TRAIN = "tests/test_tiny_train.py::test_run_writes_checkpoints_metrics_tensorboard_and_plot"
SETTINGS = "tests/test_trainer_settings.py"
TORCH = f"{TRAINER}/runtime/test_torch_backend.py"
PROVIDER = f"{TRAINER}/megatron/test_provider_config.py"
PROVIDER_MAP = f"{PROVIDER}::test_local_settings_map_every_option"
REF_PROVIDER = f"{PROVIDER}::test_ref_settings_can_differ_from_the_actor"
OPTIMIZER = f"{PROVIDER}::test_optimizer_settings_follow_the_actor_and_offload_settings"
MEMORY = f"{TRAINER}/runtime/test_rollout_memory.py"
VLLM_SETTINGS = f"{TRAINER}/vllm/test_vllm_weight_sync.py::test_from_config_maps_the_rollout_settings"
VLLM_KWARGS = f"{TRAINER}/vllm/test_vllm_weight_sync.py::test_from_config_passes_every_rollout_setting"
SAMPLING = f"{SETTINGS}::test_sampling_parameters_of_training_and_validation"
PHASE_TIMEOUTS = f"{SETTINGS}::test_each_phase_waits_as_long_as_its_timeout_setting"
LOSS = f"{TRAINER}/test_loss.py::test_the_loss_reads_the_actor_settings_and_the_response_budget"
LOG_PROBS = f"{TORCH}::test_log_probs_match_an_unpadded_forward_whatever_the_micro_batch"
MICRO = f"{TORCH}::test_one_update_is_the_same_for_any_micro_batching"
HF_EXPORT = "tests/test_checkpoint_hf_export.py"
MEGATRON_PROVIDER = f"{TRAINER}/megatron/test_megatron_provider.py"
LANDS_ON_PROVIDER = f"{MEGATRON_PROVIDER}::test_settings_and_overrides_land_on_the_bridge_provider"

MULTI_TURN = f"{TRAINER}/tools/test_multi_turn.py"
MULTI_TURN_CONFIG = f"{MULTI_TURN}::test_the_config_section_sets_every_loop_setting_and_its_tools"
MULTI_TURN_TRAIN = "tests/test_multi_turn_train.py::test_a_step_calls_tools_and_trains_on_the_sampled_ids_only"

VALIDATE = "packages/config/tests/test_validate.py"
ONE_STEP_OFF = "tests/test_one_step_off.py::test_each_step_trains_on_responses_of_the_weights_one_update_behind"
ALGO = "tests/test_algorithm_settings.py"
ALGO_TRAIN = "tests/test_algorithms_train.py::test_every_algorithm_on_writes_its_metrics_and_resumes_its_kl_coefficient"
DYNAMIC = f"{ALGO}::test_dynamic_sampling_drops_equal_groups_and_generates_until_the_batch_is_full"
CORRECTION = f"{ALGO}::test_overlong_filtering_and_rollout_correction_shape_the_loss_mask_and_weights"

# leaf -> the tests that show its effect (the first is the main one).
READ: dict[str, tuple[str, ...]] = {
    # refused on the Megatron backend: packages/config/tests/test_bad_values.py
    "actor.use_remove_padding": (f"{TORCH}::test_packed_rows_give_the_padded_log_probs_entropy_and_gradients",),
    "ref.use_remove_padding": (f"{TORCH}::test_packed_rows_give_the_padded_log_probs_entropy_and_gradients",),
    "project_name": (TINY_TRAIN,),
    "experiment_name": (TINY_TRAIN,),
    "seed": (
        "tests/test_tiny_train.py::test_same_seed_gives_identical_rewards",
        f"{TRAINER}/runtime/test_batching.py::test_split_ranks_and_step_seeds",
    ),
    "total_epochs": (f"{SETTINGS}::test_total_training_steps_or_else_total_epochs_decide_the_run_length",),
    "total_training_steps": (
        f"{SETTINGS}::test_total_training_steps_or_else_total_epochs_decide_the_run_length",
        TINY_TRAIN,
    ),
    "test_freq": (TINY_TRAIN,),
    "val_before_train": (TINY_TRAIN,),
    # read as inert (reported as ignored, never silently): packages/config/tests/test_inert.py
    "data.val_batch_size": ("packages/config/tests/test_inert.py::test_a_setting_whose_switch_is_off_loads_and_is_named_inert",),
    "max_zero_advantage_steps": ("tests/test_faults.py::test_a_run_without_learning_signal_stops_after_the_set_number_of_steps",),
    "device.kind": (f"{TRAINER}/test_devices.py::test_explicit_kind_is_parsed_without_detection",),
    "device.nnodes": (PHASE_TIMEOUTS,),
    "device.devices_per_node": (PHASE_TIMEOUTS,),
    "device.expandable_segments": (
        f"{MEMORY}::test_the_run_starts_with_the_configured_allocator_mode",
        f"{MEMORY}::test_offload_then_segments_off_for_vllm_and_back_in_reverse",
    ),
    "parallel.tp": (
        PROVIDER_MAP,
        f"{TRAINER}/runtime/test_batching.py::test_parallel_layout_decides_the_micro_batch_shape",
    ),
    "parallel.pp": (PROVIDER_MAP,),
    "parallel.ep": (PROVIDER_MAP,),
    "parallel.etp": (PROVIDER_MAP,),
    "parallel.vpp": (PROVIDER_MAP,),
    "parallel.sequence_parallel": (PROVIDER_MAP,),
    "data.train_files": (f"{SETTINGS}::test_prompt_key_names_the_column_holding_the_prompt",),
    "data.val_files": (f"{SETTINGS}::test_prompt_key_names_the_column_holding_the_prompt",),
    "data.prompt_key": (f"{SETTINGS}::test_prompt_key_names_the_column_holding_the_prompt",),
    "data.max_prompt_length": (
        f"{SETTINGS}::test_overlong_prompts_are_filtered_or_cut_as_the_data_settings_say",
    ),
    "data.max_response_length": (SAMPLING, LOSS),
    "data.train_batch_size": (
        TINY_TRAIN,
        f"{SETTINGS}::test_total_training_steps_or_else_total_epochs_decide_the_run_length",
    ),
    "data.shuffle": (f"{SETTINGS}::test_shuffle_and_the_data_seed_order_the_batches",),
    "data.seed": (f"{SETTINGS}::test_shuffle_and_the_data_seed_order_the_batches",),
    "data.filter_overlong_prompts": (
        f"{SETTINGS}::test_overlong_prompts_are_filtered_or_cut_as_the_data_settings_say",
    ),
    "data.truncation": (f"{SETTINGS}::test_overlong_prompts_are_filtered_or_cut_as_the_data_settings_say",),
    "data.apply_chat_template": (
        f"{TRAINER}/test_data.py::test_dataset_applies_chat_template_with_generation_prompt",
        f"{TRAINER}/test_data.py::test_string_prompt_and_apply_chat_template_false",
    ),
    "actor.model_path": (
        "tests/test_tiny_train.py::test_every_save_exports_the_trained_policy_as_hf_weights",
    ),
    "actor.trust_remote_code": (
        f"{TRAINER}/runtime/test_trust_remote_code.py::test_custom_code_loads_only_with_trust_remote_code",
        VLLM_SETTINGS,
    ),
    "actor.backend": (
        f"{TRAINER}/megatron/test_megatron_gpu.py::test_the_same_loss_as_the_torch_backend_on_the_same_weights_and_batch",
        "packages/config/tests/test_bad_values.py::test_bad_values_are_refused_with_the_key_the_value_and_the_range",
    ),
    "actor.dtype": (f"{TORCH}::test_the_reference_model_is_ref_model_path_in_ref_dtype", VLLM_SETTINGS),
    "actor.lr": (f"{TORCH}::test_lr_warms_up_linearly_per_training_step", OPTIMIZER),
    "actor.lr_warmup_steps": (f"{TORCH}::test_lr_warms_up_linearly_per_training_step",),
    "actor.lr_warmup_steps_ratio": ("tests/test_trainer_settings.py::test_the_warmup_ratio_is_a_share_of_the_runs_steps",),
    "actor.weight_decay": (
        f"{TORCH}::test_weight_decay_shrinks_the_weights_when_the_loss_has_no_gradient",
        OPTIMIZER,
    ),
    "actor.grad_clip": (f"{TORCH}::test_grad_clip_bounds_the_applied_gradient_norm", OPTIMIZER),
    "actor.ppo_mini_batch_size": (TINY_TRAIN,),
    "actor.ppo_micro_batch_size_per_device": (MICRO,),
    "actor.ppo_max_token_len_per_device": (MICRO,),
    "actor.use_dynamic_bsz": (MICRO,),
    "actor.ppo_epochs": (f"{TORCH}::test_ppo_epochs_pass_over_every_mini_batch_again", TINY_TRAIN),
    "actor.clip_ratio_low": (
        LOSS,
        f"{TRAINER}/test_grpo_math.py::test_policy_loss_hand_computed_single_tokens",
    ),
    "actor.clip_ratio_high": (
        LOSS,
        f"{TRAINER}/test_grpo_math.py::test_policy_loss_hand_computed_single_tokens",
    ),
    "actor.clip_ratio_c": (
        LOSS,
        f"{TRAINER}/test_grpo_math.py::test_policy_loss_hand_computed_single_tokens",
    ),
    "actor.loss_agg_mode": (LOSS, f"{TORCH}::test_one_update_equals_an_independent_reference_loop"),
    "actor.loss_scale_factor": (LOSS, "packages/config/tests/test_validate.py::test_loss_scale_factor_is_positive_and_only_with_the_mode_that_reads_it"),
    "actor.entropy_coeff": (LOSS,),
    "actor.entropy_from_logits_with_chunking": (
        f"{TORCH}::test_entropy_from_logits_with_chunking_gives_the_same_entropy_a_chunk_at_a_time",
        "packages/config/tests/test_inert.py::test_a_setting_whose_switch_is_off_loads_and_is_named_inert",
    ),
    "actor.use_kl_loss": (LOSS, f"{TORCH}::test_without_kl_no_reference_is_built_or_needed"),
    "actor.kl_loss_coef": (LOSS, f"{TORCH}::test_kl_to_the_frozen_reference_grows_as_the_policy_moves"),
    "actor.kl_loss_type": (LOSS,),
    "actor.log_prob_micro_batch_size_per_device": (LOG_PROBS,),
    "actor.log_prob_use_dynamic_bsz": (LOG_PROBS,),
    "actor.log_prob_max_token_len_per_device": (LOG_PROBS,),
    "actor.gradient_checkpointing": (
        f"{TORCH}::test_gradient_checkpointing_recomputes_and_gives_the_same_gradients",
        "packages/config/tests/test_bad_values.py::test_bad_values_are_refused_with_the_key_the_value_and_the_range",
    ),
    "actor.megatron.use_distributed_optimizer": (OPTIMIZER,),
    "actor.megatron.optimizer_offload_fraction": (OPTIMIZER,),
    "actor.megatron.param_offload": (f"{MEMORY}::test_each_offload_setting_moves_its_own_part",),
    "actor.torch.param_offload": (
        f"{MEMORY}::test_the_torch_backend_offloads_its_weights_with_their_gradients",
        f"{TORCH}::test_offload_frees_the_device_on_cuda",
    ),
    "actor.torch.optimizer_offload": (
        f"{MEMORY}::test_the_torch_backend_offloads_its_weights_with_their_gradients",
        f"{TORCH}::test_offload_frees_the_device_on_cuda",
    ),
    "ref.torch.param_offload": (f"{TORCH}::test_a_parked_reference_moves_to_the_device_only_for_its_own_pass",),
    "actor.megatron.grad_offload": (f"{MEMORY}::test_each_offload_setting_moves_its_own_part",),
    "actor.megatron.optimizer_offload": (
        f"{MEMORY}::test_each_offload_setting_moves_its_own_part",
        OPTIMIZER,
    ),
    "actor.megatron.transformer_impl": (
        f"{PROVIDER}::test_default_config_without_transformer_engine_names_every_switch",
        PROVIDER_MAP,
    ),
    "actor.megatron.recompute_method": (PROVIDER_MAP,),
    "actor.megatron.recompute_granularity": (PROVIDER_MAP, LANDS_ON_PROVIDER),
    "actor.megatron.recompute_num_layers": (PROVIDER_MAP,),
    "actor.megatron.moe_grouped_gemm": (f"{PROVIDER}::test_local_grouped_gemm_means_torch_grouped_experts",),
    "actor.megatron.moe_permute_fusion": (
        f"{PROVIDER}::test_local_impl_refuses_te_only_options",
        PROVIDER_MAP,
    ),
    "actor.megatron.moe_token_dispatcher_type": (PROVIDER_MAP,),
    "actor.megatron.moe_aux_loss_coeff": (PROVIDER_MAP, LANDS_ON_PROVIDER),
    "actor.megatron.moe_z_loss_coeff": (
        f"{PROVIDER}::test_transformer_engine_settings_keep_fusions_and_vpp_of_one_is_none",
    ),
    "actor.megatron.moe_router_load_balancing_type": (PROVIDER_MAP,),
    "actor.megatron.attention_backend": (PROVIDER_MAP, LANDS_ON_PROVIDER),
    "actor.megatron.apply_rope_fusion": (
        f"{PROVIDER}::test_transformer_engine_settings_keep_fusions_and_vpp_of_one_is_none",
        f"{PROVIDER}::test_local_impl_refuses_te_only_options",
    ),
    "actor.megatron.gradient_accumulation_fusion": (f"{PROVIDER}::test_local_impl_refuses_te_only_options",),
    "actor.megatron.override_transformer_config": (LANDS_ON_PROVIDER,),
    "actor.megatron.override_optimizer_config": (
        OPTIMIZER,
        f"{MEGATRON_PROVIDER}::test_optimizer_overrides_are_checked_against_the_real_optimizer_config",
    ),
    "ref.model_path": (f"{TORCH}::test_the_reference_model_is_ref_model_path_in_ref_dtype",),
    "ref.dtype": (f"{TORCH}::test_the_reference_model_is_ref_model_path_in_ref_dtype",),
    "ref.log_prob_micro_batch_size_per_device": (LOG_PROBS,),
    "ref.log_prob_use_dynamic_bsz": (LOG_PROBS,),
    "ref.log_prob_max_token_len_per_device": (LOG_PROBS,),
    "ref.megatron.param_offload": (f"{MEMORY}::test_each_offload_setting_moves_its_own_part",),
    "ref.megatron.transformer_impl": (REF_PROVIDER,),
    "ref.megatron.moe_grouped_gemm": (REF_PROVIDER,),
    "ref.megatron.moe_permute_fusion": (REF_PROVIDER,),
    "ref.megatron.moe_token_dispatcher_type": (REF_PROVIDER,),
    "ref.megatron.moe_aux_loss_coeff": (REF_PROVIDER,),
    "ref.megatron.moe_z_loss_coeff": (REF_PROVIDER,),
    "ref.megatron.moe_router_load_balancing_type": (REF_PROVIDER,),
    "ref.megatron.attention_backend": (REF_PROVIDER,),
    "ref.megatron.apply_rope_fusion": (REF_PROVIDER,),
    "ref.megatron.override_transformer_config": (LANDS_ON_PROVIDER,),
    "rollout.engine": (
        "tests/test_vllm_grpo_loop.py::test_tiny_grpo_loop_runs_three_steps_on_vllm",
        TINY_TRAIN,
    ),
    "rollout.dtype": (VLLM_SETTINGS, VLLM_KWARGS),
    "rollout.mode": (
        ONE_STEP_OFF,
        "tests/test_one_step_off.py::test_resume_sends_the_checkpoint_weights_before_generating",
        f"{VALIDATE}::test_one_step_off_refuses_what_it_cannot_honour",
    ),
    "rollout.nnodes": (f"{VALIDATE}::test_one_step_off_loads_with_its_rollout_devices_and_correction",),
    "rollout.devices_per_node": (
        f"{VALIDATE}::test_one_step_off_loads_with_its_rollout_devices_and_correction",
        ONE_STEP_OFF,
    ),
    "rollout.n": (SAMPLING,),
    "rollout.temperature": (SAMPLING,),
    "rollout.top_p": (SAMPLING,),
    "rollout.top_k": (SAMPLING,),
    "rollout.max_tokens": (SAMPLING, LOSS),
    "rollout.multi_turn.enable": (MULTI_TURN_TRAIN, f"{MULTI_TURN_CONFIG}"),
    "rollout.multi_turn.tool_config_path": (
        f"{TRAINER}/tools/test_verl_yaml.py::test_retool_s_yaml_runs_its_code_tool_with_its_own_limits",
        f"{TRAINER}/tools/test_verl_yaml.py::test_an_unreadable_file_or_a_clash_of_names_is_refused",
    ),
    **{
        f"rollout.multi_turn.{name}": (MULTI_TURN_CONFIG, test)
        for name, test in (
            ("max_assistant_turns", f"{MULTI_TURN}::test_turn_limits_end_the_response"),
            ("max_user_turns", f"{MULTI_TURN}::test_turn_limits_end_the_response"),
            ("max_parallel_calls", f"{MULTI_TURN}::test_parallel_calls_answer_in_one_turn_and_extra_calls_are_told_not_run"),
            ("max_tool_response_length", f"{MULTI_TURN}::test_hung_crashing_and_huge_tools_answer_the_model_and_the_batch_goes_on"),
            ("tool_response_truncate_side", f"{MULTI_TURN}::test_hung_crashing_and_huge_tools_answer_the_model_and_the_batch_goes_on"),
            ("format", f"{MULTI_TURN}::test_a_hand_checked_trajectory_is_the_templates_conversation_with_only_sampled_ids_trained"),
            ("tools", MULTI_TURN_TRAIN),
            ("function_tool_path", MULTI_TURN_CONFIG),
            ("tool_timeout_s", MULTI_TURN_TRAIN),
            ("tool_memory_mb", MULTI_TURN_CONFIG),
            ("tool_network", MULTI_TURN_CONFIG),
        )
    },
    "rollout.tensor_parallel_size": (
        VLLM_KWARGS,
        f"{SETTINGS}::test_rollout_replicas_get_their_prompts_on_every_rank_and_answer_from_their_first",
        "tests/test_vllm_replicas.py::test_replicas_generate_the_hf_greedy_tokens_before_and_after_a_synced_update",
    ),
    "rollout.gpu_memory_utilization": (VLLM_KWARGS,),
    "rollout.enforce_eager": (VLLM_SETTINGS,),
    "rollout.max_model_len": (VLLM_KWARGS, VLLM_SETTINGS),
    "rollout.max_num_batched_tokens": (VLLM_SETTINGS, VLLM_KWARGS),
    "rollout.free_cache_engine": (
        VLLM_KWARGS,
        f"{TRAINER}/vllm/test_vllm_sleep_state.py::test_without_sleep_mode_sleep_and_wake_only_log",
    ),
    "rollout.weight_sync_bucket_mb": (
        VLLM_KWARGS,
        f"{TRAINER}/vllm/test_vllm_weight_buckets.py::test_buckets_respect_the_size_and_keep_order",
    ),
    "rollout.val_n": (SAMPLING,),
    "rollout.val_temperature": (SAMPLING,),
    "rollout.val_top_p": (SAMPLING,),
    "rollout.val_top_k": (SAMPLING,),
    "rollout.val_do_sample": (SAMPLING,),
    "rollout.engine_kwargs": (VLLM_SETTINGS, VLLM_KWARGS),
    "algorithm.norm_adv_by_std": (f"{SETTINGS}::test_the_advantage_settings_shape_grpo_advantages",),
    "algorithm.adv_eps": (f"{SETTINGS}::test_the_advantage_settings_shape_grpo_advantages",),
    "algorithm.adv_estimator": (
        f"{SETTINGS}::test_the_advantage_settings_shape_grpo_advantages",
        "packages/config/tests/test_validate.py::test_adv_estimator_takes_grpo_or_rloo_and_refuses_the_rest",
    ),
    "algorithm.use_kl_in_reward": (f"{ALGO}::test_kl_in_reward_settings_shape_the_rewards", ALGO_TRAIN),
    "algorithm.kl_penalty": (f"{ALGO}::test_kl_in_reward_settings_shape_the_rewards",),
    "algorithm.kl_ctrl.type": (f"{ALGO}::test_kl_in_reward_settings_shape_the_rewards", ALGO_TRAIN),
    "algorithm.kl_ctrl.kl_coef": (f"{ALGO}::test_kl_in_reward_settings_shape_the_rewards", ALGO_TRAIN),
    "algorithm.kl_ctrl.horizon": (f"{ALGO}::test_kl_in_reward_settings_shape_the_rewards", ALGO_TRAIN),
    "algorithm.kl_ctrl.target_kl": (f"{ALGO}::test_kl_in_reward_settings_shape_the_rewards", ALGO_TRAIN),
    "algorithm.filter_groups.enable": (DYNAMIC, ALGO_TRAIN),
    "algorithm.filter_groups.metric": (f"{ALGO}::test_the_filter_metric_sees_the_overlong_penalty_or_not",),
    "algorithm.filter_groups.max_num_gen_batches": (
        f"{ALGO}::test_dynamic_sampling_stops_with_an_error_at_the_round_limit",
    ),
    "data.gen_batch_size": (DYNAMIC, ALGO_TRAIN),
    "algorithm.overlong_filter": (CORRECTION, ALGO_TRAIN),
    "algorithm.rollout_correction.rollout_is": (CORRECTION, f"{TRAINER}/test_rollout_correction.py::test_correction_applies_weights_and_mask_from_the_config", ALGO_TRAIN),
    "algorithm.rollout_correction.rollout_is_threshold": (
        CORRECTION,
        f"{TRAINER}/test_rollout_correction.py::test_correction_applies_weights_and_mask_from_the_config",
        f"{TRAINER}/test_rollout_correction.py::test_an_icepop_band_from_the_config_zeroes_the_weights_outside_it",
        f"{TRAINER}/test_rollout_correction.py::test_weights_and_diagnostics_equal_verl_s_helper",
    ),
    "algorithm.rollout_correction.rollout_is_batch_normalize": (
        f"{TRAINER}/test_rollout_correction.py::test_correction_applies_weights_and_mask_from_the_config",
        f"{TRAINER}/test_rollout_correction.py::test_truncated_weights_and_their_statistics",
    ),
    "algorithm.rollout_correction.rollout_rs": (CORRECTION, ALGO_TRAIN),
    "algorithm.rollout_correction.rollout_rs_threshold": (CORRECTION, ALGO_TRAIN),
    "algorithm.rollout_correction.bypass_mode": (f"{ALGO}::test_bypass_mode_takes_the_engines_log_probs_as_the_old_policys",),
    "reward.overlong_buffer.enable": (f"{ALGO}::test_the_filter_metric_sees_the_overlong_penalty_or_not", ALGO_TRAIN),
    "reward.overlong_buffer.len": (f"{ALGO}::test_the_filter_metric_sees_the_overlong_penalty_or_not",),
    "reward.overlong_buffer.penalty_factor": (f"{ALGO}::test_the_filter_metric_sees_the_overlong_penalty_or_not",),
    "reward.overlong_buffer.log": (f"{ALGO}::test_overlong_shaping_logs_only_when_asked",),
    "reward.overlong_buffer.max_response_length": (
        f"{ALGO}::test_the_overlong_penalty_counts_from_max_response_length_when_given",
    ),
    "device.memory_gib": (
        "tests/test_memory_plan.py::test_an_oversized_launch_is_refused_before_it_starts_with_the_numbers",
        "tests/test_memory_plan.py::test_the_dry_run_prints_the_plan_and_warns_when_it_cannot_fit",
    ),
    "actor.freeze_vision_tower": (
        "tests/test_vl_data.py::test_one_update_with_images_trains_the_vision_tower_unless_frozen",
        "tests/test_ckpt_export_qwen35.py::test_a_frozen_vision_tower_is_built_without_gradients",
    ),
    "actor.policy_loss.loss_mode": (
        f"{TRAINER}/test_loss.py::test_the_policy_loss_mode_and_the_rollout_weights_reach_the_policy_term",
        ALGO_TRAIN,
    ),
    "reward.custom_fn": (
        "packages/launchers/common/tests/test_tiny_preset.py::test_reward_travels_in_the_config_not_the_registry",
    ),
    "actor.balance_batch": (
        f"{SETTINGS}::test_balance_batch_gives_the_ranks_equal_tokens_of_each_mini_batch",
        f"{TRAINER}/runtime/test_batching.py::test_balanced_split_evens_the_ranks_tokens_within_each_mini_batch",
    ),
    "data.image_key": ("tests/test_vl_data.py::test_the_driver_reads_the_images_through_the_model_s_processor",),
    "reward.custom_fn_name": (
        f"{SETTINGS}::test_a_reward_file_and_its_function_name_reach_the_reward_manager",
        f"{TRAINER}/test_rewards_manager.py::test_custom_fn_from_a_file_as_verl_names_it",
    ),
    "reward.timeout_s": (
        f"{SETTINGS}::test_the_reward_settings_reach_the_reward_manager",
        f"{TRAINER}/test_rewards_manager.py::test_many_hanging_rows_cost_one_timeout_per_batch",
    ),
    "reward.num_workers": (f"{SETTINGS}::test_the_reward_settings_reach_the_reward_manager",),
    "reward.grader": (
        f"{TRAINER}/test_rewards_manager.py::test_the_grader_setting_picks_verl_s_or_the_lenient_grading",
        f"{SETTINGS}::test_the_reward_settings_reach_the_reward_manager",
        "packages/trainer/tests/test_rewards_equal_verl.py::test_every_row_scores_as_verl_scores_it",
    ),
    "checkpoint.dir": (TINY_TRAIN,),
    "checkpoint.save_freq": (TINY_TRAIN,),
    "checkpoint.max_to_keep": (TINY_TRAIN,),
    "checkpoint.save_contents": (f"{HF_EXPORT}::test_save_contents_chooses_what_the_training_state_holds",),
    "checkpoint.resume": (
        "packages/ckpt/tests/test_manager.py::test_resume_modes",
        "tests/test_tiny_train.py::test_sigkill_mid_run_then_rerun_resumes_from_the_last_checkpoint",
    ),
    "checkpoint.strict": (
        f"{HF_EXPORT}::test_a_strict_export_failure_keeps_the_training_state_and_names_the_keys",
        f"{HF_EXPORT}::test_a_lenient_export_records_the_skipped_key_and_goes_on",
    ),
    "checkpoint.export_hf": (
        "tests/test_tiny_train.py::test_every_save_exports_the_trained_policy_as_hf_weights",
        f"{HF_EXPORT}::test_without_export_hf_no_weights_are_exported",
    ),
    "logging.dir": (TINY_TRAIN,),
    "logging.console": (f"{TRAINER}/runtime/test_metrics.py::test_jsonl_tensorboard_console_and_plot",),
    "logging.jsonl": (
        f"{TRAINER}/runtime/test_metrics.py::test_jsonl_tensorboard_console_and_plot",
        TINY_TRAIN,
    ),
    "logging.tensorboard": (
        f"{TRAINER}/runtime/test_metrics.py::test_jsonl_tensorboard_console_and_plot",
        TINY_TRAIN,
    ),
    "logging.plot": (
        f"{TRAINER}/runtime/test_metrics.py::test_jsonl_tensorboard_console_and_plot",
        TINY_TRAIN,
    ),
    "logging.wandb": ("tests/test_tiny_train.py::test_wandb_and_validation_samples_carry_the_run",),
    "logging.val_generations": (
        "tests/test_tiny_train.py::test_wandb_and_validation_samples_carry_the_run",
        f"{TRAINER}/runtime/test_metrics.py::test_validation_samples_are_picked_as_verl_picks_them",
    ),
    "logging.level": ("tests/test_launch_tiny.py::test_logging_level_reaches_the_driver_and_every_worker",),
    "timeouts.setup_s": (
        PHASE_TIMEOUTS,
        f"{TRAINER}/runtime/test_worker_group.py::test_a_hang_in_the_first_call_is_reported_with_its_stack",
    ),
    "timeouts.generate_s": (PHASE_TIMEOUTS,),
    "timeouts.log_probs_s": (PHASE_TIMEOUTS,),
    "timeouts.update_s": (
        PHASE_TIMEOUTS,
        "tests/test_tiny_train.py::test_a_phase_past_its_timeout_stops_train_with_the_ranks_stacks",
    ),
    "timeouts.weight_sync_s": (PHASE_TIMEOUTS,),
    "timeouts.wake_sleep_s": (PHASE_TIMEOUTS,),
    "timeouts.checkpoint_s": (PHASE_TIMEOUTS,),
    "timeouts.collective_s": (
        f"{SETTINGS}::test_collective_timeout_is_the_setting_or_past_the_longest_phase",
    ),
}

MEGATRON = ["actor.backend=megatron", "device.devices_per_node=2"]
FROZEN = "the reference model is frozen"
SAME_LAYOUT = "ref.parallel differs from parallel"

# leaf -> (overrides that set a value grpo cannot honour, what the refusal says).
REFUSED: dict[str, tuple[list[str], str]] = {
    "parallel.cp": ([*MEGATRON, "parallel.cp=2"], "context parallelism is not supported"),
    "actor.megatron.bridge": (
        [*MEGATRON, "actor.megatron.bridge=mbridge"],
        "allowed values: 'megatron-bridge'",
    ),
    "actor.megatron.use_dist_checkpointing": (
        [*MEGATRON, "actor.megatron.use_dist_checkpointing=true"],
        "cannot be honoured",
    ),
    **{
        f"ref.parallel.{name}": ([*MEGATRON, f"ref.parallel.{name}={value}"], SAME_LAYOUT)
        for name, value in (
            ("tp", 2),
            ("pp", 2),
            ("ep", 2),
            ("etp", 2),
            ("cp", 2),
            ("vpp", 2),
            ("sequence_parallel", "true"),
        )
    },
    "ref.megatron.bridge": ([*MEGATRON, "ref.megatron.bridge=mbridge"], "allowed values: 'megatron-bridge'"),
    "ref.megatron.use_dist_checkpointing": (
        [*MEGATRON, "ref.megatron.use_dist_checkpointing=true"],
        "cannot be honoured",
    ),
}


def _leaves(cls: type, prefix: str = "") -> list[str]:
    out: list[str] = []
    hints = typing.get_type_hints(cls, vars(schema))
    for f in dataclasses.fields(cls):
        options = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
        section = next((a for a in options if dataclasses.is_dataclass(a)), None)
        out += _leaves(section, f"{prefix}{f.name}.") if section else [prefix + f.name]
    return out


LEAVES = _leaves(schema.TrainerConfig)


@cache
def _tests_in(path: str) -> dict[str, str]:
    """Test function name -> its source, for one test module."""
    source = (ROOT / path).read_text()
    return {
        node.name: ast.get_source_segment(source, node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def test_every_leaf_is_read_or_refused_and_none_is_both() -> None:
    assert len(LEAVES) > 150
    entered = set(READ) | set(REFUSED)
    assert not set(LEAVES) - entered, (
        f"settings with no reader and no refusal: {sorted(set(LEAVES) - entered)}"
    )
    assert not entered - set(LEAVES), (
        f"audit entries for settings the schema lacks: {sorted(entered - set(LEAVES))}"
    )
    assert not set(READ) & set(REFUSED)


@pytest.mark.parametrize("leaf", sorted(READ))
def test_each_read_leaf_names_tests_that_exist_and_use_it(leaf: str) -> None:
    """The named tests exist, and each one (or its module, for table-driven tests) names the
    setting, so a renamed setting or a deleted test shows up here."""
    name = leaf.rsplit(".", 1)[-1]
    for ref in READ[leaf]:
        path, test = ref.split("::")
        tests = _tests_in(path)
        assert test in tests, f"{leaf}: {ref} does not exist"
        module = (ROOT / path).read_text()
        assert name in tests[test] or name in module, f"{leaf}: {ref} never mentions {name!r}"


@pytest.mark.parametrize("leaf", sorted(REFUSED))
def test_each_refused_leaf_is_refused_with_its_reason(leaf: str) -> None:
    overrides, reason = REFUSED[leaf]
    assert any(o.startswith(f"{leaf}=") for o in overrides)
    with pytest.raises(ConfigError) as info:
        load(None, overrides)
    message = str(info.value)
    assert leaf.rsplit(".", 1)[-1] in message and reason in message
