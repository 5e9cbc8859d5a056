"""The multi-turn loop (issue 45): exact ids, masks and log-prob positions of a hand-checked
trajectory, no re-tokenisation, limits, parallel calls and misbehaving tools.

The engine here is scripted (`Scripted`: each call answers with the next texts, encoded by the
tokenizer, and log-probs that name their position): a random-weight model does not write tool
calls, and the exact ids are the point. The tools, the sandbox, the tokenizer and its chat template
are real; the engines that sample for real run the same loop in the rollout tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from grpo_tiny.model import TURN_END, build_tokenizer
from grpo_trainer.batching import pad_rows
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rollout.multi_turn import MultiTurnEngine, MultiTurnSettings, ToolLoop
from grpo_trainer.tools.registry import BUILTIN
from grpo_trainer.tools.render import TemplateError, ToolTurnRenderer, truncate
from grpo_trainer.tools.sandbox import Limits

TEXTS = [
    "What is 12*34? The answer is 408. calculator expression python code print while True pass "
    "raise ValueError boom x<tool_call>\n<function=calculator>\n<parameter=expression>\n</parameter>\n"
    "</function>\n</tool_call> user assistant tool <tool_response>\n</tool_response> (truncated)... "
    "abcdefghijklmnopqrstuvwxyz0123456789(){}[]*+-/=:;'\"_,.",
] * 4

CALC = (
    "<tool_call>\n<function=calculator>\n<parameter=expression>\n{}\n</parameter>\n</function>\n</tool_call>"
)
PY = "<tool_call>\n<function=python>\n<parameter=code>\n{}\n</parameter>\n</function>\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TEXTS, vocab_size=160, tools=True)


class Scripted:
    """Answers call k with `turns[k]` (a text per prompt, or ids): the ids plus the end of turn,
    log-prob -(1 + position / 100) for the position within the turn."""

    def __init__(self, tokenizer, turns: list[list[str | list[int]]]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, turns, []

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, vision=None
    ) -> list[Generation]:
        self.calls.append(([list(p) for p in prompts], params))
        out = []
        for i, turn in enumerate(self.turns[len(self.calls) - 1]):
            ids = turn if isinstance(turn, list) else self.tokenizer.encode(turn, add_special_tokens=False)
            ids = [*ids, self.tokenizer.eos_token_id][: params.max_tokens]
            stop = ids[-1] == self.tokenizer.eos_token_id
            lps = [-(1 + k / 100) for k in range(len(ids))]
            out.append(
                Generation(
                    prompt_index=i // params.n,
                    token_ids=ids,
                    logprobs=lps,
                    finish_reason="stop" if stop else "length",
                )
            )
        return out

    def update_weights(self, named_tensors) -> None: ...
    def sleep(self) -> None: ...
    def wake_up(self) -> None: ...


def engine(tokenizer, turns, **settings) -> tuple[MultiTurnEngine, Scripted]:
    inner = Scripted(tokenizer, turns)
    limits = settings.pop("limits", Limits(timeout_s=5.0, memory_mb=512))
    loop = ToolLoop(tokenizer=tokenizer, tools=BUILTIN, settings=MultiTurnSettings(limits=limits, **settings))
    return MultiTurnEngine(inner, loop), inner


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_hand_checked_trajectory_is_the_templates_conversation_with_only_sampled_ids_trained(
    tokenizer,
) -> None:
    call, answer = CALC.format("12*34"), "The answer is 408."
    mt, inner = engine(tokenizer, [[call], [answer]])
    prompt = prompt_ids(tokenizer, "What is 12*34?")
    (gen,) = mt.generate([prompt], SamplingParams(n=1, max_tokens=200, seed=3))

    # The whole row is what the chat template makes of the conversation, to the model's last end of turn.
    conversation = [
        {"role": "user", "content": "What is 12*34?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": answer},
    ]
    whole = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert whole.endswith(TURN_END + "\n")
    assert prompt + gen.token_ids == tokenizer.encode(whole[: -len("\n")], add_special_tokens=False)

    # Drawn out: turn 1 sampled (mask 1), the template's tool turn (mask 0), turn 2 sampled (mask 1).
    turn1 = [*tokenizer.encode(call, add_special_tokens=False), tokenizer.eos_token_id]
    tool_text = (
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    tool = tokenizer.encode(tool_text, add_special_tokens=False)
    turn2 = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
    assert gen.token_ids == turn1 + tool + turn2
    assert gen.mask == [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    lp = lambda n: [-(1 + k / 100) for k in range(n)]  # noqa: E731
    assert gen.logprobs == lp(len(turn1)) + [0.0] * len(tool) + lp(len(turn2))
    assert (gen.finish_reason, gen.tools.assistant_turns, gen.tools.tool_calls, gen.tools.tool_errors) == (
        "stop",
        2,
        1,
        0,
    )
    assert gen.tools.tool_tokens == len(tool)

    # The second turn was asked for on the prompt plus everything so far, with what is left of the budget.
    (again, params) = inner.calls[1]
    assert again == [prompt + turn1 + tool]
    assert (params.n, params.max_tokens) == (1, 200 - len(turn1) - len(tool))

    # The policy trains on the sampled ids only; the engine's log-probs sit at their positions.
    batch = pad_rows(
        [prompt], [gen.token_ids], pad_token_id=0, rollout_log_probs=[gen.logprobs], masks=[gen.mask]
    )
    start = len(prompt)
    assert batch.response_mask[0, start : start + len(gen.mask)].tolist() == [float(m) for m in gen.mask]
    assert batch.response_mask[0, :start].sum() == 0
    sampled = batch.response_mask[0].bool()
    assert batch.rollout_log_probs[0][sampled].tolist() == pytest.approx(lp(len(turn1)) + lp(len(turn2)))


def test_a_turn_is_kept_as_sampled_where_decode_and_encode_would_change_it(tokenizer) -> None:
    call = tokenizer.encode(CALC.format("2+2"), add_special_tokens=False)
    # "answer" spelled one character a token: the tokenizer merges it when it encodes the text.
    spelled = [tokenizer.convert_tokens_to_ids(ch) for ch in "answer"]
    assert tokenizer.encode(tokenizer.decode(spelled), add_special_tokens=False) != spelled
    mt, _ = engine(tokenizer, [[call], [spelled]])
    (gen,) = mt.generate([prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=200))
    assert gen.token_ids[-len(spelled) - 1 : -1] == spelled


def test_turn_limits_end_the_response(tokenizer) -> None:
    always = [[CALC.format("1+1")]] * 5
    mt, inner = engine(tokenizer, always, max_assistant_turns=3)
    (gen,) = mt.generate([prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=400))
    assert (len(inner.calls), gen.tools.assistant_turns, gen.tools.tool_calls) == (3, 3, 2)
    assert gen.finish_reason == "stop" and gen.mask[-1] == 1  # the last turn's call is left unanswered

    mt, inner = engine(tokenizer, always, max_user_turns=1)
    (gen,) = mt.generate([prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=400))
    assert (len(inner.calls), gen.tools.tool_calls) == (2, 1)

    # 0 is no limit, as verl reads it: the response ends when the model answers without a call.
    two_calls = [[CALC.format("1+1")], [CALC.format("2+2")], ["done"]]
    mt, inner = engine(tokenizer, two_calls, max_assistant_turns=0, max_user_turns=0)
    (gen,) = mt.generate([prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=400))
    assert (len(inner.calls), gen.tools.assistant_turns, gen.tools.tool_calls) == (3, 3, 2)


def test_parallel_calls_answer_in_one_turn_and_extra_calls_are_told_not_run(tokenizer) -> None:
    three = "".join(CALC.format(e) for e in ("1+2", "3*4", "5-6"))
    mt, _ = engine(tokenizer, [[three], ["done"]], max_parallel_calls=2)
    (gen,) = mt.generate([prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=400))
    tool_ids = [t for t, m in zip(gen.token_ids, gen.mask, strict=True) if m == 0]
    text = tokenizer.decode(tool_ids)
    assert text.count("<tool_response>") == 3 and text.count("<|im_start|>user") == 1
    assert "\n3\n" in text and "\n12\n" in text and "max_parallel_calls" in text
    assert (gen.tools.tool_calls, gen.tools.tool_errors) == (3, 1)


def test_hung_crashing_and_huge_tools_answer_the_model_and_the_batch_goes_on(tokenizer) -> None:
    turns = [
        [
            PY.format("while True: pass"),
            PY.format("raise ValueError('boom')"),
            PY.format("print('x' * 100000)"),
        ],
        ["a", "b", "c"],
    ]
    limits = Limits(timeout_s=1.0, memory_mb=512)
    mt, _ = engine(
        tokenizer, turns, limits=limits, max_tool_response_length=40, tool_response_truncate_side="left"
    )
    hung, crashed, huge = mt.generate([prompt_ids(tokenizer, "x")] * 3, SamplingParams(max_tokens=400))
    assert (hung.tools.tool_timeouts, crashed.tools.tool_errors, huge.tools.tool_errors) == (1, 1, 0)
    assert 0.9 <= hung.tools.tool_seconds < 5
    answers = [
        tokenizer.decode([t for t, m in zip(g.token_ids, g.mask, strict=True) if m == 0])
        for g in (crashed, huge)
    ]
    assert "ValueError: boom" in answers[0]
    assert "x" * 40 + "...(truncated)" in answers[1] and "x" * 41 not in answers[1]
    assert all(g.tools.assistant_turns == 2 and g.finish_reason == "stop" for g in (hung, crashed, huge))


def test_an_answer_that_does_not_fit_the_budget_ends_the_response(tokenizer) -> None:
    call = tokenizer.encode(CALC.format("1+1"), add_special_tokens=False)
    mt, inner = engine(tokenizer, [[call]])
    (gen,) = mt.generate([prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=len(call) + 5))
    assert len(inner.calls) == 1 and gen.finish_reason == "length"
    assert gen.mask == [1] * len(gen.token_ids)  # nothing of the tool's was appended
    assert gen.tools.tool_calls == 1


def test_truncation_sides_and_templates_without_tool_messages(tokenizer) -> None:
    assert truncate("abcdefgh", 4, "left") == "abcd...(truncated)"
    assert truncate("abcdefgh", 4, "right") == "(truncated)...efgh"
    assert truncate("abcdefgh", 4, "middle") == "ab...(truncated)...gh"
    assert truncate("abc", 4, "middle") == "abc"
    plain = build_tokenizer(TEXTS, vocab_size=160)
    plain.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="drops tool messages"):
        ToolTurnRenderer(plain)
    plain.chat_template = "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(TemplateError, match="cannot render"):
        ToolTurnRenderer(plain)


def test_the_config_section_sets_every_loop_setting_and_its_tools(tokenizer, tmp_path) -> None:
    from grpo_config import load
    from grpo_trainer.rollout.multi_turn import tool_loop
    from grpo_trainer.tools.schema import ToolDefinitionError

    assert tool_loop(load(), tokenizer) is None  # off by default
    functions = tmp_path / "lookup.py"
    functions.write_text(
        'def capital(country: str) -> str:\n    """The capital of a country.\n\n    Args:\n'
        '        country: its name.\n    """\n    return {"x": "abc"}.get(country, "?")\n'
    )
    cfg = load(
        overrides=[
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
            "actor_rollout_ref.rollout.multi_turn.max_user_turns=3",
            "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=99",
            "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=right",
            "rollout.multi_turn.tools=[calculator]",
            f"actor_rollout_ref.rollout.multi_turn.function_tool_path={functions}",  # verl's key
            "rollout.multi_turn.tool_timeout_s=2.5",
            "rollout.multi_turn.tool_memory_mb=300",
            "rollout.multi_turn.tool_network=true",
        ]
    )
    loop = tool_loop(cfg, tokenizer)
    s = loop.settings
    assert (s.format, s.max_assistant_turns, s.max_user_turns, s.max_parallel_calls) == ("hermes", 4, 3, 2)
    assert (s.max_tool_response_length, s.tool_response_truncate_side) == (99, "right")
    assert (s.limits.timeout_s, s.limits.memory_mb, s.limits.network) == (2.5, 300, True)
    assert sorted(loop.tools) == ["calculator", "capital"]
    assert [t["function"]["name"] for t in loop.schemas] == ["calculator", "capital"]

    # A hermes call of the file's function, answered from the file.
    call = '<tool_call>\n{"name": "capital", "arguments": {"country": "x"}}\n</tool_call>'
    (gen,) = MultiTurnEngine(Scripted(tokenizer, [[call], ["done"]]), loop).generate(
        [prompt_ids(tokenizer, "x")], SamplingParams(max_tokens=400)
    )
    assert "<tool_response>\nabc\n</tool_response>" in tokenizer.decode(gen.token_ids)

    clash = tmp_path / "clash.py"
    clash.write_text('def calculator(expression: str) -> str:\n    """Mine."""\n    return expression\n')
    with pytest.raises(ToolDefinitionError, match=r"defines calculator, a tool name rollout\.multi_turn\.tools has too"):
        tool_loop(
            dataclasses.replace(
                cfg,
                rollout=dataclasses.replace(
                    cfg.rollout,
                    multi_turn=dataclasses.replace(cfg.rollout.multi_turn, function_tool_path=str(clash)),
                ),
            ),
            tokenizer,
        )
