"""`--plan` (grpo_launch.layout_planner): the layouts of each launcher profile's cluster that are valid
and fit the memory plan in both phases, ranked by the cost model's step time. The seeds' own layouts
are among those that fit; the first choice's overrides give that layout back; one estimate is
recomputed by hand from the formulas in docs/LAYOUT_PLANNER.md."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_config
from grpo_launch.cost_model import (
    DECODE_HBM_EFFICIENCY,
    DEVICES,
    GB,
    PREFILL_MFU,
    RESPONSE_FILL,
    SYNC_GBS_PER_PROCESS,
    update_mfu,
)
from grpo_launch.layout_planner import Family, Heads, Layout, apply, current_layout, estimate, layouts
from grpo_launch.memory_plan import ModelCounts

PROFILES = [
    ("grpo-launch-35b", "gpu", "TP2 PP1 EP8, rollout TP8 (offload, full recompute)"),
    ("grpo-launch-35b", "npu", "TP2 PP2 EP8, rollout TP8 (offload, full recompute)"),
    ("grpo-launch-122b", "gpu", "TP2 PP2 EP8, rollout TP8 (offload, full recompute)"),
    ("grpo-launch-122b", "npu", "TP2 PP4 EP16, rollout TP16 (offload, full recompute)"),
]


@pytest.mark.parametrize(("launcher", "device", "seed_layout"), PROFILES)
def test_plan_answers_for_each_profile_and_ranks_the_seed_s_layout(
    launcher: str, device: str, seed_layout: str, tmp_path: Path
) -> None:
    # The child's CPU time, not the wall clock: on this 2-core machine the Ray workers an earlier test
    # leaves shutting down can double the wall time (11.4 s once, against ~2.6 s alone).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [str(Path(sys.executable).with_name(launcher)), "--plan", "--device", device],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DEVICE"} | {"HOME": str(tmp_path)},
        timeout=120,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 0, done.stderr[-2000:]
    assert cpu < 10.0, f"--plan took {cpu:.1f} s of CPU"
    out = done.stdout
    assert "the best 3:" in out and "  1. TP" in out
    own = out.split("the profile's own layout:\n", 1)[1].splitlines()[0]
    assert seed_layout in own and "does not fit" not in own, own  # the seeds' hand-picked layout fits
    assert "launch with the first choice: -- parallel.tp=" in out
    assert "does not fit: training phase needs" in out  # a rejected family says by how much
    # CP is searched and refused with grpo_config's own reason; VPP and ETP are searched.
    assert "CP2, " in out and "context parallelism is not supported by the Megatron backend" in out
    assert " VPP2 " in out and " ETP2" in out


def test_the_first_choice_s_overrides_give_its_layout_back() -> None:
    from grpo_launch_qwen35_35b.profile import PROFILE

    base = PROFILE.config_for("gpu")
    for layout in (
        Layout(tp=2, pp=4, ep=2, rollout_tp=4, offload=False, recompute=True),
        Layout(tp=2, pp=2, ep=2, rollout_tp=4, offload=True, recompute=False, etp=2, vpp=2),
    ):
        cfg = grpo_config.load(base, layout.overrides(), num_experts=PROFILE.num_experts)
        assert current_layout(cfg) == layout
        assert current_layout(apply(grpo_config.load(base), layout)) == layout


def test_model_rules_name_what_tensor_parallelism_must_divide() -> None:
    heads = Heads(kv_heads=2, linear_key_heads=16, linear_value_heads=32, layers=40, experts=256)
    rules = {(layout.family, layout.vpp): rule for layout, rule in layouts(8, 8, heads)}
    assert "does not divide the model's 2 attention key-value heads" in rules[Family(4, 1, 8), None]
    assert "EP x ETP = 8 does not divide a pipeline stage's 4 devices" in rules[Family(2, 2, 8), None]
    assert "EP x ETP = 8 does not divide a pipeline stage's 4 devices" in rules[Family(2, 2, 4, etp=2), None]
    assert "PP x VPP = 16 chunks do not divide the model's 40 layers" in rules[Family(1, 8, 1), 2]
    assert rules[Family(2, 1, 8), None] is None and rules[Family(1, 8, 1), None] is None
    assert rules[Family(2, 2, 2, etp=2), 2] is None and rules[Family(2, 1, 4, etp=2, cp=2), None] is None


def test_one_estimate_recomputed_by_hand() -> None:
    """A 2-node, 16-device H100 cluster, TP2 PP2 VPP2 EP2 ETP2, rollout TP8, no offload, no recompute,
    on a made-up MoE; every phase's number as docs/LAYOUT_PLANNER.md writes its formula."""
    from grpo_launch_qwen35_35b.profile import PROFILE

    counts = ModelCounts(
        layers=8, hidden=2048, vocab=1000, experts=16, topk=2, expert_ffn=512, shared_expert_ffn=0,
        layer_dense=10_000_000, layer_experts=16_000_000, embedding=2_048_000, output=2_048_000, vision=0, other=0,
    )  # fmt: skip
    layout = Layout(tp=2, pp=2, ep=2, rollout_tp=8, offload=False, recompute=False, etp=2, vpp=2)
    cfg = apply(grpo_config.load(PROFILE.config_for("gpu"), ["device.nnodes=2"]), layout)
    spec = DEVICES["gpu"]
    got = estimate(cfg, counts, spec, per_node=8)

    world, dp, rows, seq = 16, 4, 32 * 5, 1024 + 2048
    tokens = rows * seq
    active = 8 * (10e6 + 16e6 * 2 / 16) + 2.048e6
    flops_s = world * spec.peak_tflops * 1e12 * update_mfu(2048)
    micro = 32 * 5 // dp  # one mini-batch of 32 prompts x 5, micro-batches of one row
    bubble = 1 + (2 - 1) / (micro * 2)  # two virtual stages halve the bubble
    per_rank = tokens / dp
    tp_s = 4 * 4 * per_rank * 2048 * 2 * 2 * (1 / 2) / (spec.intra_node_gbs * GB)
    routed = 4 * 4 * (per_rank / 2) * 2 * 2048 * 2
    ep_s = routed * (1 / 2) / (spec.intra_node_gbs * GB)
    etp_s = routed * (2 - 1) / (spec.intra_node_gbs * GB)  # gathered over the two expert-TP ranks
    comm = tp_s + ep_s + etp_s
    assert got["update"] == pytest.approx(6 * active * tokens / flops_s * bubble + comm, rel=1e-12)
    assert got["log_probs"] == pytest.approx(2 * (2 * active * tokens / flops_s * bubble + comm / 3), rel=1e-12)
    dense_per_rank, experts_per_rank = 4 * 10e6 / 2 + 4.096e6 / 2, 4 * 16e6 / (2 * 2)
    expert_dp = 16 // (2 * 2 * 2)
    dp_bytes = 6 * (dense_per_rank * (3 / 4) + experts_per_rank * (expert_dp - 1) / expert_dp)
    assert got["optimizer"] == pytest.approx(1 * dp_bytes / (spec.inter_node_gbs * GB), rel=1e-12)
    total_bytes = counts.total * 2
    decode = total_bytes / 8 / (spec.hbm_gbs * GB * DECODE_HBM_EFFICIENCY)
    prefill = 2 * active * rows * 1024 / (world * spec.peak_tflops * 1e12 * PREFILL_MFU)
    assert got["rollout"] == pytest.approx(2048 * RESPONSE_FILL * decode + prefill, rel=1e-12)
    assert got["weight_sync"] == pytest.approx(total_bytes / (world * SYNC_GBS_PER_PROCESS * GB), rel=1e-12)


