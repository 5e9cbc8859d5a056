"""The step-time estimate `--plan` ranks layouts by: every constant in one place, each with where it
comes from. "measured" constants are grpo's own (docs/benchmarks.md); "vendor" ones are published
device figures; "assumed" ones are stand-ins until a measurement replaces them (the real-shape
issue's runs: rollout tokens/s and weight sync at the 35B's size). The model and its derivation:
docs/LAYOUT_PLANNER.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One accelerator and its links; every bandwidth in GB/s (per direction, per device)."""

    name: str
    memory_gib: float  # default device memory when --device-memory-gib is not given (vendor)
    peak_tflops: float  # dense bf16 (vendor)
    hbm_gbs: float  # (vendor)
    intra_node_gbs: float  # NVLink / HCCS (vendor)
    inter_node_gbs: float  # InfiniBand / RoCE, one NIC per device (vendor, typical cluster)
    host_gbs: float  # device <-> host over PCIe, what offloading moves over (vendor, practical)


DEVICES: dict[str, DeviceSpec] = {
    # H100 / H800 SXM 80 GB (the seed recipe's "80GB each"): 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3,
    # NVLink 4 900 GB/s both directions, 400 Gb/s NDR per GPU, PCIe 5 x16 ~50 GB/s in practice.
    "gpu": DeviceSpec(
        name="H100 80GB", memory_gib=80.0, peak_tflops=989.0, hbm_gbs=3350.0,
        intra_node_gbs=450.0, inter_node_gbs=50.0, host_gbs=50.0,
    ),
    # Ascend 910B 64 GB: ~313 TFLOP/s fp16/bf16, 1.6 TB/s HBM2e, HCCS ~196 GB/s per direction,
    # 200 Gb/s RoCE per NPU, PCIe 4 x16 ~25 GB/s.
    "npu": DeviceSpec(
        name="Ascend 910B 64GB", memory_gib=64.0, peak_tflops=313.0, hbm_gbs=1600.0,
        intra_node_gbs=196.0, inter_node_gbs=25.0, host_gbs=25.0,
    ),
}  # fmt: skip

# Actor-update MFU by hidden size (measured: H200, grpo's Megatron update with its fused kernels,
# medians of two runs at HEAD 54a649c, docs/benchmarks.md "Actor update MFU re-measured at HEAD":
# hidden 2048 0.310 / 0.304, hidden 4096 0.418 / 0.396). Between and beyond: linear, clamped. The
# NPU has no measurement: the GPU's is used (assumed).
UPDATE_MFU = ((2048, 0.307), (4096, 0.407))
# The log-prob passes (forward only, no recompute) run at the same MFU (assumed).
# Decode reads every weight of its shard once per generated token (a large batch hits all experts),
# at this share of HBM bandwidth (assumed; vLLM's decode is bandwidth-bound at these batch sizes;
# bench/gpu_rollout_decode.py measures it and PREFILL_MFU when a GPU is lent).
DECODE_HBM_EFFICIENCY = 0.5
# Mean generated length as a share of the response budget (assumed: geo3k responses of the seeds'
# budget; the run's own `response_length/mean` replaces it).
RESPONSE_FILL = 0.5
# Prefill runs at this MFU (assumed).
PREFILL_MFU = 0.3
# Weight sync, GB/s per trainer process (measured: H200, 4 of the 35B's layers through /dev/shm
# buckets, 1.16-1.31 GB/s; docs/benchmarks.md "Weight sync"). Processes sync their shards at once.
SYNC_GBS_PER_PROCESS = 1.2
# CPU Adam (optimizer_offload), parameters per second per device's share of host cores (assumed:
# megatron-core's fused CPU AdamW ran 1.5-1.6e9 params/s on one vCPU of the development machine,
# memory-bound, docs/benchmarks.md "Cost-model constants"; a GPU host's 8 ranks share its memory
# bandwidth, so less is taken until bench/gpu_rollout_decode.py measures a GPU host).
CPU_ADAM_PARAMS_PER_S = 1.0e9


def update_mfu(hidden: int) -> float:
    (h0, m0), (h1, m1) = UPDATE_MFU
    share = min(max((hidden - h0) / (h1 - h0), 0.0), 1.0)
    return m0 + share * (m1 - m0)


def device_spec(
    kind: str,
    *,
    memory_gib: float | None = None,
    intra_node_gbs: float | None = None,
    inter_node_gbs: float | None = None,
) -> DeviceSpec:
    """The device's defaults, with what the user named (`--device-memory-gib`, `--intra-node-gbs`,
    `--inter-node-gbs`) over them."""
    given = {"memory_gib": memory_gib, "intra_node_gbs": intra_node_gbs, "inter_node_gbs": inter_node_gbs}
    return replace(DEVICES[kind], **{k: v for k, v in given.items() if v is not None})
