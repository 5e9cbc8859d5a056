"""The token ids of tool messages as the model's chat template renders them between two of its turns.

Token in, token out: the model's own turns are never decoded and encoded again; only what the
template adds after a turn (the end of that turn the model did not sample, the tool messages, the
next turn's header) is rendered, by a delta: a dummy conversation rendered without and with the tool
messages, cut just after the assistant's content. docs/MULTI_TURN.md draws one trajectory out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SIDES = ("left", "right", "middle")

# A dummy conversation: the content is a sentinel no template rewrites.
_USER = "grpo-dummy-user-turn"
_ASSISTANT = "grpo-dummy-assistant-turn"


class TemplateError(ValueError):
    """The chat template cannot render tool messages after a turn."""


def truncate(text: str, limit: int, side: str) -> str:
    """`text` cut to `limit` characters as verl's `tool_response_truncate_side` cuts it: `left` keeps
    the beginning, `right` the end, `middle` both ends; the cut is marked."""
    if side not in SIDES:
        raise ValueError(f"tool_response_truncate_side={side!r}: use one of {list(SIDES)}")
    if limit <= 0 or len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-(limit - half) :]


class ToolTurnRenderer:
    """Renders a list of tool answers into the ids that follow a turn the model ended itself.

    `ids(answers, last_token)` returns the template's text after the assistant's content (less what
    the model sampled as its end of turn, `last_token`), the tool messages and the next assistant
    header, encoded without special-token additions. A template that renders earlier turns
    differently once tool messages follow is refused: the delta would not be the template's."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        self._base = base
        before = self._render(base, generation_prompt=False)
        end = before.rfind(_ASSISTANT)
        if end < 0:
            raise TemplateError(
                "the chat template drops the assistant's content; it cannot hold a tool conversation"
            )
        self._prefix = before[: end + len(_ASSISTANT)]
        self._turn_end = before[end + len(_ASSISTANT) :]  # e.g. "<|im_end|>\n"
        probe = self._render_answers(["grpo-probe"])
        if "grpo-probe" not in probe:
            raise TemplateError(
                "the chat template drops tool messages (role 'tool'): set rollout.multi_turn.format to a "
                "model whose template renders them, or give the tokenizer such a template"
            )

    def _render(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as exc:  # jinja raises its own errors for roles a template refuses
            raise TemplateError(
                f"the chat template cannot render {[m['role'] for m in messages]}: {exc}"
            ) from exc

    def _render_answers(self, answers: Sequence[str]) -> str:
        """The template's text after the assistant's content, for these tool answers."""
        messages = [*self._base, *({"role": "tool", "content": a} for a in answers)]
        after = self._render(messages, generation_prompt=True)
        if not after.startswith(self._prefix):
            raise TemplateError(
                "the chat template renders the turns before a tool message differently once one follows, so "
                "tool messages cannot be appended token by token"
            )
        return after[len(self._prefix) :]

    def text(self, answers: Sequence[str], last_token: int | None) -> str:
        """What follows the model's last sampled token: the rest of the template's end of turn (none
        when the model sampled it), the tool messages, the next assistant header."""
        rendered = self._render_answers(answers)
        if last_token is not None:
            sampled_end = self.tokenizer.decode([last_token])
            if sampled_end and self._turn_end.startswith(sampled_end) and rendered.startswith(sampled_end):
                return rendered[len(sampled_end) :]
        return rendered

    def ids(self, answers: Sequence[str], last_token: int | None) -> list[int]:
        return list(self.tokenizer.encode(self.text(answers, last_token), add_special_tokens=False))
