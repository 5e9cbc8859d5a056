"""The memory plan (`grpo_launch.memory_plan`): against the peaks measured on one H200
(docs/benchmarks.md, "Memory plan"), in the launchers' `--dry-run`, and refusing an oversized
launch before it starts, with the numbers. Parameter counts come from transformers' classes on the
meta device (real configs written to disk, no weights)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import structlog
import yaml

from grpo_config.schema import ActorConfig, DataConfig, DeviceConfig, MegatronConfig, TrainerConfig
from grpo_launch.memory_plan import CONTEXT_BYTES, GIB, model_counts, pipeline_in_flight, plan_memory
from grpo_tiny import hf_models

REPO = Path(__file__).resolve().parents[1]

# bench/megatron_gpu_run.py --mfu qwen3moe+gmm,LAYERS,32,8,FFN,HIDDEN,16,2048,MICRO, one spec per
# process: torch.cuda.max_memory_allocated over 4 updates (GiB).
MEASURED = [
    (8, 768, 2048, 4, 42.7),
    (12, 768, 2048, 8, 81.7),
    (4, 1536, 4096, 4, 70.1),
    (4, 1536, 4096, 8, 85.5),
    (6, 1536, 4096, 4, 100.7),
]


def _qwen3_moe(path: Path, *, layers: int, ffn: int, hidden: int, experts: int = 32) -> Path:
    config = hf_models.qwen3_moe_config(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
        num_key_value_heads=max(hidden // 512, 1), head_dim=128, num_experts=experts, num_experts_per_tok=8,
        moe_intermediate_size=ffn, vocab_size=32768, max_position_embeddings=2048,
    )
    config.save_pretrained(path)
    return path


@pytest.mark.parametrize(("layers", "ffn", "hidden", "micro", "measured_gib"), MEASURED)
def test_the_plan_is_within_15_percent_of_the_measured_h200_peak(
    tmp_path: Path, layers: int, ffn: int, hidden: int, micro: int, measured_gib: float
) -> None:
    path = _qwen3_moe(tmp_path / "m", layers=layers, ffn=ffn, hidden=hidden)
    counts = model_counts(path)
    cfg = TrainerConfig(
        actor=ActorConfig(
            model_path=str(path), backend="megatron", dtype="bfloat16", ppo_micro_batch_size_per_device=micro,
            use_kl_loss=False,
            megatron=MegatronConfig(transformer_impl="local", moe_grouped_gemm=True, use_distributed_optimizer=True),
        ),
        data=DataConfig(max_prompt_length=1024, max_response_length=1024),
        device=DeviceConfig(kind="cuda"),
    )
    plan = plan_memory(cfg, counts, device_bytes=None)
    planned = (plan.training_peak - CONTEXT_BYTES) / GIB  # the allocator's peak holds no CUDA context
    assert abs(planned - measured_gib) / measured_gib < 0.15, (planned, measured_gib, plan.to_dict())
    # 2 + 4 + 12 bytes a parameter at data parallel 1, as the bench's own count says.
    assert plan.training["weights"] + plan.training["gradients"] + plan.training["optimizer"] == pytest.approx(
        18 * counts.total, rel=1e-6
    )


def test_model_counts_are_transformers_parameter_counts(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = _qwen3_moe(tmp_path / "m", layers=2, ffn=64, hidden=256, experts=4)
    from transformers import AutoConfig

    counts = model_counts(path)
    assert not (path / "model.safetensors").exists()  # counted from the config alone
    real = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    assert counts.total == sum(p.numel() for p in real.parameters())
    assert counts.layer_experts == 4 * 3 * 256 * 64 and counts.layers == 2 and counts.topk == 8


def _parallel_and_memory(cfg: TrainerConfig, path: Path, memory_gib: float, **megatron: object) -> TrainerConfig:
    import dataclasses

    return dataclasses.replace(
        cfg,
        device=dataclasses.replace(cfg.device, memory_gib=memory_gib),
        actor=dataclasses.replace(cfg.actor, model_path=str(path), megatron=dataclasses.replace(cfg.actor.megatron, **megatron)),
    )


def test_offload_and_parallelism_move_the_plan_as_they_move_the_memory(tmp_path: Path) -> None:
    import dataclasses

    path = _qwen3_moe(tmp_path / "m", layers=4, ffn=1536, hidden=4096)
    counts = model_counts(path)
    cfg = TrainerConfig(
        actor=ActorConfig(model_path=str(path), backend="megatron", use_kl_loss=False,
                          megatron=MegatronConfig(transformer_impl="local", use_distributed_optimizer=True)),
        device=DeviceConfig(kind="cuda", devices_per_node=8),
    )
    base = plan_memory(cfg, counts, device_bytes=141 * GIB)
    offloaded = plan_memory(
        dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, megatron=dataclasses.replace(cfg.actor.megatron, optimizer_offload=True))),
        counts, device_bytes=141 * GIB,
    )
    assert offloaded.training["optimizer"] == 0 < base.training["optimizer"]
    experts_split = plan_memory(dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, ep=8)), counts, device_bytes=141 * GIB)
    assert experts_split.training["weights"] < base.training["weights"] / 3  # experts are most of it
    # The rollout phase: vLLM's reservation beside what the actor keeps on the device.
    assert base.rollout["vllm_reserved"] == int(cfg.rollout.gpu_memory_utilization * 141 * GIB)
    parked = plan_memory(
        dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, megatron=dataclasses.replace(
            cfg.actor.megatron, param_offload=True, grad_offload=True, optimizer_offload=True))),
        counts, device_bytes=141 * GIB,
    )
    assert parked.rollout_peak < base.rollout_peak and parked.rollout["actor_weights"] == 0


def test_a_pipeline_s_first_stage_holds_the_micro_batches_in_flight(tmp_path: Path) -> None:
    """1F1B: PP micro-batches' activations of one stage at once (fewer when there are fewer);
    interleaved (VPP): 1 + (PP-1)/(PP VPP) times that (Korthikanti et al.)."""
    import dataclasses

    assert pipeline_in_flight(1, None, 8) == 1
    assert pipeline_in_flight(4, None, 8) == 4 and pipeline_in_flight(4, None, 2) == 2
    assert pipeline_in_flight(2, 2, 8) == 2 * (1 + 1 / 4) and pipeline_in_flight(4, 2, 8) == 4 * (1 + 3 / 8)
    path = _qwen3_moe(tmp_path / "m", layers=4, ffn=1536, hidden=4096)
    counts = model_counts(path)
    cfg = TrainerConfig(
        actor=ActorConfig(model_path=str(path), backend="megatron", use_kl_loss=False, ppo_mini_batch_size=8,
                          megatron=MegatronConfig(transformer_impl="local", moe_grouped_gemm=False)),
        data=DataConfig(train_batch_size=8), device=DeviceConfig(kind="cuda", devices_per_node=4),
    )  # fmt: skip
    stages = lambda **par: plan_memory(  # noqa: E731
        dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **par)), counts, device_bytes=141 * GIB
    ).training["activations"]
    # Half the layers per stage, held for 2 (PP2) or 2.5 (PP2 VPP2) micro-batches: the same, then 1.25x.
    assert stages(pp=2) == pytest.approx(stages(pp=1), rel=1e-6)
    assert stages(pp=2, vpp=2) == pytest.approx(1.25 * stages(pp=1), rel=1e-6)


# bench/gpu_production_path.py on the H200 (143 771 MiB): the tiny preset's Megatron actor (resident)
# and vLLM at gpu_memory_utilization=0.2, 30 steps; nvidia-smi's peak memory.used of the GPU, MiB.
# "tis": the engine colocated in the training rank; "one_step_off": the training rank and the
# rollout worker as two processes on the one GPU (the bench's stand-in for two GPUs).
H200_MIB = 143771
PRODUCTION_PEAK_MIB = {"tis": 31713, "one_step_off": 32395}


@pytest.mark.parametrize("run", sorted(PRODUCTION_PEAK_MIB))
def test_the_rollout_phase_is_within_15_percent_of_the_measured_production_peak(tmp_path: Path, run: str) -> None:
    import grpo_config
    from grpo_launch import tiny_preset

    overrides = [
        "actor.backend=megatron", "actor.dtype=bfloat16", "actor.megatron.transformer_impl=local",
        "device.kind=cuda", "device.devices_per_node=1", "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.2",
        "algorithm.rollout_correction.rollout_is=token",
    ]
    if run == "one_step_off":
        overrides += ["rollout.mode=one_step_off", "rollout.devices_per_node=1", "rollout.free_cache_engine=false"]
    cfg = grpo_config.load(tiny_preset(tmp_path), overrides)
    plan = plan_memory(cfg, model_counts(cfg.actor.model_path), device_bytes=H200_MIB * 2**20)
    planned = plan.rollout_peak
    if run == "one_step_off":  # both processes on the one GPU: the training rank's peak beside vLLM's
        assert "actor_weights" not in plan.rollout
        planned += plan.training_peak
    measured = PRODUCTION_PEAK_MIB[run] * 2**20
    assert abs(planned - measured) / measured < 0.15, (planned / GIB, measured / GIB, plan.to_dict())


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The 35B launcher on a Qwen3.5-MoE config of 30B-class shape written to MODEL_PATH (no
    weights); RAY_ADDRESS set, so the launch does not look for a local GPU."""
    from transformers import Qwen3_5MoeTextConfig

    model = tmp_path / "model"
    Qwen3_5MoeTextConfig(
        vocab_size=151936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2,
        head_dim=256, moe_intermediate_size=768, shared_expert_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12,
    ).save_pretrained(model)
    monkeypatch.setenv("MODEL_PATH", str(model))
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRAIN_FILES", str(tmp_path / "missing.parquet"))
    monkeypatch.setenv("VAL_FILES", str(tmp_path / "missing_val.parquet"))
    for name in ("NNODES", "DATA_DIR", "DATA_SOURCE", "DEVICE"):
        monkeypatch.delenv(name, raising=False)
    root_handlers = list(logging.getLogger().handlers)
    yield model
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = root_handlers


