"""Rule-based rewards, the data_source registry and loading custom reward functions."""

from __future__ import annotations

import sys

import pytest

from grpo_trainer import rewards as rw
from grpo_trainer.rewards import math_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last box wins
        ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),  # nested braces
        ("so $\\boxed 7$", "7"),
        ("\\fbox{x+1}", "x+1"),
        ("\\boxed{unbalanced", None),
        ("no box at all", None),
    ],
)
def test_last_boxed(text, expected):
    assert rw.last_boxed(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("\\dfrac{1}{2}", "\\frac12"),
        ("0.5", "\\frac{1}{2}"),
        (".5", "1/2"),
        ("1,000", "1000"),
        ("x = 5", "5"),
        ("90^\\circ", "90"),
        ("\\text{(B)}", "(B)"),
        ("10\\%", "10"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\$5.00", "5"),
        ("3.", "3"),
    ],
)
def test_equivalent_answers_without_math_verify(pred, gold):
    assert rw.answers_match(pred, gold, use_math_verify=False)


@pytest.mark.parametrize(
    ("pred", "gold"), [("3", "4"), ("\\frac{1}{3}", "0.33"), ("(1,2)", "(2,1)"), ("x", "y")]
)
def test_different_answers(pred, gold):
    assert not rw.answers_match(pred, gold, use_math_verify=False)
    assert not rw.answers_match(pred, gold)


def test_math_verify_decides_symbolic_equivalence():
    pytest.importorskip("math_verify")
    assert math_answer.math_verify_available()
    assert not rw.answers_match("(x+1)^2", "x^2+2x+1", use_math_verify=False)
    assert rw.answers_match("(x+1)^2", "x^2+2x+1")


def test_math_score():
    assert rw.math_score("so \\boxed{\\frac{2}{4}} hmm \\boxed{\\frac12}", "0.5", None) == 1.0
    assert rw.math_score("the answer is 0.5", "0.5", None) == 0.0  # no box, no credit
    assert rw.math_score("\\boxed{3}", "\\boxed{3}", {"split": "test"}) == 1.0  # a boxed ground truth too
    assert rw.math_score("\\boxed{4}", 3, None) == 0.0
    assert rw.math_score("\\boxed{3}", 3, None) == 1.0  # a numeric ground truth


def test_geo3k_score_weights_accuracy_and_format():
    good = "<think>angles sum to 180</think> so \\boxed{30}"
    assert rw.geo3k_score(good, "30", None) == pytest.approx(1.0)
    assert rw.geo3k_score(good, "31", None) == pytest.approx(0.1)  # format only
    assert rw.geo3k_score("\\boxed{30}", "30", None) == pytest.approx(0.9)  # no think block
    assert rw.geo3k_score("\\boxed{30} <think>x</think>", "30", None) == pytest.approx(0.9)  # think after box
    assert rw.geo3k_score("<think>x</think> 30", "30", None) == 0.0


def test_gsm8k_score_is_verl_s_strict_rule():
    assert rw.gsm8k_score("so 3 + 4 = 7\n#### 7", "7", None) == 1.0
    assert rw.gsm8k_score("#### 1,234", "1234", None) == 1.0
    assert rw.gsm8k_score("#### -3", "-3", None) == 1.0
    assert rw.gsm8k_score("#### 18.0", "18", None) == 0.0  # verl compares the strings
    assert rw.gsm8k_score("#### 8\n#### 7", "7", None) == 1.0  # the last one counts
    assert rw.gsm8k_score("#### 7" + " padding" * 40, "7", None) == 0.0  # only the last 300 characters
    assert rw.gsm8k_score("the answer is 7", "7", None) == 0.0  # strict format: needs ####


def test_gsm8k_lenient_grader():
    assert rw.gsm8k_score_lenient("#### 18.0", "18", None) == 1.0
    assert rw.gsm8k_score_lenient("#### 8", "7", None) == 0.0
    assert rw.gsm8k_score_lenient("the answer is 7", "7", None) == 0.0
    assert rw.gsm8k_score_lenient("#### 7", "Natalia sold 48/2 = 24 clips.\n#### 7", None) == 1.0


