"""The typed configuration tree. Every field has a default; `None` on a `ref.*` field means
"inherit from actor" and is resolved by `grpo_config.load` (see `inherit.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

DeviceName = Literal["auto", "cuda", "npu", "cpu"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
# verl's KL estimator names (`kl` = k1, `mse` = k2, `low_var_kl` = k3; `+`: that value with k2's
# gradient). `full` is verl's name too: accepted here only to be refused with the reason (validate).
KLType = Literal[
    "k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl",
    "k1+", "kl+", "abs+", "k2+", "mse+", "k3+", "low_var_kl+",
    "full",
]


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    kind: DeviceName = "auto"
    nnodes: int = 1
    devices_per_node: int = 1
    expandable_segments: bool = True
    # Memory of one device (GiB) the launch's memory plan must fit in; None: the device's own,
    # read at launch (a dry run without the device then prints the plan without the check).
    memory_gib: float | None = None

    @property
    def world_size(self) -> int:
        """The training ranks: `nnodes` x `devices_per_node`."""
        return self.nnodes * self.devices_per_node


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Model parallel sizes; data parallel is what is left of the world size."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    vpp: int | None = None
    sequence_parallel: bool = False


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"
    image_key: str = "images"  # the column of a row's images (verl's multimodal rows)
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 8
    # Prompts per generation round with algorithm.filter_groups (DAPO's dynamic sampling); None:
    # train_batch_size. Without filter_groups every generated prompt is trained on, so it must be unset.
    gen_batch_size: int | None = None
    val_batch_size: int | None = None
    shuffle: bool = True
    seed: int = 1
    # A prompt longer than max_prompt_length is dropped (and counted) when filter_overlong_prompts,
    # else cut as `truncation` says ("error" stops the run), as verl's keys of the same names.
    filter_overlong_prompts: bool = True
    truncation: Literal["error", "left", "right"] = "error"
    apply_chat_template: bool = True


@dataclass(frozen=True, kw_only=True)
class MegatronConfig:
    """Megatron-Core options passed to the Megatron-Bridge provider."""

    bridge: Literal["megatron-bridge"] = "megatron-bridge"
    use_distributed_optimizer: bool = True
    optimizer_offload_fraction: float = 0.0
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    use_dist_checkpointing: bool = False
    transformer_impl: Literal["transformer_engine", "local"] = "transformer_engine"
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_num_layers: int | None = None
    moe_grouped_gemm: bool = True
    moe_permute_fusion: bool = True
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = "alltoall"
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"] = "aux_loss"
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = "auto"
    apply_rope_fusion: bool = True
    gradient_accumulation_fusion: bool = False
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    # megatron-core `OptimizerConfig` fields set after ours (e.g. overlap_cpu_optimizer_d2h_h2d).
    override_optimizer_config: dict[str, Any] = field(default_factory=dict)


# What only training reads: the optimizer's settings, gradients', the backward pass's. The reference
# model is frozen, so its section (`RefMegatronConfig`) has none of them.
TRAINING_ONLY_MEGATRON = (
    "use_distributed_optimizer",
    "optimizer_offload_fraction",
    "grad_offload",
    "optimizer_offload",
    "override_optimizer_config",
    "recompute_method",
    "recompute_granularity",
    "recompute_num_layers",
    "gradient_accumulation_fusion",
)


@dataclass(frozen=True, kw_only=True)
class RefMegatronConfig:
    """The reference model's Megatron options: the actor's (`MegatronConfig`) less what only training
    reads (`TRAINING_ONLY_MEGATRON`). Unset, every one is the actor's."""

    bridge: Literal["megatron-bridge"] = "megatron-bridge"
    param_offload: bool = False
    use_dist_checkpointing: bool = False
    transformer_impl: Literal["transformer_engine", "local"] = "transformer_engine"
    moe_grouped_gemm: bool = True
    moe_permute_fusion: bool = True
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = "alltoall"
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"] = "aux_loss"
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = "auto"
    apply_rope_fusion: bool = True
    override_transformer_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_actor(cls, actor: MegatronConfig) -> RefMegatronConfig:
        return cls(**{f.name: getattr(actor, f.name) for f in fields(cls)})

    def for_build(self, actor: MegatronConfig) -> MegatronConfig:
        """The options the reference model is built with: the actor's, with this section's values."""
        return replace(actor, **{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True, kw_only=True)
class TorchConfig:
    """The torch backend's offload (verl's `fsdp_config` keys of the same names): the policy's weights
    (with their gradients) and / or its optimizer state leave the device while a colocated rollout
    engine generates and come back after it sleeps, as `actor.megatron`'s offload settings do."""

    param_offload: bool = False
    optimizer_offload: bool = False


@dataclass(frozen=True, kw_only=True)
class RefTorchConfig:
    """The reference model on the torch backend: with `param_offload` (verl's
    `ref.fsdp_config.param_offload`) its weights stay on the CPU except during its log-prob pass."""

    param_offload: bool = False


@dataclass(frozen=True, kw_only=True)
class PolicyLossConfig:
    """verl's `actor.policy_loss`: "vanilla" (PPO, dual clip), "gspo" (sequence-level ratio) or
    "cispo" (clipped, stop-gradient importance weight on every token)."""

    loss_mode: Literal["vanilla", "gspo", "cispo"] = "vanilla"


@dataclass(frozen=True, kw_only=True)
class ActorConfig:
    model_path: str = ""
    trust_remote_code: bool = False  # passed to every transformers / vLLM / bridge load
    backend: Literal["torch", "megatron"] = "torch"
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    lr: float = 1e-6
    lr_warmup_steps: int = 0
    # verl's optim.lr_warmup_steps_ratio: the warmup as a share of the run's training steps
    # (total_training_steps, else epochs x batches), int() as verl rounds; with lr_warmup_steps 0.
    lr_warmup_steps_ratio: float = 0.0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_mini_batch_size: int = 8
    # verl's trainer.balance_batch (its default, true): each mini-batch's rows go to the data-parallel
    # ranks by token count so that they finish together; the update is the same (grpo_trainer.batching).
    balance_batch: bool = True
    ppo_micro_batch_size_per_device: int = 1
    ppo_max_token_len_per_device: int = 16384
    use_dynamic_bsz: bool = False
    ppo_epochs: int = 1
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: LossAggMode = "token-mean"
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    # seq-mean-token-sum-norm (Dr. GRPO) divides by this constant; None: the response budget
    # (data.max_response_length, or rollout.max_tokens when set), as verl's default.
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    # The torch backend computes each row's entropy over 2048 rows of logits at a time (verl's key of
    # the same name): the same values, a smaller peak than the whole [rows, vocabulary] softmax.
    entropy_from_logits_with_chunking: bool = False
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: KLType = "low_var_kl"
    use_remove_padding: bool = False
    log_prob_micro_batch_size_per_device: int = 4
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_device: int = 16384
    gradient_checkpointing: bool = False
    freeze_vision_tower: bool = False  # a vision-language model's vision tower is not trained
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    torch: TorchConfig = field(default_factory=TorchConfig)


@dataclass(frozen=True, kw_only=True)
class RefConfig:
    """Reference policy. Every `None` inherits the actor's value (and `parallel` the root one); `torch`
    is its own (`inherit.OWN`)."""

    model_path: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    use_remove_padding: bool | None = None
    log_prob_micro_batch_size_per_device: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_device: int | None = None
    parallel: ParallelConfig | None = None
    megatron: RefMegatronConfig | None = None
    torch: RefTorchConfig = field(default_factory=RefTorchConfig)  # not inherited, as in verl


@dataclass(frozen=True, kw_only=True)
class MultiTurnConfig:
    """Responses that call tools mid-answer (verl's `rollout.multi_turn`; docs/MULTI_TURN.md): each
    finished turn's tool calls run in a sandbox and their answers, rendered by the chat template, are
    appended before the model goes on; only the sampled tokens are trained on. Turn limits: None or 0,
    none (verl's reading)."""

    enable: bool = False
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None  # tool answers appended
    max_parallel_calls: int = 1  # calls run per turn; later ones are answered "not run"
    max_tool_response_length: int = 256  # characters of one answer
    tool_response_truncate_side: Literal["left", "right", "middle"] = "middle"
    # How the chat template writes a call: Qwen3.5's XML (vLLM's qwen3_coder parser) or hermes JSON
    # (Qwen2.5 / Qwen3, verl's default).
    format: Literal["qwen3_xml", "hermes"] = "qwen3_xml"
    tools: list[str] = field(default_factory=lambda: ["calculator", "python"])  # built in (docs/TOOLS.md)
    function_tool_path: str | None = None  # a Python file: each public function is a tool too
    tool_config_path: str | None = None  # verl's tool YAML: its code tools (docs/TOOLS.md)
    tool_timeout_s: float = 10.0  # wall clock per call
    tool_memory_mb: int = 1024  # address space per call
    tool_network: bool = False  # False: the call gets no network where the OS allows


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "vllm"
    # "sync": the engines live in the training ranks and generation and training take turns on the
    # same devices (verl's hybrid engine). "one_step_off": rollout workers on devices of their own
    # (`nnodes` x `devices_per_node`; CPU: worker processes) generate step t+1's responses with the
    # weights from before step t's update while that update runs (verl's one_step_off_policy recipe);
    # the responses are one update stale, which algorithm.rollout_correction corrects (required).
    mode: Literal["sync", "one_step_off"] = "sync"
    nnodes: int = 1
    devices_per_node: int = 0  # the rollout workers' devices per node; one_step_off only
    dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None -> actor.dtype
    n: int = 5
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None  # None -> data.max_response_length
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    enforce_eager: bool = False
    max_model_len: int | None = None
    max_num_batched_tokens: int = 8192
    free_cache_engine: bool = True
    weight_sync_bucket_mb: int = 512
    # Validation sampling, as verl's val_kwargs: greedy, one response a prompt, unless val_do_sample.
    val_do_sample: bool = False
    val_n: int = 1
    val_temperature: float = 0.0
    val_top_p: float = 1.0
    val_top_k: int = -1
    # Extra `vllm.LLM` keyword arguments (verl's engine_kwargs.vllm), checked against vLLM's EngineArgs.
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)

    @property
    def worker_count(self) -> int:
        """One-step-off's rollout workers: `nnodes` x `devices_per_node`."""
        return self.nnodes * self.devices_per_node


