"""`--config FILE`: the settings from-verl writes or a dry run prints, over the launcher's own and
under the command line's overrides; a mistake in the file is reported at its line and column."""

from __future__ import annotations

import logging
import os
import sys
import textwrap
from pathlib import Path

import pytest
import structlog
import yaml

import grpo_device
from grpo_config.from_verl import convert
from grpo_launch.run_log import RunLog
from grpo_launch_qwen35_35b import PROFILE
from grpo_launch_qwen35_35b import main as main_35b

LAUNCH_ENV = ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES", "NNODES", "DATA_DIR", "DATA_SOURCE", "DEVICE")


@pytest.fixture(autouse=True)
def launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/grpo")
    names = set(LAUNCH_ENV)
    for kind in grpo_device.DeviceKind:
        names |= set(grpo_device.EnvProfile.for_device(kind).vars)
    for device in PROFILE.devices:
        names |= set(PROFILE.env_for(device))
    for name in names:
        monkeypatch.delenv(name, raising=False)
    handlers = list(logging.getLogger().handlers)
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = handlers


def _dry_run(*argv: str, capsys: pytest.CaptureFixture[str]) -> dict:
    code = main_35b(["--dry-run", "--device", "gpu", "--output-dir", "/outputs/x", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return yaml.safe_load(captured.out)


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_the_file_goes_over_the_profile_and_the_command_line_over_the_file(tmp_path, capsys) -> None:
    run = _write(
        tmp_path / "run.yaml",
        """\
        actor:
          lr: 3.0e-07
          ppo_epochs: 2
        actor_rollout_ref.rollout.temperature: 0.7   # a verl-style key
        data:
          train_batch_size: 64
        """,
    )
    base = _dry_run(capsys=capsys)["config"]
    assert base["actor"]["lr"] != 3e-7 and base["rollout"]["temperature"] != 0.7
    cfg = _dry_run("--config", str(run), "--", "actor.ppo_epochs=3", capsys=capsys)["config"]
    assert cfg["actor"]["lr"] == 3e-7
    assert cfg["rollout"]["temperature"] == 0.7
    assert cfg["data"]["train_batch_size"] == 64
    assert cfg["actor"]["ppo_epochs"] == 3  # the command line wins
    assert cfg["parallel"] == base["parallel"]  # what the file does not set stays the profile's


def test_a_dry_run_output_read_back_gives_the_same_config(tmp_path, capsys) -> None:
    first = main_35b(["--dry-run", "--device", "gpu", "--output-dir", "/outputs/x", "--", "actor.lr=2e-6"])
    printed = capsys.readouterr().out
    assert first == 0
    saved = tmp_path / "dry.yaml"
    saved.write_text(printed)
    again = _dry_run("--config", str(saved), capsys=capsys)
    assert again["config"] == yaml.safe_load(printed)["config"]
    assert again["config"]["actor"]["lr"] == 2e-6


def test_what_from_verl_writes_launches(tmp_path, capsys) -> None:
    conversion = convert(
        [
            "actor_rollout_ref.actor.optim.lr=5e-7",
            "actor_rollout_ref.rollout.n=6",
            "data.max_response_length=1024",
        ]
    )
    run = tmp_path / "from_verl.yaml"
    run.write_text(conversion.to_yaml())
    cfg = _dry_run("--config", str(run), capsys=capsys)["config"]
    assert (cfg["actor"]["lr"], cfg["rollout"]["n"], cfg["data"]["max_response_length"]) == (5e-7, 6, 1024)


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("actor:\n  lr: 1e-6\n  no_such_key: 1\n", ":3:3: ", "actor.no_such_key"),
        ("rollout:\n  n: lots\n", ":2:3: ", "rollout.n"),
        ("actor:\n  lr: [1\n", ":3:1: ", "not valid YAML"),
        ("- a\n- b\n", ":1:1: ", "mapping of settings"),
        ("data:\n  train_batch_size: 7\n", ":2:3 (data.train_batch_size): ", "not divisible"),
    ],
    ids=["unknown-key", "bad-value", "yaml-syntax", "not-a-mapping", "cross-field"],
)
def test_a_mistake_in_the_file_is_reported_at_its_line_and_column(
    text: str, where: str, message: str, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(text)
    assert main_35b(["--dry-run", "--device", "gpu", "--config", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run}{where}" in err, err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_key_the_command_line_sets_again_is_not_blamed_on_the_file(tmp_path, capsys) -> None:
    run = _write(tmp_path / "run.yaml", "rollout:\n  n: 4\n")
    assert main_35b(["--dry-run", "--device", "gpu", "--config", str(run), "--", "rollout.n=lots"]) == 2
    err = capsys.readouterr().err
    assert "rollout.n" in err and str(run) not in err


def test_a_missing_file_is_one_line_with_what_to_do(tmp_path, capsys) -> None:
    assert main_35b(["--dry-run", "--device", "gpu", "--config", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "from-verl" in err and len(err.strip().splitlines()) == 1


def test_the_tiny_preset_takes_a_file_too(tmp_path, capsys) -> None:
    run = _write(tmp_path / "run.yaml", "total_training_steps: 3\nactor:\n  lr: 1.0e-05\n")
    code = main_35b(
        ["--dry-run", "--preset", "tiny", "--output-dir", str(tmp_path / "out"), "--config", str(run)]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    cfg = yaml.safe_load(captured.out)["config"]
    assert cfg["total_training_steps"] == 3 and cfg["actor"]["lr"] == 1e-5
    assert os.path.isdir(tmp_path / "out")


def test_a_setting_whose_switch_is_off_is_reported_as_ignored_not_refused(capsys) -> None:
    code = main_35b(["--dry-run", "--device", "gpu", "--", "algorithm.kl_ctrl.kl_coef=0.01"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    ignored = [line for line in captured.err.splitlines() if "config.ignored" in line]
    assert len(ignored) == 1 and "algorithm.kl_ctrl.kl_coef=0.01" in ignored[0]
    assert "use_kl_in_reward=true only" in ignored[0]


def test_a_logger_left_on_the_run_log_after_the_launch_still_writes(tmp_path, capsys) -> None:
    """The run log copies stderr during the launch; a log line after it (Ray's atexit) reaches the
    terminal, not a closed file."""
    run_log = RunLog(tmp_path)
    run_log.start(["x"])
    tee = sys.stderr
    print("during", file=sys.stderr)
    run_log.stop()
    tee.write("after\n")
    assert "during" in (tmp_path / "run.log").read_text() and "after" not in (tmp_path / "run.log").read_text()
    assert "after" in capsys.readouterr().err
