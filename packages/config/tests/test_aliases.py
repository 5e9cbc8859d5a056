"""verl-style keys from our users' seed scripts map onto grpo_config fields."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from grpo_config import ConfigError, load, to_dict
from grpo_config.aliases import ALIASES, resolve_alias
from grpo_config.build import schema_keys

SEED_35B_NPU = [
    "actor_rollout_ref.actor.strategy=megatron",
    "algorithm.adv_estimator=grpo",
    "algorithm.norm_adv_by_std_in_grpo=False",
    "data.train_batch_size=32",
    "data.max_prompt_length=1024",
    "actor_rollout_ref.model.path=/models/Qwen3.5-35B-A3B",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "actor_rollout_ref.actor.checkpoint.strict=False",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
    "actor_rollout_ref.actor.megatron.context_parallel_size=1",
    "actor_rollout_ref.actor.megatron.param_offload=True",
    "actor_rollout_ref.actor.megatron.vanilla_mbridge=False",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size=8",
    "actor_rollout_ref.ref.megatron.param_offload=True",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=16",
    "trainer.device=npu",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
    "trainer.project_name=qwen35",
    "trainer.experiment_name=35b_npu",
]


def test_seed_style_overrides_map_to_our_fields() -> None:
    with capture_logs() as logs:
        cfg = load(None, SEED_35B_NPU, num_experts=256)
    assert cfg.algorithm.norm_adv_by_std is False
    assert cfg.actor.model_path == "/models/Qwen3.5-35B-A3B" and cfg.ref.model_path == cfg.actor.model_path
    assert (cfg.actor.lr, cfg.actor.ppo_mini_batch_size, cfg.actor.ppo_micro_batch_size_per_device) == (
        1e-6,
        16,
        1,
    )
    assert (cfg.actor.kl_loss_coef, cfg.actor.clip_ratio_high, cfg.actor.clip_ratio_c) == (0.01, 0.28, 10.0)
    assert cfg.actor.loss_agg_mode == "seq-mean-token-mean" and cfg.actor.entropy_coeff == 0.0
    assert cfg.checkpoint.strict is False
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.ep, cfg.parallel.etp, cfg.parallel.cp) == (
        2,
        2,
        8,
        1,
        1,
    )
    assert cfg.actor.megatron.param_offload is True
    assert cfg.actor.megatron.override_transformer_config == {"moe_router_dtype": "fp32"}
    assert cfg.ref.parallel == cfg.parallel
    assert cfg.ref.megatron is not None and cfg.ref.megatron.param_offload is True
    assert (cfg.rollout.engine, cfg.rollout.n, cfg.rollout.tensor_parallel_size) == ("vllm", 8, 8)
    assert cfg.rollout.gpu_memory_utilization == 0.7
    assert (cfg.device.nnodes, cfg.device.devices_per_node, cfg.device.kind) == (1, 16, "npu")
    assert (cfg.checkpoint.save_freq, cfg.test_freq, cfg.total_epochs) == (20, 5, 15)
    assert (cfg.project_name, cfg.experiment_name) == ("qwen35", "35b_npu")
    assert [e["key"] for e in logs if e["event"] == "config.deprecated_key"] == [
        "actor_rollout_ref.actor.megatron.vanilla_mbridge"
    ]


def test_verl_style_nested_yaml_is_accepted() -> None:
    nested = {
        "actor_rollout_ref": {
            "actor": {
                "strategy": "megatron",
                "megatron": {"virtual_pipeline_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
            },
            "rollout": {"val_kwargs": {"n": 4, "temperature": 0.6}},
        },
        "trainer": {"n_gpus_per_node": 2},
        "actor": {"checkpoint": {"strict": False}},
    }
    cfg = load(nested)
    assert (cfg.parallel.pp, cfg.parallel.vpp) == (2, 2)
    assert (cfg.rollout.val_n, cfg.rollout.val_temperature) == (4, 0.6)
    sampled = load(
        None,
        [
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
            "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
            "actor_rollout_ref.rollout.val_kwargs.top_k=20",
        ],
    )
    assert (sampled.rollout.val_do_sample, sampled.rollout.val_top_p, sampled.rollout.val_top_k) == (True, 0.7, 20)
    assert cfg.checkpoint.strict is False and cfg.device.devices_per_node == 2


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.actor.megatron.use_mbridge=True",
        "actor_rollout_ref.ref.megatron.vanilla_mbridge=false",
        "actor_rollout_ref.actor.megatron.vanilla_mbridge=True",
    ],
)
def test_megatron_bridge_choice_accepted_with_deprecation_warning(override: str) -> None:
    """verl's bridge choices load and set nothing: grpo converts through Megatron-Bridge, which
    builds the same model from the same HF weights as mbridge (verl's vanilla_mbridge=True)."""
    with capture_logs() as logs:
        cfg = load(None, [override])
    assert cfg == load()  # no effect on the config
    (entry,) = logs
    assert entry["log_level"] == "warning" and entry["event"] == "config.deprecated_key"
    assert "Megatron-Bridge" in entry["note"]


def test_verl_s_bridge_less_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="without a bridge") as info:
        load(None, ["actor_rollout_ref.actor.megatron.use_mbridge=false"])
    assert "Megatron-Bridge" in str(info.value) and "Remove the key" in str(info.value)


