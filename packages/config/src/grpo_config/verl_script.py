"""A verl launch script read as bash runs it: the script runs under bash in a scratch directory with
stand-ins for every command that would start work or reach the network (`python`, `torchrun`, `ray`,
`hf`, `wget`, `git`, ...), which record their arguments and do nothing. The trainer call is then
found among the recorded ones, so arrays (`"${ALGORITHM[@]}"`), `${VAR:-default}`, `$((...))`,
`case` and `if` are resolved by bash itself, not imitated.

What runs for real: bash and the commands not stood in for (`echo`, `export`, `dirname`, ...), with the
user's environment plus `env`, in a scratch working directory, for at most `timeout_s` seconds.
Commands that change or remove files (`rm`, `mv`, `cp`, `ln`, `tee`, `touch`, ...) are stood in for
too, and `mkdir` creates folders only inside the scratch directory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Commands replaced by a recorder: they would start the training, download, or change files.
STAND_INS = (
    "python", "python3", "python3.10", "python3.11", "python3.12", "torchrun", "deepspeed", "accelerate",
    "ray", "srun", "sbatch", "salloc", "scontrol", "squeue", "mpirun", "hf", "huggingface-cli", "modelscope", "wget", "curl", "git", "pip",
    "pip3", "uv", "conda", "nvidia-smi", "npu-smi", "sleep", "rm", "mv", "cp", "ln", "rsync", "tar", "unzip",
    "tee", "touch", "chmod", "chown", "kill", "pkill",
)  # fmt: skip
# The trainer entry points: verl's main_ppo and the recipes' mains (recipe.dapo.main_dapo, ...).
_TRAINER_MODULE = re.compile(r"^(?:verl\.trainer\.main_\w+|recipe\.[\w.]+\.main_\w+|verl\.experimental\.[\w.]+\.main_\w+)$")
_TRAINER_FILE = re.compile(r"(?:^|/)main_\w+\.py$")
# A `python -c CODE` probe of the machine (`import torch_npu`, ...) is answered as failing: it is not
# run here, and the script's choice it feeds is said (TrainerCall.probes) so that --env can make it.
_RECORDER = """#!/bin/bash
printf '%s\\0' "$#" "${0##*/}" "$@" > "$GRPO_VERL_RECORD/$(date +%s%N).$$"
case "${0##*/}" in python*) [ "${1-}" = -c ] && exit 1 ;; esac
exit 0
"""


# Read by bash before the script (BASH_ENV): what only the author's machine has is forgiven and
# noted instead of stopping the script (`set -e`): `cd` into a missing folder, `source` / `.` of a
# missing file (a virtualenv's activate), `sed -i` on a missing file. `mkdir` creates folders only
# inside the scratch directory: one elsewhere (a checkpoint folder, `logs` beside the script after
# `cd "$(dirname "$0")"`) is noted, not created.
_PRELUDE = """
_grpo_note() { printf '%s\\n' "$*" >> "$GRPO_VERL_NOTES"; }
cd() { builtin cd "$@" 2>/dev/null || _grpo_note "cd $*"; return 0; }
source() { if [ -r "${1-}" ]; then builtin source "$@"; else _grpo_note "source $*"; fi; }
.() { if [ -r "${1-}" ]; then builtin source "$@"; else _grpo_note ". $*"; fi; }
ulimit() { builtin ulimit "$@" 2>/dev/null || _grpo_note "ulimit $*"; return 0; }
sed() {
  local a; for a in "$@"; do case "$a" in -i*|--in-place*) _grpo_note "sed $*"; return 0 ;; esac; done
  command sed "$@"
}
mkdir() {
  local a; for a in "$@"; do
    case "$a" in -*) continue ;; esac
    case "$(realpath -m -- "$a")/" in "$GRPO_VERL_SCRATCH"/*) ;; *) _grpo_note "mkdir $*"; return 0 ;; esac
  done
  command mkdir "$@"
}
"""
# bash's complaint about a variable the script requires: `NAME: unbound variable` (`set -u`) or
# `NAME: <message>` (`${NAME:?message}`); such a variable gets a placeholder and the script runs again.
_REQUIRED = re.compile(
    r"line \d+: ([A-Za-z_]\w*|[1-9]): (?:unbound variable|parameter null or not set|"
    r"(?!command not found|No such file|Permission denied|cannot |invalid |bad |syntax error).+)$",
    re.M,
)
MAX_PLACEHOLDER_ROUNDS = 32


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
    # Variables the script requires that were given placeholders (`<NAME>`): the user sets them.
    placeholders: list[str] = field(default_factory=list)
    # What the prelude forgave (`cd /home/me/proj`, `source .venv/bin/activate`, `sed -i ...`).
    forgiven: list[str] = field(default_factory=list)
    # True when bash never reached the call and it was read from the script's text instead.
    static: bool = False
    # How many trainer calls the script made (the last one is read).
    calls_made: int = 1


def run_script(
    script: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> tuple[list[list[str]], str]:
    """Run `script` under bash with the stand-ins; every recorded call (command name first) and the
    script's combined output."""
    calls, output, _ = _run(script, env=env, timeout_s=timeout_s)
    return calls, output


def _run(
    script: Path, *, env: Mapping[str, str] | None, timeout_s: float, args: Sequence[str] = ()
) -> tuple[list[list[str]], str, list[str]]:
    """`run_script`, and what the prelude forgave."""
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
        record = Path(scratch) / "calls"  # one file per call: stand-ins in a pipeline run at once
        record.mkdir()
        notes = Path(scratch) / "forgiven"
        notes.touch()
        prelude = Path(scratch) / "prelude.sh"
        prelude.write_text(_PRELUDE)
        environ = {**os.environ, **(env or {})}
        environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
        environ["GRPO_VERL_RECORD"] = str(record)
        environ["GRPO_VERL_NOTES"] = str(notes)
        environ["BASH_ENV"] = str(prelude)
        environ["GRPO_VERL_SCRATCH"] = str(Path(scratch).resolve())
        work = Path(scratch) / "work"
        work.mkdir()
        try:
            done = subprocess.run(
                [bash, str(Path(script).absolute()), *args],
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
        files = sorted(record.iterdir(), key=lambda f: tuple(int(part) for part in f.name.split(".")))
        calls = [call for f in files for call in _parse_record(f.read_bytes())]
        forgiven = [line for line in notes.read_text(errors="replace").splitlines() if line]
    output = (done.stdout + done.stderr).decode(errors="replace")
    return calls, output, forgiven


def _parse_record(data: bytes) -> list[list[str]]:
    fields = data.split(b"\0")
    calls, i = [], 0
    while i + 1 < len(fields) and fields[i]:
        count = int(fields[i])
        calls.append([f.decode(errors="replace") for f in fields[i + 1 : i + 2 + count]])
        i += 2 + count
    return calls


# verl's config sections: a Python call that passes several of them is a trainer built on verl's
# config (a project's own module wrapping verl's main).
_VERL_SECTIONS = re.compile(r"^[+~]{0,2}(?:actor_rollout_ref|algorithm|data|trainer|critic|reward_model)\.")
_WRAPPER_MIN_OVERRIDES = 3


def trainer_call(calls: Sequence[Sequence[str]]) -> TrainerCall | None:
    """The last recorded call that starts a verl trainer (`-m verl.trainer.main_ppo`, a recipe's
    main, or a `main_*.py` file), wherever it sits in the command (`ray job submit -- python3 -m ...`);
    failing that, the last Python call of a module or file that passes verl's config sections
    (a project's own entry point built on verl)."""
    return _trainer_call(calls, _entry) or _trainer_call(calls, _wrapper_entry)


def _wrapper_entry(args: list[str]) -> int | None:
    if not args[0].startswith("python") or sum(bool(_VERL_SECTIONS.match(a)) for a in args) < _WRAPPER_MIN_OVERRIDES:
        return None
    for i, arg in enumerate(args[1:], start=1):
        if arg == "-m" and i + 1 < len(args):
            return i + 1
        if arg.endswith(".py"):
            return i
    return None


def _trainer_call(calls: Sequence[Sequence[str]], find_entry: Callable[[list[str]], int | None]) -> TrainerCall | None:
    found = None
    for call in calls:
        args = list(call)
        start = find_entry(args)
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
    """The verl trainer call `script` makes, or ScriptError saying why there is none. A variable the
    script requires and nobody set gets a placeholder (`<NAME>`) and the script runs again; where
    bash still never reaches the call (a branch for another machine), it is read from the text."""
    given = dict(env or {})
    placeholders: list[str] = []
    first_output = None
    for _ in range(MAX_PLACEHOLDER_ROUNDS):
        positional = [given.get(str(i), f"<{i}>") for i in range(1, 1 + max((int(n) for n in given if n.isdigit()), default=0))]
        calls, output, forgiven = _run(script, env=given, timeout_s=timeout_s, args=positional)
        first_output = first_output if first_output is not None else output
        call = trainer_call(calls)
        missing = [n for n in dict.fromkeys(_REQUIRED.findall(output)) if n not in given and n not in os.environ]
        if call is not None or not missing:
            break
        placeholders += [f"${n}" if n.isdigit() else n for n in missing]
        given.update({name: f"<{name}>" for name in missing})
    static = False
    if call is None:
        text = Path(script).read_text(errors="replace")
        overrides = overrides_from_script(text, env=given)
        if _ENTRY_POINT_TEXT.search(text) and overrides:
            call, static = TrainerCall(entry_point="(read from the script's text)", overrides=overrides), True
    if call is None:
        output = first_output or output
        commands = sorted({c[0] for c in calls})
        tail = " | ".join(line for line in output.strip().splitlines()[-3:])
        raise ScriptError(
            f"{script}: no verl trainer call found when bash ran it (no `python3 -m verl.trainer.main_ppo`, recipe "
            f"main or main_*.py among the commands it ran: {', '.join(commands) or 'none'}"
            + (f"; its last output: {tail}" if tail else "")
            + "). Set the variables it needs with --env KEY=VALUE, or pass its overrides as a file of key=value lines."
        )
    probes = [
        shlex.join(c) for c in calls
        if (c[0].startswith("python") and len(c) > 1 and c[1] == "-c") or c[0] in ("nvidia-smi", "npu-smi")
    ]
    made = sum(1 for c in calls if _entry(list(c)) is not None) or sum(1 for c in calls if _wrapper_entry(list(c)) is not None)
    return dataclasses.replace(
        call, probes=probes, placeholders=placeholders, forgiven=forgiven, static=static, calls_made=max(made, 1)
    )


_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?:(:?[-=?])([^}]*))?\}|\$([A-Za-z_]\w*)")
# A trainer entry point in a script's text: `-m` of a `main_*` module (verl's, a recipe's, a project's),
# a dotted `*.main_*` module, or a `main_*.py` file.
_ENTRY_POINT_TEXT = re.compile(r"-m\s+(?:[A-Za-z_]\w*\.)*main_\w+|(?<![\w.])(?:[A-Za-z_]\w*\.)+main_\w+|main_\w+\.py\b")


def _entry_index(tokens: Sequence[str]) -> int | None:
    for i, token in enumerate(tokens):
        if re.fullmatch(r"(?:[A-Za-z_]\w*\.)+main_\w+|\S*main_\w+\.py", token) or (
            i and tokens[i - 1] == "-m" and re.fullmatch(r"main_\w+", token)
        ):
            return i
    return None


def _expand(text: str, variables: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(4)
        if name in variables:
            return variables[name]
        if name in os.environ:  # what the script would see when run here
            return os.environ[name]
        operator, default = match.group(2), match.group(3)
        if operator in (":-", "-", ":=", "="):
            return _expand(default, variables)
        return match.group(0)

    return _VARIABLE.sub(value, text)


def overrides_from_script(text: str, *, env: Mapping[str, str] | None = None) -> list[str]:
    """The `key=value` overrides of a verl launch script read from its text, without running it
    (plain assignments and `${VAR:-default}` only), or those of a file of one override per line."""
    if not _ENTRY_POINT_TEXT.search(text):
        return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    variables: dict[str, str] = dict(env or {})
    for line in re.sub(r"\\\n", " ", text).splitlines():
        stripped = line.strip()
        assignment = _ASSIGNMENT.match(stripped)
        on_call = _ENTRY_POINT_TEXT.search(stripped)
        try:
            if assignment and not on_call:
                words = shlex.split(_expand(assignment.group(2), variables), comments=True) or [""]
                variables[assignment.group(1)] = words[0]
            elif on_call:
                tokens = shlex.split(_expand(stripped, variables), comments=True)
                start = _entry_index(tokens)
                if start is not None:
                    return [t for t in tokens[start + 1 :] if "=" in t and not t.startswith("-")]
        except ValueError:  # an unbalanced quote: not something this reader can take
            continue
    return []
