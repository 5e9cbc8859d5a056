"""RewardManager with real worker processes and real threads: raising, hanging (sleeping and
CPU-spinning), crashing, printing and badly-typed rewards score 0, are counted and logged, and
the batch still finishes in about the timeout. Reward functions live in a module written to a tmp
dir and put on sys.path, so worker processes import them by name like a user's package."""

from __future__ import annotations

import importlib
import os
import time
import uuid

import pytest
from structlog.testing import capture_logs

from grpo_trainer import rewards as rw

USER_MODULE = """
import os, sys, time

def exact(solution_str, ground_truth, extra_info):
    return float(solution_str == str(ground_truth))

def uses_extra(solution_str, ground_truth, extra_info):
    return {"score": extra_info["weight"], "note": "dict results are accepted"}

def raises(solution_str, ground_truth, extra_info):
    raise RuntimeError("grader bug")

def sleeps(solution_str, ground_truth, extra_info):
    time.sleep(60)
    return 1.0

def spins(solution_str, ground_truth, extra_info):
    # CPU-bound; runs for extra_info["seconds"] (threads cannot be killed) or forever
    end = time.monotonic() + (extra_info or {}).get("seconds", float("inf"))
    while time.monotonic() < end:
        pass
    return 1.0

def crashes(solution_str, ground_truth, extra_info):
    os._exit(3)

def prints(solution_str, ground_truth, extra_info):
    print("noise on stdout " * 100)
    sys.stdout.flush()
    return 0.5

def not_a_number(solution_str, ground_truth, extra_info):
    return "yes"

def nan(solution_str, ground_truth, extra_info):
    return float("nan")

def pid(solution_str, ground_truth, extra_info):
    return float(os.getpid())
"""


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    name = f"user_rewards_{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("user_rewards")
    (root / f"{name}.py").write_text(USER_MODULE)
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(root))
    yield importlib.import_module(name)
    mp.undo()


@pytest.fixture
def sources(user_module):
    names = [
        "exact",
        "uses_extra",
        "raises",
        "sleeps",
        "spins",
        "crashes",
        "prints",
        "not_a_number",
        "nan",
        "pid",
    ]
    for n in names:
        rw.register(f"t/{n}")(getattr(user_module, n))
    yield
    for n in names:
        rw.unregister(f"t/{n}")


def item(source, solution="7", gt="7", extra=None):
    return rw.RewardItem(solution_str=solution, ground_truth=gt, data_source=f"t/{source}", extra_info=extra)


@pytest.fixture(params=["process", "thread"])
def manager(request):
    with rw.RewardManager(1.0, num_workers=2, isolation=request.param) as m:
        yield m


def test_good_rewards_score(manager, sources):
    result = manager.score(
        [
            item("exact"),
            item("exact", solution="8"),
            item("uses_extra", extra={"weight": 0.3}),
            item("prints"),
        ]
    )
    assert result == rw.RewardResult(scores=[1.0, 0.0, 0.3, 0.5])


def test_raising_and_non_numeric_rewards_score_zero_and_are_counted(manager, sources):
    with capture_logs() as logs:
        result = manager.score(
            [item("exact"), item("raises"), item("not_a_number"), item("nan"), item("exact")]
        )
    assert result.scores == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert (result.n_errors, result.n_timeouts, result.n_unknown_source) == (3, 0, 0)
    (warning,) = [e for e in logs if e["event"] == "reward errors scored 0"]
    assert warning["count"] == 3 and warning["log_level"] == "warning"
    assert warning["examples"][0] == {
        "item": 1,
        "data_source": "t/raises",
        "message": "RuntimeError: grader bug",
    }
    assert "TypeError" in warning["examples"][1]["message"]


@pytest.mark.parametrize("hang", ["sleeps", "spins"])
def test_hanging_reward_times_out_without_blocking(manager, sources, hang):
    threads = manager._processes is None
    # an abandoned thread spins on in this process, so keep it short there (still 6x the timeout)
    extra = {"seconds": 6.0} if threads else None
    batch = [
        item("exact"),
        item(hang, extra=extra),
        item("exact"),
        item(hang, extra=extra),
        item("exact", solution="0"),
    ]
    start = time.monotonic()
    with capture_logs() as logs:
        result = manager.score(batch)
    elapsed = time.monotonic() - start
    assert result.scores == [1.0, 0.0, 1.0, 0.0, 0.0]
    # Both workers hang by the batch's 1 s budget: the two hung calls and the one never started.
    assert (result.n_errors, result.n_timeouts) == (0, 3)
    # ~1 s (the batch's budget) plus worker restarts on a busy machine; the hangs last 6 s to forever
    assert elapsed < (5.0 if threads else 20.0)
    assert any(e["event"] == "reward timeouts scored 0" and e["count"] == 3 for e in logs)
    assert manager.score([item("exact")]).scores == [1.0]  # the manager still works afterwards


def test_many_hanging_rows_cost_one_timeout_per_batch(sources):
    """16 hanging rows on one reward worker: the batch ends at its 1 s budget, not after 16 s."""
    with rw.RewardManager(1.0, isolation="process", num_workers=1) as m:
        start = time.monotonic()
        result = m.score([item("exact"), *[item("sleeps") for _ in range(16)]])
        elapsed = time.monotonic() - start
        assert result.scores[0] == 1.0 and result.n_timeouts == 16
        assert elapsed < 6.0, elapsed  # one budget plus a worker start on a busy machine
        assert m.score([item("exact")]).scores == [1.0]


