"""Values grpo cannot use are refused by `load`, before anything heavy starts, with the key, the value
and what it must be; values grpo cannot honour yet, and settings the chosen backend or engine would
not read, are refused with the reason."""

from __future__ import annotations

import pytest

from grpo_config import ConfigError, load

MEGATRON = ["actor.backend=megatron"]

OUT_OF_RANGE = [
    (["actor.lr=-1"], "actor.lr=-1.0 is out of range: it must be a positive learning rate"),
    (["actor.lr=0"], "actor.lr=0.0 is out of range"),
    (["actor.lr_warmup_steps=-1"], "actor.lr_warmup_steps=-1 is out of range: it must be >= 0"),
    (["actor.weight_decay=-0.1"], "actor.weight_decay=-0.1 is out of range"),
    (["actor.grad_clip=0"], "actor.grad_clip=0.0 is out of range: it must be a positive gradient-norm bound"),
    (["actor.ppo_epochs=0"], "actor.ppo_epochs=0 is out of range"),
    (["actor.ppo_max_token_len_per_device=0"], "actor.ppo_max_token_len_per_device=0 is out of range"),
    (
        ["actor.log_prob_max_token_len_per_device=0"],
        "actor.log_prob_max_token_len_per_device=0 is out of range",
    ),
    (["actor.clip_ratio_low=-0.2"], "actor.clip_ratio_low=-0.2 is out of range: it must be >= 0"),
    (["actor.clip_ratio_high=-1"], "actor.clip_ratio_high=-1.0 is out of range"),
    (["actor.clip_ratio_c=1"], "actor.clip_ratio_c=1.0 is out of range: it must be greater than 1"),
    (["actor.kl_loss_coef=-0.01"], "actor.kl_loss_coef=-0.01 is out of range: it must be >= 0"),
    (["actor.lr=nan"], "actor.lr=nan is out of range"),
    (
        [*MEGATRON, "actor.megatron.optimizer_offload_fraction=1.5"],
        "optimizer_offload_fraction=1.5 is out of range",
    ),
    ([*MEGATRON, "actor.megatron.moe_aux_loss_coeff=-1"], "moe_aux_loss_coeff=-1.0 is out of range"),
    (["data.max_prompt_length=0"], "data.max_prompt_length=0 is out of range"),
    (["data.max_response_length=0"], "data.max_response_length=0 is out of range"),
    (["rollout.temperature=-1"], "rollout.temperature=-1.0 is out of range: it must be >= 0 (0 is greedy)"),
    (["rollout.val_temperature=-0.5"], "rollout.val_temperature=-0.5 is out of range"),
    (["rollout.top_p=0"], "rollout.top_p=0.0 is out of range: it must be in (0, 1]"),
    (["rollout.top_p=1.1"], "rollout.top_p=1.1 is out of range"),
    (["rollout.top_k=0"], "rollout.top_k=0 is out of range: it must be -1 (off) or >= 1"),
    (["rollout.max_tokens=0"], "rollout.max_tokens=0 is out of range"),
    (
        ["rollout.gpu_memory_utilization=0"],
        "rollout.gpu_memory_utilization=0.0 is out of range: it must be in (0, 1]",
    ),
    (["rollout.gpu_memory_utilization=1.2"], "rollout.gpu_memory_utilization=1.2 is out of range"),
    (["rollout.val_n=0"], "rollout.val_n=0 is out of range"),
    (["algorithm.adv_eps=0"], "algorithm.adv_eps=0.0 is out of range"),
    (["reward.timeout_s=0"], "reward.timeout_s=0.0 is out of range"),
    (["reward.num_workers=0"], "reward.num_workers=0 is out of range"),
    (
        ["checkpoint.save_freq=0"],
        "checkpoint.save_freq=0 is out of range: it must be -1 (only at the end) or >= 1",
    ),
    (["checkpoint.max_to_keep=0"], "checkpoint.max_to_keep=0 is out of range: it must be >= 1 or null"),
    (
        ["actor.use_kl_loss=false", "ref.log_prob_micro_batch_size_per_device=0"],
        "ref.log_prob_micro_batch_size_per_device=0 must be a positive integer",
    ),
    (["test_freq=0"], "test_freq=0 is out of range"),
    (["total_epochs=0"], "total_epochs=0 is out of range"),
    (["total_training_steps=0"], "total_training_steps=0 is out of range"),
    (["timeouts.collective_s=-5"], "timeouts.collective_s=-5.0 is out of range"),
    (["timeouts.update_s=0"], "timeouts.update_s=0.0 must be a positive, finite number of seconds"),
    (
        ["rollout.n=1"],
        "rollout.n=1 with algorithm.adv_estimator=grpo: the advantage is a response's reward",
    ),
    (["experiment_name=../x"], "experiment_name='../x' names a folder"),
]

