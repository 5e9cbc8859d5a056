"""The Megatron backend on a real GPU, driven by the same `Actor` as the torch backend (skipped
without CUDA or megatron-bridge; CI has neither a GPU nor runs these): log-probs against the HF
model on the same weights, weight sync into the `hf` rollout engine, strict HF export, the same
loss as the torch backend on the same weights and batch, a checkpoint round trip through grpo_ckpt
that restores weights and optimizer state, and offload/onload. Random-weight Qwen3.5-MoE text model
(grpo_tiny.hf_models), bf16, TP=PP=EP=1, transformer_impl=local (no transformer_engine on the GPU machine).

Run there: `python -m pytest -m "megatron and gpu" -s packages/trainer/tests/megatron/test_megatron_gpu.py`
(`-s` prints the measured differences recorded in docs/benchmarks.md).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

import grpo_device
from grpo_trainer.backends.megatron import megatron_available

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(not megatron_available(), reason="megatron-bridge is not installed"),
]

sys.path.insert(0, str(Path(__file__).parent))
import local_megatron  # noqa: E402

from grpo_tiny import hf_models  # noqa: E402

SEQ = 96


def _cfg(model_path: Path, *, grouped_experts: bool, backend: str = "megatron"):
    from grpo_config.schema import ActorConfig, DataConfig, DeviceConfig, TrainerConfig

    # Grouped experts with grpo's own fused permutation and RoPE (the local layers' fast path);
    # the sequential experts with megatron-core's unfused permutation and RoPE.
    megatron = local_megatron.local_megatron_config(grouped_experts=grouped_experts, fused_permutation=grouped_experts)
    actor = ActorConfig(
        model_path=str(model_path),
        backend=backend,
        dtype="bfloat16",
        lr=1e-4,
        ppo_micro_batch_size_per_device=4,
        log_prob_micro_batch_size_per_device=8,
        use_kl_loss=False,
        megatron=megatron,
    )
    return TrainerConfig(
        actor=actor,
        data=DataConfig(max_prompt_length=SEQ // 2, max_response_length=SEQ // 2),
        device=DeviceConfig(kind="cuda"),
    )


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.save_random_model(hf_models.qwen35_moe_config(), tmp_path_factory.mktemp("q35") / "hf")


@pytest.fixture(scope="module", params=[False, True], ids=["sequential-experts", "grouped-experts-fused-permutation"])
def actor(request: pytest.FixtureRequest, model_path: Path):
    from grpo_trainer.backends.megatron import MegatronBackend
    from grpo_trainer.workers.actor import Actor

    cfg = _cfg(model_path, grouped_experts=request.param)
    built = Actor.for_config(cfg, MegatronBackend.for_config(cfg, model_path=str(model_path)))
    yield built
    del built
    grpo_device.empty_cache()


@pytest.fixture(scope="module")
def hf_model(model_path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).cuda().eval()


def _batch(rows: int = 8, *, seed: int = 0):
    from grpo_trainer.protocols import PolicyBatch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 512, (rows, SEQ), generator=gen)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (rows,), generator=gen)
    attention = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    ids = ids * attention  # right padding with token 0
    response = attention.float()
    response[:, : SEQ // 2] = 0
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attention,
        response_mask=response,
        advantages=torch.randn(rows, generator=gen),
    )


def _hf_log_probs(model: torch.nn.Module, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids.cuda(), attention_mask=batch.attention_mask.cuda(), use_cache=False
        ).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None].cuda()).squeeze(-1)
    return torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1).cpu()


def test_log_probs_match_the_hf_model_on_the_same_weights(actor, hf_model) -> None:
    batch = _batch()
    ours = actor.log_probs(batch, with_entropy=True)
    theirs = _hf_log_probs(hf_model, batch)
    mask = batch.attention_mask[:, 1:].bool()
    diff = (ours["log_probs"][:, 1:] - theirs[:, 1:]).abs()[mask]
    print(f"\nlog-probs megatron vs HF (bf16): mean abs {diff.mean():.4f}, max abs {diff.max():.4f}")
    # bf16 on both sides, two implementations (MoE top-k may flip on near-ties): small on average.
    assert diff.mean() < 0.02 and torch.quantile(diff.float(), 0.99) < 0.15
    assert ours["log_probs"][:, 0].abs().max() == 0  # position 0 has no prediction
    entropy = ours["entropy"][:, 1:][mask]
    assert torch.all(entropy > 0) and torch.all(entropy <= torch.log(torch.tensor(512.0)) + 1e-3)


def test_named_weights_sync_the_hf_rollout_engine_exactly(actor, model_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_trainer.rollout import HFRolloutEngine

    rollout = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).cuda()
    with torch.no_grad():
        for p in rollout.parameters():
            p.zero_()
    HFRolloutEngine(model=rollout, eos_token_id=2, pad_token_id=0).update_weights(actor.backend.named_weights())
    reference = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16)
    expected = dict(reference.named_parameters())
    worst = max((p.cpu() - expected[n]).abs().max().item() for n, p in rollout.named_parameters())
    assert worst == 0.0
    assert len(load_file(str(model_path / "model.safetensors"))) > len(expected)  # experts were fused


def test_strict_hf_export_equals_the_input_checkpoint(actor, model_path: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    actor.backend.export_hf(str(tmp_path / "export"), strict=True)
    source = load_file(str(model_path / "model.safetensors"))
    exported: dict[str, torch.Tensor] = {}
    for file in (tmp_path / "export").glob("*.safetensors"):
        exported.update(load_file(str(file)))
    assert sorted(exported) == sorted(source)
    for name, tensor in source.items():
        assert torch.equal(exported[name], tensor), name


def test_the_same_loss_as_the_torch_backend_on_the_same_weights_and_batch(
    actor, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One update of each backend from the checkpoint's weights on one batch (the same old
    log-probs and advantages for both): the loss `Actor` computes agrees within bf16 noise.
    The HF model takes transformers' torch delta rule: FLA 0.6's Gated DeltaNet backward refuses
    Triton < 3.7.1 on Hopper (the Megatron side runs megatron-core's torch rule, deterministic_mode)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

    from grpo_trainer.backends.torch_backend import TorchBackend
    from grpo_trainer.workers.actor import Actor

    # transformers picks FLA's kernel when FLA imports; the undecorated function is its torch rule.
    rule = modeling_qwen3_5_moe.torch_chunk_gated_delta_rule
    monkeypatch.setattr(modeling_qwen3_5_moe, "torch_chunk_gated_delta_rule", inspect.unwrap(rule))
    cfg = _cfg(model_path, grouped_experts=False, backend="torch")
    torch_actor = Actor.for_config(cfg, TorchBackend.for_config(cfg, device=grpo_device.current_device("cuda")))
    batch = _batch(seed=2)
    batch.old_log_probs = torch_actor.log_probs(batch)["log_probs"]
    theirs = torch_actor.update_mini_batch(batch)
    ours = actor.update_mini_batch(batch)
    keys = ("loss", "pg_loss", "entropy", "ppo_kl", "pg_clipfrac", "grad_norm")
    print("\nmegatron vs torch backend, one update (bf16): " + ", ".join(f"{k} {ours[k]:.5f} / {theirs[k]:.5f}" for k in keys))
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=2e-2, abs=5e-3)
    assert ours["pg_loss"] == pytest.approx(theirs["pg_loss"], rel=2e-2, abs=5e-3)
    assert ours["entropy"] == pytest.approx(theirs["entropy"], rel=2e-2)
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=0.1)
    del torch_actor
    grpo_device.empty_cache()


def _optimizer_tensors(actor) -> dict[str, torch.Tensor]:
    """A snapshot of every Adam moment and main parameter of the live optimizer, in its own order;
    with `optimizer_offload` those of the CPU Adams inside megatron-core's HybridDeviceOptimizer."""
    from grpo_trainer.backends.megatron.state import sub_optimizers

    snapshot = {}
    for sub in sub_optimizers(actor.backend.optimizer):
        for inner in getattr(sub.optimizer, "sub_optimizers", None) or [sub.optimizer]:
            for group in inner.param_groups:
                for param in group["params"]:
                    index = len(snapshot)
                    snapshot[f"{index}.main_param"] = param.detach().float().cpu().clone()
                    for key, value in inner.state.get(param, {}).items():
                        if isinstance(value, torch.Tensor) and key != "step":
                            snapshot[f"{index}.{key}"] = value.detach().float().cpu().clone()
    assert any(key.endswith(".exp_avg") for key in snapshot), "no Adam moments found in the optimizer"
    return snapshot


