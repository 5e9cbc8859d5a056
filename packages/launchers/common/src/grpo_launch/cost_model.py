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
# at this share of HBM bandwidth (measured: H100, vLLM 0.26 compiled engine, Qwen3.5-35B-A3B's
# shape at 24 layers, 256 sequences, where every routed expert is touched: 0.563 and 0.549 in two
# runs; docs/benchmarks.md "Cost-model constants").
DECODE_HBM_EFFICIENCY = 0.56
# Mean generated length as a share of the response budget (assumed: geo3k responses of the seeds'
# budget; the run's own `response_length/mean` replaces it).
RESPONSE_FILL = 0.5
# Prefill MFU (measured: same engine, 64 prompts of 1024 tokens; median of six runs over two
# machines, 0.29-0.37).
PREFILL_MFU = 0.35
# Weight sync, GB/s per trainer process (measured: H100, the colocated engine's in-process
# `direct` transport, 16 of the 35B's layers, 28.95 GB; median of six syncs over two machines, 0.263
# s; the /dev/shm buckets an engine in another process reads run at 1.2-1.3 GB/s). Processes sync
# their shards at once.
SYNC_GBS_PER_PROCESS = 110.0
# CPU Adam (optimizer_offload), parameters per second per device's share of host cores (measured:
# megatron-core's fused CPU AdamW, 2e8 parameters, on the lent H100's 16-core host, median of ten
# steps over two machines: 3.9e9 at 16 threads, 2.7e9 at 8; the 8-thread figure is taken, as the
# ranks of an 8-GPU host share its memory bandwidth).
CPU_ADAM_PARAMS_PER_S = 2.7e9


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
