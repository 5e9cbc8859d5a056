#!/usr/bin/env python3
"""Build the verl rollout-correction reference cases in this directory (``cases.json``).

Every case is computed by verl's own ``compute_rollout_correction_weights`` (from
``verl/trainer/ppo/rollout_corr_helper.py``), so our implementation can be tested against
verl without importing verl.  verl is never installed and its package ``__init__`` files are
never run: the two module files that matter are loaded straight from a verl source tree
(``--verl-src DIR``, the directory that holds ``verl/``):

* ``verl/utils/torch_functional.py``       -> ``verl.utils.torch_functional`` (masked_sum / masked_mean)
* ``verl/trainer/ppo/rollout_corr_helper.py`` -> ``verl.trainer.ppo.rollout_corr_helper``

Everything else those two files import at module level is replaced by a stub in
``sys.modules`` (see ``install_stubs``); none of the stubbed names is used by the code path
exercised here (they appear only in type annotations or in functions we never call).
torch.distributed is never initialised, so verl's batch-normalise path takes the local
(non-distributed) branch.

    git -C <verl git dir> archive 1dda039b9c6311889a9c9a26040677e1254814f9 verl | tar -x -C /tmp/verl_rc
    python make_cases.py --verl-src /tmp/verl_rc [--out cases.json]

Inputs are generated deterministically in float64 with a fixed torch seed and are stored in
the output file, so tests read them from there (they never regenerate them).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent

VERL_COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"

# git blob ids of the two verl files loaded, at VERL_COMMIT (git rev-parse HEAD:<path>)
VERL_FILES = {
    "verl.utils.torch_functional": (
        "verl/utils/torch_functional.py",
        "490ffc1baf246a452faad82ac3f00f448303ba81",
    ),
    "verl.trainer.ppo.rollout_corr_helper": (
        "verl/trainer/ppo/rollout_corr_helper.py",
        "eed6de70d9696fb78753b73e9edfebebba8b6f98",
    ),
}

# SEED / NOISE_STD were picked (by a one-off scan, not part of this script) so that the data
# exercise every branch: token ratios above 5 and below 0.2, and the 7 non-empty sequence ratios
# landing in all of (0, 0.5), [0.5, 0.8), [0.8, 1.25], (1.25, 2), [2, 5) (the 1-token row) and > 5.
SEED = 20244980
BATCH, SEQ_LEN = 8, 16
NOISE_STD = 0.7
# response lengths (right padding); includes a 1-token row and an all-padding (0-token) row
LENGTHS = [16, 11, 7, 1, 0, 14, 4, 9]

ROLLOUT_IS = ["token", "sequence"]
THRESHOLDS: list[float | str] = [2.0, 5.0, "0.5_2.0", "0.8_1.25"]
BATCH_NORMALIZE = [False, True]


# --------------------------------------------------------------------------------------------
# loading verl's module files without verl's package __init__
# --------------------------------------------------------------------------------------------


def _module(name: str, **attrs: object) -> ModuleType:
    mod = ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def _package(name: str, path: Path) -> ModuleType:
    """An empty package whose __init__ is not executed (submodules still resolve by path)."""
    return _module(name, __path__=[str(path)], __package__=name)


def _placeholder(name: str) -> type:
    return type(name, (), {"__doc__": f"stub for {name} (annotation only; never used here)"})


def install_stubs(verl_src: Path) -> list[str]:
    """Put stub modules into sys.modules; return their names (recorded in the output)."""
    root = verl_src / "verl"
    stubs: dict[str, ModuleType] = {
        # third-party modules imported at top level of verl/utils/torch_functional.py,
        # used there only in annotations / functions not called here
        "tensordict": _module("tensordict", TensorDict=_placeholder("TensorDict")),
        "transformers": _module("transformers", PreTrainedTokenizer=_placeholder("PreTrainedTokenizer")),
        # verl packages: empty, so verl/__init__.py etc. (ray, hydra, ...) are never run
        "verl": _package("verl", root),
        "verl.utils": _package("verl.utils", root / "utils"),
        "verl.trainer": _package("verl.trainer", root / "trainer"),
        "verl.trainer.ppo": _package("verl.trainer.ppo", root / "trainer" / "ppo"),
        "verl.trainer.config": _package("verl.trainer.config", root / "trainer" / "config"),
        "verl.workers": _package("verl.workers", root / "workers"),
        "verl.workers.config": _package("verl.workers.config", root / "workers" / "config"),
        # verl modules imported at top level but not on the code path exercised here
        "verl.utils.device": _module(
            "verl.utils.device",
            get_device_name=lambda: "cpu",
            get_torch_device=lambda: torch.cpu,
        ),
        "verl.protocol": _module("verl.protocol", DataProto=_placeholder("DataProto")),
        "verl.trainer.config.algorithm": _module(
            "verl.trainer.config.algorithm", RolloutCorrectionConfig=_placeholder("RolloutCorrectionConfig")
        ),
        "verl.workers.config.actor": _module(
            "verl.workers.config.actor", PolicyLossConfig=_placeholder("PolicyLossConfig")
        ),
    }
    for name, mod in stubs.items():
        if name in sys.modules:
            raise RuntimeError(f"{name} is already imported; run this script in a fresh interpreter")
        sys.modules[name] = mod
    for name, mod in stubs.items():  # wire submodules as attributes of their parents
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
    return sorted(stubs)


def _git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def load_verl_module(verl_src: Path, name: str, check: bool) -> ModuleType:
    rel, blob = VERL_FILES[name]
    path = verl_src / rel
    if check and _git_blob_id(path) != blob:
        raise RuntimeError(
            f"{path} is not the file at verl {VERL_COMMIT} (blob {blob}); pass --no-check to override"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, mod)
    return mod


# --------------------------------------------------------------------------------------------
# inputs and cases
# --------------------------------------------------------------------------------------------


def make_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(SEED)
    dtype = torch.float64
    # old (training-policy) log-probs in [-3.05, -0.05]; rollout = old + N(0, NOISE_STD) noise, so
    # token ratios exp(old - rollout) fall both above 2 and below 0.5.  Padding positions hold
    # ordinary finite values too (a correct implementation must mask them out).
    old = -(0.05 + 3.0 * torch.rand(BATCH, SEQ_LEN, dtype=dtype))
    rollout = old + NOISE_STD * torch.randn(BATCH, SEQ_LEN, dtype=dtype)
    lengths = torch.tensor(LENGTHS)
    mask = (torch.arange(SEQ_LEN).unsqueeze(0) < lengths.unsqueeze(1)).to(dtype)
    return old, rollout, mask


def _plain(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def run_cases(helper: ModuleType, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise RuntimeError("torch.distributed must not be initialised")
    log_ratio = old - rollout
    cases = []
    for level, threshold, normalize in itertools.product(ROLLOUT_IS, THRESHOLDS, BATCH_NORMALIZE):
        case: dict = {
            "rollout_is": level,
            "rollout_is_threshold": threshold,
            "rollout_is_batch_normalize": normalize,
        }
        try:
            weights, metrics = helper.compute_rollout_correction_weights(
                log_ratio.clone(),
                mask.clone(),
                rollout_is=level,
                rollout_is_threshold=threshold,
                rollout_is_batch_normalize=normalize,
            )
        except Exception as exc:  # recorded, not fatal
            case["error"] = f"{type(exc).__name__}: {exc}"
        else:
            assert weights.dtype == torch.float64, weights.dtype
            case["weights"] = weights.tolist()
            case["metrics"] = {key: _plain(val) for key, val in sorted(metrics.items())}
        cases.append(case)
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--verl-src", type=Path, required=True, help="directory holding verl/ (verl source tree)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "cases.json")
    parser.add_argument("--no-check", action="store_true", help="skip the verl file blob-id check")
    args = parser.parse_args(argv)

    stubs = install_stubs(args.verl_src)
    load_verl_module(args.verl_src, "verl.utils.torch_functional", check=not args.no_check)
    helper = load_verl_module(args.verl_src, "verl.trainer.ppo.rollout_corr_helper", check=not args.no_check)

    old, rollout, mask = make_inputs()
    cases = run_cases(helper, old, rollout, mask)

    doc = {
        "verl_commit": VERL_COMMIT[:9],
        "verl_commit_full": VERL_COMMIT,
        "verl_function": "verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_weights",
        "generator": {
            "script": "make_cases.py",
            "seed": SEED,
            "noise_std": NOISE_STD,
            "lengths": LENGTHS,
            "torch_version": torch.__version__,
            "stubbed_modules": stubs,
        },
        "inputs": {
            "old_log_probs": old.tolist(),
            "rollout_log_probs": rollout.tolist(),
            "response_mask": mask.to(torch.int64).tolist(),
        },
        "cases": cases,
    }
    text = json.dumps(doc, indent=1, allow_nan=False)
    args.out.write_text(text + "\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {args.out} ({len(text)} bytes): {len(cases)} cases, {n_err} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