@dataclass(frozen=True, kw_only=True)
class KLControlConfig:
    """The coefficient of the KL penalty in the reward: fixed, or adapted towards `target_kl`
    over `horizon` sequences (verl's `algorithm.kl_ctrl`)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass(frozen=True, kw_only=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's `algorithm.filter_groups`): groups whose `metric` is the same
    for every response are dropped and generation goes on until `data.train_batch_size` prompts
    are kept, at most `max_num_gen_batches` rounds (<= 0: no limit). `metric`: "acc" / "score" the
    reward function's score, "seq_reward" that score after overlong shaping, "seq_final_reward"
    after the KL penalty too."""

    enable: bool = False
    metric: Literal["acc", "score", "seq_reward", "seq_final_reward"] = "acc"
    max_num_gen_batches: int = 0


@dataclass(frozen=True, kw_only=True)
class RolloutCorrectionConfig:
    """Rollout-training mismatch correction (verl's `algorithm.rollout_correction`), between the
    training policy at rollout time (old log-probs) and the rollout engine's log-probs.
    `rollout_is`: truncated importance weights per token or per sequence, capped at
    `rollout_is_threshold`; `rollout_rs`: rejection (masking) options, see `grpo_config.rejection`.
    `bypass_mode` (verl's): the rollout engine's log-probs of the sampled tokens are the old
    policy's, the recomputation is skipped (one forward pass of the policy less per step). The same
    numbers up to float rounding where the engine samples with the training weights at the training
    precision (the colocated `hf` engine in float32); otherwise the PPO ratio, and the KL in the
    reward (`use_kl_in_reward`, which reads the old log-probs), also hold the engine's mismatch,
    which nothing then corrects or logs (`rollout/logprob_abs_diff` and `rollout_corr/*` are not
    logged: they would compare a tensor with itself)."""

    rollout_is: Literal["token", "sequence"] | None = None
    # A number: truncated IS, weights capped there. "lower_upper" (e.g. "0.5_2.0"): IcePop, weights
    # outside the band set to 0 (rollout_corr/rollout_is_oob_ratio: the share of tokens outside it).
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    adv_estimator: Literal["grpo", "rloo"] = "grpo"
    norm_adv_by_std: bool = True
    adv_eps: float = 1e-6
    use_kl_in_reward: bool = False
    kl_penalty: KLType = "kl"  # the estimator of the KL in the reward
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    # DAPO's overlong filtering: responses cut at the length budget are left out of the loss (their
    # reward still counts in their group's statistics).
    overlong_filter: bool = False


