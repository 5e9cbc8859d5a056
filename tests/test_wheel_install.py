"""The packages installed as a user without the monorepo gets them: `hatch run build-wheels` writes
the eight wheels to one folder, and a fresh virtual environment installs the launchers from that
folder alone (`pip install --no-index --find-links DIR`: an internal name can never be answered by
a package registry). The third-party packages the wheels need are this environment's, seen through
a path file (without the editable grpo packages), so the test downloads nothing; docs/INSTALL.md
gives the same commands with the third-party packages installed from the lock."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("grpo_device", "grpo_config", "grpo_ckpt", "grpo_tiny", "grpo_trainer", "grpo_launch", "grpo_launch_qwen35_35b", "grpo_launch_qwen35_122b")


def _build_wheels(dist: Path) -> list[Path]:
    """hatch.toml's build-wheels script, as `hatch run build-wheels DIST` runs it."""
    script = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]["scripts"]["build-wheels"]
    argv = shlex.split(script.replace("{args:dist}", str(dist)))
    assert argv[0] == "python"
    subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, check=True, timeout=300)
    return sorted(dist.glob("*.whl"))


def _fresh_env(tmp: Path) -> Path:
    """A new venv whose site-packages also sees this environment's third-party packages (not grpo's)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    overlay = tmp / "third_party"
    overlay.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(("grpo", "_editable_impl_grpo", "__editable__")):
            (overlay / entry.name).symlink_to(entry)
    site = Path(subprocess.check_output([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (site / "zz_third_party.pth").write_text(f"import site; site.addsitedir({str(overlay)!r})\n")
    return venv


def test_the_launchers_install_from_their_wheels_alone_and_run(tmp_path: Path) -> None:
    wheels = _build_wheels(tmp_path / "dist")
    assert [w.name.split("-")[0] for w in wheels] == sorted(PACKAGES)
    names = zipfile.ZipFile(next(w for w in wheels if w.name.startswith("grpo_launch_qwen35_35b-"))).namelist()
    for shipped in ("architecture/config.json", "architecture/model_counts.json", "py.typed"):
        assert f"grpo_launch_qwen35_35b/{shipped}" in names

    venv = _fresh_env(tmp_path)
    python = venv / "bin/python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
         "--find-links", str(tmp_path / "dist"), "grpo-launch-qwen35-35b", "grpo-launch-qwen35-122b"],
        check=True, timeout=300,
    )  # fmt: skip
    where = subprocess.check_output(
        [str(python), "-c", f"import {', '.join(PACKAGES)}; print(*(m.__file__ for m in ({', '.join(PACKAGES)})))"],
        text=True,
    ).split()
    assert all(path.startswith(str(venv)) for path in where), where  # the wheels, not this checkout

    env = {k: v for k, v in os.environ.items() if k != "DEVICE"} | {"HOME": str(tmp_path / "home")}
    for launcher in ("grpo-launch-35b", "grpo-launch-122b"):
        dry = subprocess.run([str(venv / "bin" / launcher), "--dry-run", "--device", "gpu"], capture_output=True, text=True, env=env, timeout=180, check=False)
        assert dry.returncode == 0, dry.stderr[-2000:]
        assert f"# {launcher} --dry-run:" in dry.stdout
    plan = subprocess.run([str(venv / "bin/grpo-launch-35b"), "--plan", "--device", "gpu"], capture_output=True, text=True, env=env, timeout=180, check=False)
    assert plan.returncode == 0 and "launch with the first choice: --" in plan.stdout, plan.stderr[-2000:]
