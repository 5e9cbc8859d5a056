"""`--plan`: the parallel layouts a launch could use on a cluster, those whose memory plan fits in
both phases, ranked by an estimated step time (`cost_model`). A layout: actor TP (sequence parallel
with it), PP, VPP, EP, ETP, CP; rollout TP (its replicas fill the devices); offload of the actor's
weights, gradients and optimizer state on or off; full recompute on or off. Data parallel is what
is left. How the estimate is built, and what it leaves out: docs/LAYOUT_PLANNER.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import grpo_config
from grpo_config.schema import RefMegatronConfig, TrainerConfig
from grpo_launch.cost_model import (
    CPU_ADAM_PARAMS_PER_S,
    DECODE_HBM_EFFICIENCY,
    GB,
    PREFILL_MFU,
    RESPONSE_FILL,
    SYNC_GBS_PER_PROCESS,
    DeviceSpec,
    update_mfu,
)

GIB = 2**30
VPP_SIZES = (2, 4)  # virtual stages per pipeline stage tried beside none
PHASES = ("rollout", "log_probs", "update", "optimizer", "weight_sync")


@dataclass(frozen=True, order=True)
class Layout:
    tp: int
    pp: int
    ep: int
    rollout_tp: int
    offload: bool
    recompute: bool
    etp: int = 1
    vpp: int | None = None
    cp: int = 1

    @property
    def family(self) -> Family:
        return Family(self.tp, self.pp, self.ep, self.etp, self.cp)

    def describe(self) -> str:
        extras = [x for x, on in (("offload", self.offload), ("full recompute", self.recompute)) if on]
        vpp = f" VPP{self.vpp}" if self.vpp else ""
        return f"{self.family.describe(vpp=vpp)}, rollout TP{self.rollout_tp}" + (
            f" ({', '.join(extras)})" if extras else ""
        )

    def overrides(self) -> list[str]:
        """What a user pastes after `--` to launch with this layout."""
        flag = str(self.offload).lower()
        out = [
            f"parallel.tp={self.tp}",
            f"parallel.pp={self.pp}",
            f"parallel.vpp={self.vpp if self.vpp else 'null'}",
            f"parallel.ep={self.ep}",
            f"parallel.etp={self.etp}",
            f"parallel.cp={self.cp}",
            f"parallel.sequence_parallel={str(self.tp > 1).lower()}",
            f"rollout.tensor_parallel_size={self.rollout_tp}",
            f"actor.megatron.param_offload={flag}",
            f"actor.megatron.grad_offload={flag}",
            f"actor.megatron.optimizer_offload={flag}",
            f"actor.megatron.optimizer_offload_fraction={1.0 if self.offload else 0.0}",
            f"ref.megatron.param_offload={flag}",
        ]
        if self.recompute:
            out += [
                "actor.megatron.recompute_granularity=full",
                "actor.megatron.recompute_method=uniform",
                "actor.megatron.recompute_num_layers=1",
            ]
        else:
            out += [
                "actor.megatron.recompute_granularity=null",
                "actor.megatron.recompute_method=null",
                "actor.megatron.recompute_num_layers=null",
            ]
        return out


class Family(NamedTuple):
    """The model-parallel sizes a rejection is reported by."""

    tp: int
    pp: int
    ep: int
    etp: int = 1
    cp: int = 1

    def describe(self, *, vpp: str = "") -> str:
        extra = "".join(f" {name}{size}" for name, size in (("ETP", self.etp), ("CP", self.cp)) if size > 1)
        return f"TP{self.tp} PP{self.pp}{vpp} EP{self.ep}{extra}"


@dataclass(frozen=True)
class Heads:
    """What tensor parallelism must divide: attention's key-value heads, Gated DeltaNet's heads."""

    kv_heads: int
    linear_key_heads: int
    linear_value_heads: int
    layers: int
    experts: int

    @classmethod
    def from_config(cls, directory: Path) -> Heads:
        raw = json.loads((directory / "config.json").read_text())
        text = raw.get("text_config", raw)
        return cls(
            kv_heads=int(text.get("num_key_value_heads") or text["num_attention_heads"]),
            linear_key_heads=int(text.get("linear_num_key_heads") or 0),
            linear_value_heads=int(text.get("linear_num_value_heads") or 0),
            layers=int(text["num_hidden_layers"]),
            experts=int(text.get("num_experts") or 0),
        )


@dataclass
class Candidate:
    layout: Layout
    memory: Any = None  # grpo_launch.memory_plan.MemoryPlan
    phases: dict[str, float] = field(default_factory=dict)
    problem: str | None = None  # invalid, or does not fit

    @property
    def step_s(self) -> float:
        return sum(self.phases.values())


def _divisors(n: int, *, up_to: int) -> list[int]:
    return [d for d in range(1, min(n, up_to) + 1) if n % d == 0]


def layouts(world: int, per_node: int, heads: Heads) -> Iterator[tuple[Layout, str | None]]:
    """Every layout of the search space, with the model rule it breaks (None: none)."""
    powers = [d for d in _divisors(world, up_to=world) if d & (d - 1) == 0]
    for tp, pp, ep, rollout_tp, offload, recompute, cp in itertools.product(
        [d for d in powers if d <= per_node],
        [d for d in powers if d <= 8],
        [d for d in powers if heads.experts and heads.experts % d == 0] or [1],
        [d for d in powers if d <= per_node],
        (False, True),
        (False, True),
        (1, 2),
    ):
        etps = [d for d in powers if d <= tp] if heads.experts else [1]
        for etp, vpp in itertools.product(etps, [None, *VPP_SIZES] if pp > 1 else [None]):
            layout = Layout(tp, pp, ep, rollout_tp, offload, recompute, etp=etp, vpp=vpp, cp=cp)
            yield layout, _model_rule(layout, world, heads)


def _model_rule(layout: Layout, world: int, heads: Heads) -> str | None:
    tp, pp, ep = layout.tp, layout.pp, layout.ep
    for count, what in (
        (heads.kv_heads, "attention key-value heads"),
        (heads.linear_key_heads, "Gated DeltaNet key heads"),
        (heads.linear_value_heads, "Gated DeltaNet value heads"),
    ):
        if count and count % tp:
            return f"TP{tp} does not divide the model's {count} {what} (megatron-core splits them over TP ranks)"
    if heads.layers % pp:
        return f"PP{pp} does not divide the model's {heads.layers} layers"
    if layout.vpp and heads.layers % (pp * layout.vpp):
        return f"PP x VPP = {pp * layout.vpp} chunks do not divide the model's {heads.layers} layers"
    if world % (tp * pp):
        return f"TP x PP = {tp * pp} does not divide the {world} devices"
    if (world // pp) % (ep * layout.etp):
        return f"EP x ETP = {ep * layout.etp} does not divide a pipeline stage's {world // pp} devices"
    return None


def apply(cfg: TrainerConfig, layout: Layout) -> TrainerConfig:
    """`cfg` with `layout`'s settings (the reference inherits the actor's layout)."""
    mc = cfg.actor.megatron
    optimizer_overrides = dict(mc.override_optimizer_config)
    if not layout.offload:  # the CPU-optimizer switches go with the offload
        for key in ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer"):
            optimizer_overrides.pop(key, None)
    megatron = dataclasses.replace(
        mc,
        param_offload=layout.offload,
        grad_offload=layout.offload,
        optimizer_offload=layout.offload,
        optimizer_offload_fraction=1.0 if layout.offload else 0.0,
        override_optimizer_config=optimizer_overrides,
        recompute_granularity="full" if layout.recompute else None,
        recompute_method="uniform" if layout.recompute else None,
        recompute_num_layers=1 if layout.recompute else None,
    )
    # The reference inherits the actor's Megatron settings (its optimizer ones must equal the actor's).
    ref_megatron = (
        dataclasses.replace(RefMegatronConfig.of_actor(megatron), param_offload=layout.offload) if cfg.ref.megatron else None
    )
    return dataclasses.replace(
        cfg,
        parallel=dataclasses.replace(
            cfg.parallel,
            tp=layout.tp,
            pp=layout.pp,
            vpp=layout.vpp,
            ep=layout.ep,
            etp=layout.etp,
            cp=layout.cp,
            sequence_parallel=layout.tp > 1,
        ),
        actor=dataclasses.replace(cfg.actor, megatron=megatron),
        ref=dataclasses.replace(cfg.ref, parallel=None, megatron=ref_megatron),
        rollout=dataclasses.replace(cfg.rollout, tensor_parallel_size=layout.rollout_tp),
    )


def estimate(cfg: TrainerConfig, counts: Any, spec: DeviceSpec, *, per_node: int) -> dict[str, float]:
    """Seconds per step and phase (docs/LAYOUT_PLANNER.md has each formula)."""
    par, actor = cfg.parallel, cfg.actor
    world = cfg.device.world_size
    tp, pp, ep, etp, cp, vpp = par.tp, par.pp, par.ep, par.etp, par.cp, par.vpp or 1
    dp = world // (tp * pp * cp)
    expert_dp = world // (pp * ep * etp)
    rows = cfg.data.train_batch_size * cfg.rollout.n
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    tokens = rows * seq
    h, layers = counts.hidden, counts.layers
    expert_share = counts.topk / counts.experts if counts.experts else 0.0
    active = layers * (counts.layer_dense + counts.layer_experts * expert_share) + counts.output
    peak = spec.peak_tflops * 1e12
    mfu = update_mfu(h)
    recompute = actor.megatron.recompute_granularity == "full"
    passes = 1 + int(cfg.uses_reference_model)  # old log-probs, and the reference's
    rows_per_pipeline = max(1, actor.ppo_mini_batch_size * cfg.rollout.n // dp)
    micro = max(1, rows_per_pipeline // actor.ppo_micro_batch_size_per_device)
    bubble = 1 + (pp - 1) / (micro * vpp)
    intra = lambda group: spec.intra_node_gbs if group <= per_node else spec.inter_node_gbs  # noqa: E731
    tokens_per_rank = tokens / (dp * cp)
    # TP: two all-reduce (or reduce-scatter + all-gather) volumes per layer forward, two backward.
    tp_bytes = 4 * (layers / pp) * tokens_per_rank * h * 2 * 2 * (tp - 1) / tp
    # EP: dispatch + combine of each token's top-k copies, forward and backward.
    routed = 4 * (layers / pp) * (tokens_per_rank / tp) * counts.topk * h * 2 if counts.experts else 0
    ep_bytes = routed * (ep - 1) / ep
    # ETP: the routed tokens gathered over the expert-TP group before the experts, reduce-scattered after.
    etp_bytes = routed * (etp - 1)
    comm_update = tp_bytes / (intra(tp) * GB) + ep_bytes / (intra(ep) * GB) + etp_bytes / (intra(etp) * GB)
    update = (6 + 2 * recompute) * active * tokens / (world * peak * mfu) * bubble + comm_update
    log_probs = passes * (2 * active * tokens / (world * peak * mfu) * bubble + comm_update / 3)
    dense_per_rank = (layers / pp) * counts.layer_dense / tp + (counts.embedding + counts.output) / tp
    experts_per_rank = (layers / pp) * counts.layer_experts / (ep * etp)
    params_per_rank = dense_per_rank + experts_per_rank
    optimizer_steps = max(1, cfg.data.train_batch_size // actor.ppo_mini_batch_size) * actor.ppo_epochs
    dp_bytes = (4 + 2) * (dense_per_rank * (dp - 1) / dp + experts_per_rank * (expert_dp - 1) / expert_dp)
    optimizer = optimizer_steps * dp_bytes / (intra(world) * GB)
    if actor.megatron.param_offload or actor.megatron.optimizer_offload:
        # Weights, gradients off and back each step; the CPU optimizer reads fp32 gradients and
        # writes bf16 weights back each optimizer step.
        optimizer += 2 * params_per_rank * (2 + 4) / (spec.host_gbs * GB)
        optimizer += optimizer_steps * params_per_rank * (1 / CPU_ADAM_PARAMS_PER_S + (4 + 2) / (spec.host_gbs * GB))
    total_bytes = counts.total * 2
    generated = cfg.data.max_response_length * RESPONSE_FILL
    decode_step = (total_bytes / cfg.rollout.tensor_parallel_size) / (spec.hbm_gbs * GB * DECODE_HBM_EFFICIENCY)
    prefill = 2 * active * rows * cfg.data.max_prompt_length / (world * peak * PREFILL_MFU)
    rollout = generated * decode_step + prefill
    weight_sync = total_bytes / (world * SYNC_GBS_PER_PROCESS * GB)
    return {
        "rollout": rollout,
        "log_probs": log_probs,
        "update": update,
        "optimizer": optimizer,
        "weight_sync": weight_sync,
    }


@dataclass
class Search:
    candidates: list[Candidate]
    current: Layout
    spec: DeviceSpec
    world: int

    @property
    def fitting(self) -> list[Candidate]:
        return sorted((c for c in self.candidates if c.problem is None), key=lambda c: c.step_s)

    def find(self, layout: Layout) -> Candidate | None:
        return next((c for c in self.candidates if c.layout == layout), None)

    def rejected_families(self) -> dict[Family, str]:
        """For each (TP, PP, EP, ETP, CP) with no fitting variant: the reason of its closest variant."""
        out: dict[Family, str] = {}
        by_family: dict[Family, list[Candidate]] = {}
        for c in self.candidates:
            by_family.setdefault(c.layout.family, []).append(c)
        for family, members in sorted(by_family.items()):
            if any(c.problem is None for c in members):
                continue
            sized = [c for c in members if c.memory is not None]
            best = min(sized, key=lambda c: c.memory.peak) if sized else members[0]
            out[family] = best.problem or ""
        return out


def current_layout(cfg: TrainerConfig) -> Layout:
    mc = cfg.actor.megatron
    par = cfg.parallel
    return Layout(
        par.tp,
        par.pp,
        par.ep,
        cfg.rollout.tensor_parallel_size,
        bool(mc.param_offload and mc.grad_offload and mc.optimizer_offload),
        mc.recompute_granularity == "full",
        etp=par.etp,
        vpp=par.vpp if par.vpp and par.vpp > 1 else None,
        cp=par.cp,
    )


def search(cfg: TrainerConfig, model_dir: Path, spec: DeviceSpec) -> Search:
    """Every layout for `cfg`'s cluster (device.nnodes x device.devices_per_node of `spec`)."""
    from grpo_launch.memory_plan import model_counts, plan_memory

    counts = model_counts(str(model_dir))
    heads = Heads.from_config(model_dir)
    per_node = cfg.device.devices_per_node
    world = cfg.device.world_size
    device_bytes = int(spec.memory_gib * GIB)
    candidates = []
    for layout, rule in layouts(world, per_node, heads):
        candidate = Candidate(layout, problem=rule)
        candidates.append(candidate)
        if rule is not None:
            continue
        trial = apply(cfg, layout)
        try:
            grpo_config.validate(trial, num_experts=heads.experts or None)
        except grpo_config.ConfigError as exc:
            candidate.problem = "invalid: " + _first_problem(str(exc))
            continue
        candidate.memory = plan_memory(trial, counts, device_bytes=device_bytes)
        if not candidate.memory.fits:
            candidate.problem = _overflow(candidate.memory, device_bytes)
            continue
        if any("no KV cache is left" in note for note in candidate.memory.notes):
            candidate.problem = "does not fit: vLLM's weights fill its reservation (no KV cache)"
            continue
        candidate.phases = estimate(trial, counts, spec, per_node=per_node)
    return Search(candidates=candidates, current=current_layout(cfg), spec=spec, world=world)


