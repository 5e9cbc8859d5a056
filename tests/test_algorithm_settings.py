"""The algorithm settings the driver reads, on the driver state (`_Run`) of the tiny preset built
without workers or Ray: DAPO's dynamic sampling (rounds, dropped groups, the limit), overlong
reward shaping and filtering, and rollout correction's mask and weights on the step's batch.

The rollout engine and the reward function are stood in for by scripted generations and scores,
so that which groups have equal rewards is known; everything after them is the driver's code."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer.algo import grpo_math
from grpo_trainer.batching import pad_rows
from grpo_trainer.driver.rollout_modes import Colocated, make_rollout_mode
from grpo_trainer.driver.timing import PhaseTimer
from grpo_trainer.protocols import Generation
from grpo_trainer.rewards import RewardResult
from grpo_trainer.trainer import _Run

SMALL = [
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "actor.ppo_micro_batch_size_per_device=4",
    "rollout.n=2",
]
DAPO = [*SMALL, "algorithm.filter_groups.enable=true", "data.gen_batch_size=4"]


@pytest.fixture(scope="module")
def preset(tmp_path_factory) -> dict:
    return tiny_preset(tmp_path_factory.mktemp("algorithms"))


@pytest.fixture
def make_run(preset) -> Iterator:
    runs: list[_Run] = []

    def make(*overrides: str) -> _Run:
        run = _Run(grpo_config.load(preset, list(overrides)))
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.rewards.close()


class _ScriptedEngines:
    """Stands in for the colocated engines (the policy workers' rollout side): `generate(chunks,
    params)` answers each round; waking, sleeping and the weight sync do nothing."""

    world_size = 1

    def __init__(self, generate) -> None:
        self.script = generate

    def rollout_wake(self) -> None:
        pass

    def rollout_sleep(self) -> None:
        pass

    def sync_weights(self) -> None:
        pass

    def generate(self, prompts, params, *, vision=None, on_done=None):
        return self.script(prompts, params)


def _script(run: _Run, rounds: list[list[float]], lengths: list[list[int]] | None = None) -> list:
    """Round r's generations get scores `rounds[r]` (n per prompt, prompt order) and, when given,
    response lengths `lengths[r]`; returns the sampling params each round was called with. The run's
    rollout mode is the colocated one `train()` builds, over scripted engines."""
    calls: list = []
    scores = iter(rounds)
    sizes = iter(lengths) if lengths is not None else None

    def generate(chunks, params):
        calls.append(params)
        lens = next(sizes) if sizes is not None else None
        out, k = [], 0
        for chunk, p in zip(chunks, params, strict=True):
            gens = []
            for prompt_index in range(len(chunk)):
                for _ in range(p.n):
                    length = lens[k] if lens else 3
                    gens.append(Generation(prompt_index=prompt_index, token_ids=[5] * length, logprobs=[-1.0] * length))
                    k += 1
            out.append(gens)
        return out

    run.mode = make_rollout_mode(
        run.cfg,
        _ScriptedEngines(generate),
        planner=run.planner,
        scorer=run.scorer,
        vision=run.vision,
        sampler=run.sampler,
        total_steps=run.total_steps,
    )
    assert isinstance(run.mode, Colocated)
    run.rewards.score = lambda items: RewardResult(scores=next(scores)[: len(items)])
    return calls


def _sample(run: _Run, prompts) -> object:
    return run.mode.sample(run.step, prompts, PhaseTimer())


def _prompts(run: _Run, seen: list | None = None):
    """The `next_prompts` callable `train()` hands the step, recording each round's prompts."""
    batches = iter(run.sampler)

    def next_prompts() -> list:
        prompts = [run.train_data[i] for i in next(batches)]
        if seen is not None:
            seen.append(prompts)
        return prompts

    return next_prompts


def test_dynamic_sampling_drops_equal_groups_and_generates_until_the_batch_is_full(make_run) -> None:
    run = make_run(*DAPO)
    # 4 prompts x n=2 per round. Round 1 keeps groups 1 and 3; round 2 keeps 0, 1 and 3.
    calls = _script(run, [[1, 1, 0, 1, 0, 0, 1, 0], [0, 1, 1, 0, 1, 1, 0, 1]])
    seen: list = []
    sampled = _sample(run, _prompts(run, seen))
    # The first 4 groups kept, in order: round 1's prompts 1 and 3, round 2's prompts 0 and 1.
    rollout = sampled.rollout
    assert len(seen) == 2 and len(rollout.generations) == 4 * 2
    assert len(set(rollout.group_ids)) == 4
    expected = [seen[0][1], seen[0][3], seen[1][0], seen[1][1]]
    assert [it.prompt_ids for it in rollout.items[::2]] == [it.prompt_ids for it in expected]
    assert sampled.scores.tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert sampled.metrics["train/num_gen_batches"] == 2
    assert sampled.metrics["dynamic_sampling/groups_generated"] == 8
    assert sampled.metrics["dynamic_sampling/groups_dropped"] == 3
    assert sampled.metrics["dynamic_sampling/groups_kept_unused"] == 1
    assert sampled.metrics["dynamic_sampling/reward_mean_generated"] == pytest.approx(9 / 16)
    # Each round samples with its own seeds.
    assert [p.seed for p in calls[0]] != [p.seed for p in calls[1]]


def test_dynamic_sampling_stops_with_an_error_at_the_round_limit(make_run) -> None:
    run = make_run(*DAPO, "algorithm.filter_groups.max_num_gen_batches=2")
    _script(run, [[1, 1, 0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 0, 0]])
    prompts = _prompts(run)
    with pytest.raises(RuntimeError, match=r"kept 1 of the 4 prompts .* after 2 generation rounds .* 7 of 8 groups"):
        _sample(run, prompts)


def test_without_dynamic_sampling_every_group_is_trained(make_run) -> None:
    run = make_run(*SMALL)
    _script(run, [[1, 1, 0, 0, 1, 1, 0, 0]])
    prompts = _prompts(run)
    sampled = _sample(run, prompts)
    assert len(sampled.rollout.generations) == 8 and "train/num_gen_batches" not in sampled.metrics


@pytest.mark.parametrize("metric,kept", [("acc", 0), ("seq_reward", 4)])
def test_the_filter_metric_sees_the_overlong_penalty_or_not(make_run, metric, kept) -> None:
    """Equal scores, different lengths: only the shaped reward (seq_reward) tells the pair apart."""
    run = make_run(
        *DAPO,
        f"algorithm.filter_groups.metric={metric}",
        "algorithm.filter_groups.max_num_gen_batches=1",
        "reward.overlong_buffer.enable=true",
        "reward.overlong_buffer.len=4",
        "reward.overlong_buffer.penalty_factor=1.0",
    )
    _script(run, [[1.0] * 8], lengths=[[2, 8, 3, 7, 1, 6, 4, 8]])
    prompts = _prompts(run)
    if kept == 0:
        with pytest.raises(RuntimeError, match="kept 0 of the 4"):
            _sample(run, prompts)
        return
    sampled = _sample(run, prompts)
    # budget 8, buffer 4: penalty -(length - 4) / 4 above 4 tokens
    expected = [1.0 - max(length - 4, 0) / 4 for length in (2, 8, 3, 7, 1, 6, 4, 8)]
    assert sampled.rewards.tolist() == pytest.approx(expected)
    assert sampled.scores.tolist() == [1.0] * 8


def test_the_overlong_penalty_counts_from_max_response_length_when_given(make_run) -> None:
    """reward.overlong_buffer.max_response_length (verl's DAPO reward manager's max_resp_len): the
    penalty ramps over the `len` tokens before it instead of before the response budget; past it
    the penalty keeps growing, as verl's."""
    shaped = ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=2", "reward.overlong_buffer.penalty_factor=1.0"]
    lengths = [2, 8, 3, 7, 1, 6, 4, 5]
    for limit, expected_at in ((None, 8), (6, 6)):
        run = make_run(*SMALL, *shaped, *([f"reward.overlong_buffer.max_response_length={limit}"] if limit else []))
        _script(run, [[0.0] * 8], lengths=[lengths])
        sampled = _sample(run, _prompts(run))
        expected = [-max(length - (expected_at - 2), 0) / 2 for length in lengths]
        assert sampled.rewards.tolist() == pytest.approx(expected)


def test_overlong_shaping_logs_only_when_asked(make_run) -> None:
    shaped = ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=2", "reward.overlong_buffer.penalty_factor=0.5"]
    for log, names in ((False, set()), (True, {"reward/overlong_penalty_mean", "reward/overlong_fraction"})):
        run = make_run(*SMALL, *shaped, f"reward.overlong_buffer.log={str(log).lower()}")
        _script(run, [[0.0] * 8], lengths=[[8, 8, 6, 6, 7, 7, 2, 2]])
        prompts = _prompts(run)
        sampled = _sample(run, prompts)
        assert set(sampled.metrics) == names
        if log:
            # budget 8, buffer 2: lengths 8 lose 0.5, 7 lose 0.25, 6 and 2 nothing
            assert sampled.metrics["reward/overlong_fraction"] == pytest.approx(4 / 8)
            assert sampled.metrics["reward/overlong_penalty_mean"] == pytest.approx(-1.5 / 8)


def _batch_with_log_probs(run: _Run, sampled) -> object:
    rollout = sampled.rollout
    batch = pad_rows(
        [it.prompt_ids for it in rollout.items],
        [g.token_ids for g in rollout.generations],
        pad_token_id=0,
        rollout_log_probs=[g.logprobs for g in rollout.generations],
    )
    g = torch.Generator().manual_seed(0)
    batch.old_log_probs = batch.rollout_log_probs + torch.randn(batch.input_ids.shape, generator=g) * 0.5
    return batch


def test_overlong_filtering_and_rollout_correction_shape_the_loss_mask_and_weights(make_run) -> None:
    run = make_run(
        *SMALL,
        "algorithm.overlong_filter=true",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=1.5",
        "algorithm.rollout_correction.rollout_rs=token_k2",
        "algorithm.rollout_correction.rollout_rs_threshold=0.1",
    )
    _script(run, [[0.0] * 8], lengths=[[8, 3, 8, 2, 5, 8, 1, 4]])
    prompts = _prompts(run)
    sampled = _sample(run, prompts)
    for gen in sampled.rollout.generations:
        gen.finish_reason = "length" if len(gen.token_ids) == 8 else "stop"
    batch = _batch_with_log_probs(run, sampled)
    positions = batch.response_mask.clone()
    metrics = run.correct(batch, sampled.rollout)
    cut = [len(g.token_ids) == 8 for g in sampled.rollout.generations]
    assert metrics["rollout/overlong_filtered_fraction"] == pytest.approx(3 / 8)
    for row, was_cut in enumerate(cut):
        if was_cut:
            assert batch.response_mask[row].sum() == 0
    lr = batch.old_log_probs - batch.rollout_log_probs
    kept = (positions > 0) & ~torch.tensor(cut).unsqueeze(-1) & (0.5 * lr.square() <= 0.1)
    assert torch.equal(batch.response_mask > 0, kept)
    expected = torch.where(positions > 0, torch.exp(lr).clamp(max=1.5), torch.zeros_like(lr))
    torch.testing.assert_close(batch.rollout_is_weights, expected)
    assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1


@pytest.mark.parametrize(
    "overrides,kind,next_coef",
    [
        ([], "kl", 0.05),
        (["algorithm.kl_penalty=mse"], "mse", 0.05),
        (
            ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.001", "algorithm.kl_ctrl.horizon=80"],
            "kl",
            None,
        ),
    ],
)
def test_kl_in_reward_settings_shape_the_rewards(make_run, overrides, kind, next_coef) -> None:
    run = make_run(*SMALL, "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.05", *overrides)
    _script(run, [[1.0, 0.0] * 4])
    sampled = _sample(run, _prompts(run))
    batch = _batch_with_log_probs(run, sampled)
    batch.ref_log_probs = batch.old_log_probs + 0.3 * torch.randn(batch.old_log_probs.shape, generator=torch.Generator().manual_seed(1))
    final, metrics = run.final_rewards(sampled.rewards, batch)
    per_token = grpo_math.kl_penalty(batch.old_log_probs, batch.ref_log_probs, kind) * batch.response_mask
    expected = sampled.rewards - 0.05 * per_token.sum(dim=-1).double()
    torch.testing.assert_close(final, expected)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.05
    if next_coef is not None:
        assert run.kl_controller.value == next_coef
    else:  # KL far above target: the coefficient grows by 1 + 0.2 * 8 sequences / 80
        assert run.kl_controller.value == pytest.approx(0.05 * 1.02)
    off = make_run(*SMALL)
    assert off.final_rewards(sampled.rewards, batch) == (sampled.rewards, {})


class _RecordingWorkers:
    """Stands in for the Ray workers (their own tests run them): log-probs are the engine's plus a
    fixed offset pattern, and the batch handed to `update` is kept, as the workers would receive it."""

    dp_size = 2

    def __init__(self) -> None:
        self.updated: list = []

    def log_probs(self, batch, shards, *, ref: bool = False):
        g = torch.Generator().manual_seed(7 if ref else 3)
        return batch.rollout_log_probs + torch.randn(batch.input_ids.shape, generator=g) * 0.4

    def update(self, batch, shards, *, num_mini_batches: int, ppo_epochs: int) -> dict[str, float]:
        self.updated.append(batch)
        return {"pg_loss": 0.0, "step_skipped": 0.0}


def test_the_update_receives_the_corrected_mask_weights_and_kl_shaped_advantages(make_run) -> None:
    """One `train_step` as `train()` runs it, with the workers stood in for: what reaches the
    update is the rollout correction's weights and mask, less the overlong-filtered rows, with
    advantages of the KL-shaped rewards."""
    run = make_run(
        *SMALL,
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_is_threshold=3.0",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=1.5",
        "algorithm.overlong_filter=true",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.kl_coef=0.2",
    )
    scores = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0, 1.0]
    _script(run, [scores], lengths=[[8, 3, 4, 2, 5, 8, 1, 4]])
    run.workers = workers = _RecordingWorkers()
    engines = run.mode.engines
    original_generate = engines.script

    def generate_with_finish_reasons(chunks, params):
        outputs = original_generate(chunks, params)
        for gens in outputs:
            for gen in gens:
                gen.finish_reason = "length" if len(gen.token_ids) == 8 else "stop"
        return outputs

    engines.script = generate_with_finish_reasons
    metrics = run.train_step(_prompts(run))
    (batch,) = workers.updated
    rollout_lp = batch.rollout_log_probs
    positions = rollout_lp != 0
    old, ref = batch.old_log_probs, batch.ref_log_probs
    lr = (old - rollout_lp) * positions
    seq_weight = torch.exp(lr.sum(dim=-1).clamp(-20, 20)).clamp(max=3.0)
    torch.testing.assert_close(batch.rollout_is_weights, seq_weight.unsqueeze(-1) * positions)
    kept = positions & ((-lr).abs() <= torch.log(torch.tensor(1.5)))
    cut = torch.tensor([length == 8 for length in (8, 3, 4, 2, 5, 8, 1, 4)]).unsqueeze(-1)
    assert torch.equal(batch.response_mask > 0, kept & ~cut)
    kl_sums = ((old - ref) * positions).sum(dim=-1).double()
    expected = grpo_math.group_advantages(torch.tensor(scores, dtype=torch.float64) - 0.2 * kl_sums, [0, 0, 1, 1, 2, 2, 3, 3])
    torch.testing.assert_close(batch.advantages, expected)
    assert metrics["rollout/overlong_filtered_fraction"] == pytest.approx(2 / 8)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.2


class _CountingWorkers(_RecordingWorkers):
    def __init__(self) -> None:
        super().__init__()
        self.log_prob_calls: list[bool] = []

    def log_probs(self, batch, shards, *, ref: bool = False):
        self.log_prob_calls.append(ref)
        return super().log_probs(batch, shards, ref=ref)


@pytest.mark.parametrize("bypass", [False, True])
def test_bypass_mode_takes_the_engines_log_probs_as_the_old_policys(make_run, bypass) -> None:
    """`algorithm.rollout_correction.bypass_mode=true`: the policy's log-prob pass is not asked for
    (only the reference's), the update and the KL in the reward read the engine's log-probs as the
    old policy's, and the engine-vs-policy drift metrics (then zero by construction) are not logged."""
    run = make_run(
        *SMALL,
        f"algorithm.rollout_correction.bypass_mode={str(bypass).lower()}",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.kl_coef=0.2",
    )
    scores = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0, 1.0]
    _script(run, [scores], lengths=[[8, 3, 4, 2, 5, 8, 1, 4]])
    run.workers = workers = _CountingWorkers()
    metrics = run.train_step(_prompts(run))
    (batch,) = workers.updated
    rollout_lp = batch.rollout_log_probs
    assert workers.log_prob_calls == ([True] if bypass else [False, True])
    assert torch.equal(batch.old_log_probs, rollout_lp) is bypass
    positions = (rollout_lp != 0).double()
    kl_sums = ((batch.old_log_probs - batch.ref_log_probs) * positions).sum(dim=-1).double()
    expected = grpo_math.group_advantages(torch.tensor(scores, dtype=torch.float64) - 0.2 * kl_sums, [0, 0, 1, 1, 2, 2, 3, 3])
    torch.testing.assert_close(batch.advantages, expected)
    assert ("rollout/logprob_abs_diff" in metrics) is not bypass
    assert ("timing/old_log_probs_s" in metrics) is not bypass
