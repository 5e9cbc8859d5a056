"""The Megatron backend on an Ascend NPU: hccl, the device set through torch.npu, an npu device, and
MindSpeed's adaptor imported before megatron (or a clear error saying what to install).

No NPU exists on these machines and the main env has neither torch_npu, MindSpeed nor megatron, so
this runs on FAKES:
- `torch_npu`: a module in sys.modules (and `torch.npu`) with the calls grpo_device makes here. The
  real one also registers the "npu" device type with torch; that is permanent and makes torch treat
  "npu" as the process's accelerator (torch.optim then fails in later tests), so the one test that
  needs `torch.device("npu")` registers it in a subprocess of its own;
- `mindspeed.megatron_adaptor`: created on import by a finder; it records which `megatron.*` modules
  were already in sys.modules at that moment;
- megatron, only the minimum: empty packages `megatron`, `megatron.bridge` (so `megatron_available()`
  says yes) and `megatron.core.*` whose attributes are placeholders (so `build_policy`'s
  `from megatron.core import ...` lines run); `import_auto_bridge` is replaced by a stop signal, so
  nothing of megatron is ever executed.
`torch.distributed.init_process_group` / `is_initialized` are replaced by recorders.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

from grpo_config.schema import DeviceConfig, TrainerConfig
from grpo_device import DeviceKind, DeviceUnavailableError
from grpo_trainer.backends.megatron import build
from grpo_trainer.backends.megatron.imports import (
    MINDSPEED_ADAPTOR,
    MegatronImportOrderError,
    MegatronUnavailableError,
    MindSpeedUnavailableError,
    import_megatron_stack,
)


@dataclass
class FakeAscend:
    """Records what the backend asks of the fake torch_npu, the fake adaptor and torch.distributed."""

    count: int = 8
    current: int = 0
    set_device_calls: list[int] = field(default_factory=list)
    init_calls: list[dict] = field(default_factory=list)
    adaptor_saw: list[list[str]] = field(default_factory=list)
    adaptor_error: Exception | None = None
    with_mindspeed: bool = True

    def set_device(self, index: int) -> None:
        self.set_device_calls.append(index)
        self.current = index


class _Placeholder:
    """Any attribute of a fake megatron module (never called by these tests)."""


class _FakeModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `megatron`, `megatron.*` and (when enabled) `mindspeed`, `mindspeed.megatron_adaptor`."""

    def __init__(self, state: FakeAscend) -> None:
        self.state = state

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        top = fullname.split(".")[0]
        if top == "megatron" or (top == "mindspeed" and self.state.with_mindspeed):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package: submodules come from this finder too
        if module.__name__ == MINDSPEED_ADAPTOR:
            self.state.adaptor_saw.append(sorted(name for name in sys.modules if name.startswith("megatron")))
            if self.state.adaptor_error is not None:
                raise self.state.adaptor_error
        elif module.__name__.startswith("megatron.core"):
            module.__getattr__ = lambda name: _Placeholder  # type: ignore[attr-defined]


@pytest.fixture
def ascend(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAscend]:
    state = FakeAscend()
    npu = types.ModuleType("torch_npu.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: state.count
    npu.set_device = state.set_device
    npu.current_device = lambda: state.current
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.npu = npu
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.delenv("DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)  # init_distributed sets defaults; undone afterwards
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(state.init_calls))
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: state.init_calls.append(kwargs))
    for name in [name for name in sys.modules if name.split(".")[0] in ("megatron", "mindspeed")]:
        monkeypatch.delitem(sys.modules, name)  # a real megatron imported by other tests: hidden here
    monkeypatch.setattr(sys, "meta_path", [_FakeModules(state), *sys.meta_path])
    before = set(sys.modules)
    yield state
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("megatron", "mindspeed"):
            del sys.modules[name]


def test_npu_process_group_is_hccl_and_the_device_is_set_through_torch_npu(ascend: FakeAscend) -> None:
    build.init_distributed("npu")
    assert ascend.init_calls == [{"backend": "hccl"}]
    assert ascend.set_device_calls == [3]  # LOCAL_RANK
    build.init_distributed("npu")  # a second model (the reference) reuses the group
    assert len(ascend.init_calls) == 1


_NPU_DEVICE_SCRIPT = """
import os, sys, types
import torch
import torch.distributed as dist

state = {"current": 0}
npu = types.ModuleType("torch_npu.npu")
npu.is_available = lambda: True
npu.device_count = lambda: 8
npu.set_device = lambda index: state.update(current=index)
npu.current_device = lambda: state["current"]
torch_npu = types.ModuleType("torch_npu")
torch_npu.npu = npu
sys.modules["torch_npu"] = torch_npu
torch.utils.rename_privateuse1_backend("npu")  # what the real torch_npu does on import
torch._register_device_module("npu", npu)
groups = []
dist.is_initialized = lambda: bool(groups)
dist.init_process_group = lambda **kwargs: groups.append(kwargs["backend"])
os.environ["LOCAL_RANK"] = "3"

from grpo_trainer.backends.megatron import build

build.init_distributed("npu")
print(groups[0], build.megatron_device("npu"))
"""


