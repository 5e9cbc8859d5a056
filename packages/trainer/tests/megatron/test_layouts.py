"""Every parallel layout against world size 1, on the same HF weights, in float32, on CPU ranks.

The Megatron backend as `train()` builds it (Megatron-Bridge provider from a Qwen3.5-MoE HF
checkpoint, grpo's local spec: 3 Gated DeltaNet + 1 attention layer, 8 experts top 2, the
launchers' all-to-all dispatcher) runs as one process per rank over gloo (`cpu_ranks`: the CUDA
stand-ins live there, in the tests only). Per layout: the weights every rank would push to a
rollout engine, log-probs, one update's loss and grad norm, the weights after it, and the strict
HF export, each compared with the world-size-1 run. The numbers go into docs/LAYOUTS.md.
"""

from __future__ import annotations

import glob
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_trainer.backends.megatron import megatron_available

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.slow,
    pytest.mark.skipif(not megatron_available(), reason="megatron-bridge is not installed"),
]

sys.path.insert(0, str(Path(__file__).parent))
import cpu_ranks  # noqa: E402

from grpo_tiny import hf_models  # noqa: E402

TOLERANCE = 1e-5


@dataclass(frozen=True)
class Layout:
    name: str
    parallel: dict[str, int]
    world_size: int
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


LAYOUTS = [
    Layout("tp2_sp", {"tp": 2}, 2),
    Layout("pp2", {"pp": 2}, 2),
    Layout("pp2_vpp2", {"pp": 2, "vpp": 2}, 2),
    Layout("ep2_dp2", {"ep": 2}, 2),
    Layout("ep2_dp2_distributed_optimizer", {"ep": 2}, 2, {"distributed_optimizer": True}),
    # Also saves a checkpoint after its update and updates once more (the resume tests' reference).
    Layout(
        "tp2_ep2_grouped_experts", {"tp": 2, "ep": 2}, 4,
        {"grouped_experts": True, "distributed_optimizer": True, "checkpoint": True},
    ),
    Layout("ep2_etp2", {"ep": 2, "etp": 2}, 4),
    Layout("tp2_pp2_ep2", {"tp": 2, "pp": 2, "ep": 2}, 8, {"distributed_optimizer": True}),
    # The tiny-vl checkpoint (Qwen3_5MoeForConditionalGeneration): images through transformers' vision
    # tower in front of the first pipeline stage.
    Layout("vision_language_tp2_sp", {"tp": 2}, 2, {"vision_language": True}),
    Layout("vision_language_pp2", {"pp": 2}, 2, {"vision_language": True}),
    # The 122B GPU profile's layout (and the 35B NPU profile's) at its smallest world, one expert per
    # expert-parallel rank.
    Layout("tp2_pp2_ep8_dp4", {"tp": 2, "pp": 2, "ep": 8}, 16, {"distributed_optimizer": True}),
    # The 122B profiles' layouts at their full rank counts (4 nodes of 8 GPUs / 16 NPUs), one expert
    # per expert-parallel rank; run only when asked (GRPO_TEST_FULL_RANK_COUNTS=1).
    Layout("tp2_pp2_ep8_dp8_122b_gpu", {"tp": 2, "pp": 2, "ep": 8}, 32, {"distributed_optimizer": True}),
    Layout(
        "tp2_pp4_ep16_dp8_122b_npu", {"tp": 2, "pp": 4, "ep": 16}, 64,
        {"distributed_optimizer": True, "experts": 16},
    ),
]


_FULL_RANK_COUNT_ONLY = cpu_ranks.only_at_full_rank_counts("32 or 64 CPU ranks take 3-13 minutes on 2 cores (docs/LAYOUTS.md)")
PARAMS = [pytest.param(lay, marks=_FULL_RANK_COUNT_ONLY if lay.world_size > 16 else (), id=lay.name) for lay in LAYOUTS]


@pytest.fixture(scope="module", autouse=True)
def _fork_server() -> Any:
    """The ranks' fork server lives as long as this module's runs (its ~1.3 GB freed after)."""
    yield
    cpu_ranks.stop_fork_server()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = hf_models.qwen35_moe_config()
    return hf_models.save_random_model(config, tmp_path_factory.mktemp("layout") / "hf", dtype=torch.float32)


