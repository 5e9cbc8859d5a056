"""Settings the driver reads, as `train()` reads them: the run's length, the data pipeline, the
sampling parameters of training and validation rollouts, the collective timeout. The driver state
(`_Run`) of the tiny preset, built without workers or Ray."""

from __future__ import annotations

import typing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer.batching import pad_rows, rank_shards
from grpo_trainer.protocols import SamplingParams
from grpo_trainer.trainer import _Run
from grpo_trainer.workers.policy_worker import MIN_COLLECTIVE_TIMEOUT_S, collective_timeout_s


@pytest.fixture(scope="module")
def preset(tmp_path_factory) -> dict:
    return tiny_preset(tmp_path_factory.mktemp("settings"))


def _run(preset: dict, *overrides: str) -> _Run:
    return _Run(grpo_config.load(preset, list(overrides)))


def test_total_training_steps_or_else_total_epochs_decide_the_run_length(preset) -> None:
    batch = preset["data"]["train_batch_size"]
    assert _run(preset, "total_training_steps=null", "total_epochs=3").total_steps == 3 * (256 // batch)
    assert _run(preset, "total_training_steps=7", "total_epochs=3").total_steps == 7


def test_overlong_prompts_are_filtered_or_cut_as_the_data_settings_say(preset) -> None:
    # The tiny task's prompts are 3 tokens after the chat template.
    with pytest.raises(ValueError, match="256 overlong filtered"):  # all filtered: refused, not an empty run
        _run(preset, "data.max_prompt_length=2")
    cut = _run(
        preset, "data.max_prompt_length=2", "data.filter_overlong_prompts=false", "data.truncation=left"
    )
    assert cut.train_data.overlong == "truncate_left" and cut.train_data.report.n_truncated > 0
    assert len(cut.train_data) == 256 and max(len(cut.train_data[i].prompt_ids) for i in range(256)) == 2
    with pytest.raises(ValueError, match=r"data\.filter_overlong_prompts=true"):
        _run(
            preset, "data.max_prompt_length=2", "data.filter_overlong_prompts=false", "data.truncation=error"
        )


def test_shuffle_and_the_data_seed_order_the_batches(preset) -> None:
    ordered = _run(preset, "data.shuffle=false")
    assert next(iter(ordered.sampler)) == list(range(preset["data"]["train_batch_size"]))
    first, again, other = (next(iter(_run(preset, f"data.seed={s}").sampler)) for s in (1, 1, 2))
    assert first == again and first != other and first != next(iter(ordered.sampler))


def test_prompt_key_names_the_column_holding_the_prompt(preset, tmp_path: Path) -> None:
    rows = pq.read_table(preset["data"]["train_files"][0]).to_pylist()
    renamed = [{("messages" if k == "prompt" else k): v for k, v in row.items()} for row in rows]
    path = tmp_path / "renamed.parquet"
    pq.write_table(pa.Table.from_pylist(renamed), path)
    run = _run(preset, f"data.train_files=[{path}]", f"data.val_files=[{path}]", "data.prompt_key=messages")
    assert len(run.train_data) == len(rows)


def test_sampling_parameters_of_training_and_validation(preset) -> None:
    run = _run(
        preset,
        "rollout.n=4",
        "actor.ppo_micro_batch_size_per_device=16",
        "rollout.temperature=0.7",
        "rollout.top_p=0.9",
        "rollout.top_k=5",
        "rollout.max_tokens=6",
        "rollout.val_do_sample=true",
        "rollout.val_n=2",
        "rollout.val_temperature=0.3",
        "rollout.val_top_p=0.8",
        "rollout.val_top_k=3",
    )
    train, val = run.planner.sampling_params(validation=False), run.planner.sampling_params(validation=True)
    assert (train.n, train.temperature, train.top_p, train.top_k, train.max_tokens) == (4, 0.7, 0.9, 5, 6)
    assert (val.n, val.temperature, val.top_p, val.top_k, val.max_tokens) == (2, 0.3, 0.8, 3, 6)
    # verl's val_kwargs.do_sample=False (the default): greedy, one response, whatever the val_* say.
    greedy = _run(preset, "rollout.top_p=0.9", "rollout.val_n=2", "rollout.val_temperature=0.3").planner.sampling_params(
        validation=True
    )
    assert (greedy.n, greedy.temperature, greedy.top_p, greedy.top_k) == (1, 0.0, 1.0, -1)
    assert _run(preset).planner.sampling_params(validation=False).max_tokens == preset["data"]["max_response_length"]


def test_the_reward_settings_reach_the_reward_manager(preset) -> None:
    run = _run(preset, "reward.timeout_s=2.5", "reward.num_workers=3", "reward.grader=lenient")
    assert run.rewards.timeout_s == 2.5 and run.rewards._threads.num_workers == 3
    assert run.rewards.grader == "lenient" and _run(preset).rewards.grader == "verl"
    run.rewards.close()


def test_a_reward_file_and_its_function_name_reach_the_reward_manager(preset, tmp_path, monkeypatch) -> None:
    """verl's custom_reward_function.path / .name, as a pasted script gives them."""
    (tmp_path / "reward_fn.py").write_text("def score_em(solution_str, ground_truth, extra_info):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    run = _run(preset, "custom_reward_function.path=reward_fn.py", "custom_reward_function.name=score_em")
    item = {"solution_str": "x", "ground_truth": "y", "data_source": "any"}
    assert run.cfg.reward.custom_fn_name == "score_em" and run.rewards.score([item]).scores == [0.25]
    run.rewards.close()


def test_balance_batch_gives_the_ranks_equal_tokens_of_each_mini_batch(preset) -> None:
    """actor.balance_batch (verl's trainer.balance_batch, on by default there and here) decides how
    the step's rows go to two data-parallel ranks: by token count, or in slices when off."""
    cfg = grpo_config.load(preset, ["data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_device=1"])
    responses = [[1] * n for n in (9, 8, 1, 1, 7, 6, 1, 1)]  # 2 mini-batches of 4 rows
    batch = pad_rows([[5, 5]] * 8, responses, pad_token_id=0)
    balanced = rank_shards(cfg, batch, dp_size=2)
    assert cfg.actor.balance_batch and balanced == [[0, 3, 4, 7], [1, 2, 5, 6]]
    tokens = [sum(2 + len(responses[i]) for i in shard) for shard in balanced]
    off = grpo_config.load(preset, ["data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_device=1", "trainer.balance_batch=false"])
    assert rank_shards(off, batch, dp_size=2) == [[0, 1, 4, 5], [2, 3, 6, 7]] and tokens == [26, 24]


def test_collective_timeout_is_the_setting_or_past_the_longest_phase(preset) -> None:
    cfg = grpo_config.load(preset)
    assert collective_timeout_s(cfg) == max(MIN_COLLECTIVE_TIMEOUT_S, 1800.0 + 60.0)
    assert collective_timeout_s(grpo_config.load(preset, ["timeouts.collective_s=10800"])) == 10800.0
    assert collective_timeout_s(grpo_config.load(preset, ["timeouts.update_s=3600"])) == 3660.0


def test_the_advantage_settings_shape_grpo_advantages(preset) -> None:  # and algorithm.adv_estimator
    """algorithm.norm_adv_by_std divides by the group's (unbiased) std; algorithm.adv_eps is added
    to it. One group of four rewards [1, 0, 0, 0]: mean 0.25, std 0.5."""
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 0.0]), ["p"] * 4
    normed = _run(preset).advantages(rewards, groups)
    torch.testing.assert_close(normed, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6))
    centred = _run(preset, "algorithm.norm_adv_by_std=false").advantages(rewards, groups)
    torch.testing.assert_close(centred, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    damped = _run(preset, "algorithm.adv_eps=0.5").advantages(rewards, groups)
    torch.testing.assert_close(damped, torch.tensor([0.75, -0.25, -0.25, -0.25]) / 1.0)
    # algorithm.adv_estimator=rloo: each reward against the mean of the other three
    rloo = _run(preset, "algorithm.adv_estimator=rloo").advantages(rewards, groups)
    torch.testing.assert_close(rloo, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


class _RecordingGroup:
    """Stands in for the Ray `WorkerGroup` (whose own timeout handling test_worker_group tests on a
    real Ray cluster): records the limit each call is given. A multi-node group cannot exist here."""

    calls: typing.ClassVar[list[tuple[str, str, float]]] = []
    sent: typing.ClassVar[dict[str, typing.Any]] = {}
    world_size = 0

    def __init__(self, _cls, *, world_size: int, ready_timeout_s: float, **_kwargs) -> None:
        type(self).world_size = world_size
        self.calls.append(("ready", "timeouts.setup_s", ready_timeout_s))

    def call_rank(self, _rank, method, *, timeout_s, timeout_setting):
        self.calls.append((method, timeout_setting, timeout_s))
        return "127.0.0.1", 1

    def call(self, method, *, args_per_rank=None, timeout_s, timeout_setting, on_done=None, **kwargs):
        self.calls.append((method, timeout_setting, timeout_s))
        self.sent[method] = args_per_rank
        ranks = range(self.world_size)
        if method == "generate":
            return [("rank", r) for r in ranks]
        if method == "setup":
            return [{"dp_size": self.world_size, "dp_rank": r} for r in ranks]
        if method == "log_probs":
            return [
                torch.zeros(len(args[0].input_ids), args[0].input_ids.shape[1]) for args, _ in args_per_rank
            ]
        if method == "load_checkpoint":
            return [{"trainer_state": {}, "dataloader_state": None}] * self.world_size
        return [{"path": "x"} if method == "export_hf" else "x" for _ in ranks]

    def kill(self) -> None:
        pass


def test_each_phase_waits_as_long_as_its_timeout_setting(preset, monkeypatch) -> None:
    """timeouts.*: every call of the driver's facade carries its phase's limit and names its
    setting; device.nnodes x device.devices_per_node is the number of ranks started."""
    import ray

    from grpo_trainer.batching import pad_rows
    from grpo_trainer.workers import policy_workers

    monkeypatch.setattr(policy_workers, "WorkerGroup", _RecordingGroup)
    monkeypatch.setattr(ray, "put", lambda value: value)
    _RecordingGroup.calls = []
    limits = {
        "setup_s": 101,
        "generate_s": 102,
        "log_probs_s": 103,
        "update_s": 104,
        "weight_sync_s": 105,
        "checkpoint_s": 106,
        "wake_sleep_s": 107,
    }
    cfg = grpo_config.load(
        preset,
        ["device.nnodes=2", "device.devices_per_node=1", *(f"timeouts.{k}={v}" for k, v in limits.items())],
    )
    workers = policy_workers.PolicyWorkers(cfg)
    assert _RecordingGroup.world_size == 2 and workers.dp_size == 2
    batch = pad_rows([[1, 2], [3, 4]], [[5], [6, 7]], pad_token_id=0)
    workers.rollout_wake()
    workers.generate([[[1]], [[2]]], [SamplingParams()] * 2)
    workers.rollout_sleep()
    workers.log_probs(batch, [[0], [1]])
    workers.update(batch, [[0], [1]], num_mini_batches=1, ppo_epochs=1)
    workers.sync_weights()
    workers.save(1, trainer_state={}, dataloader_state={})
    workers.load(Path("x"))
    workers.export_checkpoint_hf(Path("x"))
    expected = {
        "ready": "setup_s",
        "rendezvous_address": "setup_s",
        "setup": "setup_s",
        "rollout_wake": "wake_sleep_s",
        "generate": "generate_s",
        "rollout_sleep": "wake_sleep_s",
        "log_probs": "log_probs_s",
        "update": "update_s",
        "sync_weights": "weight_sync_s",
        "save_checkpoint": "checkpoint_s",
        "load_checkpoint": "checkpoint_s",
        "export_checkpoint_hf": "checkpoint_s",
    }
    assert [call[0] for call in _RecordingGroup.calls] == list(expected)
    for method, setting, limit in _RecordingGroup.calls:
        assert (setting, limit) == (f"timeouts.{expected[method]}", limits[expected[method]]), method


def test_rollout_replicas_get_their_prompts_on_every_rank_and_answer_from_their_first(preset, monkeypatch) -> None:
    """rollout.tensor_parallel_size=2 over 4 ranks: 2 replicas (ranks 0-1, 2-3); every rank of a
    replica is sent that replica's prompts and sampling seed (each runs its shard of the engine),
    and the replica's generations are read from its first rank."""
    import ray

    from grpo_trainer.workers import policy_workers

    monkeypatch.setattr(policy_workers, "WorkerGroup", _RecordingGroup)
    monkeypatch.setattr(ray, "put", lambda value: value)
    _RecordingGroup.calls = []
    cfg = grpo_config.load(
        preset,
        ["device.devices_per_node=4", "actor.ppo_micro_batch_size_per_device=16", "rollout.engine=vllm", "rollout.tensor_parallel_size=2"],
    )
    workers = policy_workers.PolicyWorkers(cfg)
    assert workers.replicas.count == 2 and list(workers.replicas.ranks_of(1)) == [2, 3]
    params = [SamplingParams(seed=11), SamplingParams(seed=22)]
    out = workers.generate([[[1], [2]], [[3]]], params)
    sent = _RecordingGroup.sent["generate"]
    assert [args for args, _ in sent] == [([[1], [2]], params[0])] * 2 + [([[3]], params[1])] * 2
    assert out == [("rank", 0), ("rank", 2)]
    with pytest.raises(ValueError, match="3 prompt chunks / 3 params for 2 replicas"):
        workers.generate([[[1]]] * 3, [SamplingParams()] * 3)


def test_a_replica_stays_on_one_node(preset) -> None:
    with pytest.raises(grpo_config.ConfigError, match=r"does not divide device\.devices_per_node=2: a rollout replica"):
        _run(preset, "device.nnodes=2", "rollout.engine=vllm", "rollout.tensor_parallel_size=4")
    assert _run(preset, "rollout.engine=vllm", "rollout.tensor_parallel_size=2").planner.replicas == 1




def test_the_warmup_ratio_is_a_share_of_the_runs_steps(preset) -> None:
    """verl's lr_warmup_steps_ratio: int(ratio x the run's training steps) warmup steps, in the
    config the driver builds its workers with (`_Run.cfg`)."""
    run = _run(preset, "total_training_steps=10", "actor.lr_warmup_steps_ratio=0.285")
    assert (run.cfg.actor.lr_warmup_steps, run.cfg.actor.lr_warmup_steps_ratio) == (2, 0.0)
    by_epochs = _run(preset, "total_training_steps=null", "total_epochs=2", "actor.lr_warmup_steps_ratio=0.5")
    assert by_epochs.cfg.actor.lr_warmup_steps == by_epochs.total_steps // 2 > 0
    assert _run(preset, "actor.lr_warmup_steps=3").cfg.actor.lr_warmup_steps == 3
