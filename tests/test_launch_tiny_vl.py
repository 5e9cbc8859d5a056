"""`--preset tiny-vl` end to end through the 35B launcher on the CPU, unshortened: a tiny
vision-language Qwen3.5-MoE counts squares in images that travel from the parquet rows through the
processor, the `hf` rollout engine and the torch backend. The run must learn (mean reward of the
last 10 steps >= the first 10 + 0.2) within 10 minutes, and its HF export holds the vision tower
(strict) and loads as the vision-language class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_tiny_vl_preset_learns_and_exports_the_vision_tower(tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from grpo_trainer import read_metrics

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "RAY_ADDRESS")}
    started = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("grpo-launch-35b")), "--preset", "tiny-vl", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=850,
        check=False,
    )
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    (metrics_path,) = out.rglob("metrics.jsonl")
    rewards = [record["reward/mean"] for _, record in sorted(read_metrics(metrics_path).items())]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"tiny-vl: {len(rewards)} steps in {wall:.0f} s, reward {first:.3f} -> {last:.3f}")
    assert len(rewards) == 50 and wall < 600
    assert last - first >= 0.2
    export = out / "checkpoints" / "global_step_50" / "huggingface"
    names: set[str] = set()
    for shard in export.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            names |= set(f.keys())
    assert any(n.startswith("model.visual.") for n in names) and any(n.startswith("model.language_model.") for n in names)
    report = json.loads((out / "checkpoints" / "global_step_50" / "manifest.json").read_text())["hf_export"]
    assert report["status"] == "ok" and report["strict"] and report["model_keys_not_written"] == []
    assert report["written"] == len(names)
    model = AutoModelForImageTextToText.from_pretrained(export)
    assert type(model).__name__ == "Qwen3_5MoeForConditionalGeneration"
