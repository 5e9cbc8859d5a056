"""The device memory a run needs, per rank, before it starts: what `--dry-run` prints and what a
launch that cannot fit refuses with.

The derivation: docs/INTERNALS.md, `grpo_launch.memory_plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_config.schema import TrainerConfig
from grpo_launch.plan_config import choose_plan_config

GIB = 2**30
CONTEXT_BYTES = int(1.5 * GIB)
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True, kw_only=True)
class ModelCounts:
    """Parameter counts of a checkpoint, by where the Megatron backend puts them."""

    layers: int
    hidden: int
    vocab: int
    experts: int
    topk: int
    expert_ffn: int
    shared_expert_ffn: int
    layer_dense: int  # per decoder layer, routed experts excluded
    layer_experts: int  # routed experts, per decoder layer
    embedding: int
    output: int
    vision: int
    other: int  # final norm and the like (counted on the last stage)

    @property
    def total(self) -> int:
        return self.layers * (self.layer_dense + self.layer_experts) + self.embedding + self.output + self.vision + self.other


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") or config


COUNTS_FILE = "model_counts.json"  # beside a shipped config.json: its counts, keyed by its hash


def _config_hash(directory: Path) -> str:
    import hashlib

    return hashlib.sha256((directory / "config.json").read_bytes()).hexdigest()


def write_counts(directory: Path) -> Path:
    """Store `directory`'s counts beside its config.json (a launcher's shipped architecture), so a
    plan reads them without building the model (transformers and its kernel libraries take seconds
    to import). Regenerate: `python -c "from grpo_launch.memory_plan import write_counts; ..."`,
    or the test that checks them prints what to run."""
    counts = _counted(str(directory))
    path = directory / COUNTS_FILE
    path.write_text(json.dumps({"config_sha256": _config_hash(directory), "counts": dataclasses.asdict(counts)}, indent=1) + "\n")
    return path


@functools.lru_cache(maxsize=8)
def model_counts(model_path: str | Path) -> ModelCounts:
    """Counts from the checkpoint's config.json (transformers on the meta device), or from the
    `model_counts.json` beside it when that was written for this very config.json; cached, as a
    dry run plans in two places (the printed plan and its warnings)."""
    directory = Path(model_path)
    stored = directory / COUNTS_FILE
    if stored.is_file():
        record = json.loads(stored.read_text())
        if record.get("config_sha256") == _config_hash(directory):
            return ModelCounts(**record["counts"])
    return _counted(str(directory))


def _counted(model_path: str) -> ModelCounts:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    raw = json.loads((Path(model_path) / "config.json").read_text())
    config = AutoConfig.from_pretrained(model_path)
    vision_language = "vision_config" in raw
    # Building the model imports its modelling code, whose kernels libraries warn about the machine
    # (flash-linear-attention: "Triton is not supported"); nothing here runs a kernel.
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = (AutoModelForImageTextToText if vision_language else AutoModelForCausalLM).from_config(config)
    text = _text_config(raw)
    layers = int(text["num_hidden_layers"])
    per_layer_dense = [0] * layers
    per_layer_experts = [0] * layers
    embedding = output = vision = other = 0
    for name, param in model.named_parameters():
        count = param.numel()
        if "visual." in name:
            vision += count
        elif "embed_tokens" in name:
            embedding += count
        elif name.startswith("lm_head"):
            output += count
        elif match := _LAYER.search(name):
            index = int(match.group(1))
            if ".experts." in name:
                per_layer_experts[index] += count
            else:
                per_layer_dense[index] += count
        else:
            other += count
    if raw.get("tie_word_embeddings", text.get("tie_word_embeddings")) and output == 0:
        output = embedding  # Megatron keeps its own output layer copy on the last stage
    return ModelCounts(
        layers=layers,
        hidden=int(text["hidden_size"]),
        vocab=int(text["vocab_size"]),
        experts=int(text.get("num_experts") or text.get("num_local_experts") or 0),
        topk=int(text.get("num_experts_per_tok") or 0),
        expert_ffn=int(text.get("moe_intermediate_size") or 0),
        shared_expert_ffn=int(text.get("shared_expert_intermediate_size") or 0),
        layer_dense=max(per_layer_dense),
        layer_experts=max(per_layer_experts),
        embedding=embedding,
        output=output,
        vision=vision,
        other=other,
    )


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Bytes per rank. `device_bytes` None: not checked (no device memory known)."""

    device_bytes: int | None
    training: dict[str, int]
    rollout: dict[str, int]
    notes: list[str] = field(default_factory=list)
    model_config: dict[str, Any] = field(default_factory=dict)  # which config.json was counted

    @property
    def training_peak(self) -> int:
        return sum(self.training.values())

    @property
    def rollout_peak(self) -> int:
        return sum(self.rollout.values())

    @property
    def peak(self) -> int:
        return max(self.training_peak, self.rollout_peak)

    @property
    def fits(self) -> bool | None:
        return None if self.device_bytes is None else self.peak <= self.device_bytes

    def to_dict(self) -> dict[str, Any]:
        gib = lambda n: round(n / GIB, 2)  # noqa: E731
        return {
            **({"model_config": dict(self.model_config)} if self.model_config else {}),
            "device_gib": None if self.device_bytes is None else gib(self.device_bytes),
            "training_gib": {**{k: gib(v) for k, v in self.training.items()}, "total": gib(self.training_peak)},
            "rollout_gib": {**{k: gib(v) for k, v in self.rollout.items()}, "total": gib(self.rollout_peak)},
            "peak_gib": gib(self.peak),
            "fits": self.fits,
            "notes": list(self.notes),
        }

    def refusal(self) -> str | None:
        """Why this plan cannot run on its device, with the numbers; None when it fits or was not checked."""
        if self.fits is not False:
            return None
        phase = "training" if self.training_peak >= self.rollout_peak else "rollout"
        parts = self.training if phase == "training" else self.rollout
        listing = ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items() if v)
        return (
            f"the memory plan needs {self.peak / GIB:.1f} GiB per device in its {phase} phase ({listing} GiB), "
            f"and a device has {self.device_bytes / GIB:.1f} GiB: raise parallel.tp / parallel.pp / parallel.ep "
            "(or the device count), offload (actor.megatron.*_offload), recompute "
            "(actor.megatron.recompute_granularity), lower actor.ppo_micro_batch_size_per_device or "
            "rollout.gpu_memory_utilization. Set device.memory_gib if the device is not the one planned for."
        )