@pytest.mark.parametrize("launcher", ["qwen35_35b", "qwen35_122b"])
def test_the_shipped_counts_are_those_of_the_shipped_config(launcher: str) -> None:
    """A plan reads `model_counts.json` instead of building the model when it was written for that
    config.json (same sha256): it must hold what counting the model gives."""
    import json

    from grpo_launch.memory_plan import COUNTS_FILE, _config_hash, _counted, model_counts

    directory = Path(__file__).parents[1] / "packages" / "launchers" / launcher / "src" / f"grpo_launch_{launcher}" / "architecture"
    stored = json.loads((directory / COUNTS_FILE).read_text())
    fix = f"regenerate: python -c \"from grpo_launch.memory_plan import write_counts; write_counts(Path('{directory}'))\""
    assert stored["config_sha256"] == _config_hash(directory), fix
    assert model_counts(str(directory)) == _counted(str(directory)), fix


def test_the_cluster_flags_without_plan_are_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("grpo-launch-35b")), "--dry-run", "--device", "gpu", "--nodes", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "--nodes describe the cluster --plan plans for" in done.stderr


def test_the_interconnect_the_user_names_changes_the_estimate() -> None:
    """--inter-node-gbs: an expert-parallel group across nodes is priced at the named bandwidth."""
    from grpo_launch.cost_model import device_spec
    from grpo_launch.memory_plan import model_counts
    from grpo_launch_qwen35_122b.profile import PROFILE

    counts = model_counts(str(PROFILE.architecture))
    cfg = apply(grpo_config.load(PROFILE.config_for("gpu"), num_experts=256), Layout(2, 1, 16, 8, True, True))
    slow = estimate(cfg, counts, device_spec("gpu"), per_node=8)
    fast = estimate(cfg, counts, device_spec("gpu", inter_node_gbs=100.0), per_node=8)
    assert fast["update"] < slow["update"] and fast["rollout"] == slow["rollout"]
    assert device_spec("gpu", intra_node_gbs=900.0).intra_node_gbs == 900.0