def _run(model_path: Path, layout: Layout, out: Path, reference: Path | None) -> dict[str, Any]:
    spec = {"model_path": str(model_path), "parallel": layout.parallel, **layout.extra}
    if reference is not None:
        spec["reference"] = str(reference)
    ranks = cpu_ranks.run_ranks(spec, world_size=layout.world_size, out=out, timeout_s=1800)
    tensors = [torch.load(out / f"rank{r['rank']}.pt") for r in ranks]
    return {"out": out, "ranks": ranks, "tensors": tensors}


_RUNS: dict[str, dict[str, Any]] = {}


def _once(layout: Layout, model_path: Path, factory: pytest.TempPathFactory, reference: Path | None) -> dict:
    """Each layout runs once per session, whichever test asks first."""
    if layout.name not in _RUNS:
        _RUNS[layout.name] = {**_run(model_path, layout, factory.mktemp(layout.name), reference), "layout": layout}
    return _RUNS[layout.name]


@pytest.fixture(scope="module")
def sixteen_experts_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = hf_models.qwen35_moe_config(num_experts=16)
    return hf_models.save_random_model(config, tmp_path_factory.mktemp("layout16") / "hf", dtype=torch.float32)


@pytest.fixture(scope="module")
def vision_language_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_tiny import vl_model as tiny_vl_model
    from grpo_tiny import vl_task as tiny_vl_task

    return tiny_vl_model.ensure_tiny_vl_model(tmp_path_factory.mktemp("layout_vl") / "hf", texts=tiny_vl_task.corpus())


@pytest.fixture(scope="module")
def reference(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _once(Layout("world1", {}, 1), model_path, tmp_path_factory, None)


@pytest.fixture(scope="module", params=PARAMS)
def layout_run(request: pytest.FixtureRequest, model_path: Path, vision_language_path: Path, tmp_path_factory) -> dict[str, Any]:
    layout = request.param
    if layout.extra.get("vision_language"):
        path = vision_language_path
        base = _once(Layout("world1_vision_language", {}, 1, {"vision_language": True}), path, tmp_path_factory, None)
    elif layout.extra.get("experts") == 16:
        path = request.getfixturevalue("sixteen_experts_path")
        base = _once(Layout("world1_sixteen_experts", {}, 1), path, tmp_path_factory, None)
    else:
        path = model_path
        base = _once(Layout("world1", {}, 1), path, tmp_path_factory, None)
    return {**_once(layout, path, tmp_path_factory, base["out"]), "reference": base}


def _by_data_parallel_rank(run: dict[str, Any], key: str) -> torch.Tensor:
    """The rows of every data-parallel rank in order (each DP rank's first rank holds them)."""
    first: dict[int, torch.Tensor] = {}
    for result, tensors in zip(run["ranks"], run["tensors"], strict=True):
        first.setdefault(result["dp_rank"], tensors[key])
    width = max(t.shape[1] for t in first.values())  # each rank's rows are cut to their own longest
    return torch.cat([torch.nn.functional.pad(first[dp], (0, width - first[dp].shape[1])) for dp in sorted(first)])


def test_layout_log_probs_equal_world_size_one(layout_run: dict) -> None:
    reference = layout_run["reference"]
    ours = _by_data_parallel_rank(layout_run, "log_probs")
    theirs = reference["tensors"][0]["log_probs"]
    assert ours.shape == theirs.shape and int((ours != 0).sum()) > 100
    assert float((ours - theirs).abs().max()) <= TOLERANCE


def test_layout_update_equals_world_size_one(layout_run: dict) -> None:
    """Loss and grad norm of one update (the same on every rank), the log-probs inside it (ppo_kl
    against the pass before it) and after it."""
    reference = layout_run["reference"]
    theirs = reference["ranks"][0]["metrics"]
    for result in layout_run["ranks"]:
        ours = result["metrics"]
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=TOLERANCE)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=TOLERANCE)
        assert abs(ours["ppo_kl"]) <= TOLERANCE and ours["pg_clipfrac"] == 0.0
    after = _by_data_parallel_rank(layout_run, "log_probs_after")
    assert float((after - reference["tensors"][0]["log_probs_after"]).abs().max()) <= 10 * TOLERANCE


def test_layout_synced_weights_equal_world_size_one_on_every_rank(layout_run: dict) -> None:
    """What every rank pushes to a rollout engine (`named_weights`, gathered over TP/PP/EP): before
    the update bit for bit the world-size-1 export, after it within the tolerance."""
    for result in layout_run["ranks"]:
        before, after = result["weights_before"], result["weights_after"]
        for report in (before, after):
            assert report["missing"] == report["unexpected"] == report["shape_mismatch"] == []
        assert before["bitwise_equal"], f"rank {result['rank']}: {before['max_abs_diff']}"
        assert after["max_abs_diff"] <= TOLERANCE, f"rank {result['rank']}"