def test_checkpoint_round_trip_restores_weights_and_optimizer(actor, tmp_path: Path) -> None:
    """Save after one update (Adam moments non-zero), update again, load: the log-probs and every
    optimizer tensor (fp32 main params, exp_avg, exp_avg_sq) equal the saved ones. Then the
    update from the loaded state is compared with the one from the live state, against the
    run-to-run spread of two updates from the same loaded state."""
    _check_round_trip(actor, tmp_path, "optimizer on the device")


def test_checkpoint_round_trip_with_the_optimizer_on_the_cpu(model_path: Path, tmp_path: Path) -> None:
    """The same round trip with `actor.megatron.optimizer_offload` (the GPU profiles' setting):
    megatron-core's HybridDeviceOptimizer steps CPU Adams of its own, whose state is what the
    checkpoint must hold (the CPU-rank layout tests cannot build it)."""
    from dataclasses import replace

    from grpo_trainer.backends.megatron import MegatronBackend
    from grpo_trainer.workers.actor import Actor

    base = _cfg(model_path, grouped_experts=True)
    megatron = replace(base.actor.megatron, optimizer_offload=True)
    cfg = replace(base, actor=replace(base.actor, megatron=megatron))
    actor = Actor.for_config(cfg, MegatronBackend.for_config(cfg, model_path=str(model_path)))
    assert any(
        getattr(sub.optimizer, "sub_optimizers", None) for sub in _sub_optimizers(actor)
    ), "optimizer_offload did not build a HybridDeviceOptimizer"
    _check_round_trip(actor, tmp_path, "optimizer_offload")
    del actor
    grpo_device.empty_cache()


