"""How a failed launch ends (`grpo_launch.failure.describe`): each kind of failure the end-to-end
fault tests provoke (tests/test_faults.py, in the `full` tier) judged on its own, in milliseconds,
with the exception the real run raises built by hand (no run, no Ray)."""

from __future__ import annotations

import errno
from pathlib import Path

from grpo_launch.failure import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, describe
from grpo_trainer.workers.group import WorkerError, WorkerTimeoutError

LOG = Path("/runs/a/run.log")


def test_ctrl_c_is_130_and_says_how_to_resume(tmp_path: Path) -> None:
    failure = describe(KeyboardInterrupt(), checkpoint_dir=str(tmp_path), log_path=LOG)
    assert failure.exit_code == EXIT_INTERRUPTED
    assert failure.line.startswith("interrupted. No complete checkpoint in") and "resume" in failure.line
    assert failure.line.endswith(f"(traceback: {LOG}).")


def test_a_workers_value_error_is_exit_2_with_its_rank_and_phase() -> None:
    error = WorkerError("...", rank=1, phase="update", cause=ValueError("reward.custom_fn: no file x.py\n  set it"))
    failure = describe(error, checkpoint_dir=None, log_path=None)
    assert (failure.exit_code, failure.line) == (EXIT_USAGE, "reward.custom_fn: no file x.py set it (rank 1, update)")


def test_a_killed_worker_is_exit_2_naming_memory_and_the_last_checkpoint() -> None:
    error = WorkerError("...", rank=0, phase="save_checkpoint", died=True, summary="Worker exit type: SYSTEM_ERROR x")
    failure = describe(error, checkpoint_dir=None, log_path=None)
    assert failure.exit_code == EXIT_USAGE
    assert failure.line.startswith("rank 0's process died during save_checkpoint (Ray's exit type SYSTEM_ERROR)")
    assert "out of memory" in failure.line and "No checkpoint was written." in failure.line


def test_a_full_disk_names_the_path_and_its_free_space_even_when_wrapped(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "ckpt" / "model.pt"))
    failure = describe(RuntimeError("save failed"), checkpoint_dir=None, log_path=None)
    assert failure.exit_code == EXIT_BUG  # an unexplained error is a bug in grpo
    wrapped = RuntimeError("torch.distributed.checkpoint failed")
    wrapped.__cause__ = full
    failure = describe(wrapped, checkpoint_dir=None, log_path=None)
    assert failure.exit_code == EXIT_USAGE
    assert failure.line.startswith(f"disk full writing {tmp_path / 'ckpt' / 'model.pt'} (") and "GiB free there" in failure.line
    as_text = WorkerError("...", rank=2, phase="save_checkpoint", cause=RuntimeError("[Errno 28] No space left on device"))
    assert describe(as_text, checkpoint_dir=None, log_path=None).line.startswith("disk full (no space left on device) (rank 2")


def test_a_timeout_is_exit_2_with_its_first_line() -> None:
    error = WorkerTimeoutError("rank 1 gave no answer to update within timeouts.update_s=5 s.\nstack ...")
    failure = describe(error, checkpoint_dir=None, log_path=LOG)
    assert failure.exit_code == EXIT_USAGE
    assert failure.line.startswith("rank 1 gave no answer to update within timeouts.update_s=5 s.")
    assert "stack ..." not in failure.line


def test_anything_else_is_a_bug_saying_where_the_traceback_is() -> None:
    failure = describe(KeyError("x"), checkpoint_dir=None, log_path=LOG)
    assert failure.exit_code == EXIT_BUG
    assert failure.line == f"internal error KeyError: 'x'. This is a bug in grpo: please report it with the traceback (traceback: {LOG})."