def test_model_engine_megatron_is_the_megatron_backend() -> None:
    assert load(None, ["model_engine=megatron"]).actor.backend == "megatron"
    with pytest.raises(ConfigError, match="verl's 'veomni' engine has no counterpart"):
        load(None, ["model_engine=veomni"])


def test_bridge_key_value_is_type_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"'actor_rollout_ref\.actor\.megatron\.vanilla_mbridge' has value 'nope'"
    ):
        load(None, ["actor_rollout_ref.actor.megatron.vanilla_mbridge=nope"])


def test_every_alias_target_is_a_schema_key() -> None:
    keys = set(schema_keys())
    # A target may also be one entry of a mapping-valued setting (rollout.engine_kwargs.<vLLM arg>).
    bad = [
        f"{alias} -> {target}"
        for alias, target in ALIASES.items()
        if target not in keys and target.rsplit(".", 1)[0] not in keys
    ]
    assert bad == []
    assert all(alias not in keys for alias in ALIASES), "an alias must not shadow one of our keys"


def test_prefix_alias_carries_the_rest_of_the_key() -> None:
    assert resolve_alias("actor_rollout_ref.ref.megatron.override_transformer_config.x") == (
        "ref.megatron.override_transformer_config.x"
    )
    assert resolve_alias("actor.lr") is None
    cfg = load(None, ["actor.backend=megatron", "actor_rollout_ref.ref.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=2"])
    assert to_dict(cfg)["ref"]["megatron"]["override_transformer_config"] == {"num_layers_in_first_pipeline_stage": 2}
    assert cfg.actor.megatron.override_transformer_config == {}


def test_an_override_of_a_grpo_megatron_setting_sets_that_setting() -> None:
    """verl passes recompute and MoE options as override_transformer_config entries; grpo has them as
    settings of their own, so the entry lands on the setting (one place for one value)."""
    cfg = load(None, ["actor.backend=megatron",
            "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
            "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
            "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=2",
            "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.01",
            "actor_rollout_ref.ref.megatron.override_transformer_config.moe_z_loss_coeff=0.001",
        ],
    )
    assert cfg.actor.megatron.recompute_num_layers == 2
    assert cfg.actor.megatron.moe_aux_loss_coeff == 0.01
    assert cfg.actor.megatron.override_transformer_config == {}
    assert cfg.ref.megatron.moe_z_loss_coeff == 0.001
    assert cfg.ref.megatron.moe_aux_loss_coeff == 0.01  # the rest inherited from the actor
    assert cfg.ref.megatron.for_build(cfg.actor.megatron).recompute_num_layers == 2
    with pytest.raises(ConfigError, match=r"set actor\.megatron\.recompute_method instead"):
        load(None, ["actor.backend=megatron", "actor.megatron.override_transformer_config={recompute_method: uniform}"])