def test_builtin_sources_are_registered_per_grader():
    """grader "verl" (the default): verl's default_compute_score per source; "lenient": grpo's
    broader matching where it has one, else the verl one; a source unknown to both is an error."""
    from grpo_trainer.rewards.hendrycks_math import hendrycks_math_score
    from grpo_trainer.rewards.minerva_math import minerva_math_score

    assert rw.get_reward_fn("openai/gsm8k") is rw.gsm8k_score
    assert rw.get_reward_fn("hiyouga/geometry3k") is rw.geo3k_score
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert rw.get_reward_fn(source) is hendrycks_math_score
        assert rw.get_reward_fn(source, "lenient") is rw.math_score
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime24", "aime_2025"):
        assert rw.get_reward_fn(source) is minerva_math_score
    assert rw.get_reward_fn("openai/gsm8k", "lenient") is rw.gsm8k_score_lenient
    assert rw.get_reward_fn("hiyouga/geometry3k", "lenient") is rw.geo3k_score_lenient
    assert {"openai/gsm8k", "lighteval/MATH", "aime*"} <= set(rw.registered_sources())
    with pytest.raises(rw.UnknownDataSourceError):
        rw.get_reward_fn("nobody/knows", "lenient")


def test_a_grader_whose_library_is_missing_is_refused_naming_the_setting(monkeypatch):
    """geo3k's "verl" grader imports mathruler when first called; on a machine without it (the GPU
    install once lacked it) the lookup, and so the reward manager's first batch, stops with the
    setting to change, not a ModuleNotFoundError at import; the lenient grader still scores."""
    monkeypatch.setitem(sys.modules, "mathruler", None)  # as if not installed
    with pytest.raises(rw.GraderUnavailableError) as refused:
        rw.get_reward_fn("hiyouga/geometry3k")
    message = str(refused.value)
    assert "reward.grader=verl" in message and "mathruler" in message
    assert "reward.grader=lenient (geo3k_score_lenient)" in message
    assert isinstance(refused.value, ValueError)  # a setting: the launchers' exit 2, one line
    with rw.RewardManager(timeout_s=5, isolation="thread") as manager, pytest.raises(rw.GraderUnavailableError):
        manager.score([{"data_source": "hiyouga/geometry3k", "solution_str": "\\boxed{1}", "ground_truth": "1"}])
    assert rw.get_reward_fn("hiyouga/geometry3k", "lenient")("<think>x</think>\\boxed{1}", "1", None) == 1.0
    monkeypatch.delitem(sys.modules, "mathruler")
    assert rw.get_reward_fn("hiyouga/geometry3k") is rw.geo3k_score


def test_register_get_and_conflicts():
    @rw.register("test/a", "test/b")
    def constant(solution_str, ground_truth, extra_info):
        return 0.25

    try:
        assert rw.get_reward_fn("test/a") is constant and rw.get_reward_fn("test/b") is constant
        rw.register("test/a")(constant)  # the same function again is fine (module re-import)

        def other(solution_str, ground_truth, extra_info):
            return 1.0

        with pytest.raises(ValueError, match="already has reward function"):
            rw.register("test/a")(other)
    finally:
        rw.unregister("test/a")
        rw.unregister("test/b")
    with pytest.raises(
        rw.UnknownDataSourceError, match=r"no reward function for data_source 'test/a'.*custom_fn"
    ):
        rw.get_reward_fn("test/a")
    with pytest.raises(ValueError, match="non-empty"):
        rw.register()


def test_load_custom_fn(tmp_path, monkeypatch):
    (tmp_path / "my_custom_reward.py").write_text(
        "class Scorers:\n"
        "    @staticmethod\n"
        "    def exact(solution_str, ground_truth, extra_info):\n"
        "        return float(solution_str == ground_truth)\n"
        "def length(solution_str, ground_truth, extra_info):\n"
        "    return len(solution_str) / 10\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert rw.load_custom_fn("my_custom_reward:length")("abcde", None, None) == 0.5
    assert rw.load_custom_fn("my_custom_reward:Scorers.exact")("a", "a", None) == 1.0
    with pytest.raises(rw.CustomRewardError, match=r"must look like 'package\.module:function'"):
        rw.load_custom_fn("my_custom_reward.length")
    with pytest.raises(rw.CustomRewardError, match="cannot import module 'no_such_module_xyz'"):
        rw.load_custom_fn("no_such_module_xyz:fn")
    with pytest.raises(rw.CustomRewardError, match="has no attribute 'missing'"):
        rw.load_custom_fn("my_custom_reward:missing")
    with pytest.raises(rw.CustomRewardError, match="not a function"):
        rw.load_custom_fn("my_custom_reward:NOT_CALLABLE")


def test_public_api_is_frozen():
    assert rw.__all__ == [
        "CustomRewardError",
        "GraderUnavailableError",
        "RewardFn",
        "RewardItem",
        "RewardManager",
        "RewardResult",
        "UnknownDataSourceError",
        "answers_match",
        "geo3k_score",
        "geo3k_score_lenient",
        "get_reward_fn",
        "gsm8k_score",
        "gsm8k_score_lenient",
        "last_boxed",
        "load_custom_fn",
        "math_score",
        "normalize_answer",
        "register",
        "registered_sources",
        "unregister",
    ]