def pipeline_in_flight(pp: int, vpp: int | None, micro_batches: int) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once, in whole stages:
    megatron-core's 1F1B warm-up runs PP - 1 forwards before the first backward; interleaved, it runs
    2 (PP - 1) + (VPP - 1) PP chunks of 1 / VPP of a stage (Korthikanti et al.: 1 + (PP-1)/(PP VPP)
    stages' worth of PP micro-batches). Never more than the micro-batches there are."""
    if pp == 1:
        return 1.0
    chunks_per_stage = vpp if vpp and vpp > 1 else 1
    warm = pp - 1 if chunks_per_stage == 1 else 2 * (pp - 1) + (chunks_per_stage - 1) * pp
    return min(warm + 1, micro_batches * chunks_per_stage) / chunks_per_stage


def plan_memory(cfg: TrainerConfig, counts: ModelCounts, *, device_bytes: int | None) -> MemoryPlan:
    """The plan of `cfg` for the model `counts` describes, on devices of `device_bytes`."""
    par, mc, actor = cfg.parallel, cfg.actor.megatron, cfg.actor
    world = cfg.device.world_size
    megatron = actor.backend == "megatron"
    tp, pp, cp, ep, etp = (par.tp, par.pp, par.cp, par.ep, par.etp) if megatron else (1, 1, 1, 1, 1)
    dp = max(1, world // (tp * pp * cp))
    expert_dp = max(1, world // (pp * ep * etp))
    notes: list[str] = []
    if not megatron:
        notes.append("actor.backend=torch: every rank holds the whole model (no model parallelism)")

    stage_layers = math.ceil(counts.layers / pp)
    dense = stage_layers * counts.layer_dense / tp
    experts = stage_layers * counts.layer_experts / (ep * etp)
    first = counts.embedding / tp + counts.vision
    last = counts.output / tp + counts.other
    dense_params = dense + (first + last if pp == 1 else max(first, last))
    params = dense_params + experts

    weight_bytes = _DTYPE_BYTES[actor.dtype]
    master = 4 if weight_bytes < 4 else 0
    optimizer_per_param = master + 8
    sharded = megatron and mc.use_distributed_optimizer
    optimizer = optimizer_per_param * (dense_params / (dp if sharded else 1) + experts / (expert_dp if sharded else 1))
    if megatron and mc.optimizer_offload:
        optimizer = 0
        notes.append("optimizer state on the CPU (actor.megatron.optimizer_offload)")
    elif megatron and mc.optimizer_offload_fraction > 0:
        optimizer *= 1 - mc.optimizer_offload_fraction

    tokens = actor.ppo_micro_batch_size_per_device * (cfg.data.max_prompt_length + cfg.data.max_response_length)
    h, k, f = counts.hidden, counts.topk, counts.expert_ffn
    per_token_layer = 34 * h + (k * (4 * h + 6 * f) if counts.experts else 0)
    if counts.shared_expert_ffn:
        per_token_layer += 2 * h + 6 * counts.shared_expert_ffn
    micro_batches = max(1, actor.ppo_mini_batch_size * cfg.rollout.n // dp // actor.ppo_micro_batch_size_per_device)
    in_flight = pipeline_in_flight(pp, par.vpp if megatron else None, micro_batches)
    if in_flight > 1:
        notes.append(f"pipeline: the first stage holds {in_flight:g} micro-batches' activations at once")
    if megatron and mc.recompute_granularity == "full":
        layer_bytes = tokens * (2 * h * stage_layers * in_flight + per_token_layer)
        notes.append("full recompute: each layer keeps its input, one layer its activations")
    else:
        layer_bytes = tokens * per_token_layer * stage_layers * in_flight
    activations = layer_bytes / (tp * cp)
    logits = 3 * 4 * tokens * counts.vocab / (tp * cp)
    expert_stacks = 0.0
    if megatron and mc.transformer_impl == "local" and mc.moe_grouped_gemm and counts.experts:
        expert_stacks = stage_layers * counts.layer_experts / (ep * etp) * weight_bytes

    reference = 0.0
    if cfg.uses_reference_model and not (cfg.ref.megatron and cfg.ref.megatron.param_offload):
        reference = params * weight_bytes

    training = {
        "weights": int(params * weight_bytes),
        "gradients": int(params * 4),
        "optimizer": int(optimizer),
        "activations": int(activations + expert_stacks),
        "logits": int(logits),
        "reference": int(reference),
        "context": CONTEXT_BYTES,
    }
    resident = {
        "actor_weights": 0 if megatron and mc.param_offload else training["weights"],
        "actor_gradients": 0 if megatron and mc.grad_offload else training["gradients"],
        "actor_optimizer": 0 if megatron and mc.optimizer_offload else training["optimizer"],
        "reference": training["reference"],
    }
    if cfg.rollout.mode == "one_step_off":  # the engines are on devices of their own
        resident = {}
        notes.append("rollout.mode=one_step_off: the rollout phase is on the rollout workers' devices")
    rollout: dict[str, int] = {}
    if cfg.rollout.engine == "vllm" and device_bytes is not None:
        reserved = int(cfg.rollout.gpu_memory_utilization * device_bytes)
        rollout_weights = int(counts.total * 2 / cfg.rollout.tensor_parallel_size)
        rollout = {"vllm_reserved": reserved, **resident, "context": CONTEXT_BYTES}
        if rollout_weights >= reserved:
            notes.append(
                f"vLLM's weights ({rollout_weights / GIB:.1f} GiB per rank at rollout.tensor_parallel_size="
                f"{cfg.rollout.tensor_parallel_size}) do not fit its reservation ({reserved / GIB:.1f} GiB at "
                f"gpu_memory_utilization={cfg.rollout.gpu_memory_utilization}): no KV cache is left"
            )
        else:
            notes.append(f"vLLM KV cache ~{(reserved - rollout_weights) / GIB:.1f} GiB per rank after its weights")
    elif cfg.rollout.engine == "vllm":
        notes.append("vLLM reserves rollout.gpu_memory_utilization of the device: not planned without its size")
    return MemoryPlan(device_bytes=device_bytes, training=training, rollout=rollout, notes=notes)


def plan_for_launch(
    cfg: TrainerConfig, *, device_bytes: int | None, architecture: Path | None = None
) -> MemoryPlan | str:
    """The plan for `cfg` (device memory: `device.memory_gib`, else `device_bytes`), or why there is
    none. Counted from the config.json at actor.model_path; while that has none, from `architecture`
    (a directory holding the model's published config.json, handed down by the launcher), and the
    plan says which one it used (`grpo_launch.plan_config`)."""
    chosen = choose_plan_config(cfg.actor.model_path, architecture)
    if chosen.directory is None:
        return f"no config.json at actor.model_path={cfg.actor.model_path}: memory not planned"
    if cfg.device.memory_gib is not None:
        device_bytes = int(cfg.device.memory_gib * GIB)
    try:
        counts = model_counts(str(chosen.directory))
    except (ValueError, KeyError, OSError) as exc:  # a config transformers cannot build
        return f"the model config at {chosen.directory} could not be counted ({type(exc).__name__}: {exc}): memory not planned"
    plan = plan_memory(cfg, counts, device_bytes=device_bytes)
    return dataclasses.replace(plan, model_config=chosen.description)
