"""The grouped experts' gradient accumulation under megatron-core's real DistributedDataParallel (one
gloo rank on the CPU): one add into the gradient buffer per stacked weight gives the same main
gradients, bit for bit, as Megatron's hook adding each expert's gradient, and the hook is told so.
The kernel count it saves is measured on the GPU (bench/megatron_gpu_run.py --profile)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from grpo_trainer.backends.megatron import grouped_experts

sys.path.insert(0, str(Path(__file__).parent))
from cpu_ranks import free_port

pytestmark = pytest.mark.megatron


class _Expert(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.linear_fc1 = torch.nn.Linear(hidden, 2 * ffn, bias=False)
        self.linear_fc2 = torch.nn.Linear(ffn, hidden, bias=False)


class _Experts(torch.nn.Module):
    """The parameter layout of megatron-core's `SequentialMLP` (what `GroupedMMExperts` keeps)."""

    def __init__(self, experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.local_experts = torch.nn.ModuleList(_Expert(hidden, ffn) for _ in range(experts))

    def forward(self, x: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return grouped_experts.grouped_swiglu_experts(
            x,
            counts,
            probs,
            [e.linear_fc1.weight for e in self.local_experts],
            [e.linear_fc2.weight for e in self.local_experts],
        )


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch):
    import torch.distributed as dist
    from megatron.core import parallel_state

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # DDP's buffers: no GPU here
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    if started_here:
        dist.destroy_process_group()


def _main_grads_after_two_micro_batches(fused: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not fused:
        monkeypatch.setattr(grouped_experts, "_main_grads_as_one", lambda weights: None)
    torch.manual_seed(0)
    experts = _Experts(4, 32, 16).to(torch.bfloat16)
    config = TransformerConfig(
        num_layers=1, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True
    )
    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True),
        experts,
    )
    gen = torch.Generator().manual_seed(1)
    for counts in ([3, 0, 5, 4], [1, 6, 2, 3]):  # the second micro-batch accumulates onto the first
        tokens = sum(counts)
        x = torch.randn(tokens, 32, generator=gen).bfloat16()
        upstream = torch.randn(tokens, 32, generator=gen)
        out = ddp(x, torch.tensor(counts), torch.rand(tokens, generator=gen))
        (out.float() * upstream).sum().backward()
    weights = [w for e in experts.local_experts for w in (e.linear_fc1.weight, e.linear_fc2.weight)]
    assert all(w.grad is None for w in weights)  # added already, or taken by Megatron's hook
    return [w.main_grad.clone() for w in weights], [w.grad_added_to_main_grad for w in weights]


def test_one_add_per_stacked_weight_equals_megatrons_add_per_expert(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fused, told = _main_grads_after_two_micro_batches(True, monkeypatch)
    per_expert, told_per_expert = _main_grads_after_two_micro_batches(False, monkeypatch)
    assert all(told) and not any(told_per_expert)
    assert all(g.abs().sum() > 0 for g in fused)
    for ours, theirs in zip(fused, per_expert, strict=True):
        assert torch.equal(ours, theirs)


def test_main_grads_not_evenly_spaced_take_the_per_expert_path() -> None:
    buffer = torch.zeros(100)
    weights = []
    for start in (0, 10, 30):  # uneven gaps: no single strided view
        w = torch.nn.Parameter(torch.zeros(2, 3))
        w.main_grad = buffer[start : start + 6].view(2, 3)
        weights.append(w)
    assert grouped_experts._main_grads_as_one(tuple(weights)) is None
    weights[2].main_grad = buffer[20:26].view(2, 3)
    view, reversed_order = grouped_experts._main_grads_as_one(tuple(weights))
    assert not reversed_order and view.shape == (3, 2, 3)
    view.add_(1.0)
    assert buffer[:6].eq(1).all() and buffer[6:10].eq(0).all() and buffer[20:26].eq(1).all()


def test_the_view_is_kept_while_the_buffer_stays_and_found_again_when_it_moves() -> None:
    def experts_in(buffer: torch.Tensor, weights: list[torch.nn.Parameter]) -> None:
        for index, w in enumerate(weights):  # Megatron's order: the last expert first
            start = (len(weights) - 1 - index) * 8
            w.main_grad = buffer[start : start + 6].view(2, 3)

    weights = [torch.nn.Parameter(torch.zeros(2, 3)) for _ in range(3)]
    experts_in(torch.zeros(24), weights)
    view, reversed_order = grouped_experts._stacked_main_grads(tuple(weights))
    assert reversed_order and grouped_experts._stacked_main_grads(tuple(weights))[0] is view
    moved = torch.zeros(24)
    experts_in(moved, weights)  # e.g. the gradient buffer freed and made again
    again, _ = grouped_experts._stacked_main_grads(tuple(weights))
    again.add_(torch.arange(3.0).view(3, 1, 1))  # in address order: expert 2, 1, 0
    assert again is not view and moved[16:22].eq(2).all() and moved[8:14].eq(1).all() and moved[:6].eq(0).all()
