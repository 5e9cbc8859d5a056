"""Cross-field checks: batch divisibility, parallel sizes against the world size and experts."""

from __future__ import annotations

import pytest

from grpo_config import ConfigError, load, validate


def _problems(overrides: list[str], **kwargs: int) -> str:
    with pytest.raises(ConfigError) as info:
        load(None, overrides, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_train_batch_must_be_multiple_of_mini_batch() -> None:
    msg = _problems(["data.train_batch_size=10", "actor.ppo_mini_batch_size=4"])
    assert msg == (
        "Invalid config, 1 problem: (1) data.train_batch_size=10 is not divisible by "
        "actor.ppo_mini_batch_size=4: make data.train_batch_size a multiple of 4 or "
        "actor.ppo_mini_batch_size a divisor of 10."
    )


def test_mini_batch_sequences_must_split_over_micro_batch_times_dp() -> None:
    # world 8, tp 2 -> dp 4; 2 prompts * n 3 = 6 sequences, not a multiple of micro 1 * dp 4.
    base = [
        "device.devices_per_node=8",
        "parallel.tp=2",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=2",
    ]
    msg = _problems(["actor.backend=megatron", *base, "rollout.n=3"])
    assert "actor.ppo_mini_batch_size * rollout.n = 2*3 = 6 sequences" in msg
    assert "actor.ppo_micro_batch_size_per_device * data parallel size = 1*4 = 4" in msg
    assert load(None, ["actor.backend=megatron", *base, "rollout.n=4"]).rollout.n == 4  # 8 sequences over 4 ranks is fine
    # micro 2 * dp 4 = 8 does not divide 2*6=12
    assert "= 2*4 = 8" in _problems(["actor.backend=megatron", *base, "rollout.n=6", "actor.ppo_micro_batch_size_per_device=2"])


def test_dynamic_batch_size_only_needs_dp_to_divide() -> None:
    base = [
        "device.devices_per_node=4",
        "actor.ppo_mini_batch_size=2",
        "data.train_batch_size=4",
        "rollout.n=2",
    ]
    cfg = load(None, [*base, "actor.use_dynamic_bsz=true", "actor.ppo_micro_batch_size_per_device=3"])
    assert cfg.actor.use_dynamic_bsz
    assert "= 3*4 = 12" in _problems([*base, "actor.ppo_micro_batch_size_per_device=3"])


def test_pipeline_parallel_megatron_needs_micro_batches_of_one_row_count() -> None:
    # world 4, pp 2 -> dp 2; 4 prompts * n 5 = 20 rows per step -> 10 per data-parallel rank.
    base = [
        "actor.backend=megatron",
        "device.devices_per_node=4",
        "parallel.pp=2",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=2",
        "rollout.n=5",
    ]
    msg = _problems([*base, "actor.log_prob_micro_batch_size_per_device=4"])
    assert "actor.log_prob_micro_batch_size_per_device=4 does not divide the 10 rows" in msg
    # no log-prob pass runs (bypass mode, no reference model): its default micro-batch (4) is not checked
    bypass = ["algorithm.rollout_correction.bypass_mode=true", "actor.use_kl_loss=false"]
    assert load(None, [*base, *bypass]).algorithm.rollout_correction.bypass_mode
    msg = _problems(
        [*base, "actor.log_prob_micro_batch_size_per_device=5", "ref.log_prob_micro_batch_size_per_device=3"]
    )
    assert "ref.log_prob_micro_batch_size_per_device=3 does not divide" in msg
    msg = _problems([*base, "actor.log_prob_micro_batch_size_per_device=5", "actor.use_dynamic_bsz=true"])
    assert "actor.use_dynamic_bsz=true with parallel.pp=2 is not supported" in msg
    assert load(None, [*base, "actor.log_prob_micro_batch_size_per_device=5"]).parallel.pp == 2
    # Pipeline parallelism is the Megatron backend's only: the torch backend refuses it.
    assert "read by the Megatron backend only" in _problems(["actor.backend=torch", *base[1:]])


def test_model_parallel_product_must_divide_world() -> None:
    msg = _problems(["device.devices_per_node=8", "parallel.tp=2", "parallel.pp=2", "parallel.cp=3"])
    assert "parallel.tp * parallel.pp * parallel.cp = 2*2*3 = 12 does not divide the world size 8" in msg


def test_expert_parallel_must_divide_devices_per_pipeline_stage() -> None:
    world16 = ["device.nnodes=2", "device.devices_per_node=8", "parallel.pp=2", "parallel.ep=8", "actor.log_prob_micro_batch_size_per_device=5"]
    assert load(None, ["actor.backend=megatron", *world16]).parallel.ep == 8  # 8*1 divides 16//2
    msg = _problems(["actor.backend=megatron", *world16, "parallel.etp=2"])
    assert "parallel.ep * parallel.etp = 8*2 = 16 does not divide the devices per pipeline stage" in msg
    assert "world // parallel.pp = 16//2 = 8" in msg


def test_expert_parallel_must_divide_number_of_experts_when_known() -> None:
    overrides = ["actor.backend=megatron", "device.devices_per_node=8", "parallel.ep=8"]
    assert load(None, overrides, num_experts=256).parallel.ep == 8
    msg = _problems(overrides, num_experts=12)
    assert "parallel.ep=8 does not divide the model's 12 experts: set parallel.ep to a divisor of 12." in msg
    cfg = load(None, overrides)
    with pytest.raises(ConfigError, match="12 experts"):
        validate(cfg, num_experts=12)


def test_seed_profiles_are_valid() -> None:
    # 122B npu seed: TP2 PP4 EP16 GEN_TP16, 16 devices x 4 nodes; Qwen3.5-122B-A10B has 256 experts.
    cfg = load(None, ["actor.backend=megatron",
            "device.nnodes=4",
            "device.devices_per_node=16",
            "parallel.tp=2",
            "parallel.pp=4",
            "parallel.ep=16",
            "rollout.tensor_parallel_size=16",
            "data.train_batch_size=64",
            "actor.ppo_mini_batch_size=16",
        ],
        num_experts=256,
    )
    assert cfg.parallel.ep == 16


def test_clip_ratio_c_must_exceed_one() -> None:
    assert "actor.clip_ratio_c=1.0 is out of range: it must be greater than 1" in _problems(["actor.clip_ratio_c=1"])


def test_rollout_tp_must_divide_world() -> None:
    msg = _problems(["device.devices_per_node=6", "rollout.tensor_parallel_size=4"])
    assert "rollout.tensor_parallel_size=4 does not divide the world size 6" in msg


def test_verl_kl_names_are_accepted_and_full_is_refused_with_the_reason() -> None:
    for name in ("kl", "mse", "k1+", "mse+", "low_var_kl+", "abs+"):
        assert load(None, [f"actor.kl_loss_type={name}"]).actor.kl_loss_type == name
    assert "actor.kl_loss_type=full cannot be honoured: the full KL needs both models' whole vocabulary" in (
        _problems(["actor.kl_loss_type=full"])
    )


def test_loss_scale_factor_is_positive_and_only_with_the_mode_that_reads_it() -> None:
    norm = "actor.loss_agg_mode=seq-mean-token-sum-norm"
    assert load(None, [norm, "actor.loss_scale_factor=4096"]).actor.loss_scale_factor == 4096
    assert "actor.loss_scale_factor=0.0 is out of range" in _problems([norm, "actor.loss_scale_factor=0"])
    assert load(None, ["actor.loss_scale_factor=4096"]).actor.loss_agg_mode != "seq-mean-token-sum-norm"  # inert


def test_adv_estimator_takes_grpo_or_rloo_and_refuses_the_rest() -> None:
    assert load(None, ["algorithm.adv_estimator=rloo"]).algorithm.adv_estimator == "rloo"
    with pytest.raises(ConfigError, match="allowed values: 'grpo', 'rloo'"):
        load(None, ["algorithm.adv_estimator=gae"])
    assert "rollout.n=1 with algorithm.adv_estimator=rloo" in _problems(["algorithm.adv_estimator=rloo", "rollout.n=1"])
    load(None, ["algorithm.adv_estimator=rloo", "algorithm.norm_adv_by_std=false"])  # inert: test_inert.py


def test_a_rollout_replica_stays_on_one_node() -> None:
    msg = _problems(["device.nnodes=2", "device.devices_per_node=4", "rollout.tensor_parallel_size=8"])
    assert "rollout.tensor_parallel_size=8 does not divide device.devices_per_node=4: a rollout replica spans" in msg


def test_vpp_needs_pipeline_parallel() -> None:
    assert "set parallel.pp > 1 or parallel.vpp=null" in _problems(["actor.backend=megatron", "parallel.vpp=2"])
    assert load(None, ["actor.backend=megatron", "device.devices_per_node=2", "parallel.pp=2", "parallel.vpp=2"]).parallel.vpp == 2


def test_an_interleaved_pipeline_needs_micro_batches_in_groups_of_pp() -> None:
    """megatron-core's interleaved schedule raises when a pass's micro-batch count is no multiple of PP."""
    base = ["actor.backend=megatron", "device.devices_per_node=4", "parallel.pp=4", "parallel.vpp=2",
            "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.n=2"]  # fmt: skip
    msg = _problems([*base, "actor.ppo_micro_batch_size_per_device=4"])
    assert "actor.ppo_micro_batch_size_per_device=4 makes 2 micro-batches in an update's pipeline, not a multiple of parallel.pp=4" in msg
    msg = _problems([*base, "actor.log_prob_micro_batch_size_per_device=8"])
    assert "actor.log_prob_micro_batch_size_per_device=8 makes 2 micro-batches in a log-prob pass's pipeline" in msg
    assert load(None, [*base, "actor.log_prob_micro_batch_size_per_device=4"]).parallel.vpp == 2
    assert load(None, [*base[:3], *base[4:], "actor.log_prob_micro_batch_size_per_device=8"]).parallel.pp == 4  # no VPP: any count


def test_zero_sizes_are_reported_not_divided_by() -> None:
    msg = _problems(["parallel.tp=0", "actor.ppo_micro_batch_size_per_device=0"])
    assert "parallel.tp=0 must be a positive integer." in msg
    assert "actor.ppo_micro_batch_size_per_device=0 must be a positive integer." in msg


def test_ref_parallel_may_only_repeat_the_actor_layout() -> None:
    megatron = ["actor.backend=megatron", "device.devices_per_node=8", "parallel.tp=2", "parallel.sequence_parallel=true"]
    assert load(None, [*megatron, "ref.parallel.tp=2"]).ref.parallel == load(None, megatron).parallel
    assert "shares the actor's parallel layout" in _problems([*megatron, "ref.parallel.tp=4"])
    assert "read by the Megatron backend only" in _problems(["device.devices_per_node=8", "ref.parallel.tp=2"])


def test_all_problems_reported_at_once() -> None:
    msg = _problems(
        [
            "data.train_batch_size=10",
            "actor.ppo_mini_batch_size=4",
            "actor.clip_ratio_c=0.5",
            "rollout.gpu_memory_utilization=1.5",
        ]
    )
    assert msg.startswith("Invalid config, 3 problems: (1) ")
    assert "(3) rollout.gpu_memory_utilization=1.5 is out of range: it must be in (0, 1]" in msg


def test_phase_timeouts_load_through_dotted_overrides() -> None:
    cfg = load(None, ["timeouts.update_s=30", "timeouts.setup_s=2.5"])
    assert (cfg.timeouts.update_s, cfg.timeouts.setup_s) == (30.0, 2.5)
    assert isinstance(cfg.timeouts.update_s, float)
    assert cfg.timeouts.log_probs_s == 900.0  # the others keep their defaults
    assert load({"timeouts": {"weight_sync_s": 60}}).timeouts.weight_sync_s == 60.0


def test_phase_timeouts_must_be_positive_and_finite() -> None:
    msg = _problems(["timeouts.update_s=0", "timeouts.generate_s=-5", "timeouts.checkpoint_s=inf"])
    assert msg.startswith("Invalid config, 3 problems: (1) timeouts.generate_s=-5.0 must be a positive")
    assert (
        "timeouts.update_s=0.0 must be a positive, finite number of seconds (how long the driver waits "
        "for every rank in that phase before it stops the run): set timeouts.update_s to e.g. 1800."
    ) in msg
    assert "timeouts.checkpoint_s=inf must be a positive" in msg
    assert "timeouts.setup_s" not in msg


ONE_STEP_OFF = [
    "rollout.mode=one_step_off",
    "rollout.devices_per_node=1",
    "algorithm.rollout_correction.rollout_is=token",
    "rollout.free_cache_engine=false",
]


def test_one_step_off_loads_with_its_rollout_devices_and_correction() -> None:
    from grpo_config import RolloutReplicas

    cfg = load(None, [*ONE_STEP_OFF, "device.devices_per_node=2", "rollout.devices_per_node=3"])
    assert cfg.rollout.mode == "one_step_off"
    layout = RolloutReplicas.for_config(cfg)  # the rollout workers, not the training ranks
    assert (layout.count, layout.world_size) == (3, 3)


@pytest.mark.parametrize(
    ("dropped", "added", "expected"),
    [
        ("rollout.devices_per_node=1", "rollout.devices_per_node=0", "set rollout.devices_per_node >= 1"),
        ("algorithm.rollout_correction.rollout_is=token", None, "set algorithm.rollout_correction.rollout_is=token"),
        ("rollout.free_cache_engine=false", None, "Set rollout.free_cache_engine=false."),
        (None, "rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size=2 with rollout.mode=one_step_off"),
        (None, "algorithm.filter_groups.enable=true", "not implemented with one-step-off rollout"),
    ],
)
def test_one_step_off_refuses_what_it_cannot_honour(dropped: str | None, added: str | None, expected: str) -> None:
    overrides = [o for o in ONE_STEP_OFF if o != dropped] + ([added] if added else [])
    msg = _problems(overrides)
    assert "1 problem" in msg and expected in msg


def test_one_step_off_takes_bypass_mode_instead_of_importance_weights() -> None:
    """In bypass mode the old policy's log-probs are the rollout engine's, one update behind: the
    PPO ratio itself is taken against the policy that sampled, so no weights are asked for."""
    overrides = [o for o in ONE_STEP_OFF if "rollout_is" not in o]
    cfg = load(None, [*overrides, "algorithm.rollout_correction.bypass_mode=true"])
    assert cfg.algorithm.rollout_correction.bypass_mode and cfg.algorithm.rollout_correction.rollout_is is None


def test_one_step_off_refuses_offload_meant_for_a_colocated_engine() -> None:
    msg = _problems([*ONE_STEP_OFF, "actor.backend=megatron", "actor.megatron.param_offload=true"])
    assert "actor.megatron.param_offload=true: offload frees the training devices" in msg


def test_rollout_devices_of_their_own_need_one_step_off() -> None:
    msg = _problems(["rollout.devices_per_node=2"])
    assert "only rollout.mode=one_step_off uses" in msg


def test_verl_one_step_off_keys_map_to_the_mode_and_devices() -> None:
    cfg = load(
        None,
        [
            "actor_rollout_ref.hybrid_engine=False",
            "rollout.n_gpus_per_node=2",
            "rollout.nnodes=1",
            "algorithm.rollout_correction.rollout_is=token",
            "actor_rollout_ref.rollout.free_cache_engine=False",
        ],
    )
    assert (cfg.rollout.mode, cfg.rollout.devices_per_node) == ("one_step_off", 2)
    assert load(None, ["actor_rollout_ref.hybrid_engine=True"]).rollout.mode == "sync"
