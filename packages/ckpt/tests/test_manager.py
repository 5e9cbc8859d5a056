from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from grpo_ckpt import (
    CheckpointCorruptError,
    CheckpointManager,
    CheckpointNotFoundError,
    restore_rng,
    verify,
)


@dataclasses.dataclass
class TinyTransformerConfig:
    num_layers: int = 2
    params_dtype: torch.dtype = torch.bfloat16
    activation_func: object = torch.nn.functional.silu


def _state(step: int) -> dict:
    gen = torch.Generator().manual_seed(step)
    model = {
        "embed.weight": torch.randn(16, 8, generator=gen).to(torch.bfloat16),
        "layers.0.mlp.weight": torch.randn(8, 8, generator=gen),
    }
    optimizer = {
        "state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(8, 8, generator=gen)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0], "foreach": None}],
    }
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": {"last_epoch": step, "base_lrs": [1e-3], "_last_lr": [1e-3 * step]},
        "trainer_state": {"global_step": step, "epoch": 0, "best": {"reward": 0.5}},
        "dataloader_state": {"epoch": 0, "index": 4 * step, "order": (3, 1, 2), 7: "int key"},
    }


def _save(manager: CheckpointManager, step: int, **kwargs: object) -> Path:
    return manager.save(step, **_state(step), **kwargs)


def _assert_tree_equal(a: object, b: object) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_tree_equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        for x, y in zip(a, b, strict=True):
            _assert_tree_equal(x, y)
    else:
        assert a == b


