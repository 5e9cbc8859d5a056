"""The command line every model launcher shares. A launcher package's `main` is one call:
`run_launcher(PROFILE, argv)`.

The derivation: docs/INTERNALS.md, `grpo_launch.cli`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import structlog

import grpo_config
from grpo_config import ConfigError
from grpo_launch.config_file import ConfigFile, read_config_file
from grpo_launch.dry_run import render_dry_run
from grpo_launch.errors import LaunchError
from grpo_launch.failure import EXIT_BUG, EXIT_USAGE, describe, one_line
from grpo_launch.logging_setup import LOG_LEVELS, configure_logging, worker_runtime_env
from grpo_launch.plan import TINY_PRESETS, LaunchPlan, device_from_cli, plan_full, plan_tiny, tiny_output_dir
from grpo_launch.preflight import preflight_problems, preflight_warnings, run_common_steps
from grpo_launch.profile import DEVICE_KINDS, LaunchProfile
from grpo_launch.run_log import RunLog

log = structlog.get_logger()


def build_parser(profile: LaunchProfile) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=profile.launcher,
        description=(
            f"GRPO on {profile.model_id} ({profile.dataset}). Environment: MODEL_PATH, TRAIN_FILES, "
            "VAL_FILES, NNODES, DATA_DIR, DATA_SOURCE; DEVICE=gpu|npu|cpu overrides device detection."
        ),
        epilog="Dotted overrides go last, after `--`: e.g. -- actor_rollout_ref.actor.checkpoint.strict=False",
    )
    parser.add_argument(
        "--preset",
        choices=("tiny", "tiny-vl", "tiny-tool", "full"),
        default="full",
        help=(
            "default: full; tiny / tiny-vl / tiny-tool: a shrunk text / vision-language / tool-calling model and "
            "task on the CPU"
        ),
    )
    parser.add_argument(
        "--device", choices=tuple(DEVICE_KINDS), default=None, help="default: detected (DEVICE env honoured)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the resolved launch and exit")
    parser.add_argument("--output-dir", type=Path, default=None, help="checkpoints and logs go here")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings in YAML (what from-verl writes, or a --dry-run output), over the launcher's own; "
        "key=value overrides go over the file's",
    )
    source.add_argument(
        "--from-verl",
        type=Path,
        default=None,
        metavar="SCRIPT",
        help="a verl launch script, run under bash with stand-ins (nothing starts) and read as its trainer "
        "call's overrides, over the launcher's own; key=value overrides go over the script's",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="list the parallel layouts that fit the cluster (--nodes, --devices-per-node, --device-memory-gib), "
        "ranked by estimated step time, with the overrides of the best; starts nothing",
    )
    parser.add_argument("--nodes", type=int, default=None, help="--plan: nodes (default: the profile's)")
    parser.add_argument(
        "--devices-per-node", type=int, default=None, help="--plan: devices per node (default: the profile's)"
    )
    parser.add_argument(
        "--device-memory-gib", type=float, default=None, help="--plan: memory per device (default: the device's)"
    )
    parser.add_argument(
        "--intra-node-gbs", type=float, default=None, help="--plan: NVLink / HCCS GB/s per device and direction"
    )
    parser.add_argument(
        "--inter-node-gbs", type=float, default=None, help="--plan: InfiniBand / RoCE GB/s per device and direction"
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help="the same as logging.level=LEVEL (default: info)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return parser


def plan_launch(profile: LaunchProfile, args: argparse.Namespace) -> LaunchPlan:
    if args.preset in TINY_PRESETS:
        return plan_tiny(
            profile,
            device=args.device or "cpu",
            output_dir=args.output_dir,
            overrides=args.overrides,
            preset=args.preset,
        )
    return plan_full(
        profile,
        device=device_from_cli(args.device, environ=os.environ, dry_run=args.dry_run),
        output_dir=args.output_dir,
        overrides=args.overrides,
        environ=os.environ,
    )


def run_launcher(profile: LaunchProfile, argv: Sequence[str] | None = None) -> int:
    args = build_parser(profile).parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        print(f"error: overrides are key=value pairs; got {' '.join(bad)}", file=sys.stderr)
        return EXIT_USAGE
    if args.log_level is not None:
        args.overrides = [*args.overrides, f"logging.level={args.log_level}"]
    if args.plan:
        return _plan_layouts(profile, args)
    planning_only = [f for f, v in (("--nodes", args.nodes), ("--devices-per-node", args.devices_per_node),
                                    ("--device-memory-gib", args.device_memory_gib),
                                    ("--intra-node-gbs", args.intra_node_gbs),
                                    ("--inter-node-gbs", args.inter_node_gbs)) if v is not None]
    if planning_only:
        print(
            f"error: {', '.join(planning_only)} describe the cluster --plan plans for; a launch takes its size "
            "from device.nnodes / device.devices_per_node (NNODES) and device.memory_gib. Add --plan, or set those.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # The level asked for on the command line from the start (a verl script is read, planning may
    # build the tiny preset); the resolved config's, once it is known.
    level = _asked_level(args.overrides)
    json_lines = configure_logging(level=level)
    config_file: ConfigFile | None = None
    if args.config is not None:
        try:
            config_file = read_config_file(args.config)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        given = {o.partition("=")[0].strip().lstrip("+") for o in args.overrides}
        config_file = config_file.without(given)  # a key given on the command line is not the file's fault
        args.overrides = [*config_file.overrides, *args.overrides]
    if args.from_verl is not None:
        try:
            args.overrides = [*verl_script_overrides(args.from_verl), *args.overrides]
        except ValueError as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            return EXIT_USAGE
    run_log: RunLog | None = None
    plan: LaunchPlan | None = None
    with contextlib.ExitStack() as held:
        try:
            if args.preset in TINY_PRESETS:  # a tiny preset builds its model and task while it is planned
                run_log = _hold_output_dir(
                    held, tiny_output_dir(profile, args.output_dir, args.preset), argv, level=level
                )
            plan = plan_launch(profile, args)
            json_lines = configure_logging(level=plan.config.logging.level)
            if args.dry_run:
                sys.stdout.write(render_dry_run(plan, environ=os.environ))
                for problem in preflight_problems(plan):
                    log.warning("a real launch would stop here", problem=problem)
                for warning in preflight_warnings(plan):
                    log.warning("check the model", warning=warning)
                ignored = grpo_config.inert_settings(plan.config)
                if ignored:  # train() logs the same once at the start of a real run
                    log.warning("config.ignored", settings={", ".join(keys): why for keys, why in ignored})
                return 0
            if run_log is None:
                run_log = _hold_output_dir(held, plan.output_dir, argv, level=level)
                json_lines = configure_logging(level=plan.config.logging.level)
            run_common_steps(plan)
            return _train(plan, json_lines=json_lines)
        except SystemExit:
            raise
        except BaseException as exc:  # KeyboardInterrupt; torch's CheckpointException is one too
            return _failed(exc, plan=plan, run_log=run_log, config_file=config_file)


def verl_script_overrides(script: Path) -> list[str]:
    """The overrides of a verl script's trainer call that grpo honours; ValueError naming those it
    cannot (each with its reason in `hatch run from-verl SCRIPT`)."""
    from structlog.testing import capture_logs

    from grpo_config.from_verl import convert
    from grpo_config.verl_script import read_trainer_call

    call = read_trainer_call(script, env={}, timeout_s=60.0)
    if call.placeholders:  # from-verl writes a YAML with <NAME> in them; a launch would use them
        raise ValueError(
            f"--from-verl {script}: the script requires {', '.join(call.placeholders)}, which are not set: "
            "export them and launch again"
        )
    for probe in call.probes:  # e.g. `python3 -c 'import torch_npu'` choosing DEVICE
        log.warning("from_verl.probe_answered_failing", script=str(script), probe=probe, hint="export what it decides")
    for forgiven in call.forgiven:
        log.warning("from_verl.skipped_for_the_authors_machine", script=str(script), command=forgiven)
    if call.static:
        log.warning("from_verl.read_from_text", script=str(script), reason="bash never reached the trainer call")
    overrides = call.overrides
    # Each line is judged many times; its warnings (a deprecated key) come once from the plan's own load.
    with capture_logs():
        conversion = convert(overrides, config_name=call.config_name)
    if conversion.refused:
        keys = ", ".join(line for line, _ in conversion.refused)
        raise ValueError(
            f"--from-verl {script}: {len(conversion.refused)} of its settings cannot be honoured here: {keys}. "
            f"`hatch run from-verl {script}` gives each one's reason; remove them from the script, or write the "
            "YAML with from-verl, edit it and launch it with --config"
        )
    log.info("from_verl", script=str(script), settings=len(conversion.accepted), inert=len(conversion.inert))
    if conversion.inert:  # lines that do nothing, in verl as here: said once, left out of the settings
        log.warning("config.ignored", settings=dict(conversion.inert))
    return list(conversion.accepted)


def _plan_layouts(profile: LaunchProfile, args: argparse.Namespace) -> int:
    """`--plan`: the profile's launch on the cluster the flags name, searched over layouts."""
    from grpo_launch.cost_model import device_spec
    from grpo_launch.layout_planner import render, search
    from grpo_launch.plan_config import choose_plan_config

    if args.preset != "full":
        print("error: --plan plans the full run's layout; drop --preset", file=sys.stderr)
        return EXIT_USAGE
    for flag, value in (("--nodes", args.nodes), ("--devices-per-node", args.devices_per_node)):
        if value is not None and value < 1:
            print(f"error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return EXIT_USAGE
    for flag, value in (
        ("--device-memory-gib", args.device_memory_gib),
        ("--intra-node-gbs", args.intra_node_gbs),
        ("--inter-node-gbs", args.inter_node_gbs),
    ):
        if value is not None and value <= 0:
            print(f"error: {flag} must be > 0, got {value}", file=sys.stderr)
            return EXIT_USAGE
    cluster = [f"device.nnodes={args.nodes}"] if args.nodes else []
    cluster += [f"device.devices_per_node={args.devices_per_node}"] if args.devices_per_node else []
    args.overrides = [*cluster, *args.overrides]
    args.dry_run = True  # planning inspects, like a dry run: DEVICE is taken at its word
    try:
        plan = plan_launch(profile, args)
    except (LaunchError, grpo_config.ConfigError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    model_dir = choose_plan_config(plan.config.actor.model_path, plan.architecture).directory
    if model_dir is None:
        print(f"error: no model config to plan from (actor.model_path={plan.config.actor.model_path})", file=sys.stderr)
        return EXIT_USAGE
    spec = device_spec(
        plan.device,
        memory_gib=args.device_memory_gib,
        intra_node_gbs=args.intra_node_gbs,
        inter_node_gbs=args.inter_node_gbs,
    )
    sys.stdout.write(render(search(plan.config, model_dir, spec)))
    return 0


def _hold_output_dir(
    held: contextlib.ExitStack, output_dir: Path, argv: Sequence[str] | None, *, level: str
) -> RunLog:
    """Lock the output folder for the launch (a second launch into it stops with exit 2) and copy
    stderr into its run.log from here on."""
    from grpo_ckpt import RunLock

    held.enter_context(RunLock(output_dir, what="--output-dir"))
    run_log = RunLog(output_dir)
    run_log.start(list(sys.argv[:1]) + list(sys.argv[1:] if argv is None else argv))
    held.callback(run_log.stop)
    configure_logging(level=level)  # onto the stream that copies into the log
    return run_log


def _failed(
    exc: BaseException, *, plan: LaunchPlan | None, run_log: RunLog | None, config_file: ConfigFile | None
) -> int:
    """The one line and exit status of a failed launch; the traceback into the run's log."""
    if run_log is None and isinstance(exc, ValueError):  # before the run: a setting, a file, the folder
        where = config_file.blame(exc) if config_file and isinstance(exc, ConfigError) else None
        print(f"error: {where + ': ' if where else ''}{one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if run_log is not None:
        run_log.traceback(exc)
    failure = describe(
        exc,
        checkpoint_dir=plan.config.checkpoint.dir if plan is not None else None,
        log_path=run_log.path if run_log is not None else None,
    )
    if run_log is None and failure.exit_code == EXIT_BUG:
        traceback.print_exception(exc, file=sys.stderr)  # no log to keep it in
    print(f"error: {failure.line}", file=sys.stderr)
    return failure.exit_code


def _train(plan: LaunchPlan, *, json_lines: bool) -> int:
    # torch, Ray and the engines: imported only once a run really starts. From its defining module
    # (re-exported as `grpo_trainer.train`) so that importing the launcher stays light.
    from grpo_trainer.trainer import train

    log.info(
        "launch",
        launcher=plan.launcher,
        preset=plan.preset,
        device=plan.device,
        output_dir=str(plan.output_dir),
    )
    level = plan.config.logging.level
    result = train(plan.config, ray_runtime_env=worker_runtime_env(level=level, json=json_lines))
    log.info("training finished", launcher=plan.launcher, result=_describe(result))
    return 0


def _asked_level(overrides: Sequence[str] | None) -> str:
    asked = [
        o.partition("=")[2].strip() for o in overrides or () if o.partition("=")[0].strip() == "logging.level"
    ]
    return asked[-1] if asked and asked[-1] in LOG_LEVELS else "info"


def _describe(result: object) -> dict[str, object]:
    fields = ("final_step", "wall_time_s", "metrics_path", "plot_path", "checkpoint_dir")
    values = {name: getattr(result, name) for name in fields if hasattr(result, name)}
    return {name: v if isinstance(v, int | float) or v is None else str(v) for name, v in values.items()}