def test_verl_resume_mode_and_engine_switches_map() -> None:
    assert load(None, ["trainer.resume_mode=auto"]).checkpoint.resume == "auto"
    assert load(None, ["trainer.resume_mode=disable"]).checkpoint.resume == "none"
    by_path = load(None, ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/global_step_5"])
    assert by_path.checkpoint.resume == "/ckpt/global_step_5"
    with pytest.raises(ConfigError, match="resume modes are auto, disable and resume_path"):
        load(None, ["trainer.resume_mode=sometimes"])
    engine = load(
        None,
        [
            "rollout.engine=vllm",
            "actor_rollout_ref.rollout.enable_chunked_prefill=True",
            "actor_rollout_ref.rollout.enable_prefix_caching=False",
            "actor_rollout_ref.rollout.max_num_seqs=256",
            "actor_rollout_ref.rollout.disable_log_stats=False",
        ],
    )
    assert engine.rollout.engine_kwargs == {
        "enable_chunked_prefill": True, "enable_prefix_caching": False, "max_num_seqs": 256, "disable_log_stats": False,
    }


def test_verl_logging_and_reward_manager_keys_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """(wandb is the trainer's optional stack, not grpo-config's: its presence is stood in for here;
    tests/test_tiny_train.py runs the real one.)"""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "wandb" else find_spec(name, *a))
    cfg = load(
        None,
        [
            'trainer.logger=["console","wandb"]',
            "trainer.log_val_generations=10",
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=64",
            "+reward_model.reward_kwargs.max_resp_len=256",
            "++actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
        ],
    )
    assert (cfg.logging.console, cfg.logging.tensorboard, cfg.logging.wandb) == (True, False, True)
    assert cfg.logging.val_generations == 10
    assert cfg.reward.overlong_buffer.max_response_length == 256 and cfg.reward.overlong_buffer.len == 64
    assert cfg.actor.entropy_from_logits_with_chunking is True
    with pytest.raises(ConfigError, match="'mlflow', which grpo does not log to"):
        load(None, ["trainer.logger=[console,mlflow]"])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ConfigError, match="needs the wandb package, which is not installed here"):
        load(None, ['trainer.logger=["console","wandb"]'])


def test_verl_s_newer_reward_section_and_custom_reward_function_map() -> None:
    """verl's `reward.` layout (its reward_model section split up) sets what the old keys set, and
    custom_reward_function's file and function name set reward.custom_fn / custom_fn_name."""
    cfg = load(
        None,
        [
            "reward.reward_manager.name=dapo",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward.reward_kwargs.overlong_buffer_cfg.len=64",
            "+reward.reward_kwargs.max_resp_len=256",
            "custom_reward_function.path=recipe/retool/retool.py",
            "custom_reward_function.name=compute_score_em",
        ],
    )
    buffer = cfg.reward.overlong_buffer
    assert (buffer.enable, buffer.len, buffer.max_response_length) == (True, 64, 256)
    assert (cfg.reward.custom_fn, cfg.reward.custom_fn_name) == ("recipe/retool/retool.py", "compute_score_em")
    assert load(None, ["reward.custom_reward_function.path=r.py"]).reward.custom_fn == "r.py"
    with pytest.raises(ConfigError, match="only 'naive' or 'dapo' is accepted"):
        load(None, ["reward.reward_manager.name=prime"])
    with pytest.raises(ConfigError, match=r"names a function of reward\.custom_fn, which is not set"):
        load(None, ["custom_reward_function.name=compute_score_em"])
    with pytest.raises(ConfigError, match="names its function already"):
        load(None, ["reward.custom_fn=pkg.mod:fn", "custom_reward_function.name=other"])


