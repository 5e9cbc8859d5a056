"""A verl launch script read as bash runs it: the script runs under bash in a scratch directory with
stand-ins for every command that would start work or reach the network (`python`, `torchrun`, `ray`,
`hf`, `wget`, `git`, ...), which record their arguments and do nothing. The trainer call is then
found among the recorded ones, so arrays (`"${ALGORITHM[@]}"`), `${VAR:-default}`, `$((...))`,
`case` and `if` are resolved by bash itself, not imitated.

What runs for real: bash and the commands not stood in for (`mkdir`, `echo`, `export`, ...), with the
user's environment plus `env`, in a scratch working directory, for at most `timeout_s` seconds.
Commands that change or remove files (`rm`, `mv`, `cp`, `ln`, `tee`, ...) are stood in for too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Commands replaced by a recorder: they would start the training, download, or change files.
STAND_INS = (
    "python", "python3", "python3.10", "python3.11", "python3.12", "torchrun", "deepspeed", "accelerate",
    "ray", "srun", "sbatch", "mpirun", "hf", "huggingface-cli", "modelscope", "wget", "curl", "git", "pip",
    "pip3", "uv", "conda", "nvidia-smi", "npu-smi", "sleep", "rm", "mv", "cp", "ln", "rsync", "tar", "unzip",
    "tee", "chmod", "chown", "kill", "pkill",
)  # fmt: skip
# The trainer entry points: verl's main_ppo and the recipes' mains (recipe.dapo.main_dapo, ...).
_TRAINER_MODULE = re.compile(r"^(?:verl\.trainer\.main_\w+|recipe\.[\w.]+\.main_\w+|verl\.experimental\.[\w.]+\.main_\w+)$")
_TRAINER_FILE = re.compile(r"(?:^|/)main_\w+\.py$")
# A `python -c CODE` probe of the machine (`import torch_npu`, ...) is answered as failing: it is not
# run here, and the script's choice it feeds is said (TrainerCall.probes) so that --env can make it.
_RECORDER = """#!/bin/bash
{ printf '%s\\0' "$#" "${0##*/}" "$@"; } >> "$GRPO_VERL_RECORD"
case "${0##*/}" in python*) [ "${1-}" = -c ] && exit 1 ;; esac
exit 0
"""


class ScriptError(ValueError):
    """The script could not be read as a verl launch (no trainer call, bash failed, timed out)."""


@dataclass(frozen=True)
class TrainerCall:
    """The recorded trainer call: its entry point, Hydra's config name and path, and its overrides."""

    entry_point: str
    overrides: list[str]
    config_name: str | None = None
    config_path: str | None = None
    command: list[str] = field(default_factory=list)
    # `python -c CODE` commands the script ran to probe the machine, answered as failing.
    probes: list[str] = field(default_factory=list)


def run_script(
    script: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> tuple[list[list[str]], str]:
    """Run `script` under bash with the stand-ins; every recorded call (command name first) and the
    script's combined output."""
    bash = shutil.which("bash")
    if bash is None:
        raise ScriptError("bash is not on PATH: from-verl runs the script under bash to resolve it")
    with tempfile.TemporaryDirectory(prefix="from-verl-") as scratch:
        bin_dir = Path(scratch) / "bin"
        bin_dir.mkdir()
        for name in STAND_INS:
            recorder = bin_dir / name
            recorder.write_text(_RECORDER)
            recorder.chmod(0o755)
        record = Path(scratch) / "calls"
        record.touch()
        environ = {**os.environ, **(env or {})}
        environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
        environ["GRPO_VERL_RECORD"] = str(record)
        work = Path(scratch) / "work"
        work.mkdir()
        try:
            done = subprocess.run(
                [bash, str(Path(script).absolute())],
                cwd=work,
                env=environ,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ScriptError(
                f"{script} did not finish within {timeout_s:g} s under bash with the stand-ins (a loop that waits "
                "for a cluster?); raise --timeout or pass the overrides as a file of key=value lines"
            ) from None
        calls = _parse_record(record.read_bytes())
    output = (done.stdout + done.stderr).decode(errors="replace")
    return calls, output


def _parse_record(data: bytes) -> list[list[str]]:
    fields = data.split(b"\0")
    calls, i = [], 0
    while i + 1 < len(fields) and fields[i]:
        count = int(fields[i])
        calls.append([f.decode(errors="replace") for f in fields[i + 1 : i + 2 + count]])
        i += 2 + count
    return calls


def trainer_call(calls: Sequence[Sequence[str]]) -> TrainerCall | None:
    """The last recorded call that starts a verl trainer (`-m verl.trainer.main_ppo`, a recipe's
    main, or a `main_*.py` file), wherever it sits in the command (`ray job submit -- python3 -m ...`)."""
    found = None
    for call in calls:
        args = list(call)
        start = _entry(args)
        if start is None:
            continue
        entry, rest = args[start], args[start + 1 :]
        overrides, name, path = [], None, None
        i = 0
        while i < len(rest):
            arg = rest[i]
            if arg in ("--config-name", "-cn", "--config-path", "-cp") and i + 1 < len(rest):
                name, path = (rest[i + 1], path) if arg in ("--config-name", "-cn") else (name, rest[i + 1])
                i += 2
                continue
            if arg.startswith(("--config-name=", "--config-path=")):
                option, _, value = arg.partition("=")
                name, path = (value, path) if option == "--config-name" else (name, value)
            elif "=" in arg or arg.startswith("~"):
                overrides.append(arg)
            i += 1
        found = TrainerCall(entry_point=entry, overrides=overrides, config_name=name, config_path=path, command=args)
    return found


def _entry(args: list[str]) -> int | None:
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args) and _TRAINER_MODULE.match(args[i + 1]):
            return i + 1
        if _TRAINER_FILE.search(arg) and "=" not in arg:
            return i
    return None


def read_trainer_call(script: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> TrainerCall:
    """The verl trainer call `script` makes, or ScriptError saying why there is none."""
    calls, output = run_script(script, env=env, timeout_s=timeout_s)
    call = trainer_call(calls)
    if call is None:
        commands = sorted({c[0] for c in calls})
        tail = " | ".join(line for line in output.strip().splitlines()[-3:])
        raise ScriptError(
            f"{script}: no verl trainer call found when bash ran it (no `python3 -m verl.trainer.main_ppo`, recipe "
            f"main or main_*.py among the commands it ran: {', '.join(commands) or 'none'}"
            + (f"; its last output: {tail}" if tail else "")
            + "). Set the variables it needs with --env KEY=VALUE, or pass its overrides as a file of key=value lines."
        )
    probes = [shlex.join(c) for c in calls if c[0].startswith("python") and len(c) > 1 and c[1] == "-c"]
    return dataclasses.replace(call, probes=probes)
