"""from-verl on verl's own launch scripts as a user pastes them (tests/data/verl_scripts, from
verl's repository): the script runs under bash with stand-ins for every command that would start
work, download or change files, so its arrays, `${VAR:-default}`s, arithmetic and branches resolve
as bash resolves them; the trainer call is found among the recorded commands."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import structlog
import yaml

from grpo_config.from_verl import convert, is_override_file, main
from grpo_config.verl_script import ScriptError, read_trainer_call, run_script

SCRIPTS = Path(__file__).parent / "data" / "verl_scripts"
# The variables a script reads without a default (under `set -u`), as a user would export them.
ENV = {"test_gspo_qwen30b_a3b_ep.sh": {"HDFS_ROOT": "/hdfs", "DATA_ROOT": "/data"}}
# Overrides mapped or inert, per script (of those bash resolves); the rest are refused with a reason.
# run_qwen3_vl-30b-megatron.sh's trainer call ends at the comment line inside its continued command:
# bash (and so verl) never sees the overrides after it; the stand-ins show the same.
MAPPED_AT_LEAST = 0.9


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_each_verl_script_resolves_to_its_trainer_call_and_maps(script: str, tmp_path: Path) -> None:
    """Each script: its trainer call found, >= 90% of its overrides mapped or inert, and the YAML
    from-verl writes (the refused lines left out, each with its reason) loads: a Megatron script's
    through the 35B launcher's --dry-run over its GPU profile (the layout there), an FSDP script's
    as a whole config on grpo's torch backend (no launcher profile is a torch one; on the 35B's
    Megatron profile their use_remove_padding=True is refused: test_bad_values.py)."""
    call = read_trainer_call(SCRIPTS / script, env=ENV.get(script, {}), timeout_s=60)
    assert call.entry_point in ("verl.trainer.main_ppo", "recipe.dapo.main_dapo") or call.entry_point.endswith(
        "main_ppo.py"
    ), call.entry_point
    assert len(call.overrides) >= 20
    assert not [o for o in call.overrides if "$" in o], "bash left a variable unexpanded"
    conversion = convert(call.overrides)
    mapped = len(conversion.accepted) - len(conversion.inferred)
    print(
        f"\n{script}: {mapped} of {len(call.overrides)} mapped, {len(conversion.inert)} inert, "
        f"{len(conversion.refused)} refused"
    )
    assert mapped + len(conversion.inert) >= MAPPED_AT_LEAST * len(call.overrides)
    if conversion.settings.get("actor", {}).get("backend") != "megatron":
        assert conversion.problems is None, conversion.problems
        return
    run = tmp_path / "run.yaml"
    run.write_text(conversion.to_yaml())
    dry = _launch("--dry-run", "--device", "gpu", "--config", str(run), home=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]


def test_arrays_defaults_arithmetic_and_branches_resolve_as_bash_does(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        textwrap.dedent(
            """\
            #!/usr/bin/env bash
            set -xeuo pipefail
            NNODES=${NNODES:-2}
            GPUS=8
            MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen3-8B}
            case "${BACKEND:-megatron}" in
              megatron) TP=4 ;;
              *) TP=1 ;;
            esac
            if [ "$NNODES" -gt 1 ]; then LR=1e-6; else LR=2e-6; fi
            ALGORITHM=(
                algorithm.adv_estimator=grpo
                algorithm.use_kl_in_reward=False
            )
            ACTOR=(
                actor_rollout_ref.model.path="$MODEL_PATH"
                actor_rollout_ref.actor.optim.lr=$LR
                actor_rollout_ref.rollout.tensor_model_parallel_size=$TP
                data.train_batch_size=$((NNODES * GPUS * 4))
            )
            mkdir -p logs
            python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_megatron_trainer.yaml' \\
                "${ALGORITHM[@]}" "${ACTOR[@]}" +trainer.val_only=False ~actor_rollout_ref.ref \\
                trainer.nnodes=$NNODES trainer.n_gpus_per_node=$GPUS "$@" 2>&1 | tee logs/run.log
            """
        )
    )
    call = read_trainer_call(script, env={"HOME": "/home/u", "NNODES": "4"})
    assert call.config_name == "ppo_megatron_trainer.yaml" and call.config_path == "config"
    assert call.overrides == [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.model.path=/home/u/models/Qwen3-8B",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "data.train_batch_size=128",
        "+trainer.val_only=False",
        "~actor_rollout_ref.ref",
        "trainer.nnodes=4",
        "trainer.n_gpus_per_node=8",
    ]


def test_the_stand_ins_start_nothing_and_change_no_file(tmp_path: Path) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    script = tmp_path / "run.sh"
    script.write_text(
        f"rm -rf {tmp_path}\nwget https://example.com/x -O {keep}\nhf download Qwen/Qwen3-8B\n"
        f"cp /etc/hostname {keep}\npython3 -m verl.trainer.main_ppo data.train_batch_size=8\n"
    )
    calls, _ = run_script(script)
    assert [c[0] for c in calls] == ["rm", "wget", "hf", "cp", "python3"]
    assert keep.read_text() == "mine"


def test_folders_are_made_only_in_the_scratch_directory(tmp_path: Path) -> None:
    """`mkdir` beside the script (after `cd "$(dirname "$0")"`) or at an absolute path is noted, not
    made; one in the scratch working directory is made, so a later write into it still works."""
    script = tmp_path / "run.sh"
    script.write_text(textwrap.dedent(f"""\
        set -e
        mkdir -p scratch_logs && echo ok > scratch_logs/x && cat scratch_logs/x
        cd "$(dirname "$0")"
        mkdir -p logs ckpt/run1 && touch made.txt
        mkdir -p {tmp_path}/abs
        python3 -m verl.trainer.main_ppo data.train_batch_size=8
        """))
    call = read_trainer_call(script, env={})
    assert call.overrides == ["data.train_batch_size=8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.sh"]
    assert call.forgiven == ["mkdir -p logs ckpt/run1", f"mkdir -p {tmp_path}/abs"]
    assert run_script(script)[1].startswith("ok")


@pytest.fixture
def entry_point_logging():
    """from-verl's `main` configures structlog for its process (stderr); put it back after."""
    yield
    structlog.reset_defaults()