@dataclass(frozen=True, kw_only=True)
class OverlongBufferConfig:
    """DAPO's overlong reward shaping (verl's `reward_model.overlong_buffer`): a response longer than
    `budget - len` tokens loses `(length - (budget - len)) / len * penalty_factor`, up to
    `penalty_factor` at the budget. `log`: log the penalty's mean and the share penalised.
    `max_response_length`: the budget the penalty counts from (verl's DAPO reward manager's
    `max_resp_len`); None: the response budget (rollout.max_tokens, else data.max_response_length)."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 0.0
    log: bool = False
    max_response_length: int | None = None


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    # "package.module:function" or "path/to/file.py[:function]" (verl's custom_reward_function.path),
    # loaded only when set explicitly; custom_fn_name: the function of a file given without one
    # (verl's custom_reward_function.name).
    custom_fn: str | None = None
    custom_fn_name: str = "compute_score"
    timeout_s: float = 60.0  # the budget of one batch's scoring (all its rows, num_workers at a time)
    num_workers: int = 1
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # How the built-in rewards grade answers: "verl" as verl's default_compute_score per data source
    # (mathruler for geo3k, verl's gsm8k / MATH / DAPO rules); "lenient" grpo's broader matching
    # (numeric closeness, math-verify when installed). verl has no such setting. Not read with custom_fn.
    grader: Literal["verl", "lenient"] = "verl"


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    dir: str = "checkpoints"
    save_freq: int = -1  # -1: only at the end
    max_to_keep: int | None = None
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    resume: str = "auto"  # auto | none | a checkpoint path
    strict: bool = True
    export_hf: bool = False


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    dir: str = "runs"
    console: bool = True
    jsonl: bool = True
    tensorboard: bool = True
    plot: bool = True
    # Weights & Biases (verl's trainer.logger 'wandb'): project_name / experiment_name, every step's
    # metrics; WANDB_MODE / WANDB_API_KEY etc. from the environment. Needs the wandb package.
    wandb: bool = False
    # Validation samples (prompt, response, score) logged per validation, as verl's
    # trainer.log_val_generations picks them: val_generations.jsonl, TensorBoard text, a wandb table.
    val_generations: int = 0
    level: Literal["debug", "info", "warning", "error"] = "info"


@dataclass(frozen=True, kw_only=True)
class TimeoutsConfig:
    """How long the driver waits, in seconds, for every rank to answer one call of a worker phase.
    Past it, the ranks that gave no answer are named with their Python stacks and the run stops."""

    setup_s: float = 1800.0  # model build + rollout engine start
    generate_s: float = 1800.0  # rollout generation, also validation
    log_probs_s: float = 900.0  # old and reference log-probs
    update_s: float = 1800.0  # the policy update of one step
    weight_sync_s: float = 600.0  # policy -> rollout engine weights after an update
    # rollout engine wake (with the weight sync first when it slept without one) and sleep, with the
    # policy's offload / onload around them
    wake_sleep_s: float = 600.0
    checkpoint_s: float = 1800.0  # save, load, HF export
    # torch.distributed collectives (verl's nccl_timeout); None -> the longest phase + 60 s, >= 600 s.
    collective_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    project_name: str = "grpo"
    experiment_name: str = "default"
    seed: int = 42
    total_epochs: int = 1
    total_training_steps: int | None = None
    test_freq: int = -1
    val_before_train: bool = False
    # Stop (exit 2) after this many steps in a row whose advantages are all zero (every group's
    # rewards equal: nothing is learned); 0 never stops. verl: trainer.max_zero_advantage_steps.
    max_zero_advantage_steps: int = 10
    device: DeviceConfig = field(default_factory=DeviceConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)

    @property
    def uses_reference_model(self) -> bool:
        """A frozen reference policy is built for the KL loss or the KL penalty in the reward."""
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward
