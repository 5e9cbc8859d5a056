"""Multi-turn rollouts with tools, over any rollout engine: generate, read the tool calls of each
finished turn, run them (in parallel, sandboxed), append the tool messages as the chat template
renders them, generate again, until a turn without a call or a limit.

Token in, token out: a response is the ids the engine sampled plus the template's ids for the tool
messages, never a decode and encode of text; `Generation.mask` is 1 on sampled ids, 0 on the
template's. Turns are taken in lock step: every unfinished response of the batch goes back to the
engine together once the tools of the turn have answered. docs/MULTI_TURN.md draws a trajectory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_config.schema import MultiTurnConfig, TrainerConfig
from grpo_trainer.protocols import Generation, RolloutEngine, SamplingParams, ToolUse
from grpo_trainer.tools.calls import Format, ToolCall, parse_tool_calls
from grpo_trainer.tools.registry import BUILTIN, Tool, call_tool, load_function_tools
from grpo_trainer.tools.render import ToolTurnRenderer, truncate
from grpo_trainer.tools.sandbox import Limits, ToolResult
from grpo_trainer.tools.schema import ToolDefinitionError
from grpo_trainer.tools.verl_yaml import load_verl_tools


@dataclass(frozen=True, kw_only=True)
class MultiTurnSettings:
    """verl's `rollout.multi_turn` settings; a turn limit of None or 0 is no limit (verl's reading)."""

    format: Format = "qwen3_xml"
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256  # characters of one tool answer (verl's default)
    tool_response_truncate_side: str = "middle"
    limits: Limits = field(default_factory=Limits)
    # Tool calls running at once, across the batch: a call mostly waits (its interpreter's start, the
    # kernel making its network namespace: ~180 ms here, ~35 ms of it CPU; docs/TOOLS.md).
    tool_workers: int = 32


@dataclass(kw_only=True)
class Trajectory:
    prompt_index: int
    prompt: list[int]
    group: int = 0  # the replica that samples it
    vision: Any = None  # its prompt's vision inputs
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    use: ToolUse = field(default_factory=lambda: ToolUse(assistant_turns=0))
    calls: list[ToolCall] = field(default_factory=list)  # the last turn's, waiting for answers
    done: bool = False

    def add_turn(self, turn: Generation, budget: int) -> None:
        room = budget - len(self.ids)
        ids, logprobs, reason = turn.token_ids, turn.logprobs, turn.finish_reason
        if len(ids) > room:  # sampled with the batch's largest budget: cut at this one's own
            ids, logprobs, reason = ids[:room], logprobs[:room], "length"
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [1] * len(ids)
        self.finish_reason = reason
        self.use.assistant_turns += 1

    def generation(self) -> Generation:
        return Generation(
            prompt_index=self.prompt_index,
            token_ids=self.ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            mask=self.mask,
            tools=self.use,
        )


def next_turn_params(
    params: SamplingParams, *, turn_index: int, responses: int, max_tokens: int
) -> SamplingParams:
    """A further turn's sampling: one sample a response, what is left of the budget, and a seed past
    every earlier turn's (request i of a batch takes seed + i, so turns of `responses` never meet)."""
    seed = None if params.seed is None else params.seed + turn_index * responses
    return dataclasses.replace(params, n=1, seed=seed, max_tokens=max_tokens)


ContinueTurns = Callable[[list["Trajectory"], int, int], list[Generation]]


class ToolLoop:
    """The loop itself, for any way of sampling a batch of turns: `start` takes the first turn's
    generations, `finish` runs tools and asks `continue_turns(trajectories, turn_index, max_tokens)`
    for each further turn of the trajectories still going (their prompts: `prompt + ids`)."""

    def __init__(self, *, tokenizer: Any, tools: Mapping[str, Tool], settings: MultiTurnSettings) -> None:
        if not tools:
            raise ValueError("a multi-turn rollout needs at least one tool")
        if settings.max_parallel_calls < 1:
            raise ValueError(f"max_parallel_calls={settings.max_parallel_calls} must be >= 1")
        self.tokenizer = tokenizer
        self.tools = dict(tools)
        self.settings = settings
        self.renderer = ToolTurnRenderer(tokenizer)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools as the chat template lists them in the prompt (`tools=`)."""
        return [tool.schema for tool in self.tools.values()]

    @staticmethod
    def start(
        first: Sequence[Generation],
        prompts: Sequence[Sequence[int]],
        budget: int,
        *,
        group: int = 0,
        vision: Any = None,
    ) -> list[Trajectory]:
        runs = []
        for turn in first:
            run = Trajectory(
                prompt_index=turn.prompt_index,
                prompt=list(prompts[turn.prompt_index]),
                group=group,
                vision=vision[turn.prompt_index] if vision is not None else None,
            )
            run.add_turn(turn, budget)
            runs.append(run)
        return runs

    def finish(self, runs: list[Trajectory], budget: int, continue_turns: ContinueTurns) -> list[Generation]:
        turn_index = 0
        while True:
            waiting = [run for run in runs if not run.done and self._wants_tools(run)]
            if not waiting:
                break
            self._answer(waiting, budget)
            going = [run for run in waiting if not run.done]
            if not going:
                break
            turn_index += 1
            turns = continue_turns(going, turn_index, max(budget - len(run.ids) for run in going))
            for run, turn in zip(going, turns, strict=True):
                run.add_turn(turn, budget)
        return [run.generation() for run in runs]

    def _wants_tools(self, run: Trajectory) -> bool:
        """Whether the last turn asks for tools and the limits let them answer; else the response ends."""
        s = self.settings
        run.done = True
        if run.finish_reason != "stop":
            return False
        if s.max_assistant_turns and run.use.assistant_turns >= s.max_assistant_turns:
            return False
        if s.max_user_turns and run.use.assistant_turns - 1 >= s.max_user_turns:
            return False
        last_turn = run.ids[len(run.ids) - _last_turn_length(run.mask) :]
        run.calls = parse_tool_calls(self.tokenizer.decode(last_turn, skip_special_tokens=False), s.format)
        run.done = not run.calls
        return bool(run.calls)

    def _answer(self, waiting: list[Trajectory], budget: int) -> None:
        """Runs the calls of every waiting response at once and appends their answers (or ends the
        response where the answers would not fit the token budget)."""
        s = self.settings
        jobs = [(run, call) for run in waiting for call in run.calls[: s.max_parallel_calls]]
        with ThreadPoolExecutor(max_workers=max(1, min(s.tool_workers, len(jobs)))) as pool:
            results = list(pool.map(lambda job: call_tool(self.tools, job[1], s.limits), jobs))
        answers: dict[int, list[ToolResult]] = {}
        for (run, _), result in zip(jobs, results, strict=True):
            answers.setdefault(id(run), []).append(result)
        for run in waiting:
            got = answers.get(id(run), [])
            extra = len(run.calls) - len(got)
            got += [_too_many(s.max_parallel_calls)] * max(extra, 0)
            run.use.tool_calls += len(got)
            run.use.tool_errors += sum(r.status == "error" for r in got)
            run.use.tool_timeouts += sum(r.status == "timeout" for r in got)
            run.use.tool_seconds += sum(r.seconds for r in got)
            texts = [truncate(r.text, s.max_tool_response_length, s.tool_response_truncate_side) for r in got]
            ids = self.renderer.ids(texts, run.ids[-1] if run.ids else None)
            if len(run.ids) + len(ids) >= budget:  # no room to answer and turn again: as verl, it ends here
                run.done, run.finish_reason = True, "length"
                continue
            run.ids += ids
            run.logprobs += [0.0] * len(ids)
            run.mask += [0] * len(ids)
            run.use.tool_tokens += len(ids)
            run.calls = []
            run.done = False


class MultiTurnEngine:
    """A `RolloutEngine` whose responses may call tools, `inner` sampling every turn (a rollout
    worker's engine of its own). Weight sync, sleep and wake go to `inner` as they are."""

    def __init__(self, inner: RolloutEngine, loop: ToolLoop) -> None:
        self.inner = inner
        self.loop = loop

    def __getattr__(self, name: str) -> Any:  # the inner engine's own attributes (weights_dropped, shutdown)
        return getattr(self.inner, name)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.update_weights(named_tensors)

    def sleep(self) -> None:
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, vision: Sequence[Any] | None = None
    ) -> list[Generation]:
        budget = params.max_tokens
        runs = self.loop.start(
            self.inner.generate(prompts, params, vision=vision), prompts, budget, vision=vision
        )

        def continue_turns(going: list[Trajectory], turn_index: int, max_tokens: int) -> list[Generation]:
            again = next_turn_params(
                params, turn_index=turn_index, responses=len(runs), max_tokens=max_tokens
            )
            pixels = [run.vision for run in going] if vision is not None else None
            return self.inner.generate([run.prompt + run.ids for run in going], again, vision=pixels)

        return self.loop.finish(runs, budget, continue_turns)


