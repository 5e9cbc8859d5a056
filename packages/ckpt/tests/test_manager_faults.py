"""A full disk: a save that fails leaves no partial folder behind (a retry would otherwise die on
the space it holds) and the previous checkpoint stays the resumable one; a save is refused before
it writes anything when the disk has less free space than the last checkpoint took."""

from __future__ import annotations

import contextlib
import errno
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from grpo_ckpt import CheckpointManager
from grpo_ckpt.errors import CheckpointSpaceError


def _state(step: int, *, mib: float = 0.25) -> dict:
    gen = torch.Generator().manual_seed(step)
    n = int(mib * 2**20 / 4)
    return {
        "model": {"w": torch.randn(n, generator=gen)},
        "optimizer": None,
        "scheduler": None,
        "trainer_state": {"global_step": step},
    }


@contextlib.contextmanager
def _small_filesystem(tmp_path: Path, mib: int):
    """A tmpfs of `mib` MiB (a real ENOSPC), where this machine lets the test mount one."""
    mount = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a small filesystem here ({done.stderr.decode().strip()}); the fake writer test covers it"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_save_that_fills_the_disk_removes_its_partial_folder(tmp_path: Path) -> None:
    with _small_filesystem(tmp_path, 3) as fs:
        manager = CheckpointManager(fs / "ckpt")
        first = manager.save(1, **_state(1, mib=0.5))
        free_before = shutil.disk_usage(fs).free
        with capture_logs() as logs, pytest.raises(BaseException) as info:  # torch DCP: BaseException
            manager.save(2, **_state(2, mib=8))  # larger than the disk
        # OSError in one process; torch's distributed checkpoint (a process group) wraps it in text.
        assert getattr(info.value, "errno", None) == errno.ENOSPC or "No space left on device" in str(
            info.value
        )
        assert not manager.step_dir(2).exists()
        assert any(e["event"] == "ckpt.partial_removed" for e in logs)
        assert shutil.disk_usage(fs).free >= free_before - 64 * 1024  # the space is back
        assert manager.latest_complete() == first
        manager.save(3, **_state(3, mib=0.5))  # a retry that fits succeeds
        assert manager.latest_complete() == manager.step_dir(3)


def test_a_failing_writer_removes_the_partial_folder_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    """The same contract where no filesystem can be mounted: the failure comes from a writer."""
    manager = CheckpointManager(tmp_path / "ckpt")
    first = manager.save(1, **_state(1))

    def full_disk(directory: Path) -> None:
        (directory / "part").write_bytes(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "part"))

    with pytest.raises(OSError):
        manager.save(2, **_state(2), writers={"megatron": full_disk})
    assert not manager.step_dir(2).exists()
    assert manager.latest_complete() == first
    assert manager.resolve_resume("auto") == first


def test_a_save_is_refused_before_it_starts_when_the_last_checkpoint_would_not_fit(
    tmp_path, monkeypatch
) -> None:
    manager = CheckpointManager(tmp_path / "ckpt")
    first = manager.save(1, **_state(1, mib=1))
    size = sum(f.stat().st_size for f in first.rglob("*") if f.is_file())
    real = shutil.disk_usage
    monkeypatch.setattr(
        "grpo_ckpt.manager.shutil.disk_usage", lambda path: real(path)._replace(free=size // 2)
    )
    with pytest.raises(CheckpointSpaceError) as info:
        manager.save(2, **_state(2, mib=1))
    message = str(info.value)
    assert f"{size // 2 / 2**30:.2f} GiB free" in message and f"{size / 2**30:.2f} GiB" in message
    assert "global_step_1" in message and "run the same command again" in message
    assert not manager.step_dir(2).exists()
    monkeypatch.setattr("grpo_ckpt.manager.shutil.disk_usage", lambda path: real(path)._replace(free=size))
    manager.save(2, **_state(2, mib=1))  # room for it: saved