def test_the_dry_run_prints_the_plan_and_warns_when_it_cannot_fit(launch_env, tmp_path: Path, capsys) -> None:
    from grpo_launch_qwen35_35b import main

    assert main(["--dry-run", "--device", "gpu", "--output-dir", str(tmp_path / "o"), "device.memory_gib=141"]) == 0
    captured = capsys.readouterr()
    plan = yaml.safe_load(captured.out.split("\n", 1)[1])["memory_plan"]
    assert plan["device_gib"] == 141.0 and plan["fits"] is True and "refused" not in plan
    assert set(plan["training_gib"]) >= {"weights", "gradients", "optimizer", "activations", "total"}
    assert plan["rollout_gib"]["vllm_reserved"] == pytest.approx(0.6 * 141, abs=0.01)

    assert main(["--dry-run", "--device", "gpu", "--output-dir", str(tmp_path / "o"), "device.memory_gib=16"]) == 0
    captured = capsys.readouterr()
    plan = yaml.safe_load(captured.out.split("\n", 1)[1])["memory_plan"]
    assert plan["fits"] is False and "16.0 GiB" in plan["refused"]
    events = [json.loads(line) for line in captured.err.splitlines() if line.strip().startswith("{")]
    assert any("the memory plan needs" in e.get("problem", "") for e in events if e["event"] == "a real launch would stop here")