def test_save_load_round_trip_and_layout(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    with capture_logs() as logs:
        path = _save(manager, 3, transformer_config=TinyTransformerConfig(), extra_files={"tok/vocab.txt": b"a\nb"})
    assert path == tmp_path / "global_step_3"
    assert (tmp_path / "latest").read_text() == "global_step_3\n"
    names = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    assert {"manifest.json", "trainer_state.json", "transformer_config.json", "rng/rank_00000.json",
            "model/structure.json", "optimizer/structure.json", "scheduler/structure.json",
            "dataloader/structure.json", "extra/tok/vocab.txt"} <= names
    assert any(n.startswith("model/") and n.endswith(".safetensors") for n in names)
    assert not any(n.startswith("scheduler/") and n.endswith(".safetensors") for n in names)  # no tensors

    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 3 and set(manifest["files"]) == names - {"manifest.json"}
    for rel, record in manifest["files"].items():
        data = (path / rel).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert json.loads((path / "transformer_config.json").read_text()) == {
        "num_layers": 2, "params_dtype": "torch.bfloat16", "activation_func": "torch.nn.functional.silu"}
    saved = next(e for e in logs if e["event"] == "ckpt.saved")
    assert saved["bytes"] == manifest["total_bytes"] > 16 * 8 * 2 and saved["seconds"] > 0

    loaded = manager.load(path)
    expected = _state(3)
    assert loaded.step == 3
    for name in ("model", "optimizer", "scheduler", "trainer_state", "dataloader_state"):
        _assert_tree_equal(expected[name], getattr(loaded, name))
    assert loaded.rng is not None and set(loaded.rng) == {"python", "numpy", "torch", "device"}


def test_rng_capture_restore_reproduces_draws(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = _save(manager, 1)
    first = (random.random(), np.random.rand(), torch.rand(2))
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    restore_rng(manager.load(path).rng)
    again = (random.random(), np.random.rand(), torch.rand(2))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


def test_retention_keeps_newest_and_deletes_stale_incomplete(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2):
        _save(manager, step)
    (tmp_path / "global_step_2" / "manifest.json").unlink()  # a crashed save
    for step in (3, 4):
        _save(manager, step)
    assert [s for s, _ in manager.step_dirs()] == [4, 3]
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointManager(tmp_path, max_to_keep=0)


def test_incomplete_latest_falls_back_with_warning(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    _save(manager, 2)
    (tmp_path / "global_step_2" / "manifest.json").unlink()
    (tmp_path / "global_step_5").mkdir()  # a save killed right after mkdir
    with capture_logs() as logs:
        assert manager.resolve_resume("auto") == tmp_path / "global_step_1"
    events = [e["event"] for e in logs]
    assert events == ["ckpt.latest_incomplete", "ckpt.skip_incomplete"]
    assert all(e["log_level"] == "warning" for e in logs)


def test_resume_modes(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt")
    assert manager.resolve_resume("auto") is None  # fresh run
    _save(manager, 7)
    assert manager.resolve_resume("none") is None
    assert manager.resolve_resume("auto") == tmp_path / "ckpt" / "global_step_7"
    assert manager.resolve_resume(str(tmp_path / "ckpt" / "global_step_7")) == tmp_path / "ckpt" / "global_step_7"
    assert manager.resolve_resume(str(tmp_path / "ckpt")) == tmp_path / "ckpt" / "global_step_7"
    with pytest.raises(CheckpointNotFoundError, match="no such directory"):
        manager.resolve_resume(str(tmp_path / "nope"))
    (tmp_path / "ckpt" / "global_step_7" / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointNotFoundError, match="not a complete checkpoint"):
        manager.resolve_resume(str(tmp_path / "ckpt" / "global_step_7"))


def test_truncated_file_is_detected(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    path = _save(manager, 1)
    shard = next((path / "model").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointCorruptError, match=r"model/.*safetensors: \d+ bytes, manifest says \d+ \(truncated\?\)"):
        verify(path)
    with capture_logs() as logs:
        assert manager.latest_complete() is None
    assert "bytes, manifest says" in logs[0]["reason"]


def test_flipped_byte_is_detected_on_load(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    path = _save(manager, 1)
    shard = next((path / "optimizer").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF  # inside tensor data: safetensors itself would load it without complaint
    shard.write_bytes(bytes(data))
    assert manager.latest_complete() == path  # sizes match: only hashing finds it
    with pytest.raises(CheckpointCorruptError, match=r"(?s)1 of 8 files.*optimizer/.*sha256 .*Do not resume from it"):
        manager.load(path)
    assert manager.load(path, verify=False).step == 1


def test_resave_same_step_replaces_it(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    _save(manager, 2)
    state = _state(9)
    skipped = {"hf_export": {"strict": False, "source_keys_not_written": ["model.extra.weight"]}}
    manager.save(2, model=state["model"], optimizer=None, scheduler=None, trainer_state={"x": 1},
                 manifest_extra=skipped)
    loaded = manager.load(tmp_path / "global_step_2")
    _assert_tree_equal(state["model"], loaded.model)
    assert loaded.optimizer is None and loaded.trainer_state == {"x": 1}
    assert loaded.manifest["hf_export"] == skipped["hf_export"] and loaded.manifest["components"] == ["model"]


def test_bad_arguments_raise_value_errors_before_touching_the_disk(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    good = _save(manager, 1)
    with pytest.raises(ValueError, match=r"builtins\.set at state/0"):
        manager.save(1, model=None, optimizer={"state": {0: {1, 2}}}, scheduler=None, trainer_state={})
    assert manager.latest_complete() == good  # the existing step 1 was not deleted
    with pytest.raises(ValueError, match="non-negative int"):
        manager.save(-1, model=None, optimizer=None, scheduler=None, trainer_state={})
    with pytest.raises(ValueError, match="relative path"):
        manager.save(1, model=None, optimizer=None, scheduler=None, trainer_state={}, extra_files={"../x": b""})
    assert manager.latest_complete() == good


def test_tied_and_non_contiguous_tensors_round_trip(tmp_path: Path) -> None:
    embed = torch.randn(6, 4)
    model = {"embed.weight": embed, "lm_head.weight": embed, "t": torch.randn(4, 6).t(), "empty": torch.zeros(0)}
    manager = CheckpointManager(tmp_path)
    loaded = manager.load(manager.save(1, model=model, optimizer=None, scheduler=None, trainer_state={}))
    _assert_tree_equal(model, loaded.model)


def test_a_writers_files_join_the_manifest_and_a_failing_writer_completes_nothing(tmp_path: Path) -> None:
    """A library's own checkpoint files (Megatron's distributed checkpoint keeps its index in a
    hidden `.metadata`) are hashed with the rest; a writer that raises leaves `latest` where it was."""
    manager = CheckpointManager(tmp_path)

    def write(directory: Path) -> None:
        assert directory == tmp_path / "global_step_1" / "megatron" and not any(directory.iterdir())
        (directory / ".metadata").write_bytes(b"index")
        (directory / "__0_0.distcp").write_bytes(b"tensors")

    path = _save(manager, 1, writers={"megatron": write})
    manifest = manager.load(path).manifest
    assert {"megatron/.metadata", "megatron/__0_0.distcp"} <= set(manifest["files"])
    assert manifest["components"] == ["dataloader", "megatron", "model", "optimizer", "scheduler"]
    (path / "megatron" / ".metadata").write_bytes(b"INDEX")
    with pytest.raises(CheckpointCorruptError, match=r"megatron/\.metadata: sha256"):
        verify(path)

    good = _save(manager, 2)

    def fail(directory: Path) -> None:
        (directory / "part").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _save(manager, 3, writers={"megatron": fail})
    assert manager.latest_complete() == good
    with pytest.raises(ValueError, match=r"writers \['model'\]"):
        _save(manager, 4, writers={"model": write})
