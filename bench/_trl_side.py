"""The Hugging Face TRL side of bench_grpo_vs_trl.py: `trl.GRPOTrainer` configured from a
`BenchSpec` (same model directory, prompts, group size, lengths, sampling, optimizer steps per
rollout, KL on/off and reward function as our trainer), timed step by step with a callback.

Runs in its own process (the `bench` hatch env, which has trl). One TRL "GRPO step" here is one
generation batch (`prompts_per_step` x `n` completions) and the optimizer steps made on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _trl_spec import BenchSpec, SideResult, per_step, tree_cpu_seconds

# Our loss_agg_mode -> TRL's loss_type with the same normalisation (see GRPOConfig.loss_type).
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def read_rows(files: list[str]) -> list[dict[str, Any]]:
    """verl-format rows (parquet or jsonl) flattened to TRL's columns: a conversational `prompt`
    plus `ground_truth` and `data_source`, which TRL hands to the reward function as kwargs."""
    import json

    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for name in files:
        path = Path(name)
        if path.suffix == ".parquet":
            raw = pq.read_table(path).to_pylist()
        else:
            raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for row in raw:
            rows.append(
                {
                    "prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
                    "ground_truth": str(row["reward_model"]["ground_truth"]),
                    "data_source": row["data_source"],
                }
            )
    if not rows:
        raise ValueError(f"no rows in {files}")
    return rows


class RolloutLedger:
    """Filled by the reward function (called once per generation batch): rewards and sampled tokens."""

    def __init__(self) -> None:
        self.mean_rewards: list[float] = []
        self.generated_tokens: list[int] = []


def make_reward_func(ledger: RolloutLedger, *, custom_fn: str | None):
    """Our reward as a TRL reward function, resolved as our RewardManager resolves it: `custom_fn`
    (the config's reward.custom_fn, e.g. the tiny preset's task) for every row, else the function
    registered for each row's data_source."""
    from grpo_trainer.rewards import get_reward_fn, load_custom_fn
    from grpo_trainer.rewards.protocol import as_score

    custom = load_custom_fn(custom_fn) if custom_fn else None

    def grpo_registered_reward(
        *,
        completions: list[Any],
        completion_ids: list[list[int]],
        ground_truth: list[str],
        data_source: list[str],
        **_: Any,
    ) -> list[float]:
        scores = []
        for completion, truth, source in zip(completions, ground_truth, data_source, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            fn = custom or get_reward_fn(source)
            scores.append(as_score(fn(text, truth, None)))
        ledger.mean_rewards.append(sum(scores) / len(scores))
        ledger.generated_tokens.append(sum(len(ids) for ids in completion_ids))
        return scores

    return grpo_registered_reward


def trl_batch_rows(spec: BenchSpec, *, procs: int, requested: int | None) -> int:
    """Rows per TRL forward/backward in each process (per_device_train_batch_size). Default: what
    our workers run per forward in total (micro batch x workers) spread over the TRL processes,
    capped at one mini-batch."""
    mini_rows = spec.mini_batch_prompts * spec.n
    rows = requested or min(spec.micro_batch_rows * spec.world_size, mini_rows) // procs
    if rows < 1 or mini_rows % (rows * procs):
        raise ValueError(
            f"--trl-batch-rows {rows} x {procs} process(es) must divide the mini-batch of {mini_rows} completions"
        )
    return rows


def grpo_config(spec: BenchSpec, *, output_dir: Path, batch_rows: int, procs: int, experts: str):
    import torch
    from trl import GRPOConfig

    if spec.loss_agg_mode not in LOSS_TYPES:
        raise ValueError(
            f"loss_agg_mode {spec.loss_agg_mode!r} has no TRL equivalent; use one of {sorted(LOSS_TYPES)}"
        )
    rollout_rows = spec.completions_per_step
    mini_rows = spec.mini_batch_prompts * spec.n
    model_kwargs: dict[str, Any] = {"dtype": torch.float32}  # fp32 master weights, as ours
    if experts != "default":
        model_kwargs["experts_implementation"] = experts
    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=spec.dtype == "bfloat16",
        fp16=spec.dtype == "float16",
        model_init_kwargs=model_kwargs,
        seed=spec.seed,
        data_seed=spec.seed,
        max_steps=spec.total_steps * spec.optimizer_steps_per_rollout,
        # Batch geometry: one generation batch per GRPO step, one optimizer step per mini-batch.
        per_device_train_batch_size=batch_rows,
        gradient_accumulation_steps=mini_rows // (batch_rows * procs),
        steps_per_generation=rollout_rows // (batch_rows * procs),
        num_iterations=spec.ppo_epochs,
        num_generations=spec.n,
        max_completion_length=spec.max_response_length,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=max(spec.top_k, 0),
        # Objective.
        beta=spec.kl_loss_coef if spec.use_kl_loss else 0.0,
        loss_type=LOSS_TYPES[spec.loss_agg_mode],
        epsilon=spec.clip_ratio_low,
        epsilon_high=spec.clip_ratio_high,
        scale_rewards="group" if spec.norm_adv_by_std else "none",
        router_aux_loss_coef=0.0,  # our torch backend adds no MoE load-balancing loss
        # Optimizer: AdamW, constant lr after linear warm-up, grad-norm clip.
        optim="adamw_torch",
        learning_rate=spec.lr,
        lr_scheduler_type="constant_with_warmup" if spec.lr_warmup_steps else "constant",
        warmup_steps=spec.lr_warmup_steps,
        weight_decay=spec.weight_decay,
        max_grad_norm=spec.grad_clip,
        gradient_checkpointing=spec.gradient_checkpointing,  # TRL's default is on: follow ours
        # Nothing else in the timed loop: no eval, saves, hub, trackers or completion tables.
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def notes(
    spec: BenchSpec, *, batch_rows: int, experts: str, procs: int, threads: int, dist_type: str
) -> list[str]:
    kl = (
        f"k3 KL to a frozen reference, beta={spec.kl_loss_coef}"
        if spec.use_kl_loss
        else "no KL, no reference model"
    )
    return [
        f"trl.GRPOTrainer, {procs} process(es) (accelerate {dist_type}) x {threads} torch thread(s)",
        f"rollout: transformers generate on the policy, {spec.completions_per_step // procs} sequences per process",
        f"old log-probs recomputed, {kl}, router aux loss off",
        f"{spec.optimizer_steps_per_rollout} optimizer step(s) per rollout, {batch_rows} rows per forward/backward "
        "per process, "
        f"loss_type={LOSS_TYPES.get(spec.loss_agg_mode)}",
        f"MoE experts implementation: {experts}; gradient checkpointing {'on' if spec.gradient_checkpointing else 'off'}",
    ]


def run_trl(
    spec: BenchSpec, *, workdir: Path, process_start: float, batch_rows: int | None, experts: str
) -> SideResult | None:
    """Train with TRL and time it. Started by torchrun when `WORLD_SIZE` > 1 (accelerate then runs
    DDP over gloo); every process returns, rank 0 with the result, the others with None."""
    import torch
    import torch.distributed as dist
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from grpo_trainer.backends.hf_kernels import use_torch_kernels_on_cpu

    # The bench environment holds flash-linear-attention (megatron-core needs it): transformers <
    # 5.20 then binds Qwen3.5's Gated DeltaNet to FLA's Triton kernels, which have no CPU driver
    # ("0 active drivers"). CPU tensors go to transformers' own PyTorch functions instead, the stock
    # ones TRL would run without FLA (our side's shorter chunk is not applied here).
    use_torch_kernels_on_cpu()
    procs = int(os.environ.get("WORLD_SIZE", "1"))
    threads = max(1, spec.threads // procs)
    torch.set_num_threads(threads)
    rows_per_forward = trl_batch_rows(spec, procs=procs, requested=batch_rows)
    ledger = RolloutLedger()
    per_rollout = spec.optimizer_steps_per_rollout
    # The process tree whose CPU time is counted: torchrun and its ranks, or this process alone.
    tree_root = os.getppid() if procs > 1 else os.getpid()
    step_ends: list[float] = []
    step_cpu: list[float] = []
    tokens_seen: list[int] = []  # gathered over processes by TRL
    first_begin: list[float] = []
    first_cpu: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if not first_begin:
                first_begin.append(time.perf_counter())
                first_cpu.append(tree_cpu_seconds(tree_root))

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % per_rollout == 0:  # the last optimizer step of a rollout
                step_ends.append(time.perf_counter())
                step_cpu.append(tree_cpu_seconds(tree_root))
                tokens_seen.append(int(state.num_input_tokens_seen))

    tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
    args = grpo_config(
        spec, output_dir=workdir / "trl_out", batch_rows=rows_per_forward, procs=procs, experts=experts
    )
    trainer = GRPOTrainer(
        model=spec.model_dir,
        reward_funcs=make_reward_func(ledger, custom_fn=spec.reward_custom_fn),
        args=args,
        train_dataset=Dataset.from_list(read_rows(spec.train_files)),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.train()
    if len(step_ends) != spec.total_steps or len(ledger.generated_tokens) != spec.total_steps:
        raise RuntimeError(
            f"TRL ran {len(step_ends)} steps and {len(ledger.generated_tokens)} rollouts, expected {spec.total_steps}"
        )
    # Each process saw its own share of the completions: add the ledgers up.
    generated = torch.tensor(ledger.generated_tokens, dtype=torch.float64)
    rewards = torch.tensor(ledger.mean_rewards, dtype=torch.float64)
    if procs > 1:
        dist.all_reduce(generated)
        dist.all_reduce(rewards)
        rewards /= procs
    if trainer.accelerator.process_index != 0:
        return None
    w = spec.warmup_steps
    return SideResult(
        name="TRL",
        setup_s=first_begin[0] - process_start,
        step_s=per_step([first_begin[0], *step_ends], first_measured=w),
        cpu_s=per_step([first_cpu[0], *step_cpu], first_measured=w),
        generated_tokens=int(generated[w:].sum()),
        trained_tokens=tokens_seen[-1] - (tokens_seen[w - 1] if w else 0),
        rewards=rewards.tolist(),
        notes=notes(
            spec,
            batch_rows=rows_per_forward,
            experts=experts,
            procs=procs,
            threads=threads,
            dist_type=str(trainer.accelerator.distributed_type.value),
        ),
    )


def describe_versions() -> Mapping[str, str]:
    import torch
    import transformers
    import trl

    return {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
