"""The command line every model launcher shares. A launcher package's `main` is one call:
`run_launcher(PROFILE, argv)`.

    grpo-launch-35b [--preset tiny|full] [--device gpu|npu|cpu] [--dry-run] [--output-dir DIR]
                    [--config run.yaml] [--log-level LEVEL] [-- dotted.key=value ...]

Exit status: 0 done, 2 a user error (bad option, config error, missing model or data): one message
on stderr, no traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from grpo_config import ConfigError
from grpo_launch.config_file import ConfigFile, read_config_file
from grpo_launch.dry_run import render_dry_run
from grpo_launch.logging_setup import LOG_LEVELS, configure_logging, worker_runtime_env
from grpo_launch.plan import TINY_PRESETS, LaunchPlan, device_from_cli, plan_full, plan_tiny
from grpo_launch.profile import DEVICE_KINDS, LaunchProfile
from grpo_launch.steps import preflight_problems, preflight_warnings, run_common_steps

log = structlog.get_logger()

EXIT_USAGE = 2


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
        choices=("tiny", "tiny-vl", "full"),
        default="full",
        help="default: full; tiny / tiny-vl: a shrunk text / vision-language model and task on the CPU",
    )
    parser.add_argument(
        "--device", choices=tuple(DEVICE_KINDS), default=None, help="default: detected (DEVICE env honoured)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the resolved launch and exit")
    parser.add_argument("--output-dir", type=Path, default=None, help="checkpoints and logs go here")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings in YAML (what from-verl writes, or a --dry-run output), over the launcher's own; "
        "key=value overrides go over the file's",
    )
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default=None, help="the same as logging.level=LEVEL (default: info)"
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
    if args.log_level is not None:
        args.overrides = [*args.overrides, f"logging.level={args.log_level}"]
    # The level asked for on the command line from the start (planning may build the tiny preset);
    # the resolved config's, once it is known.
    asked = [o.partition("=")[2].strip() for o in args.overrides if o.partition("=")[0].strip() == "logging.level"]
    json_lines = configure_logging(level=asked[-1] if asked and asked[-1] in LOG_LEVELS else "info")
    try:
        plan = plan_launch(profile, args)
        json_lines = configure_logging(level=plan.config.logging.level)
        if args.dry_run:
            sys.stdout.write(render_dry_run(plan, environ=os.environ))
            for problem in preflight_problems(plan):
                log.warning("a real launch would stop here", problem=problem)
            for warning in preflight_warnings(plan):
                log.warning("check the model", warning=warning)
            return 0
        run_common_steps(plan)
    except ValueError as exc:  # LaunchError, grpo_config.ConfigError and bad environment values
        where = config_file.blame(exc) if config_file and isinstance(exc, ConfigError) else None
        print(f"error: {where + ': ' if where else ''}{exc}", file=sys.stderr)
        return EXIT_USAGE
    return _train(plan, json_lines=json_lines)


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


def _describe(result: object) -> dict[str, object]:
    fields = ("final_step", "wall_time_s", "metrics_path", "plot_path", "checkpoint_dir")
    values = {name: getattr(result, name) for name in fields if hasattr(result, name)}
    return {name: v if isinstance(v, int | float) or v is None else str(v) for name, v in values.items()}