def test_the_backends_device_is_an_npu_device(tmp_path) -> None:
    """megatron_device("npu") after init_distributed: the NPU of LOCAL_RANK. In a subprocess with
    the fake torch_npu registering "npu" with torch, as the real one does (see the module docstring)."""
    result = subprocess.run(
        [sys.executable, "-c", _NPU_DEVICE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "DEVICE": ""},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["hccl", "npu:3"]


def test_cuda_process_group_is_nccl(ascend: FakeAscend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same code on CUDA (no GPU here: torch.cuda's calls are recording stand-ins)."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: calls[-1])
    build.init_distributed("gpu")
    assert (ascend.init_calls, calls, ascend.set_device_calls) == ([{"backend": "nccl"}], [3], [])
    assert build.megatron_device("cuda") == torch.device("cuda", 3)


def test_cpu_is_refused_with_the_reason(ascend: FakeAscend) -> None:
    for call in (build.init_distributed, build.megatron_device):
        with pytest.raises(ValueError, match="megatron-core's forward does not run on CPU"):
            call("cpu")
    assert ascend.init_calls == []


def test_no_visible_npu_is_a_clear_error(ascend: FakeAscend) -> None:
    ascend.count = 0
    with pytest.raises(DeviceUnavailableError, match="ASCEND_RT_VISIBLE_DEVICES"):
        build.init_distributed("npu")


def test_mindspeed_adaptor_is_imported_before_megatron(ascend: FakeAscend) -> None:
    assert import_megatron_stack("npu") is DeviceKind.NPU
    assert ascend.adaptor_saw == [[]]  # no megatron module existed when the adaptor ran
    assert MINDSPEED_ADAPTOR in sys.modules
    import_megatron_stack("npu")  # idempotent: the adaptor runs once
    assert len(ascend.adaptor_saw) == 1


def test_build_policy_imports_the_adaptor_before_its_megatron_imports(
    ascend: FakeAscend, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stop(Exception):
        pass

    def stop() -> None:
        assert "megatron.core" in sys.modules  # build_policy's own megatron imports ran, after the adaptor
        raise Stop

    monkeypatch.setattr(build, "import_auto_bridge", stop)
    cfg = TrainerConfig(device=DeviceConfig(kind="npu"))
    with pytest.raises(Stop):
        build.build_policy(cfg, model_path="unused")
    assert ascend.adaptor_saw == [[]]


def test_importing_the_backend_imports_no_megatron_module() -> None:
    """`make_backend` imports the backend's module before `import_megatron_stack` runs: if that
    import loaded megatron-core, every NPU launch would stop at MindSpeed's order check. A fresh
    interpreter, so that no earlier test's imports count."""
    code = (
        "import sys, grpo_trainer.backends.megatron.backend, grpo_trainer.backends.megatron as m; "
        "loaded = [n for n in sys.modules if n == 'megatron' or n.startswith('megatron.')]; "
        "assert loaded == [], loaded; m.megatron_available()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_megatron_imported_first_is_refused(ascend: FakeAscend) -> None:
    import megatron.core  # noqa: F401  (the fake)

    with pytest.raises(MegatronImportOrderError, match=r"megatron\.core .*import_megatron_stack\(kind\)"):
        import_megatron_stack("npu")
    assert ascend.adaptor_saw == []


def test_without_mindspeed_the_error_says_what_to_install(
    ascend: FakeAscend, monkeypatch: pytest.MonkeyPatch
) -> None:
    ascend.with_mindspeed = False
    monkeypatch.setitem(sys.modules, "mindspeed", None)  # not installed, even where it is
    with pytest.raises(MindSpeedUnavailableError) as err:
        import_megatron_stack("npu")
    message = str(err.value)
    assert isinstance(err.value, MegatronUnavailableError | ImportError)
    for needed in (
        "needs MindSpeed",
        "matches your Megatron-LM / megatron-core version",
        "pip install --no-deps -e MindSpeed",
        "PyPI's `mindspeed` is an unrelated placeholder",
        "https://gitee.com/ascend/MindSpeed",
        "MindSpeed 0.16 with Megatron-LM 0.16",
    ):
        assert needed in message
    assert "megatron.core" not in sys.modules


def test_a_broken_mindspeed_is_reported_as_such(ascend: FakeAscend) -> None:
    ascend.adaptor_error = ImportError("cannot import name 'get_args' from 'megatron.training'")
    with pytest.raises(MindSpeedUnavailableError, match="does not match the installed megatron-core") as err:
        import_megatron_stack("npu")
    assert err.value.__cause__ is ascend.adaptor_error


def test_cuda_never_imports_mindspeed(ascend: FakeAscend) -> None:
    assert import_megatron_stack("cuda") is DeviceKind.CUDA
    assert ascend.adaptor_saw == [] and MINDSPEED_ADAPTOR not in sys.modules
