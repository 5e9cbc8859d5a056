"""A resume at other Megatron model-parallel sizes is refused from the checkpoint's trainer state,
before any worker starts (the layout runs show the checkpoint holds one state per shard)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_config.schema import ActorConfig, ParallelConfig, TrainerConfig
from grpo_trainer.resume_layout import (
    LAYOUT_KEY,
    ResumeLayoutError,
    check_resume_layout,
    checkpoint_layout,
    resume_layout_problem,
)


def _cfg(backend: str = "megatron", **parallel: object) -> TrainerConfig:
    return TrainerConfig(actor=ActorConfig(backend=backend), parallel=ParallelConfig(**parallel))


def _step(tmp_path: Path, cfg: TrainerConfig | None) -> Path:
    step = tmp_path / "global_step_3"
    step.mkdir()
    state = {"global_step": 3, **({LAYOUT_KEY: checkpoint_layout(cfg)} if cfg else {})}
    (step / "trainer_state.json").write_text(json.dumps(state))
    return step


def test_same_model_parallel_sizes_resume_and_data_parallel_is_free(tmp_path: Path) -> None:
    step = _step(tmp_path, _cfg(tp=2, ep=2, sequence_parallel=True))
    assert resume_layout_problem(_cfg(tp=2, ep=2, sequence_parallel=True), step) is None
    check_resume_layout(_cfg(tp=2, ep=2, sequence_parallel=True), step)
    check_resume_layout(_cfg(), None)  # a fresh run


@pytest.mark.parametrize("asked", [{}, {"pp": 2}, {"tp": 2, "ep": 2, "vpp": None, "pp": 2}])
def test_other_sizes_are_refused_with_the_way_out(tmp_path: Path, asked: dict) -> None:
    step = _step(tmp_path, _cfg(tp=2, ep=2, sequence_parallel=True))
    with pytest.raises(ResumeLayoutError) as refused:
        check_resume_layout(_cfg(**asked), step)
    message = str(refused.value)
    assert "saved at backend=megatron tp=2 pp=1 vpp=1 ep=2" in message
    assert f"actor.model_path={step / 'huggingface'} checkpoint.resume=none" in message


def test_backend_change_is_refused_and_old_checkpoints_pass(tmp_path: Path) -> None:
    step = _step(tmp_path, _cfg("torch"))
    assert "backend=torch" in resume_layout_problem(_cfg(), step)
    assert resume_layout_problem(_cfg("torch"), step) is None
    legacy = _step(tmp_path / "old", None) if (tmp_path / "old").mkdir() is None else None
    assert resume_layout_problem(_cfg(tp=4), legacy) is None  # saved before the record existed