def _sub_optimizers(actor) -> list:
    from grpo_trainer.backends.megatron.state import sub_optimizers

    return sub_optimizers(actor.backend.optimizer)


def _check_round_trip(actor, tmp_path: Path, label: str) -> None:
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.workers.actor_checkpoint import load_actor, save_actor

    batch = _batch(seed=1)
    batch.old_log_probs = actor.log_probs(batch)["log_probs"]
    noise = (actor.log_probs(batch)["log_probs"] - batch.old_log_probs).abs().max().item()
    actor.update_mini_batch(batch)
    saved_optimizer = _optimizer_tensors(actor)
    before = actor.log_probs(batch)["log_probs"]
    manager = CheckpointManager(tmp_path / "ckpt")
    save_actor(manager, 1, actor, contents=("model", "optimizer", "extra"), trainer_state={})

    metrics = actor.update_mini_batch(batch)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k != "step_skipped")
    live_update = actor.log_probs(batch)["log_probs"]
    moved = (live_update - before).abs().max().item()

    def load() -> None:
        load_actor(manager, manager.latest_complete(), actor)

    load()
    back = (actor.log_probs(batch)["log_probs"] - before).abs().max().item()
    restored = _optimizer_tensors(actor)
    assert sorted(restored) == sorted(saved_optimizer)
    optimizer_diff = max((restored[k] - saved_optimizer[k]).abs().max().item() for k in saved_optimizer)
    actor.update_mini_batch(batch)
    replay = actor.log_probs(batch)["log_probs"]
    load()
    actor.update_mini_batch(batch)
    spread = (actor.log_probs(batch)["log_probs"] - replay).abs().max().item()
    replay_diff = (replay - live_update).abs().max().item()
    print(
        f"\nckpt ({label}): forward noise {noise:.2e}, update moved {moved:.3e}, after load {back:.2e}, "
        f"optimizer state {optimizer_diff:.2e}, replayed update vs live {replay_diff:.2e}, "
        f"two replays {spread:.2e}"
    )
    assert moved > 100 * max(noise, 1e-6)
    assert back <= noise + 1e-6
    assert optimizer_diff == 0.0
    assert replay_diff <= max(3 * spread, 1e-3)


def _device_bytes(actor) -> int:
    """Bytes of the policy's own device storage: parameters, Megatron's main gradients, the
    optimizer's main parameters and moments (each storage once)."""
    from grpo_trainer.backends.megatron.offload import _optimizer_tensors

    tensors = [p for chunk in actor.backend.model for p in chunk.parameters()]
    tensors += [p.main_grad for p in tensors if getattr(p, "main_grad", None) is not None]
    tensors += [t for _, _, t in _optimizer_tensors(actor.backend.optimizer)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.is_cuda}
    return sum(storages.values())