def test_a_script_without_a_trainer_call_is_an_error_that_says_so(tmp_path: Path, capsys, entry_point_logging) -> None:
    script = tmp_path / "run.sh"
    script.write_text("set -u\necho preparing\npython3 prepare.py --out $DATA_DIR\n")
    with pytest.raises(ScriptError, match="DATA_DIR: unbound variable"):
        read_trainer_call(script)
    assert main([str(script)]) == 2
    assert "no verl trainer call found" in capsys.readouterr().err
    assert main([str(script), "--env", "DATA_DIR=/d"]) == 2  # it runs, but still starts no trainer


def test_a_file_of_overrides_is_read_as_lines_not_run() -> None:
    assert is_override_file("# a recipe\ndata.train_batch_size=8\n+trainer.val_only=False\n")
    assert not is_override_file("set -x\npython3 -m verl.trainer.main_ppo data.x=1\n")


def _launch(*argv: str, home: Path, launcher: str = "grpo-launch-35b", **env: str) -> subprocess.CompletedProcess[str]:
    """The installed launcher, as a user runs it: no DEVICE from this machine, HOME a scratch folder."""
    return subprocess.run(
        [str(Path(sys.executable).with_name(launcher)), *argv],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DEVICE"} | {"HOME": str(home), **env},
        timeout=180,
        check=False,
    )