def test_process_isolation_kills_hung_workers_and_survives_crashes(sources):
    with rw.RewardManager(1.0, isolation="process") as m:
        (first_pid,) = m.score([item("pid")]).scores
        assert m.score([item("spins")]).n_timeouts == 1
        (second_pid,) = m.score([item("pid")]).scores
        assert second_pid != first_pid  # the spinning worker was killed and replaced
        crashed = m.score([item("crashes"), item("exact")])
        assert crashed.scores == [0.0, 1.0] and crashed.n_errors == 1
        assert m.score([item("exact")]).scores == [1.0]


def test_unknown_data_source_scores_zero_with_one_warning(manager, sources):
    with capture_logs() as logs:
        result = manager.score([item("exact"), item("nope"), item("nope")])
        manager.score([item("nope")])
    assert result.scores == [1.0, 0.0, 0.0] and result.n_unknown_source == 2
    assert sum(e["event"] == "reward data_source unknown, scoring 0" for e in logs) == 1


def test_custom_fn_by_string_scores_every_source(user_module):
    with rw.RewardManager(2.0, f"{user_module.__name__}:exact") as m:
        result = m.score([item("anything"), item("openai/gsm8k", solution="1")])
    assert result.scores == [1.0, 0.0] and result.n_unknown_source == 0
    with pytest.raises(rw.CustomRewardError):
        rw.RewardManager(2.0, "not a spec")


def test_custom_fn_from_a_file_as_verl_names_it(tmp_path, monkeypatch):
    """verl's custom_reward_function: a file that is not on PYTHONPATH (relative to the working
    directory), its function named apart (default compute_score); scored in the reward worker
    process, which loads the file itself (no thread fallback)."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "my_reward.py").write_text(
        "import os\n"
        "def compute_score(solution_str, ground_truth, extra_info):\n    return 0.5\n"
        "def score_em(solution_str, ground_truth, extra_info):\n    return float(os.getpid())\n"
    )
    monkeypatch.chdir(tmp_path)
    with rw.RewardManager(5.0, "recipe/my_reward.py") as m:
        assert m.score([item("anything")]).scores == [0.5]
    with capture_logs() as logs, rw.RewardManager(5.0, "recipe/my_reward.py", custom_fn_name="score_em") as m:
        scores = m.score([item("a"), item("b")]).scores
    assert scores[0] == scores[1] != float(os.getpid()) and not any("thread" in e["event"] for e in logs)
    with rw.RewardManager(5.0, "recipe/my_reward.py:score_em", isolation="thread") as m:
        assert m.score([item("a")]).scores == [float(os.getpid())]
    with pytest.raises(rw.CustomRewardError, match=r"no file .*missing\.py"):
        rw.RewardManager(2.0, "recipe/missing.py")
    with pytest.raises(rw.CustomRewardError, match=r"'.*my_reward\.py' has no attribute 'nope'"):
        rw.RewardManager(2.0, "recipe/my_reward.py", custom_fn_name="nope")


def test_unpicklable_function_falls_back_to_threads():
    rw.register("t/lambda")(lambda s, g, e: 0.75)
    try:
        with capture_logs() as logs, rw.RewardManager(1.0, isolation="process") as m:
            assert m.score([item("lambda"), item("lambda")]).scores == [0.75, 0.75]
        assert sum("runs in a thread" in e["event"] for e in logs) == 1
    finally:
        rw.unregister("t/lambda")


def test_builtin_rewards_through_the_manager_and_mappings():
    with rw.RewardManager(5.0) as m:
        result = m.score(
            [
                {
                    "solution_str": "\\boxed{\\frac{1}{2}}",
                    "ground_truth": "0.5",
                    "data_source": "lighteval/MATH",
                },
                {
                    "solution_str": "#### 12",
                    "ground_truth": "12",
                    "data_source": "openai/gsm8k",
                    "extra_info": {},
                },
                {
                    "solution_str": "<think>a</think>\\boxed{3}",
                    "ground_truth": "4",
                    "data_source": "hiyouga/geometry3k",
                },
            ]
        )
    assert result.scores == pytest.approx([1.0, 1.0, 0.1])


def test_invalid_manager_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        rw.RewardManager(0)
    with pytest.raises(ValueError, match="isolation"):
        rw.RewardManager(1.0, isolation="fork")


def test_the_grader_setting_picks_verl_s_or_the_lenient_grading() -> None:
    """reward.grader: "verl" (the default) scores as verl does; "lenient" takes equivalent answers
    verl's rules miss, on the same rows, through the same manager the trainer builds."""
    items = [
        {"solution_str": "#### 18.0", "ground_truth": "18", "data_source": "openai/gsm8k"},
        {"solution_str": "<think>x</think> \\boxed{5.333333}", "ground_truth": "\\frac{16}{3}", "data_source": "hiyouga/geometry3k"},
        {"solution_str": "so \\boxed{0.25}", "ground_truth": "\\frac{1}{4}", "data_source": "lighteval/MATH"},
    ]
    verl = rw.RewardManager(timeout_s=30, isolation="thread")
    lenient = rw.RewardManager(timeout_s=30, isolation="thread", grader="lenient")
    assert verl.score(items).scores == pytest.approx([0.0, 0.1, 0.0])
    assert lenient.score(items).scores == pytest.approx([1.0, 1.0, 1.0])