CANNOT_HONOUR = [
    (
        [*MEGATRON, "actor.use_remove_padding=true"],
        "actor.use_remove_padding=True cannot be honoured on the Megatron backend yet",
    ),
    (
        [*MEGATRON, "ref.use_remove_padding=true"],
        "ref.use_remove_padding=True cannot be honoured on the Megatron backend yet",
    ),
    (
        [*MEGATRON, "actor.megatron.use_dist_checkpointing=true"],
        "use_dist_checkpointing=True cannot be honoured",
    ),
    (
        ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full"],
        "algorithm.kl_penalty=full cannot be honoured: the full KL needs",
    ),
    (
        ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=k3+"],
        "algorithm.kl_penalty=k3+: a '+' estimator differs from its base only in the gradient",
    ),
    (
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
        "bypass_mode=true with rollout_is / rollout_rs is not implemented",
    ),
    (
        [
            "algorithm.rollout_correction.bypass_mode=true",
            "actor.use_kl_loss=false",
            "actor.log_prob_micro_batch_size_per_device=2",
        ],
        "actor.log_prob_micro_batch_size_per_device=2: read by the policy's log-prob pass, which bypass_mode=true skips",
    ),
    (
        [
            "algorithm.rollout_correction.bypass_mode=true",
            "rollout.engine=vllm",
            'rollout.engine_kwargs={"logprobs_mode": "processed_logprobs"}',
        ],
        "bypass_mode=true with rollout.engine_kwargs.logprobs_mode=processed_logprobs: those log-probs",
    ),
    (
        [
            "algorithm.rollout_correction.rollout_rs=token_k4",
            "algorithm.rollout_correction.rollout_rs_threshold=2",
        ],
        "unknown rollout_rs option(s) ['token_k4']",
    ),
    (
        ["algorithm.rollout_correction.rollout_rs=token_k1"],
        "rollout_rs_threshold must be given when rollout_rs is set",
    ),
    (
        [
            "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
            "algorithm.rollout_correction.rollout_rs_threshold=0.5_2",
        ],
        "seq_mean_k3 takes one upper threshold",
    ),
    (
        [
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=seq_final_reward",
            "algorithm.use_kl_in_reward=true",
        ],
        "groups are filtered before the log-prob passes",
    ),
    (
        ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4096"],
        "reward.overlong_buffer.len=4096 must be between 1 and the response budget 512",
    ),
    (
        ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=64", "reward.overlong_buffer.max_response_length=32"],
        "reward.overlong_buffer.len=64 must be between 1 and reward.overlong_buffer.max_response_length=32",
    ),
    (["actor.clip_ratio_low=10"], "actor.clip_ratio_low=10.0 makes the ratio's lower clip bound"),
    (
        ["actor_rollout_ref.actor.tis_imp_ratio_cap=2"],
        "verl's legacy token-level TIS key; set algorithm.rollout_correction.rollout_is=token",
    ),
    (
        ["algorithm.adv_estimator=gae"],
        "'algorithm.adv_estimator' has value 'gae', which is not allowed; allowed values: 'grpo'",
    ),
    (
        [*MEGATRON, "parallel.cp=2", "device.devices_per_node=2"],
        "parallel.cp=2: context parallelism is not supported",
    ),
    (
        [*MEGATRON, "actor.gradient_checkpointing=true"],
        "actor.gradient_checkpointing=true with the Megatron backend",
    ),
    ([*MEGATRON, "ref.dtype=float32"], "ref.dtype=float32 differs from actor.dtype=bfloat16"),
    (
        [*MEGATRON, "ref.megatron.optimizer_offload=true"],
        "ref.megatron.optimizer_offload=True: the reference model is frozen",
    ),
    (
        [*MEGATRON, "actor.megatron.recompute_method=block", "actor.megatron.recompute_num_layers=3"],
        "actor.megatron.recompute_method=block, actor.megatron.recompute_num_layers=3 without "
        "actor.megatron.recompute_granularity recomputes nothing",
    ),
    (
        [*MEGATRON, "ref.megatron.gradient_accumulation_fusion=true"],
        "ref.megatron.gradient_accumulation_fusion=True: the reference model is frozen",
    ),
    (
        [*MEGATRON, "actor.megatron.override_optimizer_config={lr: 1.0}"],
        "override_optimizer_config.lr is set by grpo from actor.lr",
    ),
    (
        [*MEGATRON, "actor.megatron.override_transformer_config={moe_aux_loss_coeff: 0.1}"],
        "set actor.megatron.moe_aux_loss_coeff instead",
    ),
    (
        ["rollout.engine_kwargs={max_model_len: 64}"],
        "rollout.engine_kwargs.max_model_len is set by grpo from rollout.max_model_len",
    ),
    (["rollout.engine=hf", "rollout.engine_kwargs={swap_space: 1}"], "rollout.engine=hf takes none"),
    (
        ["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[search]"],
        "rollout.multi_turn.tools has 'search', which is not a built-in tool; the built-in tools are calculator, python",
    ),
    (["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[]"], "rollout.multi_turn.enable=true with no tools"),
    (
        ["rollout.multi_turn.enable=true", "data.apply_chat_template=false"],
        "rollout.multi_turn.enable=true with data.apply_chat_template=false",
    ),
    (
        ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_user_turns=-1"],
        "rollout.multi_turn.max_user_turns=-1 is out of range",
    ),
    (
        ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_parallel_calls=0"],
        "rollout.multi_turn.max_parallel_calls=0 is out of range",
    ),
    (
        ["actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml"],
        "verl's interactions (a simulated user answering each turn) are not in grpo",
    ),
    (
        ["actor_rollout_ref.rollout.multi_turn.max_turns=3"],
        "'actor_rollout_ref.rollout.multi_turn.max_turns=3' is not a multi_turn key grpo knows",
    ),
]

UNREAD = [
    (
        ["parallel.tp=2", "device.devices_per_node=2"],
        "parallel.tp=2: read by the Megatron backend only, and actor.backend=torch",
    ),
    (
        ["actor.megatron.param_offload=true"],
        "actor.megatron.param_offload=True: read by the Megatron backend only",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "message"), OUT_OF_RANGE + CANNOT_HONOUR + UNREAD, ids=lambda v: str(v)[:60]
)
def test_bad_values_are_refused_with_the_key_the_value_and_the_range(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(None, overrides)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "rollout.temperature=0.01",
            "rollout.top_p=1",
            "rollout.top_k=-1",
            "checkpoint.save_freq=-1",
            "test_freq=-1",
        ],
        ["rollout.n=2", "actor.clip_ratio_low=0", "actor.kl_loss_coef=0", "checkpoint.max_to_keep=1"],
        [*MEGATRON, "ref.megatron.param_offload=true", "ref.parallel.tp=1"],  # the ref's own, or the actor's
    ],
)
def test_the_edges_of_each_range_are_accepted(overrides: list[str]) -> None:
    load(None, overrides)