def _first_problem(message: str) -> str:
    text = message.split("(1) ", 1)[-1]
    return text.split(" (2) ", 1)[0].strip()


def _overflow(memory: Any, device_bytes: int) -> str:
    phase = "training" if memory.training_peak >= memory.rollout_peak else "rollout"
    need = memory.peak
    return f"does not fit: {phase} phase needs {need / GIB:.1f} GiB, {(need - device_bytes) / GIB:.1f} GiB over"


def render(result: Search, *, top: int = 3) -> str:
    spec = result.spec
    lines = [
        f"layouts for {result.world} x {spec.name} ({spec.memory_gib:g} GiB each); estimated seconds per step "
        f"(cost model: grpo_launch/cost_model.py, docs/LAYOUT_PLANNER.md)",
    ]
    fitting = result.fitting
    lines.append(f"{len(fitting)} of {len(result.candidates)} fit and are valid; the best {min(top, len(fitting))}:")
    for rank, c in enumerate(fitting[:top], 1):
        lines += _candidate_lines(rank, c)
    current = result.find(result.current)
    lines.append("the profile's own layout:")
    if current is None:
        lines.append(f"  {result.current.describe()}: outside the search space")
    elif current.problem is None:
        rank = fitting.index(current) + 1
        best = fitting[0].step_s
        lines += _candidate_lines(rank, current)
        lines.append(f"  the first choice is estimated {current.step_s / best:.2f}x faster than it" if rank > 1 else "  it is the first choice")
    else:
        lines.append(f"  {result.current.describe()}: {current.problem}")
    rejected = result.rejected_families()
    if rejected:
        lines.append("rejected (TP, PP, EP, ETP, CP) families, with the reason of their closest variant:")
        by_reason: dict[str, list[str]] = {}
        for family, why in rejected.items():
            by_reason.setdefault(why, []).append(family.describe())
        for why, families in by_reason.items():
            shown = ", ".join(families[:6]) + (f" and {len(families) - 6} more" if len(families) > 6 else "")
            lines.append(f"  {shown}: {why}")
    if fitting:
        lines.append("launch with the first choice: -- " + " ".join(fitting[0].layout.overrides()))
    return "\n".join(lines) + "\n"


def _candidate_lines(rank: int, c: Candidate) -> list[str]:
    phases = ", ".join(f"{name} {c.phases[name]:.1f}" for name in PHASES)
    memory = c.memory
    return [
        f"  {rank}. {c.layout.describe()}: {c.step_s:.1f} s ({phases}); memory per device "
        f"{memory.training_peak / GIB:.1f} GiB training, {memory.rollout_peak / GIB:.1f} GiB rollout"
    ]

