"""Test support: the real Megatron backend over gloo on CPU processes, one process per rank.

megatron-core and Megatron-Bridge assume CUDA in a handful of places that have nothing to do with
the parallel layout under test. `apply_cpu_patches()` redirects exactly those, in the test
processes only (product code refuses `actor.backend=megatron` on CPU; docs/LAYOUTS.md lists every
patch and why):
- `torch.cuda.current_device()` returns "cpu" and `Module.cuda()` is a no-op (parameter placement,
  attention buffers, the bridge's `get_model`);
- a torch function mode turns `device="cuda"` / `.cuda()` / `.to("cuda")` into the CPU (the
  optimizer's scale tensors, clip-grad buffers), drops pinning (`pin_memory`: offload buffers) and answers `Tensor.type()` with the CUDA type name
  (clip-grad asserts `torch.cuda.FloatTensor`);
- CUDA streams are inert objects and `torch.cuda.synchronize` returns at once (DDP wrapping waits
  on a stream; pipeline p2p synchronises after its sends);
- the model-parallel RNG tracker neither records nor forks CUDA RNG states, and activation
  recomputation saves and restores none (no CUDA RNG; the models have no dropout);
- `all_gather` of unequal sizes (expert tensor parallelism gathers each rank's routed tokens) is
  padded to the largest, as gloo gathers equal sizes only;
- the all-to-all dispatcher's split sizes become numpy arrays, as its device-to-host copy makes
  them on a GPU;
- the Gated DeltaNet's q/k L2 norm is computed in torch (megatron-core takes FLA's Triton kernel;
  the delta rule and convolution already run in torch with `deterministic_mode=True`);
- the backend's CPU refusal and device set-up (`build._accelerator`, `build.init_distributed`): the
  process group is the harness's own gloo group.

`run_ranks()` runs `world_size` ranks of `layout_rank.py` as forks of one process (`forked_ranks.py`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

HERE = Path(__file__).resolve().parent


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


class CudaOnCpu(TorchFunctionMode):
    """Every tensor that asks for CUDA lands on the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.pin_memory:
            # A pinned copy is a copy: the offload then frees the device buffer it came from.
            return args[0].clone()
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # page-locked host memory is a CUDA allocation
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _InertStream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> _InertStream:
        return self  # an event whose synchronize() returns at once


def _torch_l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # FLA's l2norm: x * rsqrt(sum(x^2) + eps) over the last dimension, accumulated in float32.
    squares = x.float().pow(2).sum(-1, keepdim=True)
    return (x.float() * torch.rsqrt(squares + eps)).to(x.dtype)