def test_offload_frees_the_device_and_onload_restores_the_policy(actor) -> None:
    batch = _batch(seed=3)
    before = actor.log_probs(batch)["log_probs"]
    grpo_device.synchronize()
    held = grpo_device.memory_stats("cuda").allocated_bytes
    owned = _device_bytes(actor)
    actor.backend.offload(weights=True, grads=True, optimizer=True)
    grpo_device.synchronize()
    offloaded = grpo_device.memory_stats("cuda").allocated_bytes
    left = _device_bytes(actor)
    actor.backend.onload()
    after = actor.log_probs(batch)["log_probs"]
    batch.old_log_probs = after
    metrics = actor.update_mini_batch(batch)
    print(
        f"\noffload: the policy's {owned / 2**20:.1f} MiB on the device -> {left / 2**20:.1f} MiB; "
        f"allocated {held / 2**20:.1f} -> {offloaded / 2**20:.1f} MiB; log-probs after onload max diff "
        f"{(after - before).abs().max().item():.2e}"
    )
    assert owned > 0 and left == 0
    assert held - offloaded >= 0.9 * owned
    assert torch.equal(after, before)
    assert metrics["step_skipped"] == 0.0
    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("loss", "grad_norm"))


def test_rollout_memory_offloads_what_each_setting_names_and_turns_segments_off_for_the_rollout(actor) -> None:
    """The path `PolicyWorker.rollout_wake` / `rollout_sleep` take (RolloutMemory): per offload
    setting, the device memory freed before the rollout and the offload / onload time; with
    rollout.engine=vllm, expandable segments are off (read back from the live allocator) while the
    engine would be awake and on again for training. The policy is unchanged afterwards."""
    import time
    from dataclasses import replace

    from grpo_config.schema import DeviceConfig, TrainerConfig
    from grpo_device import DeviceKind
    from grpo_trainer.workers.rollout_memory import RolloutMemory

    cuda = DeviceKind.CUDA
    cfg = TrainerConfig(actor=actor.settings, device=DeviceConfig(kind="cuda"))  # what RolloutMemory reads
    assert cfg.rollout.engine == "vllm" and cfg.device.expandable_segments
    RolloutMemory.start(cfg.device.expandable_segments, kind=cuda)
    assert grpo_device.read_expandable_segments(cuda) is True
    batch = _batch(seed=4)
    before = actor.log_probs(batch)["log_probs"]
    owned = _device_bytes(actor)
    rows: list[tuple[str, float, float, float]] = []
    for name, flags in (
        ("param_offload", {"param_offload": True}),
        ("grad_offload", {"grad_offload": True}),
        ("optimizer_offload", {"optimizer_offload": True}),
        ("all three", {"param_offload": True, "grad_offload": True, "optimizer_offload": True}),
    ):
        megatron = replace(actor.settings.megatron, **flags)
        memory = RolloutMemory.for_config(
            replace(cfg, actor=replace(actor.settings, megatron=megatron)), actor.backend, kind=cuda
        )
        grpo_device.synchronize()
        held = grpo_device.memory_stats(cuda).allocated_bytes
        started = time.perf_counter()
        memory.before_rollout()
        grpo_device.synchronize()
        offload_s = time.perf_counter() - started
        freed = held - grpo_device.memory_stats(cuda).allocated_bytes
        assert grpo_device.read_expandable_segments(cuda) is False, name
        started = time.perf_counter()
        memory.after_rollout()
        grpo_device.synchronize()
        onload_s = time.perf_counter() - started
        assert grpo_device.read_expandable_segments(cuda) is True, name
        assert freed > 0, name
        rows.append((name, freed / 2**20, offload_s, onload_s))
    print(f"\nrollout memory: the policy owns {owned / 2**20:.1f} MiB on the device")
    for name, freed_mib, offload_s, onload_s in rows:
        print(f"  {name:18s} freed {freed_mib:8.1f} MiB  offload {offload_s * 1e3:7.1f} ms  onload {onload_s * 1e3:7.1f} ms")
    assert rows[-1][1] * 2**20 >= 0.9 * owned
    assert torch.equal(actor.log_probs(batch)["log_probs"], before)