@pytest.mark.parametrize(
    ("override", "refused_because"),
    [
        ("critic.optim.lr=1e-5", "GRPO trains no critic"),
        ("+distillation.distillation_loss.topk=64", "distillation"),
        ("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16", "grpo's torch backend trains with DDP"),
        ("actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params=0", "grpo's torch backend trains with DDP"),
        ("global_profiler.tool=nsys", "grpo has no profiler setting"),
        ("+retriever.url=http://127.0.0.1:8000/retrieve", "multi-turn rollouts"),
        ("hydra.run.dir=outputs", "grpo does not run under Hydra"),
    ],
)
def test_verl_sections_grpo_has_not_are_refused_with_their_reason(override: str, refused_because: str) -> None:
    """Every key under such a section is refused with what the section is and why grpo has none,
    not as an unknown key; an inert value of a listed key under it still passes."""
    with pytest.raises(ConfigError, match=refused_because) as info:
        load(None, [override])
    assert "Unknown config key" not in str(info.value)
    assert load(None, ["actor_rollout_ref.actor.fsdp_config.forward_prefetch=False"]) == load(None, [])


@pytest.mark.parametrize(
    ("override", "refused_because"),
    [
        ("reward_model.reward_manager=prime", "only 'naive' or 'dapo' is accepted"),
        ("actor_rollout_ref.actor.fsdp_config.grad_offload=sometimes", "only True or False is accepted"),
        ("actor_rollout_ref.actor.fsdp_config.fsdp_size=8", "stands in for verl's FSDP with DDP"),
        ("actor_rollout_ref.ref.use_torch_compile=sometimes", "only True or False is accepted"),
        ("actor_rollout_ref.actor.optim.lr_decay_style=cosine", "constant after actor.lr_warmup_steps"),
        ("actor_rollout_ref.model.use_fused_kernels=True", "without its fused kernels"),
        ("actor_rollout_ref.rollout.mode=agent", "only 'sync' or 'async' is accepted"),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "constant after actor.lr_warmup_steps"),
        ("trainer.val_only=True", "only validates is not in grpo"),
        ("actor_rollout_ref.rollout.ignore_eos=True", "stop a response at the end-of-sequence token"),
        ("actor_rollout_ref.rollout.load_format=dummy", "only 'auto' or 'safetensors' is accepted"),
        ("data.train_data_num=1000", "reads every row of data.train_files"),
        ("data.val_data_num=64", "reads every row of data.train_files / data.val_files"),
        ("actor_rollout_ref.model.override_config.attention_dropout=0.1", "only 0.0 or 0 is accepted"),
        ("actor_rollout_ref.model.override_config.resid_pdrop=0.1", "have no dropout"),
    ],
)
def test_verl_keys_that_restate_grpo_are_dropped_and_others_refused(override: str, refused_because: str) -> None:
    """A verl key with no grpo setting loads when its value restates what grpo does (it sets
    nothing, and is logged as ignored with the reason); any other value is refused with it."""
    key, _, _ = override.partition("=")
    accepted = {
        "reward_model.reward_manager": "naive",
        "actor_rollout_ref.actor.fsdp_config.grad_offload": "True",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size": "-1",
        "actor_rollout_ref.ref.use_torch_compile": "True",
        "actor_rollout_ref.actor.optim.lr_decay_style": "constant",
        "actor_rollout_ref.model.use_fused_kernels": "False",
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
        "trainer.val_only": "false",
        "actor_rollout_ref.rollout.ignore_eos": "False",
        "actor_rollout_ref.rollout.load_format": "safetensors",
        "data.train_data_num": "null",
        "data.val_data_num": "null",
        "actor_rollout_ref.model.override_config.attention_dropout": "0.",
        "actor_rollout_ref.model.override_config.resid_pdrop": "0",
    }[key]
    with capture_logs() as logs:
        assert load(None, [f"{key}={accepted}"]) == load(None, [])
    assert [entry["key"] for entry in logs if entry["event"] == "config.verl_key_ignored"] == [key]
    with pytest.raises(ConfigError, match=refused_because):
        load(None, [override])


def test_verl_keys_that_change_only_speed_are_dropped_whatever_their_value() -> None:
    with capture_logs() as logs:
        cfg = load(
            None,
            [
                "data.filter_overlong_prompts_workers=64",
                "ray_kwargs.ray_init.runtime_env.py_executable=uv -v run --frozen --extra vllm",
                "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
                "trainer.use_legacy_worker_impl=disable",
                "algorithm.gamma=0.99",  # read by verl's gae and reinforce_plus_plus only
                "algorithm.lam=0.95",
            ],
        )
    assert cfg == load(None, [])
    assert {entry["key"] for entry in logs if entry["event"] == "config.verl_key_ignored"} == {
        "data.filter_overlong_prompts_workers",
        "ray_kwargs.ray_init.runtime_env.py_executable",
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch",
        "trainer.use_legacy_worker_impl",
        "algorithm.gamma",
        "algorithm.lam",
    }