def _to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    # megatron-core moves the all-to-all split sizes off the GPU as numpy arrays; on the CPU it
    # leaves them tensors, which the all-to-all binding refuses.
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _uneven_all_gather(all_gather: Any) -> Any:
    """gloo's all_gather wants equal sizes; NCCL's takes outputs of different first dimensions
    (megatron-core gathers the tokens of an expert-tensor-parallel group so). Unequal ones are
    padded to the largest, gathered, and cut back."""

    def gather(outputs: list, tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
        sizes = {tuple(t.shape) for t in outputs} | {tuple(tensor.shape)}
        if len(sizes) == 1 or async_op:
            return all_gather(outputs, tensor, group=group, async_op=async_op)
        longest = max(t.shape[0] for t in outputs)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        buffers = [torch.empty_like(padded) for _ in outputs]
        all_gather(buffers, padded, group=group)
        for out, buffer in zip(outputs, buffers, strict=True):
            out.copy_(buffer[: out.shape[0]])
        return None

    return gather


_PATCHED = False


def apply_cpu_patches() -> None:
    """Idempotent; call before building a Megatron model in this process."""
    global _PATCHED
    if _PATCHED:
        return
    torch.cuda.current_device = lambda: "cpu"
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.cuda.Stream = _InertStream
    torch.cuda.current_stream = lambda *args, **kwargs: _InertStream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    CudaOnCpu().__enter__()
    torch.distributed.all_gather = _uneven_all_gather(torch.distributed.all_gather)

    from megatron.core.tensor_parallel import random as tp_random

    tp_random.CudaRNGStatesTracker.add = lambda self, name, seed: None
    tp_random.CudaRNGStatesTracker.fork = contextlib.contextmanager(lambda self, name="model-parallel-rng": (yield))
    tp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    tp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    import megatron.core.ssm.gated_delta_net.common as gdn_common
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _to_host

    gdn_common.l2norm = _torch_l2norm

    from grpo_device import DeviceKind
    from grpo_trainer.backends.megatron import build

    build._accelerator = lambda kind: DeviceKind.CPU

    def _process_group_given(kind: Any) -> None:
        assert torch.distributed.is_initialized(), "the harness starts the gloo process group"

    build.init_distributed = _process_group_given
    _PATCHED = True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_rank() -> tuple[int, int]:
    """(rank, world size): the gloo process group from the variables `run_ranks` set."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
    )
    return rank, world


class RanksFailed(RuntimeError):
    pass


FULL_RANK_COUNTS = "GRPO_TEST_FULL_RANK_COUNTS"


def only_at_full_rank_counts(why: str) -> pytest.MarkDecorator:
    """Skip unless GRPO_TEST_FULL_RANK_COUNTS=1: the runs too large for CI's 2 cores and 24 GiB."""
    return pytest.mark.skipif(os.environ.get(FULL_RANK_COUNTS) != "1", reason=f"{why}; {FULL_RANK_COUNTS}=1 runs it")


class _ForkServer:
    """`forked_ranks.py`, started on first use and kept for the process's later runs."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "forked_ranks.py")], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=sink,
            )
        self.pending = b""

    def _answer(self, deadline: float) -> str | None:
        """The server's next answer line, or None at the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                tail = "\n".join(self.log.read_text().splitlines()[-25:])
                raise RanksFailed(f"the fork server exited (its log, {self.log}):\n{tail}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def run(self, request: dict[str, Any], timeout_s: float) -> int | str:
        """One layout run; its exit code, or "timeout" (its ranks killed)."""
        deadline = time.monotonic() + timeout_s
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        started = self._answer(deadline)  # the first run's answer waits for the server's imports
        if started is None:
            self.stop()
            return "timeout"
        leader = int(started.split()[1])
        answer = self._answer(deadline)
        if answer is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
            if self._answer(time.monotonic() + 60) is None:
                self.stop()  # out of step with its answers: the next run starts a new server
            return "timeout"
        return int(answer.split()[1])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


_FORK_SERVER: _ForkServer | None = None


@atexit.register
def stop_fork_server() -> None:
    """Free the fork server's memory (~1.3 GB) once its runs are over."""
    global _FORK_SERVER
    if _FORK_SERVER is not None:
        _FORK_SERVER.stop()
        _FORK_SERVER = None


def _fork_server(env: dict[str, str], log: Path) -> _ForkServer:
    global _FORK_SERVER
    if _FORK_SERVER is None or _FORK_SERVER.proc.poll() is not None:
        _FORK_SERVER = _ForkServer(env, log)
    return _FORK_SERVER


def run_ranks(spec: dict[str, Any], *, world_size: int, out: Path, timeout_s: float = 900) -> list[dict]:
    """Run `layout_rank.py` as `world_size` ranks over gloo, forks of a server process that imported
    the Megatron stack once (`forked_ranks.py`: no rank pays the imports, and 64 ranks fit in
    memory); each rank writes `out/rank{R}.json`. Returns those results in rank order; raises
    `RanksFailed` with the failing ranks' log tails when any rank fails or the run times out."""
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out)}))
    env = {
        **os.environ,
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    request = {"spec": str(spec_path), "world_size": world_size, "env": env, "log": str(out / "forked.log")}
    code = _fork_server(env, out.parent / "fork_server.log").run(request, timeout_s)
    if code != 0:
        failed = [rank for rank in range(world_size) if not (out / f"rank{rank}.json").exists()] or [0]

        def tail(rank: int) -> str:
            log = out / f"rank{rank}.log"
            log = log if log.exists() else out / "forked.log"  # the leader failed before forking
            return "\n".join(log.read_text().splitlines()[-25:])

        tails = "\n".join(f"--- rank {rank} ({code}):\n{tail(rank)}" for rank in failed[:2])
        raise RanksFailed(f"{len(failed)} of {world_size} ranks failed:\n{tails}")
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]
