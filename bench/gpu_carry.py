"""What a GPU session carries to the lent machine, derived from requirements/gpu.lock.

The lock's `# via` lines give, for every pinned package, the packages that require it; its roots are
what requirements/gpu.in asks for, our packages' requirements included. Carried: every package reachable
from the roots that the machine's image lacks (bench/gpu_machine.txt), at the lock's version, except
the subtrees NOT_CARRIED names with their reason (a package also required by a carried one is still
carried). vLLM and Ray travel as stripped archives (bench/gpu_prepare.sh), sdist-only packages as
wheels built here, the rest as the lock's wheels.

    python3 bench/gpu_carry.py            # the plan: one `KIND NAME==VERSION` line per carried package
    python3 bench/gpu_carry.py --explain  # every lock package and why it is or is not carried
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "gpu.lock"
MACHINE = ROOT / "bench" / "gpu_machine.txt"

# Packages that travel as an archive bench/gpu_prepare.sh strips, not as a wheel.
ARCHIVED = ("vllm", "ray")
# The lock's sdist-only packages (gpu.in's header): built into wheels here.
BUILT_HERE = ("antlr4-python3-runtime", "wget")

# Subtrees the production path on one GPU does not import, by reason. Each name must be in the lock.
NOT_CARRIED: dict[str, tuple[str, ...]] = {
    "vLLM's OpenAI-compatible server, tool and reasoning parsers, tracing, structured output "
    "backends other than xgrammar/llguidance, and video decoding: offline vllm.LLM with text and "
    "image prompts imports none of them": (
        "anthropic", "mcp", "model-hosting-container-standards", "prometheus-fastapi-instrumentator",
        "opentelemetry-exporter-otlp", "opentelemetry-sdk", "opentelemetry-semantic-conventions-ai",
        "lm-format-enforcer", "outlines-core", "mistral-common", "lark", "ijson", "python-json-logger",
        "watchfiles", "torchcodec", "pynvvideocodec", "fastapi-cli", "uvicorn", "email-validator",
        "pydantic-extra-types", "pydantic-settings", "python-multipart", "fastar",
    ),
    "vLLM's kernels for other models, quantisations or cards, and its FlashInfer backend: the "
    "sessions set VLLM_USE_FLASHINFER_SAMPLER=0 and gdn_prefill_backend=triton; on SM90 vLLM "
    "runs FA3 and its own Triton MoE (tilelang travels: FLA's gated delta-rule backward runs on its "
    "TileLang backend on Hopper, where Triton 3.6 is refused, fla issue 640)": (
        "flashinfer-python", "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla",
        "humming-kernels", "fastsafetensors", "nvtx",
    ),
    "TransformerEngine: not built for the machine yet (transformer-engine-torch is an sdist that "
    "compiles against the installed torch); the GPU runs use transformer_impl=local": (
        "transformer-engine",
    ),
    "megatron-core's [dev,mlm] extras: the data loaders, inference server and storage clients of "
    "megatron.training; grpo imports megatron.core's models, parallel state and optimizer only": (
        "megatron-energon", "multi-storage-client", "flask-restful", "quart", "hypercorn", "wget",
        "orjson", "av", "zstandard", "emerging-optimizers",
    ),
    "megatron-bridge's model-specific and training-loop requirements: grpo's bridge calls (the "
    "Qwen3.5 provider, HF import/export) import none of them": (
        "diffusers", "open-clip-torch", "qwen-vl-utils",
    ),
    "ray[default]'s dashboard, metrics agent and runtime-env tools: the sessions start Ray with "
    "include_dashboard=False and no runtime_env": (
        "aiohttp-cors", "colorful", "opencensus", "opentelemetry-exporter-prometheus", "py-spy",
        "smart-open", "virtualenv", "opentelemetry-proto",
    ),
    "logging.wandb: the machine reaches no network; the GPU benches run with logging.wandb=false": (
        "wandb",
    ),
    "grpo-launch's prepare-data (hub and file datasets into the data files): run before training, "
    "not on the training path the sessions measure": (
        "datasets",
    ),
    "the build requirement of transformer-engine-torch (not built there, above)": (
        "wheel",
    ),
}


@dataclass(frozen=True)
class Locked:
    version: str
    required_by: frozenset[str]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, Locked]:
    """name -> version and the names of what requires it (`-r` for gpu.in, `--override` dropped)."""
    pins: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        if pin := re.match(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==(\S+)", line):
            current = normalise(pin[1])
            pins[current] = (pin[2], set())
        elif current and (via := re.match(r"^\s+#\s+(?:via\s+)?(\S+)", line)) and via[1] != "via":
            if via[1] != "--override":
                pins[current][1].add(via[1] if via[1] == "-r" else normalise(via[1]))
        elif not line.startswith(" "):
            current = None
    return {name: Locked(version, frozenset(parents)) for name, (version, parents) in pins.items()}


def read_machine(path: Path = MACHINE) -> dict[str, str | None]:
    """name -> version where known, from bench/gpu_machine.txt (`name` or `name==version` lines)."""
    machine: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            machine[normalise(name)] = version or None
    return machine


@dataclass(frozen=True)
class Plan:
    carried: dict[str, str]  # name -> the lock's version
    on_machine: dict[str, str | None]  # needed, the image has it: name -> its version where known
    not_carried: dict[str, str]  # name -> reason (listed, or needed only through a listed one)
    unreachable: frozenset[str]  # in the lock, required by nothing the roots reach

    def kind(self, name: str) -> str:
        if name in ARCHIVED:
            return "archive"
        return "build" if name in BUILT_HERE else "wheel"


def plan(lock: dict[str, Locked] | None = None, machine: dict[str, str | None] | None = None) -> Plan:
    lock = read_lock() if lock is None else lock
    machine = read_machine() if machine is None else machine
    reason_of = {name: reason for reason, names in NOT_CARRIED.items() for name in names}
    unknown = sorted(set(reason_of) - set(lock))
    if unknown:
        raise ValueError(f"NOT_CARRIED names packages the lock does not hold: {unknown}")
    requires: dict[str, set[str]] = {}
    for name, locked in lock.items():
        for parent in locked.required_by:
            requires.setdefault(parent, set()).add(name)
    roots = {name for name, locked in lock.items() if "-r" in locked.required_by or any(
        parent.startswith("grpo-") for parent in locked.required_by)}

    def reach(start: set[str], stop: set[str]) -> set[str]:
        seen: set[str] = set()
        todo = [n for n in start if n not in stop]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(n for n in requires.get(name, ()) if n not in stop)
        return seen

    needed = reach(roots, set(reason_of))
    everything = reach(roots, set())
    pruned = {}
    for name in sorted(everything - needed):
        listed = name
        while listed not in reason_of:  # walk up to the listed package it hangs from
            listed = next(p for p in sorted(lock[listed].required_by) if p in everything - needed)
        pruned[name] = reason_of[listed] if name == listed else f"needed only through {listed}"
    return Plan(
        carried={n: lock[n].version for n in sorted(needed) if n not in machine},
        on_machine={n: machine[n] for n in sorted(needed) if n in machine},
        not_carried=pruned,
        unreachable=frozenset(set(lock) - everything),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()
    p = plan()
    if not args.explain:
        for name, version in p.carried.items():
            print(f"{p.kind(name)} {name}=={version}")
        return
    lock = read_lock()
    for name, version in p.carried.items():
        print(f"carried      {name}=={version} ({p.kind(name)})")
    for name, version in p.on_machine.items():
        differs = f" (lock {lock[name].version})" if version and version != lock[name].version else ""
        print(f"on machine   {name}{'==' + version if version else ''}{differs}")
    for name, reason in p.not_carried.items():
        print(f"not carried  {name}=={lock[name].version}: {reason}")
    for name in sorted(p.unreachable):
        print(f"unreachable  {name}=={lock[name].version}")


if __name__ == "__main__":
    main()
