"""Save and resume an `Actor` through `grpo_ckpt.CheckpointManager`, whichever backend it runs.

Backends hold their state one of two ways: as plain nested dicts of tensors that the manager
stores (`state_dict` / `load_state_dict`: the torch backend), or as a directory they write
themselves (`DirectoryState`: the Megatron backend's distributed checkpoint, which loads at
another parallel layout). The LR schedule's position, the trainer and dataloader state and the
RNG always go through the manager. Every rank calls `save_actor` and `load_actor`.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from grpo_trainer.protocols import DirectoryState, TensorState
from grpo_trainer.workers.actor import Actor


def save_actor(
    manager: Any,
    step: int,
    actor: Actor,
    *,
    contents: Collection[str],
    trainer_state: dict[str, Any],
    dataloader_state: dict[str, Any] | None = None,
    transformer_config: Any = None,
) -> Path:
    """A complete checkpoint of `actor` at `step`. `contents` is `checkpoint.save_contents`:
    "model" and "optimizer" name the policy's parts; the LR schedule travels with the optimizer
    or, as in verl, with "extra"."""
    backend = actor.backend
    scheduler = actor.schedule.state_dict() if set(contents) & {"optimizer", "extra"} else None
    common = dict(trainer_state=trainer_state, dataloader_state=dataloader_state, transformer_config=transformer_config)
    if isinstance(backend, DirectoryState):
        with_optimizer = "optimizer" in contents
        writers = {}
        if "model" in contents:
            writers[backend.state_directory] = lambda directory: backend.save_state(directory, optimizer=with_optimizer)
        return manager.save(step, model=None, optimizer=None, scheduler=scheduler, writers=writers, **common)
    state = _tensor_state(backend).state_dict()
    return manager.save(
        step,
        model=state["model"] if "model" in contents else None,
        optimizer=state.get("optimizer") if "optimizer" in contents else None,
        scheduler=scheduler,
        **common,
    )


def load_actor(manager: Any, path: str | Path, actor: Actor) -> Any:
    """Restore `actor` from the checkpoint at `path` (verified first); returns the manager's
    `LoadedCheckpoint` (trainer and dataloader state, RNG)."""
    loaded = manager.load(path)
    backend = actor.backend
    if isinstance(backend, DirectoryState):
        directory = Path(path) / backend.state_directory
        if not directory.is_dir():
            raise ValueError(_no_state(path, loaded, expected=backend.state_directory))
        backend.load_state(directory)
    else:
        if loaded.model is None:
            raise ValueError(_no_state(path, loaded, expected="model"))
        state = {"model": loaded.model}
        if loaded.optimizer is not None:
            state["optimizer"] = loaded.optimizer
        _tensor_state(backend).load_state_dict(state)
    if loaded.scheduler is not None:
        actor.schedule.load_state_dict(loaded.scheduler)
    return loaded


def _tensor_state(backend: Any) -> TensorState:
    if not isinstance(backend, TensorState):
        raise TypeError(f"{type(backend).__name__} keeps no checkpoint state (neither TensorState nor DirectoryState)")
    return backend


def _no_state(path: str | Path, loaded: Any, *, expected: str) -> str:
    holds = loaded.manifest.get("components", [])
    return (
        f"checkpoint {path} holds no {expected!r} state for this backend (it holds {holds}): it was saved "
        "without 'model' in checkpoint.save_contents or by another actor.backend. Resume with the backend "
        "it was saved with, or start from its HF export (actor.model_path=<step>/huggingface checkpoint.resume=none)"
    )
