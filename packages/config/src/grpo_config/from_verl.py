"""verl Hydra overrides -> a grpo YAML, with every line grpo refuses and why.

`hatch run from-verl run_qwen3_5.sh > run.yaml` reads a verl launch script as bash runs it (with
stand-ins for the commands that would start work: `verl_script.py`), taking the overrides of its
trainer call, or a file of one `key=value` per line. The YAML holds what maps onto grpo settings, typed; each refused
line goes to stderr with its reason. Exit status 0 when the YAML loads as it is, 2 otherwise (the
YAML is still written: the settings that conflict are named) or when the script cannot be read.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_config.aliases import GLOBAL_MICRO_BATCH_KEYS, MODEL_ENGINE_KEY, ignored_reason
from grpo_config.errors import ConfigError
from grpo_config.loader import build
from grpo_config.serialize import to_dict
from grpo_config.sources import collect
from grpo_config.validate import inert_settings, validate, value_problems
from grpo_config.verl_script import overrides_from_script

_STRATEGY = "actor_rollout_ref.actor.strategy"
_INTERPOLATION = re.compile(r"\$\{[^}]*\}")  # Hydra's ${other.key} / ${oc.env:VAR} (bash left it)
_MEGATRON_KEYS = ("actor_rollout_ref.actor.megatron.", "actor_rollout_ref.ref.megatron.")


@dataclass(frozen=True, kw_only=True)
class Conversion:
    """The grpo settings a list of verl overrides maps to, and the lines refused with their reason."""

    settings: dict[str, Any]  # nested, grpo key names, typed values
    accepted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (override, reason)
    problems: str | None = None  # why the accepted settings do not load together, if they do not
    inferred: list[str] = field(default_factory=list)  # overrides added, not written by the user
    inert: list[tuple[str, str]] = field(default_factory=list)  # (override, why it does nothing) as in verl
    engines: str = ""  # the backend (and what decided it), rollout engine and algorithm of the whole call

    def to_yaml(self) -> str:
        text = yaml.safe_dump(self.settings, sort_keys=False, default_flow_style=False, allow_unicode=True)
        if self.inert:
            text += "# Ignored: these set nothing here (their switch is off, as in verl, or they restate what grpo does):\n"
            text += "".join(f"#   {line}  ({why})\n" for line, why in self.inert)
        return text


def _lookup(nested: Mapping[str, Any], dotted: str) -> Any:
    node: Any = nested
    for part in dotted.split("."):
        node = node[part]
    return node


def _place(nested: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = nested
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _grpo_keys(line: str) -> set[str]:
    """The grpo keys one override sets (none when it does not map)."""
    try:
        return set(collect({}, [line]).values)
    except ConfigError:
        return set()


def _problems(lines: list[str]) -> set[str] | None:
    """The cross-field problems of `lines` together; None when they do not build."""
    try:
        return set(value_problems(build(collect({}, lines))))
    except ConfigError:
        return None


def _why_refused(line: str, context: list[str]) -> str | None:
    """None when `line` maps to a grpo setting with a value grpo honours beside `context` (the
    script's other lines that map): refused only for the problems it adds to them, so a setting
    that needs another one of the script (dynamic sampling's sizes, GSPO's aggregation) is judged
    with it."""
    try:
        cfg = build(collect({}, [*context, line]))
    except ConfigError as exc:
        return str(exc)
    before = _problems(context) or set()
    added = [p for p in value_problems(cfg) if p not in before]
    return " ".join(added) if added else None


def last_of_each_key(overrides: Iterable[str]) -> list[str]:
    """As Hydra: a key given twice takes its last value (`+key` / `++key` are the same key)."""
    last: dict[str, str] = {}
    for line in overrides:
        key = line.partition("=")[0].strip().lstrip("+")
        last.pop(key, None)
        last[key] = line
    return list(last.values())


def _value_of(lines: Sequence[str], key: str, default: int) -> int | None:
    """The integer value of `key` among `lines` (the last one), `default` when absent, None when not
    an integer."""
    for line in reversed(lines):
        name, _, value = line.partition("=")
        if name.strip().lstrip("+") == key:
            try:
                parsed = yaml.safe_load(value) if value.strip() else None
            except yaml.YAMLError:
                return None
            return parsed if isinstance(parsed, int) and not isinstance(parsed, bool) else None
    return default


def per_device_sizes(lines: Sequence[str], *, megatron: bool) -> dict[str, str]:
    """verl's deprecated global micro-batch sizes as the `_per_gpu` lines verl's workers divide them
    into: by the data-parallel size, the world (trainer.nnodes x trainer.n_gpus_per_node of the same
    call, verl's defaults 1 x 8) over the Ulysses size (FSDP) or over the actor's tensor x pipeline x
    context sizes (Megatron). {rewritten line: the script's line}; a size that does not divide into
    >= 1 a device, or whose key is also given per device, stays as written (refused)."""
    nodes = _value_of(lines, "trainer.nnodes", 1)
    per_node = _value_of(lines, "trainer.n_gpus_per_node", 8)
    splits = (
        [f"actor_rollout_ref.actor.megatron.{name}_parallel_size" for name in ("tensor_model", "pipeline_model", "context")]
        if megatron
        else ["actor_rollout_ref.actor.ulysses_sequence_parallel_size"]
    )
    sizes = [_value_of(lines, key, 1) for key in splits]
    model_parallel = None if None in sizes or 0 in sizes else math.prod(sizes)  # type: ignore[arg-type]
    keys = {line.partition("=")[0].strip().lstrip("+") for line in lines}
    rewritten = {}
    for line in lines:
        key = line.partition("=")[0].strip().lstrip("+")
        size = _value_of([line], key, 0) if key in GLOBAL_MICRO_BATCH_KEYS else None
        if size is None or not (nodes and per_node and model_parallel) or f"{key}_per_gpu" in keys:
            continue
        data_parallel = nodes * per_node // model_parallel
        if data_parallel >= 1 and size // data_parallel >= 1:
            rewritten[f"{key}_per_gpu={size // data_parallel}"] = line
    return rewritten


def backend_choice(lines: Sequence[str], config_name: str | None = None) -> tuple[str | None, str]:
    """verl's engine for the whole command line, whatever the order of its lines, and what decided
    it: the last `actor_rollout_ref.actor.strategy` / `model_engine` given, else the Hydra config
    (`--config-name=ppo_megatron_trainer`), else verl's Megatron keys (those of its Megatron trainer
    config), else None (verl's default config: FSDP, grpo's torch backend)."""
    for line in reversed(lines):
        key, _, value = line.partition("=")
        if key.strip().lstrip("+") in (_STRATEGY, MODEL_ENGINE_KEY):
            return value.strip().strip("'\""), line
    if config_name and "megatron" in Path(config_name).stem:
        return "megatron", f"--config-name={config_name}"
    if config_name and not Path(config_name).stem.endswith("_trainer"):
        return None, f"--config-name={config_name}: a project's own config, not read"
    keys = [line.partition("=")[0].strip().lstrip("+") for line in lines]
    if any(k.startswith(_MEGATRON_KEYS) for k in keys):
        return "megatron", "verl's Megatron keys"
    return None, "verl's default config"


def convert(overrides: Iterable[str], *, config_name: str | None = None) -> Conversion:
    """Map each verl override (a refused one is left out with its reason), then the accepted ones
    together into typed, nested grpo settings. Each line is judged beside the engine verl picks
    for the whole command line (`backend_choice`): a Megatron config name or Megatron keys without
    an explicit strategy add `actor.strategy=megatron`."""
    lines = last_of_each_key(overrides)
    interpolated = [line for line in lines if _INTERPOLATION.search(line.partition("=")[2])]
    lines = [line for line in lines if line not in interpolated]
    backend, decided_by = backend_choice(lines, config_name)
    written_as = per_device_sizes(lines, megatron=backend == "megatron")  # judged per device, reported as written
    per_device = {old: new for new, old in written_as.items()}
    lines = [per_device.get(line, line) for line in lines]
    inferred = [] if backend is None or decided_by in lines else [f"{_STRATEGY}=megatron"]
    # every line's context: the line that decides the backend, when it holds on its own
    base = inferred + ([decided_by] if decided_by in lines and _problems([decided_by]) is not None else [])
    lines = inferred + lines
    # Lines that build on their own are each other's context; a line that does not is refused alone.
    candidates = [line for line in lines if _problems([*base, line]) is not None]
    refused: dict[str, str] = {}
    while True:
        newly = {}
        for line in candidates:
            # The other candidates, less those setting the same key (each is judged as if it set it).
            others = [o for o in candidates if o is not line and not _grpo_keys(o) & _grpo_keys(line)]
            reason = _why_refused(line, [*base, *others] if _problems(others) is not None else base)
            if reason is not None:
                newly[line] = reason
        if not newly:
            break
        refused.update(newly)  # judged again against what is left: a line that needed a refused one goes too
        candidates = [line for line in candidates if line not in newly]
    for line in lines:
        if line not in candidates and line not in refused:
            refused[line] = _why_refused(line, base) or "does not load beside the other settings"
    accepted = [line for line in lines if line in candidates]
    refused_in_order = [(line, refused[line]) for line in lines if line in refused] + [
        (line, "a Hydra interpolation: verl resolves it against its own config when it starts, grpo does not; "
         "write the value itself") for line in interpolated
    ]
    # Lines that load but do nothing (their switch is off): listed, not written as settings.
    why_inert = {
        text.partition("=")[0]: why for texts, why in inert_settings(build(collect({}, accepted))) for text in texts
    }
    inert = [
        (line, why_inert[key])
        for line in accepted
        if line not in inferred
        for key in sorted(_grpo_keys(line))[:1]
        if key in why_inert
    ]
    # verl keys whose accepted value restates what grpo does: they set nothing.
    inert += [
        (line, why)
        for line in accepted
        if not _grpo_keys(line)
        for why in [ignored_reason(line.partition("=")[0].strip().lstrip("+"))]
        if why is not None
    ]
    accepted = [line for line in accepted if line not in {line for line, _ in inert}]
    flat = collect({}, accepted)
    cfg = build(flat)
    typed = to_dict(cfg)
    settings: dict[str, Any] = {}
    dropped = set()
    for key in flat.values:
        try:
            _place(settings, key, _lookup(typed, key))
        except KeyError:  # the build dropped it: a frozen reference's training setting equal to the actor's
            dropped.add(key)
    if dropped:
        restating = [line for line in accepted if _grpo_keys(line) and _grpo_keys(line) <= dropped]
        inert += [(line, "the reference model is frozen (no backward pass); this training setting equals the "
                   "actor's, which is what the reference is built with") for line in restating]
        accepted = [line for line in accepted if line not in restating]
    problems = None
    try:
        validate(cfg)
    except ConfigError as exc:
        problems = str(exc)
    def script_line(line: str) -> str:
        return written_as.get(line, line)

    return Conversion(
        settings=settings,
        accepted=[script_line(line) for line in accepted],
        refused=[(script_line(line), why) for line, why in refused_in_order],
        problems=problems,
        inferred=inferred,
        inert=[(script_line(line), why) for line, why in inert],
        engines=f"backend {cfg.actor.backend} ({decided_by}{', refused' if decided_by in refused else ''}), "
        f"rollout {cfg.rollout.engine}, "
        f"algorithm {cfg.algorithm.adv_estimator}",
    )


_OVERRIDE_LINE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.-]*(=\S.*|=)?$")


def is_override_file(text: str) -> bool:
    """A file of one `key=value` per line (comments and blank lines aside), not a script."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    # `HYDRA_FULL_ERROR=1 python -m ...` is a command with a variable before it, not an override
    commands = any(re.search(r"\s(?:python\d*(?:\.\d+)?|torchrun|ray|bash|srun)\s", f" {line} ") for line in lines)
    return bool(lines) and not commands and all(_OVERRIDE_LINE.match(line) and "=" in line for line in lines)


def script_overrides(path: Path, *, env: Mapping[str, str], timeout_s: float) -> list[str]:
    """The overrides of a verl script as bash resolves them (`verl_script`)."""
    from grpo_config.verl_script import read_trainer_call

    return read_trainer_call(path, env=env, timeout_s=timeout_s).overrides


def _log_once_to_stderr() -> None:
    """from-verl's own entry point: stdout carries the YAML, so warnings go to stderr, each once
    (a deprecated key is met once per line judged)."""
    import structlog

    seen: set[str] = set()

    def once(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        key = repr(sorted(event.items()))
        if key in seen:
            raise structlog.DropEvent
        seen.add(key)
        return event

    structlog.configure(
        processors=[once, structlog.stdlib.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="from-verl",
        description="Turn a verl launch script's Hydra overrides into a grpo YAML (stdout); refused "
        "lines and their reasons go to stderr. A script runs under bash with stand-ins for every "
        "command that would start work or download (python, torchrun, ray, hf, wget, git, ...), so "
        "its arrays, variables and branches resolve as they would.",
    )
    parser.add_argument("script", type=Path, help="a verl launch script, or a file of key=value lines")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="a variable the script reads (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds the script may run (default 60)")
    args = parser.parse_args(argv)
    _log_once_to_stderr()
    try:
        text = args.script.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"from-verl: cannot read {args.script}: {exc}", file=sys.stderr)
        return 2
    reading = ""  # how the call was found, when not simply as bash ran it
    if is_override_file(text):
        overrides, config_name = overrides_from_script(text), None
    else:
        bad = [e for e in args.env if "=" not in e]
        if bad:
            print(f"from-verl: --env takes KEY=VALUE, got {' '.join(bad)}", file=sys.stderr)
            return 2
        env = dict(e.split("=", 1) for e in args.env)
        from grpo_config.verl_script import read_trainer_call

        try:
            call = read_trainer_call(args.script, env=env, timeout_s=args.timeout)
        except ValueError as exc:
            print(f"from-verl: {exc}", file=sys.stderr)
            return 2
        overrides, config_name = call.overrides, call.config_name
        for probe in call.probes:
            print(f"note: the script probed the machine with `{probe}`: not run here, answered as failing "
                  "(no output); set what it decides with --env (e.g. --env DEVICE=npu)", file=sys.stderr)
        for forgiven in call.forgiven:
            print(f"note: `{forgiven}` needs the author's machine: skipped here", file=sys.stderr)
        reading = "".join([
            f"; set: {', '.join(call.placeholders)} (placeholders <NAME> here; --env NAME=VALUE)"
            if call.placeholders else "",
            "; read from the script's text: bash never reached the trainer call" if call.static else "",
            f"; the script makes {call.calls_made} trainer calls: the last one is read" if call.calls_made > 1 else "",
        ])
    conversion = convert(overrides, config_name=config_name)
    sys.stdout.write(conversion.to_yaml())
    for line in conversion.inferred:
        print(f"added: {line} (verl's engine for this call: {conversion.engines})", file=sys.stderr)
    for line, reason in conversion.refused:
        print(f"refused: {line}\n  {reason}", file=sys.stderr)
    for line, why in conversion.inert:
        print(f"ignored: {line}\n  sets nothing here: {why}", file=sys.stderr)
    print(
        f"from-verl: {conversion.engines}; {len(conversion.accepted) - len(conversion.inferred)} lines "
        f"mapped, {len(conversion.inert)} inert, {len(conversion.refused)} refused{reading}",
        file=sys.stderr,
    )
    if conversion.problems:
        print(f"from-verl: the YAML is written, but its settings do not load together yet: {conversion.problems}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
