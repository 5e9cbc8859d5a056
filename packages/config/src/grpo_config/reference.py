"""Generate `packages/config/defaults.yaml`, the reference of every key and its default.

hatch run config-defaults            # rewrite the file
hatch run config-defaults --check    # exit 1 when the file is out of date
hatch run config-defaults --output x.yaml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from grpo_config.schema import TrainerConfig
from grpo_config.serialize import to_yaml

HEADER = """\
# grpo_config reference: every key with its default value.
# GENERATED from packages/config/src/grpo_config/schema.py; do not edit by hand.
# Regenerate with `hatch run config-defaults` (python -m grpo_config.reference); a test fails on drift.
# `ref.*: null` means "inherit": ref takes the actor's value (ref.parallel the root `parallel`).
# verl-style keys are accepted as aliases too: see grpo_config/aliases.py.
"""


def render_defaults() -> str:
    return HEADER + "\n" + to_yaml(TrainerConfig())


def default_output() -> Path | None:
    """packages/config/defaults.yaml in a source checkout, None in an installed wheel."""
    package_root = Path(__file__).resolve().parents[2]
    return package_root / "defaults.yaml" if (package_root / "pyproject.toml").is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="config-defaults", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", type=Path, default=None, help="file to write (default: the checked-in one)"
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when out of date")
    args = parser.parse_args(argv)
    output = args.output or default_output()
    if output is None:
        parser.error("not running from a source checkout: pass --output PATH")
    text = render_defaults()
    current = output.read_text(encoding="utf-8") if output.is_file() else None
    if args.check:
        if current != text:
            print(f"{output} is out of date: run `hatch run config-defaults`", file=sys.stderr)
            return 1
        print(f"{output} is up to date")
        return 0
    if current != text:
        output.write_text(text, encoding="utf-8")
    print(f"wrote {output}" if current != text else f"{output} already up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