def test_verls_former_shuffle_key_sets_data_shuffle() -> None:
    assert load(None, ["data.shuffle_train_dataloader=False"]).data.shuffle is False
    assert load(None, ["data.shuffle_train_dataloader=True"]).data.shuffle is True


def test_verls_fsdp_offload_keys_set_the_torch_backends_offload() -> None:
    """verl's FSDP engine offload keys are the torch backend's (`actor.torch`, `ref.torch`)."""
    cfg = load(
        None,
        [
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
            "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        ],
    )
    assert cfg.actor.backend == "torch"
    assert (cfg.actor.torch.param_offload, cfg.actor.torch.optimizer_offload, cfg.ref.torch.param_offload) == (
        True,
        True,
        True,
    )


@pytest.mark.parametrize(
    ("strategy", "backend"),
    [("fsdp", "torch"), ("fsdp2", "torch"), ("megatron", "megatron")],
)
def test_verls_strategy_picks_grpos_backend(strategy: str, backend: str) -> None:
    """verl's FSDP (either generation) trains on the torch backend (DDP: said in the log), its
    Megatron engine on the Megatron one; the reference's strategy sets nothing (one backend
    builds both)."""
    with capture_logs() as logs:
        cfg = load(None, [f"actor_rollout_ref.actor.strategy={strategy}", f"actor_rollout_ref.ref.strategy={strategy}"])
    assert cfg.actor.backend == backend
    assert any(e["event"] == "config.verl_fsdp_as_ddp" for e in logs) == (backend == "torch")


def test_verls_other_engines_are_refused() -> None:
    with pytest.raises(ConfigError, match="'fsdp_turbo' engine has no counterpart in grpo"):
        load(None, ["actor_rollout_ref.actor.strategy=fsdp_turbo"])
    with pytest.raises(ConfigError, match="only 'fsdp' or 'fsdp2' or 'megatron' is accepted"):
        load(None, ["actor_rollout_ref.ref.strategy=veomni"])


@pytest.mark.parametrize(
    ("overrides", "refused_because"),
    [
        (["actor.backend=megatron", "actor.torch.param_offload=true"], "read by the torch backend only"),
        (["actor.backend=megatron", "ref.torch.param_offload=true"], "read by the torch backend only"),
        (["rollout.engine=hf", "actor.torch.param_offload=true"], "the hf engine generates with the policy's own"),
        (
            ["rollout.mode=one_step_off", "actor.torch.optimizer_offload=true", "rollout.free_cache_engine=false",
             "algorithm.rollout_correction.rollout_is=token", "rollout.devices_per_node=1"],
            "actor.torch.optimizer_offload=true: offload frees the training devices",
        ),
    ],
)
def test_torch_offload_is_refused_where_nothing_reads_or_uses_it(overrides: list[str], refused_because: str) -> None:
    with pytest.raises(ConfigError, match=refused_because):
        load(None, overrides)
    # the hf engine with the optimizer state offloaded, and a parked reference, load
    load(None, ["rollout.engine=hf", "actor.torch.optimizer_offload=true", "ref.torch.param_offload=true"])


def test_verls_warmup_ratio_maps_and_cannot_be_given_beside_the_steps() -> None:
    """verl takes lr_warmup_steps over the ratio when both are set; grpo asks for one."""
    cfg = load(None, ["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"])
    assert (cfg.actor.lr_warmup_steps_ratio, cfg.actor.lr_warmup_steps) == (0.1, 0)
    with pytest.raises(ConfigError, match="keep one of them"):
        load(None, ["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1", "actor.lr_warmup_steps=10"])
    with pytest.raises(ConfigError, match=r"in \[0, 1\]"):
        load(None, ["actor.lr_warmup_steps_ratio=1.5"])
