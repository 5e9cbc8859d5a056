"""The checked-in defaults.yaml matches the schema; the generator writes and checks it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import grpo_config
from grpo_config import load, to_dict
from grpo_config.reference import default_output, main, render_defaults

DEFAULTS = Path(__file__).resolve().parents[1] / "defaults.yaml"


def test_checked_in_defaults_have_not_drifted() -> None:
    assert DEFAULTS.read_text(encoding="utf-8") == render_defaults(), (
        "packages/config/defaults.yaml is out of date: run `hatch run config-defaults`"
    )


def test_defaults_file_loads_to_the_default_config() -> None:
    assert DEFAULTS.read_text(encoding="utf-8").startswith("# grpo_config reference")
    assert "GENERATED" in render_defaults() and "hatch run config-defaults" in render_defaults()
    assert load(DEFAULTS) == load()
    assert to_dict(load(DEFAULTS))["checkpoint"]["strict"] is True


def test_generator_check_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """From a source checkout the generator defaults to the checked-in file; from an installed
    wheel (hatch's pkg-config env) there is none, and it asks for --output."""
    from_source = Path(grpo_config.__file__).resolve().is_relative_to(DEFAULTS.parent / "src")
    assert default_output() == (DEFAULTS if from_source else None)
    if not from_source:
        with pytest.raises(SystemExit):
            main(["--check"])
        assert "pass --output PATH" in capsys.readouterr().err
    target = tmp_path / "defaults.yaml"
    target.write_text("stale: true\n")
    assert main(["--check", "--output", str(target)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == render_defaults()
    assert main(["--check", "--output", str(target)]) == 0


def test_readme_yaml_example_loads() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = load(yaml.safe_load(example), num_experts=256)
    assert (cfg.parallel.ep, cfg.actor.lr, cfg.checkpoint.strict) == (8, 1e-6, False)
    assert cfg.ref.megatron is not None
    assert cfg.ref.megatron.override_transformer_config == {"moe_router_dtype": "fp32"}