def test_an_oversized_launch_is_refused_before_it_starts_with_the_numbers(launch_env, tmp_path: Path, capsys) -> None:
    from grpo_launch_qwen35_35b import main

    assert main(["--device", "gpu", "--output-dir", str(tmp_path / "o"), "device.memory_gib=16"]) == 2
    err = capsys.readouterr().err
    assert "error: the memory plan needs" in err and "a device has 16.0 GiB" in err
    for part in ("weights", "gradients", "optimizer", "activations"):
        assert part in err
    # Enough memory: the launch passes the plan and stops later, on the missing data files.
    assert main(["--device", "gpu", "--output-dir", str(tmp_path / "o"), "device.memory_gib=1000"]) == 2
    err = capsys.readouterr().err
    assert "memory plan needs" not in err and "data files missing" in err


def _dry_run_plan(main, tmp_path: Path, capsys) -> tuple[dict, list[dict]]:
    assert main(["--dry-run", "--device", "gpu", "--output-dir", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    events = [json.loads(line) for line in captured.err.splitlines() if line.strip().startswith("{")]
    return yaml.safe_load(captured.out.split("\n", 1)[1])["memory_plan"], events


def test_a_checkpoint_of_another_architecture_wins_and_the_difference_is_said(launch_env, tmp_path: Path, capsys) -> None:
    """MODEL_PATH holds a 30B-class Qwen3.5-MoE text config (128 experts, 48 layers): the plan is
    counted from it, and the dry run names every value that differs from the 35B's shipped config."""
    from grpo_launch_qwen35_35b import PROFILE, main

    plan, events = _dry_run_plan(main, tmp_path, capsys)
    source = plan["model_config"]
    assert source["path"] == str(launch_env / "config.json") and source["source"].startswith("your checkpoint")
    assert source["shipped_path"] == str(PROFILE.architecture / "config.json")
    differs = source["differs_from_shipped"]
    assert differs["num_experts"] == {"yours": 128, "shipped": 256}
    assert differs["num_hidden_layers"] == {"yours": 48, "shipped": 40}
    assert differs["vocab_size"] == {"yours": 151936, "shipped": 248320}
    assert differs["architectures"]["shipped"] == ["Qwen3_5MoeForConditionalGeneration"]
    warnings = [e["warning"] for e in events if e["event"] == "check the model"]
    assert len(warnings) == 1 and "not Qwen/Qwen3.5-35B-A3B's architecture" in warnings[0]
    assert "num_experts: yours 128, Qwen/Qwen3.5-35B-A3B 256" in warnings[0]
    # The numbers are the checkpoint's: its counts, not the shipped model's.
    counts = model_counts(launch_env)
    tp, ep = 2, 8
    assert plan["training_gib"]["weights"] == pytest.approx(
        2 * (counts.layers * (counts.layer_dense / tp + counts.layer_experts / ep) + (counts.embedding + counts.output) / tp + counts.other) / GIB, abs=0.01
    )


def test_the_published_architecture_at_model_path_plans_as_the_shipped_one_without_warning(
    launch_env, tmp_path: Path, capsys
) -> None:
    """A downloaded checkpoint of the launcher's own model: its config.json is the one counted, the
    numbers equal the shipped plan's (the goldens'), and nothing is flagged."""
    import shutil

    from grpo_launch_qwen35_35b import PROFILE, main

    shutil.copy(PROFILE.architecture / "config.json", launch_env / "config.json")
    plan, events = _dry_run_plan(main, tmp_path, capsys)
    assert plan["model_config"] == {"path": str(launch_env / "config.json"), "source": "your checkpoint (actor.model_path)"}
    assert not [e for e in events if e["event"] == "check the model"]
    golden = yaml.safe_load(
        (REPO / "packages/launchers/qwen35_35b/tests/goldens/dry_run_gpu.yaml").read_text().split("\n", 1)[1]
    )["memory_plan"]
    assert plan["training_gib"] == golden["training_gib"]


def test_a_launch_on_another_architecture_warns_before_it_goes_on(launch_env, tmp_path: Path, capsys) -> None:
    from grpo_launch_qwen35_35b import main

    assert main(["--device", "gpu", "--output-dir", str(tmp_path / "o"), "device.memory_gib=1000"]) == 2
    err = capsys.readouterr().err
    events = [json.loads(line) for line in err.splitlines() if line.strip().startswith("{")]
    assert any(e["event"] == "check the model" and "num_experts" in e["warning"] for e in events)
    assert "data files missing" in err  # not refused for it: the launch went on to the next check