def test_the_command_line_prints_yaml_for_a_real_script(tmp_path: Path) -> None:
    script = SCRIPTS / "run_qwen3moe-30b_megatron_96gb.sh"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_config.from_verl", str(script)],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=120,
        check=False,
    )
    assert "lines mapped" in done.stderr and "refused" in done.stderr
    settings = yaml.safe_load(done.stdout)  # the YAML alone on stdout: warnings go to stderr, once each
    assert settings["actor"]["backend"] == "megatron" and "parallel" in settings
    assert done.stderr.count("config.deprecated_key") == 1
    run = tmp_path / "run.yaml"
    run.write_text(done.stdout)
    dry = _launch("--dry-run", "--device", "gpu", "--config", str(run), home=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert yaml.safe_load(dry.stdout)["config"]["actor"]["lr"] == settings["actor"]["lr"]




def test_the_launcher_runs_a_verl_script_over_its_profile(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "#!/bin/bash\nset -x\nLR=${LR:-3e-6}\nARGS=(actor_rollout_ref.actor.optim.lr=$LR actor_rollout_ref.rollout.n=6)\n"
        'python3 -m verl.trainer.main_ppo "${ARGS[@]}" data.max_response_length=$((512*2)) actor_rollout_ref.actor.ppo_epochs=1'
        " algorithm.kl_ctrl.kl_coef=0.0 actor_rollout_ref.rollout.mode=async\n"
    )
    done = _launch("--from-verl", str(script), "--dry-run", "--device", "gpu", "--", "actor.ppo_epochs=2", home=tmp_path, LR="4e-6")
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = yaml.safe_load(done.stdout)["config"]
    assert cfg["actor"]["lr"] == 4e-6  # the user's environment, as bash saw it
    assert (cfg["rollout"]["n"], cfg["data"]["max_response_length"]) == (6, 1024)
    assert cfg["actor"]["ppo_epochs"] == 2  # the command line over the script
    assert cfg["parallel"]["ep"] == 8  # the rest is the 35B profile's
    # Lines that do nothing, in verl as here, are said once at launch, with their reasons.
    (ignored,) = [line for line in done.stderr.splitlines() if "config.ignored" in line and "kl_coef" in line]
    assert "actor_rollout_ref.rollout.mode=async" in ignored and "use_kl_in_reward=true only" in ignored


def test_the_launcher_refuses_a_verl_script_with_settings_it_cannot_honour(tmp_path: Path) -> None:
    script = SCRIPTS / "run_qwen3moe-30b_megatron_96gb.sh"
    done = _launch("--from-verl", str(script), "--dry-run", "--device", "gpu", home=tmp_path)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "1 of its settings cannot be honoured here" in line and f"hatch run from-verl {script}" in line


def test_inert_lines_become_comments_not_settings() -> None:
    conversion = convert(
        ["algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0", "algorithm.filter_groups.max_num_gen_batches=10"]
    )
    assert [line for line, _ in conversion.inert] == [
        "algorithm.kl_ctrl.kl_coef=0.0",
        "algorithm.filter_groups.max_num_gen_batches=10",
    ]
    assert conversion.refused == []
    text = conversion.to_yaml()
    assert "#   algorithm.kl_ctrl.kl_coef=0.0  (read with algorithm.use_kl_in_reward=true only" in text
    assert yaml.safe_load(text) == {"algorithm": {"use_kl_in_reward": False}}


def test_a_refused_layout_field_takes_only_its_own_lines() -> None:
    """verl scripts give the actor and the reference the same Megatron layout. Context parallelism is
    refused; the tensor and pipeline sizes both sides give still map (before 2026-12-07 the two cp
    lines took the four others with them: 'ref.parallel differs')."""
    layout = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "context_parallel_size": 2}
    lines = [
        f"actor_rollout_ref.{role}.megatron.{key}={value}" for role in ("actor", "ref") for key, value in layout.items()
    ]
    conversion = convert(["actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=8", *lines])
    refused = dict(conversion.refused)
    assert sorted(refused) == [
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "actor_rollout_ref.ref.megatron.context_parallel_size=2",
    ]
    assert "context parallelism is not supported" in refused["actor_rollout_ref.actor.megatron.context_parallel_size=2"]
    assert "ref.parallel.cp=2: ref.parallel differs from parallel (cp=1)" in refused[
        "actor_rollout_ref.ref.megatron.context_parallel_size=2"
    ]
    assert conversion.settings["parallel"] == {"tp": 2, "pp": 2}


def test_a_machine_probe_is_answered_failing_and_said(tmp_path: Path, capsys, entry_point_logging) -> None:
    """verl's Qwen3.5 scripts choose DEVICE with `python3 -c 'import torch_npu'`: the probe is not run
    here, it fails (the GPU branch), and from-verl names it so that --env can choose the other."""
    script = tmp_path / "run.sh"
    script.write_text(
        "set -euo pipefail\n"
        "DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}\n"
        'case "$DEVICE" in gpu) TP=8 ;; npu) TP=16 ;; esac\n'
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.tensor_model_parallel_size=$TP "
        "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_load_balancing_type=\\\"none\\\"\n"
    )
    call = read_trainer_call(script)
    assert call.probes == ["python3 -c 'import torch_npu'"]
    assert call.overrides[0] == "actor_rollout_ref.rollout.tensor_model_parallel_size=8"
    # Hydra reads the escaped quotes as a quoted string: "none", not '"none"'.
    assert convert(call.overrides).settings["actor"]["megatron"]["moe_router_load_balancing_type"] == "none"
    assert read_trainer_call(script, env={"DEVICE": "npu"}).overrides[0].endswith("=16")
    main([str(script)])
    assert "probed the machine with `python3 -c 'import torch_npu'`" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "launcher"),
    [("run_qwen3_5_35b_megatron.sh", "grpo-launch-35b"), ("run_qwen3_5_122b_a10b_megatron.sh", "grpo-launch-122b")],
)
def test_verl_s_qwen3_5_seed_scripts_launch_as_they_are(script: str, launcher: str, tmp_path: Path) -> None:
    """The two scripts this project replaces, unchanged, through their launcher's --from-verl: the
    dry run passes, the script's settings over the profile (its batch and lengths, its layout)."""
    done = _launch("--from-verl", str(SCRIPTS / script), "--dry-run", "--device", "gpu", home=tmp_path, launcher=launcher)
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = yaml.safe_load(done.stdout)["config"]
    call = read_trainer_call(SCRIPTS / script, env={"HOME": str(tmp_path)})
    given = dict(line.lstrip("+").split("=", 1) for line in call.overrides)
    assert cfg["data"]["train_batch_size"] == int(given["data.train_batch_size"])
    assert cfg["data"]["max_response_length"] == int(given["data.max_response_length"])
    assert cfg["parallel"]["ep"] == int(given["actor_rollout_ref.actor.megatron.expert_model_parallel_size"])
    assert cfg["rollout"]["n"] == int(given["actor_rollout_ref.rollout.n"])
    assert cfg["actor"]["backend"] == "megatron" and cfg["logging"]["wandb"] is True
    assert "config.ignored" in done.stderr and "probe_answered_failing" in done.stderr