def _safetensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(glob.glob(str(directory / "*.safetensors"))):
        tensors.update(load_file(path))
    return tensors


def test_layout_strict_hf_export_equals_world_size_one(layout_run: dict) -> None:
    reference = layout_run["reference"]
    ours = _safetensors(layout_run["out"] / "export")
    theirs = _safetensors(reference["out"] / "export")
    assert set(ours) == set(theirs) and len(ours) > 100
    worst = max(float((ours[n] - theirs[n]).abs().max()) for n in ours)
    assert worst <= TOLERANCE
    reports = [r["export"] for r in layout_run["ranks"]]  # every rank joins the gathering; rank 0 writes
    assert all(r["written"] == len(theirs) and r["model_keys_not_written"] == [] for r in reports)


def _checkpointed(model_path: Path, reference: dict, factory: pytest.TempPathFactory) -> dict[str, Any]:
    layout = next(lay for lay in LAYOUTS if lay.extra.get("checkpoint"))
    return _once(layout, model_path, factory, reference["out"])


def _resumed(saved: dict, model_path: Path, factory: pytest.TempPathFactory, name: str, parallel: dict, world_size: int, **extra: Any) -> dict:
    spec = {"resume": str(saved["out"] / "ckpt" / "global_step_1"), **extra}
    return _run(model_path, Layout(name, parallel, world_size, spec), factory.mktemp(name), None)


def _second_weights(run: dict[str, Any]) -> dict[str, torch.Tensor]:
    return run["tensors"][0]["weights_second"]  # every rank gathers the full HF-named weights


