"""What a resume may change, decided from the checkpoint before any worker starts: Megatron sizes
may change (the state is resharded on load: test_layouts.py), the backend may not, and a Megatron
run needs the checkpoint's Megatron state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_config.schema import ActorConfig, ParallelConfig, TrainerConfig
from grpo_trainer.driver.resume_layout import (
    LAYOUT_KEY,
    ResumeLayoutError,
    check_resume_layout,
    checkpoint_layout,
    layout_change,
    resume_layout_problem,
)


def _cfg(backend: str = "megatron", **parallel: object) -> TrainerConfig:
    return TrainerConfig(actor=ActorConfig(backend=backend), parallel=ParallelConfig(**parallel))


def _step(tmp_path: Path, cfg: TrainerConfig | None, *, megatron_state: bool = True) -> Path:
    step = tmp_path / "global_step_3"
    step.mkdir()
    state = {"global_step": 3, **({LAYOUT_KEY: checkpoint_layout(cfg)} if cfg else {})}
    (step / "trainer_state.json").write_text(json.dumps(state))
    if megatron_state and cfg is not None and cfg.actor.backend == "megatron":
        (step / "megatron").mkdir()
    return step


def test_same_model_parallel_sizes_resume_and_data_parallel_is_free(tmp_path: Path) -> None:
    step = _step(tmp_path, _cfg(tp=2, ep=2, sequence_parallel=True))
    assert resume_layout_problem(_cfg(tp=2, ep=2, sequence_parallel=True), step) is None
    check_resume_layout(_cfg(tp=2, ep=2, sequence_parallel=True), step)
    check_resume_layout(_cfg(), None)  # a fresh run


@pytest.mark.parametrize(
    ("asked", "change"),
    [({}, "tp=2 ep=2 -> tp=1 ep=1"), ({"pp": 2, "tp": 2, "ep": 2}, "pp=1 -> pp=2"), ({"pp": 2, "vpp": 2}, "tp=2 pp=1 vpp=1 ep=2 -> tp=1 pp=2 vpp=2 ep=1")],
)
def test_other_megatron_sizes_resume_and_say_so(tmp_path: Path, asked: dict, change: str) -> None:
    step = _step(tmp_path, _cfg(tp=2, ep=2, sequence_parallel=True))
    check_resume_layout(_cfg(**asked), step)
    assert layout_change(_cfg(**asked), step) == change
    assert layout_change(_cfg(tp=2, ep=2, sequence_parallel=True), step) is None
    assert layout_change(_cfg(), None) is None


def test_a_checkpoint_without_megatron_state_is_refused_with_the_way_out(tmp_path: Path) -> None:
    step = _step(tmp_path, _cfg(tp=2, ep=2, sequence_parallel=True), megatron_state=False)
    with pytest.raises(ResumeLayoutError) as refused:
        check_resume_layout(_cfg(tp=2, ep=2, sequence_parallel=True), step)
    message = str(refused.value)
    assert "holds no Megatron state (megatron/)" in message and "save_contents" in message
    assert f"actor.model_path={step / 'huggingface'} checkpoint.resume=none" in message


def test_backend_change_is_refused_and_old_checkpoints_pass(tmp_path: Path) -> None:
    step = _step(tmp_path, _cfg("torch"))
    assert "saved by actor.backend=torch; this run uses actor.backend=megatron" in resume_layout_problem(_cfg(), step)
    assert resume_layout_problem(_cfg("torch"), step) is None
    legacy = _step(tmp_path / "old", None) if (tmp_path / "old").mkdir() is None else None
    assert resume_layout_problem(_cfg(tp=4), legacy) is None  # saved before the record existed


def test_the_other_megatron_optimizer_kind_is_refused(tmp_path: Path) -> None:
    from grpo_config.schema import MegatronConfig

    plain = TrainerConfig(actor=ActorConfig(backend="megatron", megatron=MegatronConfig(use_distributed_optimizer=False)))
    step = _step(tmp_path, plain)
    assert resume_layout_problem(plain, step) is None
    problem = resume_layout_problem(_cfg(), step)
    assert "saved with actor.megatron.use_distributed_optimizer=False: set it so to resume" in problem
