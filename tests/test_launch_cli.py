"""The model launchers' command line: dry-run snapshots per model x device, the parallel values and
per-device deltas they resolve to, ref inheritance, environment variables, overrides and the clean
exit-2 errors. Everything here is real (grpo_config, grpo_device, argparse, structlog); the
accelerator itself is only named (`--device gpu|npu`), never used."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import yaml

import grpo_config
import grpo_device
from grpo_config.schema import RefMegatronConfig
from grpo_launch import plan_full
from grpo_launch_qwen35_35b import PROFILE as PROFILE_35B
from grpo_launch_qwen35_35b import main as main_35b
from grpo_launch_qwen35_122b import PROFILE as PROFILE_122B
from grpo_launch_qwen35_122b import main as main_122b

REPO = Path(__file__).resolve().parents[1]
MAINS = {"35b": main_35b, "122b": main_122b}
PROFILES = {"35b": PROFILE_35B, "122b": PROFILE_122B}
PACKAGE_DIRS = {"35b": "qwen35_35b", "122b": "qwen35_122b"}
LAUNCH_ENV = ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "NNODES", "DATA_DIR", "DATA_SOURCE", "DEVICE")

# The table: model x device -> parallel sizes, rollout TP, devices per node, nodes, strict.
EXPECTED = {
    ("35b", "gpu"): dict(tp=2, pp=1, ep=8, etp=1, cp=1, rollout_tp=8, per_node=8, nnodes=1, strict=True),
    ("35b", "npu"): dict(tp=2, pp=2, ep=8, etp=1, cp=1, rollout_tp=8, per_node=16, nnodes=1, strict=False),
    ("122b", "gpu"): dict(tp=2, pp=2, ep=8, etp=1, cp=1, rollout_tp=8, per_node=8, nnodes=4, strict=True),
    ("122b", "npu"): dict(tp=2, pp=4, ep=16, etp=1, cp=1, rollout_tp=16, per_node=16, nnodes=4, strict=False),
}
CASES = sorted(EXPECTED)


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fixed environment: HOME=/home/grpo, none of the launch variables, none of the profile
    variables (so nothing counts as 'kept from your environment'); logging restored afterwards."""
    monkeypatch.setenv("HOME", "/home/grpo")
    profile_vars = set()
    for kind in grpo_device.DeviceKind:
        profile_vars |= set(grpo_device.EnvProfile.for_device(kind).vars)
    for profile in PROFILES.values():
        for device in profile.devices:
            profile_vars |= set(profile.env_for(device))
    for name in (*LAUNCH_ENV, *profile_vars):
        monkeypatch.delenv(name, raising=False)
    root_handlers = list(logging.getLogger().handlers)
    yield dict(os.environ)
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = root_handlers