def test_a_preamble_for_the_authors_machine_is_forgiven_and_required_variables_listed(
    tmp_path: Path, capsys, entry_point_logging
) -> None:
    """What only the author's machine has does not hide the trainer call: `cd` into their folders,
    a virtualenv's activate, `sed -i` on their files (forgiven, each said), a variable the script
    requires (`${VAR:?}` under `set -u`: a placeholder, listed on the summary), the call wrapped in
    `ray job submit ... --` inside a branch for the head node."""
    script = tmp_path / "train.sh"
    script.write_text(textwrap.dedent("""\
        #!/bin/bash
        set -euo pipefail
        cd /home/author/projects/rl
        source .venv/bin/activate
        MODEL_PATH=${MODEL_PATH:?must be set}
        sed -i 's/a/b/' /home/author/patch.py
        if [ "${RANK:-0}" == "0" ]; then
          ray job submit --address=http://head:8265 -- python3 -m verl.trainer.main_ppo \\
            algorithm.adv_estimator=grpo actor_rollout_ref.model.path=$MODEL_PATH trainer.total_epochs=1
        fi
        """))
    call = read_trainer_call(script, env={})
    assert call.overrides == [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=<MODEL_PATH>", "trainer.total_epochs=1",
    ]
    assert call.placeholders == ["MODEL_PATH"] and not call.static
    assert call.forgiven == [
        "cd /home/author/projects/rl", "source .venv/bin/activate", "sed -i s/a/b/ /home/author/patch.py",
    ]
    assert main([str(script)]) == 0
    err = capsys.readouterr().err
    assert "set: MODEL_PATH (placeholders <NAME> here; --env NAME=VALUE)" in err
    assert "`source .venv/bin/activate` needs the author's machine: skipped here" in err
    assert read_trainer_call(script, env={"MODEL_PATH": "/m"}).overrides[1] == "actor_rollout_ref.model.path=/m"


def test_a_call_bash_never_reaches_is_read_from_the_text_and_said(tmp_path: Path, capsys, entry_point_logging) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "MODEL=Qwen/Qwen3-8B\n"
        'if [ "$(hostname)" == "head-node-7" ]; then\n'
        "  python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=$MODEL "
        "trainer.total_epochs=${EPOCHS:-2}\n"
        "fi\n"
    )
    call = read_trainer_call(script, env={})
    assert call.static and call.overrides == [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.model.path=Qwen/Qwen3-8B", "trainer.total_epochs=2",
    ]
    assert main([str(script)]) == 0
    assert "read from the script's text: bash never reached the trainer call" in capsys.readouterr().err


def test_a_projects_own_entry_point_built_on_verls_config_is_the_trainer_call(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "python3 -m myproject.prepare --out /data\n"
        "python3 -m myproject.trainer.main_grpo_agent data.train_batch_size=8 algorithm.adv_estimator=grpo "
        "actor_rollout_ref.rollout.n=4 myproject.tools=calculator\n"
        "python3 -m myproject.report --run latest\n"
    )
    call = read_trainer_call(script, env={})
    assert call.entry_point == "myproject.trainer.main_grpo_agent" and not call.static
    assert call.overrides == [
        "data.train_batch_size=8", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
        "myproject.tools=calculator",
    ]


def test_the_launcher_refuses_a_script_whose_required_variables_are_unset(tmp_path: Path) -> None:
    """from-verl writes `<MODEL_PATH>` and lists it; a launch would use the placeholder, so the
    launcher stops, naming the variable, and launches once it is exported."""
    script = tmp_path / "train.sh"
    script.write_text(
        "set -u\nMODEL_PATH=${MODEL_PATH:?set it}\n"
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=$MODEL_PATH\n"
    )
    done = _launch("--from-verl", str(script), "--dry-run", "--device", "gpu", home=tmp_path)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "requires MODEL_PATH, which are not set: export them" in line