def _last_turn_length(mask: list[int]) -> int:
    """How many ids at the end of `mask` the model sampled in a row (its last turn)."""
    count = 0
    for bit in reversed(mask):
        if not bit:
            break
        count += 1
    return count


def _too_many(limit: int) -> ToolResult:
    return ToolResult(
        "error",
        f"not run: at most {limit} tool call(s) run in one turn (rollout.multi_turn.max_parallel_calls)",
        0.0,
    )


def tool_loop(cfg: TrainerConfig, tokenizer: Any) -> ToolLoop | None:
    """The loop `rollout.multi_turn` asks for (None when it is off): its built-in tools and the
    functions of `function_tool_path`, its limits."""
    section = cfg.rollout.multi_turn
    if not section.enable:
        return None
    return ToolLoop(tokenizer=tokenizer, tools=tools_of(section), settings=settings_of(section))


def tools_of(section: MultiTurnConfig) -> dict[str, Tool]:
    """The tools a run offers, by name: the built-ins named, a verl tool YAML's and a function
    file's; two of one name are refused."""
    tools = {name: BUILTIN[name] for name in section.tools}
    sources = [("rollout.multi_turn.tools", set(tools))]
    loaded = []
    if section.tool_config_path:
        yaml_tools = load_verl_tools(section.tool_config_path, _limits(section))
        loaded.append((f"tool_config_path {section.tool_config_path}", yaml_tools))
    if section.function_tool_path:
        file_tools = load_function_tools(section.function_tool_path)
        loaded.append((f"function_tool_path {section.function_tool_path}", file_tools))
    for where, found in loaded:
        for earlier, names in sources:
            clash = sorted(set(found) & names)
            if clash:
                raise ToolDefinitionError(
                    f"{where} defines {', '.join(clash)}, a tool name {earlier} has too: each tool name must be "
                    "unique; rename one (or drop the built-in)"
                )
        sources.append((where, set(found)))
        tools.update(found)
    return tools


def _limits(section: MultiTurnConfig) -> Limits:
    return Limits(
        timeout_s=section.tool_timeout_s, memory_mb=section.tool_memory_mb, network=section.tool_network
    )


def settings_of(section: MultiTurnConfig) -> MultiTurnSettings:
    return MultiTurnSettings(
        format=section.format,
        max_assistant_turns=section.max_assistant_turns,
        max_user_turns=section.max_user_turns,
        max_parallel_calls=section.max_parallel_calls,
        max_tool_response_length=section.max_tool_response_length,
        tool_response_truncate_side=section.tool_response_truncate_side,
        limits=_limits(section),
    )
