"""Line coverage per package from the combined .coverage file (`hatch run cov` / `cov-all`): one row
per package of packages/*/src, statements and the share run. docs/TESTING.md, "Coverage"."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]


def package_of(path: Path) -> str | None:
    parts = path.resolve().relative_to(ROOT).parts
    if parts[0] != "packages" or "src" not in parts:
        return None
    return "/".join(parts[1 : parts.index("src")])


def main() -> int:
    cov = coverage.Coverage(config_file=str(ROOT / ".coveragerc"))
    cov.load()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name in cov.get_data().measured_files():
        path = Path(name)
        if not path.is_relative_to(ROOT) or (package := package_of(path)) is None:
            continue
        _, statements, _, missing, _ = cov.analysis2(name)
        totals[package][0] += len(statements)
        totals[package][1] += len(statements) - len(missing)
    # files no test imported count as not run
    for source in sorted(ROOT.glob("packages/**/src/**/*.py")):
        if str(source) not in cov.get_data().measured_files() and (package := package_of(source)):
            statements = cov.analysis2(str(source))[1]
            totals[package][0] += len(statements)
    print("| package | statements | run | line coverage |\n|---|---:|---:|---:|")
    for package, (statements, run) in sorted(totals.items()):
        print(f"| {package} | {statements} | {run} | {100 * run / max(statements, 1):.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