def dry_run(model: str, device: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    code = MAINS[model](["--dry-run", "--device", device, "--output-dir", f"/outputs/{model}", *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return out, yaml.safe_load(out)


def portable(out: str, model: str) -> str:
    """The shipped architecture config's path depends on where the package is installed: the
    snapshot names it by package."""
    shipped = PROFILES[model].architecture
    assert shipped is not None and str(shipped) in out
    return out.replace(str(shipped), f"<{shipped.parent.name}>/{shipped.name}")


@pytest.mark.parametrize(("model", "device"), CASES)
def test_dry_run_matches_snapshot(model: str, device: str, launch_env, capsys) -> None:
    out, _ = dry_run(model, device, capsys=capsys)
    out = portable(out, model)
    golden = REPO / "packages/launchers" / PACKAGE_DIRS[model] / "tests/goldens" / f"dry_run_{device}.yaml"
    if os.environ.get("GRPO_UPDATE_GOLDENS") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out)
    assert golden.exists(), f"no snapshot {golden}: run with GRPO_UPDATE_GOLDENS=1 to create it"
    assert out == golden.read_text(), f"dry run drifted from {golden}; GRPO_UPDATE_GOLDENS=1 regenerates it"


@pytest.mark.parametrize(("model", "device"), CASES)
def test_dry_run_parallel_values(model: str, device: str, launch_env, capsys) -> None:
    want = EXPECTED[(model, device)]
    _, doc = dry_run(model, device, capsys=capsys)
    cfg = doc["config"]
    assert {k: cfg["parallel"][k] for k in ("tp", "pp", "ep", "etp", "cp")} == {
        k: want[k] for k in ("tp", "pp", "ep", "etp", "cp")
    }
    assert cfg["rollout"]["tensor_parallel_size"] == want["rollout_tp"]
    assert cfg["device"] == {
        "kind": {"gpu": "cuda", "npu": "npu"}[device],
        "nnodes": want["nnodes"],
        "devices_per_node": want["per_node"],
        "expandable_segments": (model, device) != ("122b", "npu"),
        "memory_gib": None,
    }
    assert cfg["checkpoint"]["strict"] is want["strict"]
    assert cfg["actor"]["backend"] == "megatron"
    assert cfg["actor"]["megatron"]["bridge"] == "megatron-bridge"
    assert cfg["actor"]["megatron"]["moe_token_dispatcher_type"] == "alltoall"
    world = want["nnodes"] * want["per_node"]
    assert doc["world"]["world_size"] == world
    assert doc["world"]["data_parallel"] == world // (want["tp"] * want["pp"] * want["cp"])
    assert doc["world"]["rollout"]["replicas"] == world // want["rollout_tp"]


@pytest.mark.parametrize(("model", "device"), CASES)
def test_ref_inherits_actor_settings(model: str, device: str, launch_env) -> None:
    plan = plan_full(PROFILES[model], device=device, output_dir=None, overrides=[], environ=os.environ)
    cfg = plan.config
    assert cfg.ref.parallel == cfg.parallel
    assert cfg.ref.use_remove_padding is cfg.actor.use_remove_padding is False
    assert cfg.ref.model_path == cfg.actor.model_path
    assert cfg.ref.dtype == cfg.actor.dtype
    assert cfg.ref.log_prob_micro_batch_size_per_device == cfg.actor.log_prob_micro_batch_size_per_device
    # The one deliberate difference: the ref's weights are always offloaded between uses.
    assert cfg.ref.megatron.param_offload is True
    assert dataclasses.replace(cfg.ref.megatron, param_offload=cfg.actor.megatron.param_offload) == (
        RefMegatronConfig.of_actor(cfg.actor.megatron)
    )


def test_ref_follows_an_actor_override(launch_env) -> None:
    plan = plan_full(
        PROFILE_122B,
        device="npu",
        output_dir=None,
        overrides=["parallel.pp=2", "actor.megatron.moe_permute_fusion=false"],
        environ=os.environ,
    )
    assert plan.config.ref.parallel.pp == 2
    assert plan.config.ref.megatron.moe_permute_fusion is False


def test_npu_122b_deltas(launch_env, capsys) -> None:
    _, doc = dry_run("122b", "npu", capsys=capsys)
    env = doc["environment"]["set"]
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "garbage_collection_threshold:0.8"
    assert env["HCCL_CONNECT_TIMEOUT"] == "5400"
    assert env["HCCL_BUFFSIZE"] == "300"
    assert env["TASK_QUEUE_ENABLE"] == "1"  # the device profile's own values stay
    assert doc["config"]["actor"]["log_prob_micro_batch_size_per_device"] == 4
    assert doc["config"]["ref"]["log_prob_micro_batch_size_per_device"] == 4
    assert grpo_device.npu_alloc_conf_conflicts(env["PYTORCH_NPU_ALLOC_CONF"]) == ()


def test_gpu_122b_deltas(launch_env, capsys) -> None:
    _, gpu = dry_run("122b", "gpu", capsys=capsys)
    _, npu = dry_run("122b", "npu", capsys=capsys)
    assert gpu["config"]["actor"]["megatron"]["moe_router_load_balancing_type"] == "none"
    assert gpu["config"]["actor"]["megatron"]["apply_rope_fusion"] is False
    assert npu["config"]["actor"]["megatron"]["moe_router_load_balancing_type"] == "aux_loss"
    assert "PYTORCH_NPU_ALLOC_CONF" not in gpu["environment"]["set"]


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("model", sorted(PROFILES))
def test_devices_differ_only_by_their_deltas(model: str, launch_env) -> None:
    """Common values are defined once: gpu and npu resolve to the same config except for the keys a
    device delta names (and the ref copies of them)."""
    profile = PROFILES[model]
    gpu, npu = (
        _flat(
            grpo_config.to_dict(
                plan_full(profile, device=d, output_dir=None, overrides=[], environ=os.environ).config
            )
        )
        for d in ("gpu", "npu")
    )
    delta_keys = {"device.kind"}
    for device in ("gpu", "npu"):
        delta_keys |= set(_flat(dict(profile.devices[device].config)))
    delta_keys |= {f"ref.{k.removeprefix('actor.')}" for k in delta_keys if k.startswith("actor.")}
    delta_keys |= {f"ref.{k}" for k in delta_keys if k.startswith("parallel.")}
    differing = {k for k in gpu.keys() | npu.keys() if gpu.get(k) != npu.get(k)}
    assert differing, "the two devices must differ somewhere"
    # A mapping empty on one device is one key there, its entries on the other.
    unexplained = {k for k in differing if not any(k == d or d.startswith(k + ".") for d in delta_keys)}
    assert not unexplained


def test_environment_variables_are_honoured(launch_env, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MODEL_PATH", "/models/q35")
    monkeypatch.setenv("TRAIN_FILES", "['/d/a.parquet', '/d/b.parquet']")
    monkeypatch.setenv("VAL_FILES", "/d/v1.parquet,/d/v2.parquet")
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("HCCL_BUFFSIZE", "512")
    _, doc = dry_run("35b", "npu", capsys=capsys)
    cfg = doc["config"]
    assert cfg["actor"]["model_path"] == cfg["ref"]["model_path"] == "/models/q35"
    assert cfg["data"]["train_files"] == ["/d/a.parquet", "/d/b.parquet"]
    assert cfg["data"]["val_files"] == ["/d/v1.parquet", "/d/v2.parquet"]
    assert cfg["device"]["nnodes"] == 2 and doc["world"]["world_size"] == 32
    assert doc["environment"]["kept_from_your_environment"] == ["HCCL_BUFFSIZE"]
    assert "check TRAIN_FILES and VAL_FILES exist" in doc["launch"]["steps"]


def test_defaults_come_from_home_and_data_dir(launch_env, monkeypatch, capsys) -> None:
    _, doc = dry_run("122b", "gpu", capsys=capsys)
    assert doc["config"]["actor"]["model_path"] == "/home/grpo/models/Qwen3.5-122B-A10B"
    assert doc["config"]["data"]["train_files"] == ["/home/grpo/data/geo3k/train.parquet"]
    monkeypatch.setenv("DATA_DIR", "/shared/data")
    _, doc = dry_run("122b", "gpu", capsys=capsys)
    assert doc["config"]["data"]["val_files"] == ["/shared/data/geo3k/test.parquet"]
    assert doc["config"]["checkpoint"]["dir"] == "/outputs/122b/checkpoints"


def test_dotted_overrides_and_verl_aliases(launch_env, capsys) -> None:
    _, doc = dry_run(
        "35b",
        "gpu",
        "actor_rollout_ref.actor.checkpoint.strict=False",
        "rollout.n=8",
        "data.train_batch_size=256",
        capsys=capsys,
    )
    assert doc["config"]["checkpoint"]["strict"] is False
    assert doc["config"]["rollout"]["n"] == 8
    assert doc["config"]["data"]["train_batch_size"] == 256


def test_the_gsm8k_calculator_example_plans_multi_turn_on_the_35b(launch_env, capsys) -> None:
    """docs/MULTI_TURN.md's gsm8k + calculator example (after `prepare-data --dataset gsm8k_tool`)
    on the 35B's GPU profile: taken whole, with Qwen3.5's call format."""
    _, doc = dry_run(
        "35b",
        "gpu",
        "data.train_files=[/data/gsm8k_tool/train.parquet]",
        "data.val_files=[/data/gsm8k_tool/test.parquet]",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "rollout.multi_turn.tools=[calculator]",
        "rollout.multi_turn.max_assistant_turns=5",
        capsys=capsys,
    )
    turns = doc["config"]["rollout"]["multi_turn"]
    assert (turns["enable"], turns["tools"], turns["format"], turns["max_assistant_turns"]) == (
        True,
        ["calculator"],
        "qwen3_xml",
        5,
    )
    assert doc["config"]["data"]["train_files"] == ["/data/gsm8k_tool/train.parquet"]


def test_one_step_off_dry_run_shows_the_rollout_workers_and_their_memory(launch_env, capsys) -> None:
    _, doc = dry_run(
        "35b",
        "gpu",
        "rollout.mode=one_step_off",
        "rollout.devices_per_node=8",
        "rollout.tensor_parallel_size=1",
        "rollout.free_cache_engine=false",
        "algorithm.rollout_correction.rollout_is=token",
        "actor.megatron.param_offload=false",
        "actor.megatron.grad_offload=false",
        "actor.megatron.optimizer_offload=false",
        capsys=capsys,
    )
    rollout = doc["world"]["rollout"]
    assert rollout["mode"] == "one_step_off" and rollout["replicas"] == 8
    assert rollout["rollout_workers"] == {"nnodes": 1, "devices_per_node": 8, "devices": 8}
    assert doc["world"]["world_size"] == 8  # the training ranks; the rollout workers come beside them


def test_device_from_the_device_variable(launch_env, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DEVICE", "NPU")
    assert main_35b(["--dry-run", "--output-dir", "/o"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["launch"]["device"] == "npu"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--device", "gpu", "--", "parallel.ep=7"],
            {},
            "parallel.ep=7 does not divide the model's 256 experts",
        ),
        (
            ["--device", "gpu", "--", "device.devices_per_node=4"],
            {},
            "does not divide the devices per pipeline stage",
        ),
        (["--device", "npu", "--", "actor.no_such_key=1"], {}, "actor.no_such_key"),
        (["--device", "gpu"], {"NNODES": "two"}, "NNODES must be a positive integer"),
        (["--device", "cpu"], {}, "use --preset tiny"),
        (["--device", "gpu", "--", "not-an-override"], {}, "overrides are key=value pairs"),
    ],
)
def test_user_errors_exit_2_with_one_message(argv, env, message, launch_env, monkeypatch, capsys) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main_35b(["--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_missing_model_is_a_clean_error(launch_env, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")  # a cluster driver: no local GPU needed
    assert main_122b(["--device", "gpu", "--output-dir", "/o"]) == 2
    err = capsys.readouterr().err
    assert "model path /home/grpo/models/Qwen3.5-122B-A10B does not exist" in err
    assert "hf download Qwen/Qwen3.5-122B-A10B" in err and "MODEL_PATH" in err


def test_missing_data_is_a_clean_error(launch_env, monkeypatch, tmp_path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("MODEL_PATH", str(model))
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    monkeypatch.setenv("TRAIN_FILES", str(tmp_path / "missing.parquet"))
    monkeypatch.setenv("VAL_FILES", str(tmp_path / "missing_val.parquet"))
    assert main_35b(["--device", "npu", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"data files missing: {tmp_path / 'missing.parquet'}" in err
    assert "hatch run prepare-data --dataset geo3k" in err


def test_dry_run_warns_about_what_a_real_run_would_stop_on(launch_env, capsys) -> None:
    """The launcher configures logging itself (JSON, stderr is not a TTY here), so its log is read
    back from stderr rather than captured."""
    assert main_35b(["--dry-run", "--device", "gpu", "--output-dir", "/o"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    problems = [e["problem"] for e in events if e["event"] == "a real launch would stop here"]
    assert len(problems) == 1 and "model path /home/grpo/models/Qwen3.5-35B-A3B" in problems[0]
    assert all(e["level"] == "warning" for e in events if e["event"] == "a real launch would stop here")


def test_console_script_exit_code_and_json_logs(tmp_path) -> None:
    """The installed entry point, in a child process whose stderr is a pipe (not a TTY)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV} | {
        "HOME": str(tmp_path),
        "RAY_ADDRESS": "h:1",
    }
    script = Path(sys.executable).with_name("grpo-launch-35b")
    proc = subprocess.run(
        [str(script), "--device", "gpu", "--output-dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: model path") and "Traceback" not in proc.stderr
    dry = subprocess.run(
        [str(script), "--dry-run", "--device", "gpu", "--output-dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert dry.returncode == 0
    assert yaml.safe_load(dry.stdout)["config"]["parallel"]["ep"] == 8
    log_lines = [line for line in dry.stderr.splitlines() if line.strip()]
    assert log_lines and all(line.startswith("{") for line in log_lines)
    assert any('"event": "a real launch would stop here"' in line for line in log_lines)


@pytest.fixture
def restore_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_full_run_does_the_common_steps_then_trains(
    launch_env, restore_environ, monkeypatch, tmp_path
) -> None:
    """A real launch up to `train(cfg)`. `train` itself is replaced by a recorder: a 35B Megatron run
    cannot exist on this CPU machine. Everything before it is real: the model check, geo3k prepared
    from a local `datasets` directory into DATA_DIR, proxies unset, the NPU environment applied
    without overriding the user's value."""
    import datasets

    import grpo_trainer.trainer

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rows = datasets.Dataset.from_dict({"problem": ["<image>Find x.", "Find y."], "answer": ["3", "4"]})
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(tmp_path / "geo3k_src")
    for key, value in {
        "MODEL_PATH": str(model),
        "DATA_DIR": str(tmp_path / "data"),
        "DATA_SOURCE": str(tmp_path / "geo3k_src"),
        "https_proxy": "http://proxy:3128",
        "HCCL_CONNECT_TIMEOUT": "7200",
        "RAY_ADDRESS": "head:6379",  # a cluster driver: no local NPU needed
    }.items():
        monkeypatch.setenv(key, value)
    seen: list[object] = []
    runtime_envs: list[dict] = []

    def fake_train(cfg, *, ray_runtime_env):
        seen.append(cfg)
        runtime_envs.append(ray_runtime_env)

    monkeypatch.setattr(grpo_trainer.trainer, "train", fake_train)

    assert main_35b(["--device", "npu", "--output-dir", str(tmp_path / "out")]) == 0

    (cfg,) = seen
    assert runtime_envs[0]["worker_process_setup_hook"]  # workers configure logging as the driver
    assert cfg.actor.model_path == str(model) and cfg.parallel.pp == 2
    assert cfg.data.train_files == [str(tmp_path / "data/geo3k/train.parquet")]
    assert (tmp_path / "data/geo3k/train.parquet").is_file() and (
        tmp_path / "data/geo3k/test.parquet"
    ).is_file()
    assert "https_proxy" not in os.environ
    assert os.environ["HCCL_CONNECT_TIMEOUT"] == "7200"  # the user's value wins
    assert os.environ["TASK_QUEUE_ENABLE"] == "1" and os.environ["HCCL_BUFFSIZE"] == "200"
    assert cfg.checkpoint.dir == str(tmp_path / "out/checkpoints")


def test_a_real_run_on_a_missing_accelerator_stops_early(launch_env, monkeypatch, capsys) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if grpo_device.detect(environ={}) is not grpo_device.DeviceKind.CPU:
        pytest.skip("this machine has an accelerator")
    assert main_35b(["--device", "gpu", "--output-dir", "/o"]) == 2
    err = capsys.readouterr().err
    assert "torch.cuda.is_available() is False" in err and "Traceback" not in err


def test_deep_merge_recurses_and_never_aliases() -> None:
    from grpo_launch import deep_merge

    base = {"a": {"b": 1, "c": [1]}, "d": 2}
    merged = deep_merge(base, {"a": {"b": 5}, "e": {"f": 1}})
    assert merged == {"a": {"b": 5, "c": [1]}, "d": 2, "e": {"f": 1}}
    merged["a"]["c"].append(2)
    assert base == {"a": {"b": 1, "c": [1]}, "d": 2}


@pytest.mark.parametrize(("model", "total_gib"), [("35b", 65.51), ("122b", 228.51)])
def test_dry_run_plans_the_shipped_model_whole_when_unsharded(model: str, total_gib: float, launch_env, capsys) -> None:
    """No checkpoint at MODEL_PATH: the plan is the shipped config's, and with no model parallelism a
    rank holds all of it (35.17 B / 122.68 B parameters in bf16); the profile's layout shards it."""
    _, whole = dry_run(model, "gpu", "parallel.tp=1", "parallel.pp=1", "parallel.ep=1", capsys=capsys)
    _, sharded = dry_run(model, "gpu", capsys=capsys)
    assert whole["memory_plan"]["model_config"]["path"] == str(PROFILES[model].architecture / "config.json")
    assert whole["memory_plan"]["training_gib"]["weights"] == pytest.approx(total_gib, abs=0.01)
    assert whole["memory_plan"]["training_gib"]["gradients"] == pytest.approx(2 * total_gib, abs=0.02)
    assert sharded["memory_plan"]["training_gib"]["weights"] < total_gib / 5


def test_a_resume_from_a_checkpoint_without_megatron_state_stops_before_launch(launch_env, monkeypatch, tmp_path, capsys) -> None:
    """A Megatron run resuming a checkpoint that holds no Megatron state (grpo's earlier per-shard
    format): exit 2 and one line before the model, the data or any worker is touched. Other
    parallel sizes alone are no reason: the state is resharded on load (docs/LAYOUTS.md)."""
    import torch

    from grpo_ckpt import CheckpointManager

    saved = {"backend": "megatron", "tp": 2, "pp": 1, "vpp": 1, "ep": 8, "etp": 1, "cp": 1}
    CheckpointManager(tmp_path / "out" / "checkpoints").save(
        20, model={"w": torch.zeros(2)}, optimizer=None, scheduler=None,
        trainer_state={"global_step": 20, "parallel_layout": saved},
    )
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")  # a cluster driver: no local NPU needed
    assert main_35b(["--device", "npu", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "global_step_20 holds no Megatron state (megatron/)" in err and "checkpoint.resume=none" in err