def _worst(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    return max(float((ours[n] - w).abs().max()) for n, w in theirs.items())


def test_layout_resume_at_the_saved_sizes_continues_exactly(model_path: Path, reference: dict, tmp_path_factory) -> None:
    """Saved after one update at TP2 x EP2, resumed in fresh processes at TP2 x EP2: the second
    update is bit-identical to the uninterrupted run's."""
    saved = _checkpointed(model_path, reference, tmp_path_factory)
    layout = saved["layout"]
    same = {k: v for k, v in layout.extra.items() if k != "checkpoint"}
    resumed = _resumed(saved, model_path, tmp_path_factory, "resumed", layout.parallel, layout.world_size, **same)
    for ours, theirs in zip(resumed["ranks"], saved["ranks"], strict=True):
        assert "refused" not in ours
        for key in ("loss", "grad_norm", "ppo_kl"):
            assert ours["metrics_second"][key] == pytest.approx(theirs["metrics_second"][key], abs=1e-6)
    for ours, theirs in zip(resumed["tensors"], saved["tensors"], strict=True):
        assert torch.equal(ours["log_probs_second"], theirs["log_probs_second"])
        assert _worst(ours["weights_second"], theirs["weights_second"]) == 0.0


RESUMED_AT = [
    # name, parallel sizes, world size, spec (the checkpoint's: distributed optimizer, grouped experts
    # at TP2 x EP2). TP1 x EP1: one rank, one optimizer where two were chained; PP2: each rank reads
    # its half of the layers; EP2 x DP2: the moments split over two data-parallel ranks.
    ("world1", {}, 1, {"distributed_optimizer": True}),
    ("pp2", {"pp": 2}, 2, {"distributed_optimizer": True}),
    ("ep2_dp2", {"ep": 2}, 2, {"distributed_optimizer": True, "grouped_experts": True}),
]


@pytest.mark.parametrize(("name", "parallel", "world_size", "extra"), RESUMED_AT, ids=[r[0] for r in RESUMED_AT])
def test_layout_resume_at_other_sizes_continues_the_run(
    model_path: Path, reference: dict, tmp_path_factory, name: str, parallel: dict, world_size: int, extra: dict
) -> None:
    """Saved at TP2 x EP2 after one update, resumed at another layout: the second update (loss,
    grad norm, KL, log-probs, every weight after it) equals the uninterrupted TP2 x EP2 run's, within
    the layouts' own tolerance (docs/LAYOUTS.md). Adam's moments come back resharded: left unloaded
    (zero), the weights after the second update differ by 9e-4 at TP1 (measured), 90 x the tolerance."""
    saved = _checkpointed(model_path, reference, tmp_path_factory)
    resumed = _resumed(saved, model_path, tmp_path_factory, f"resumed_{name}", parallel, world_size, **extra)
    theirs = saved["ranks"][0]["metrics_second"]
    for result in resumed["ranks"]:
        assert "refused" not in result
        assert result["metrics_second"]["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
        assert result["metrics_second"]["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5)
        assert result["metrics_second"]["ppo_kl"] == pytest.approx(theirs["ppo_kl"], abs=1e-6)
    ours_lp = _by_data_parallel_rank(resumed, "log_probs_second")
    theirs_lp = _by_data_parallel_rank(saved, "log_probs_second")
    assert float((ours_lp - theirs_lp).abs().max()) <= TOLERANCE
    ours, theirs_w = _second_weights(resumed), _second_weights(saved)
    assert set(ours) == set(theirs_w)
    assert _worst(ours, theirs_w) <= TOLERANCE


def test_layout_context_parallel_is_refused_in_the_config() -> None:
    import grpo_config

    raw = {"actor": {"backend": "megatron"}, "parallel": {"cp": 2}, "device": {"nnodes": 1, "devices_per_node": 2}}
    with pytest.raises(grpo_config.ConfigError, match=r"Set parallel\.cp=1"):
        grpo_config.load(raw, [])


def test_layout_resume_with_the_other_optimizer_kind_is_refused(model_path: Path, reference: dict, tmp_path_factory) -> None:
    """The distributed optimizer keeps fp32 copies of the weights in its state, the plain one does
    not: a resume that switches `use_distributed_optimizer` says which setting to use. (`train()` and
    the launchers refuse it before any worker starts: test_resume_layout.py.)"""
    saved = _checkpointed(model_path, reference, tmp_path_factory)
    refused = _resumed(saved, model_path, tmp_path_factory, "resumed_plain_optimizer", {}, 1)
    assert "set actor.megatron.use_distributed_optimizer=true to resume" in refused["ranks"][0]["refused"]


def test_layout_a_model_only_checkpoint_resumes_its_weights_with_a_fresh_optimizer(model_path: Path, reference: dict, tmp_path_factory) -> None:
    """`checkpoint.save_contents=[model]` at TP2: resumed at world size 1, the weights are the saved
    ones (the log-probs before the second update equal the saving run's) and the optimizer starts anew
    (Adam step 0, so its second update differs from the saving run's)."""
    saved_layout = Layout("tp2_model_only", {"tp": 2}, 2, {"checkpoint": True, "save_contents": ["model"]})
    saved = _once(saved_layout, model_path, tmp_path_factory, reference["out"])
    resumed = _resumed(saved, model_path, tmp_path_factory, "resumed_model_only", {}, 1)
    result = resumed["ranks"][0]
    assert "refused" not in result and result["adam_step_after_load"] == 0
    ours, theirs = resumed["tensors"][0]["log_probs_second"], _by_data_parallel_rank(saved, "log_probs_second")
    assert float((ours - theirs).abs().max()) <= TOLERANCE
    assert _worst(_second_weights(resumed), _second_weights(saved)) > 100 * TOLERANCE



def test_layout_harness_reports_failed_and_timed_out_runs_then_serves_the_next(model_path: Path, tmp_path_factory) -> None:
    """The harness itself: a run whose ranks fail names them with their logs' tails; a run past its
    time has its ranks killed and is reported; the fork server then runs the next layout as before."""
    missing = {"model_path": str(model_path.parent / "missing"), "parallel": {"tp": 2}}
    with pytest.raises(cpu_ranks.RanksFailed, match=r"2 of 2 ranks failed:\n--- rank 0 \(1\):\n[\s\S]*missing"):
        cpu_ranks.run_ranks(missing, world_size=2, out=tmp_path_factory.mktemp("failing"))
    spec = {"model_path": str(model_path), "parallel": {"pp": 2}}
    with pytest.raises(cpu_ranks.RanksFailed, match=r"2 of 2 ranks failed:\n--- rank 0 \(timeout\)"):
        cpu_ranks.run_ranks(spec, world_size=2, out=tmp_path_factory.mktemp("timed_out"), timeout_s=1)
    ranks = cpu_ranks.run_ranks(spec, world_size=2, out=tmp_path_factory.mktemp("after"))
    assert [(r["rank"], r["pp_rank"]) for r in ranks] == [(0, 0), (1, 1)]
