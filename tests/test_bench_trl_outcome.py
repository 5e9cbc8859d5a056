"""The TRL comparison bench (`bench/bench_grpo_vs_trl.py`) keeps a side's measurement when the side
exits non-zero after writing it (a TRL rank aborting in teardown, seen once), printing the exit
and the log's last lines; a side that wrote no result still fails the bench with them. Ours takes
the old log-probs from its engine unless told to recompute them, and says which."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _trl_spec import SideResult
from bench_grpo_vs_trl import BYPASS, make_spec, parse_args, side_outcome


def _result(path: Path) -> SideResult:
    result = SideResult(
        name="trl", setup_s=3.0, step_s=[1.0, 2.0], cpu_s=[2.0, 4.0], generated_tokens=64, trained_tokens=256, rewards=[0.1, 0.2, 0.3]
    )
    result.save(path)
    return result


def test_a_side_that_crashed_in_teardown_keeps_its_result_and_says_why(tmp_path: Path, capsys) -> None:
    log = tmp_path / "trl_0.log"
    log.write_text("step 5 done\nterminate called after throwing an instance of 'gloo::EnforceNotMet'\n")
    written = _result(tmp_path / "result.json")
    kept = side_outcome("trl", -6, result_path=tmp_path / "result.json", log_path=log)
    assert kept.step_s == written.step_s and kept.rewards == written.rewards
    out = capsys.readouterr().out
    assert "trl side exited -6 after writing its result" in out and "gloo::EnforceNotMet" in out


def test_a_side_without_a_result_fails_the_bench_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "grpo_0.log"
    log.write_text("Traceback ...\nRuntimeError: worker died\n")
    with pytest.raises(SystemExit, match=r"grpo side failed \(exit 1\) without a result(.|\n)*worker died"):
        side_outcome("grpo", 1, result_path=tmp_path / "missing.json", log_path=log)


def test_a_clean_exit_returns_the_result_quietly(tmp_path: Path, capsys) -> None:
    _result(tmp_path / "result.json")
    assert side_outcome("trl", 0, result_path=tmp_path / "result.json", log_path=tmp_path / "none.log").steps_per_s > 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("recompute", [False, True])
def test_ours_takes_the_engines_old_log_probs_unless_told_to_recompute(tmp_path: Path, recompute: bool) -> None:
    from _trl_ours import load_config, notes

    args = parse_args([*(["--recompute-old-log-probs"] if recompute else []), "seed=7"])
    spec = make_spec(args, tmp_path)
    assert (BYPASS in spec.overrides) is not recompute and "seed=7" in spec.overrides
    cfg = load_config(tmp_path / "preset", tmp_path / "grpo", user_overrides=spec.overrides, total_steps=2)
    assert cfg.algorithm.rollout_correction.bypass_mode is not recompute
    said = " ".join(notes(cfg, spec))
    assert ("old log-probs recomputed" in said) is recompute
    assert ("old log-probs: the rollout engine's" in said) is not recompute
