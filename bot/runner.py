"""The runner: alternate LLM calls and tool calls until the model answers.

The turn's messages accumulate in a list the caller owns, so when a turn is cancelled or fails
half-way the caller still holds everything that was done. At each phase the runner hands the
turn to ``on_phase`` so the caller can checkpoint it durably (DESIGN.md section 5).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from bot.images import shown_message
from bot.llm import LLMError, LLMProvider, LLMResponse, ToolCall
from bot.safejson import BadArguments, parse_arguments
from bot.session import ANSWERED_BY_KEY
from bot.spend.budget import BudgetSpent
from bot.spend.record import TOOL_ITERATION, TURN, estimated, reported
from bot.streaming import TurnStream
from bot.tools.base import ToolContext, ToolRegistry

log = logging.getLogger(__name__)
# A tool's name as a log line shows it: the model writes the name of a call, and one holding
# " session=<another chat>" or a line break would file the line under that chat, or forge one.
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def logged_name(name: str) -> str:
    return _NOT_IN_A_NAME.sub("?", name[:80]) or "?"


INTERRUPTED_TOOL_RESULT = "Error: task interrupted before this tool finished."
EMPTY_ANSWER_TEXT = "(the model returned an empty answer)"
# What the model reads where a turn of the history ended without its answer (``close_turn``):
# memobot's words, bracketed as its other notes are, that name no error the model could take
# up and repeat as its own answer; the person was shown their own note (bot.turn).
NO_ANSWER_NOTE = "[memobot: this message got no answer.]"
CLOSING_NOTES = {
    "failed": "[memobot: this message got no answer: the request to the model failed.]",
    "stopped": "[memobot: the person stopped this answer before it was written.]",
}
CALL_LIMIT_PREFIX = "Error: not run: this turn reached its limit of"
# The same tool with the same arguments this many times in one turn, each time with the same
# result, ends it: a model asking again for what it already has is looping, and each round
# costs a whole prompt.
REPEAT_LIMIT = 3
REPEATED_RESULT = "Error: not run: this exact call already got the same result twice in this turn."
Phase = Literal["awaiting_tools", "awaiting_approval", "tools_completed", "final_response"]
PhaseHook = Callable[[Phase, list[dict[str, Any]]], Awaitable[None]]
# Before a call runs: None lets it run, a string is its result instead (not approved).
Approver = Callable[[ToolCall, list[dict[str, Any]]], Awaitable[str | None]]
BuildMessages = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


@dataclass(slots=True)
class TurnResult:
    text: str
    status: Literal["ok", "max_iterations", "llm_error", "max_tokens", "repeated"]
    iterations: int
    error: LLMError | None = None


def call_limit_result(limit: int) -> str:
    """The tool result of a call that was not run because the turn used up its calls."""
    return (
        f"{CALL_LIMIT_PREFIX} {limit} tool calls (agent.maxToolCallsPerTurn). Answer with "
        "what you have, or tell the user what is left to do."
    )


def calls_made(turn: list[dict[str, Any]]) -> int:
    """Tool calls already run in ``turn`` (a resumed turn carries its earlier results)."""
    return sum(
        1
        for m in turn
        if m.get("role") == "tool"
        and m.get("content") != INTERRUPTED_TOOL_RESULT
        and not str(m.get("content", "")).startswith(CALL_LIMIT_PREFIX)
    )


def empty_answer_text(response: LLMResponse, max_tokens: int | None) -> str:
    """What the person is shown for an answer without text: why, when the server said so (a
    reasoning model can spend the whole budget thinking: ``finish_reason`` "length")."""
    if response.finish_reason == "length":
        budget = f", llm.maxTokens = {max_tokens}," if max_tokens else ""
        return (
            f"(the model used its whole answer budget{budget} before writing an answer; "
            "raise llm.maxTokens)"
        )
    return EMPTY_ANSWER_TEXT


class Runner:
    def __init__(
        self,
        provider: LLMProvider,
        tools: ToolRegistry,
        max_iterations: int,
        max_tool_calls: int = 50,
        max_tokens: int | None = None,
        max_turn_tokens: int = 0,
    ) -> None:
        """``max_tokens``: the answer budget requests are sent with (llm.maxTokens), named
        when an answer comes back empty because it was used up. ``max_turn_tokens``: the
        tokens a turn's calls may use together (agent.maxTokensPerTurn; 0: no limit)."""
        self.provider = provider
        self.tools = tools
        self.max_iterations = max_iterations
        self.max_tool_calls = max_tool_calls
        self.max_tokens = max_tokens
        self.max_turn_tokens = max_turn_tokens

    async def run(
        self,
        build_messages: BuildMessages,
        turn: list[dict[str, Any]],
        ctx: ToolContext,
        on_phase: PhaseHook | None = None,
        stream: TurnStream | None = None,
        approve: Approver | None = None,
        purpose: str = TURN,
        model: str | None = None,
    ) -> TurnResult:
        """Drive one turn. ``turn`` holds the new user message and grows as the turn runs.

        ``build_messages(turn)`` returns the full request (system prompt, history, turn). The
        final answer is appended to ``turn`` as an assistant message. LLM failures end the turn
        with a user-facing message instead of raising; cancellation propagates.
        ``stream``: the model's text and each tool call are told to it as they happen (the
        requests are streamed); None: plain requests.

        ``ctx.extra["offered"]`` (a set of names), when present, limits the tools: only they
        are offered to the model, and a call of any other is refused (a model may name a tool
        it was not offered). ``approve(call, turn)`` runs before each call: None lets it run,
        a string is its result instead (denied). A turn whose last assistant message has
        calls without results (resumed from an approval pause) runs those first.
        ``purpose``: what the usage ledger records the calls as; a person's turn ("turn")
        records each call that follows tool results as a "tool_iteration".
        ``model``: the chat's model, a name in llm.models (None: llm's own).
        """
        offered = self._offered(ctx)
        schemas = self.tools.schemas()
        if offered is not None:
            schemas = [s for s in schemas if s["function"]["name"] in offered]
        # Counted over the whole turn, not per LLM round: one response can carry hundreds.
        made = calls_made(turn)
        # A turn resumed while it waited for an approval: its batch goes on where it paused.
        waiting = unfinished_calls(turn)
        shown = 0  # images of ctx.images already in the turn
        if waiting:
            made = await self._run_calls(waiting, turn, ctx, made, offered, approve, stream)
            results_in_call_order(turn)  # a resumed call ran after the interrupted ones
            shown = _show_images(turn, ctx, shown)
            if on_phase:
                await on_phase("tools_completed", turn)
        after_tools = any(m.get("role") == "tool" for m in turn)  # a resumed turn's too
        # Counted from what this process asked: a turn resumed after a crash starts again at
        # 0 (its earlier calls' usage is in the ledger, not in the turn).
        used = 0

        def finished(response: LLMResponse) -> None:
            # The chat learns the answer is whole at once, not after the usage ledger's
            # write: a streamed preview is then not sent again for nothing.
            if stream and not response.tool_calls:
                stream.on_done()

        for iteration in range(1, self.max_iterations + 1):
            if self.max_turn_tokens and used >= self.max_turn_tokens:
                # Checked before a call, as the budget is: the call that crossed it finished.
                log.warning(
                    "turn stopped session=%s: %d tokens used, agent.maxTokensPerTurn is %d",
                    ctx.session_key,
                    used,
                    self.max_turn_tokens,
                )
                text = (
                    f"I stopped this answer after its model calls used {used:,} tokens "
                    f"(agent.maxTokensPerTurn = {self.max_turn_tokens:,}). Tell me how to "
                    "continue, or ask an admin to raise the limit."
                )
                return await self._give_up(turn, text, "max_tokens", iteration - 1, on_phase)
            started = time.monotonic()
            request = build_messages(turn)
            try:
                response: LLMResponse = await self.provider.chat(
                    request,
                    schemas,
                    session_key=ctx.session_key,
                    on_text=stream.on_text if stream else None,
                    purpose=TOOL_ITERATION if purpose == TURN and after_tools else purpose,
                    on_answer=finished,
                    model=model,
                )
            except LLMError as exc:
                # A spent budget is no failure of the model: the budget logs it once.
                spent = isinstance(exc, BudgetSpent)
                log.log(
                    logging.INFO if spent else logging.ERROR,
                    "llm %s session=%s: %s",
                    "not asked" if spent else "failed",
                    ctx.session_key,
                    exc,
                )
                return TurnResult(exc.user_message, "llm_error", iteration, exc)
            used += turn_tokens(response, request, schemas)
            log.debug(
                "llm answered session=%s iteration=%d tool_calls=%d in %.0f ms",
                ctx.session_key,
                iteration,
                len(response.tool_calls),
                (time.monotonic() - started) * 1000,
            )
            if not response.tool_calls:
                text = (response.content or "").strip() or empty_answer_text(
                    response, self.max_tokens
                )
                final: dict[str, Any] = {"role": "assistant", "content": response.content or text}
                if response.answered_by:
                    # Bookkeeping, not sent: to_wire drops it from the history (prompt cache).
                    final[ANSWERED_BY_KEY] = response.answered_by
                turn.append(final)
                if on_phase:
                    await on_phase("final_response", turn)
                return TurnResult(text, "ok", iteration)
            turn.append(response.assistant_message())
            if on_phase:
                await on_phase("awaiting_tools", turn)
            calls = list(response.tool_calls)
            history = call_results(turn)
            repeated = [c for c in calls if looping(history, c)]
            if repeated:
                # Every call of the batch gets a result (the history must stay valid); none
                # runs, and the turn ends here without asking the model once more.
                for c in calls:
                    _tried(stream, c)
                    turn.append(_result(c, REPEATED_RESULT))
                if on_phase:
                    await on_phase("tools_completed", turn)
                name = repeated[0].name
                log.warning(
                    "turn stopped session=%s: %s called %d times with the same arguments",
                    ctx.session_key,
                    name,
                    REPEAT_LIMIT,
                )
                text = (
                    f"I stopped this answer: the model kept calling {name} with the same "
                    "arguments, which would not have led anywhere. Tell me how to continue."
                )
                return await self._give_up(turn, text, "repeated", iteration, on_phase)
            made = await self._run_calls(calls, turn, ctx, made, offered, approve, stream)
            after_tools = True
            shown = _show_images(turn, ctx, shown)
            if on_phase:
                await on_phase("tools_completed", turn)
        text = (
            f"I stopped after {self.max_iterations} tool steps without reaching an answer "
            "(agent.maxToolIterations). Tell me how to continue, or raise the limit."
        )
        return await self._give_up(turn, text, "max_iterations", self.max_iterations, on_phase)

    async def _give_up(
        self,
        turn: list[dict[str, Any]],
        text: str,
        status: Literal["max_iterations", "max_tokens", "repeated"],
        iterations: int,
        on_phase: PhaseHook | None,
    ) -> TurnResult:
        """End the turn with memobot's note to the person as its answer."""
        turn.append({"role": "assistant", "content": text})
        if on_phase:
            await on_phase("final_response", turn)
        return TurnResult(text, status, iterations)

    def _offered(self, ctx: ToolContext) -> set[str] | None:
        offered = ctx.extra.get("offered")
        return set(offered) if offered is not None else None

    async def _run_calls(
        self,
        calls: list[ToolCall],
        turn: list[dict[str, Any]],
        ctx: ToolContext,
        made: int,
        offered: set[str] | None,
        approve: Approver | None,
        stream: TurnStream | None = None,
    ) -> int:
        """Run one batch of calls in order, each result appended as it comes; returns the
        turn's call count."""
        refused = 0
        # Counted from the turn, not from this process: a resumed turn names its calls alike.
        batch = sum(1 for m in turn if m.get("role") == "assistant" and m.get("tool_calls"))
        for call in calls:
            if made >= self.max_tool_calls:
                # Answered, not dropped: every call needs a result for the history to be
                # valid, and the model must learn why nothing happened.
                refused += 1
                _tried(stream, call)
                turn.append(_result(call, call_limit_result(self.max_tool_calls)))
                continue
            if offered is not None and call.name not in offered:
                log.warning(
                    "tool %s refused session=%s: not offered in this chat",
                    logged_name(call.name),
                    ctx.session_key,
                )
                _tried(stream, call)
                turn.append(_result(call, not_offered_result(call.name)))
                continue
            made += 1
            try:
                parse_arguments(call.arguments)
            except BadArguments as exc:
                # Refused before anyone is asked: a question about arguments that cannot
                # run would show nothing true. The chat still sees what was tried.
                if stream:
                    stream.on_tool(call.name, call.arguments)
                turn.append(_result(call, f"Error: {exc}"))
                continue
            if approve is not None:
                instead = await approve(call, turn)
                if instead is not None:
                    turn.append(_result(call, instead))
                    continue
            if stream:
                stream.on_tool(call.name, call.arguments)
            started = time.monotonic()
            ctx.call_id = f"{batch}/{call.id}"
            result = await self.tools.execute(call.name, call.arguments, ctx)
            log.info(
                "tool %s session=%s %s in %.0f ms",
                logged_name(call.name),
                ctx.session_key,
                "failed" if result.startswith("Error:") else "ok",
                (time.monotonic() - started) * 1000,
            )
            turn.append(_result(call, result))
        if refused:
            log.warning(
                "tool calls not run session=%s refused=%d: the turn reached "
                "agent.maxToolCallsPerTurn (%d)",
                ctx.session_key,
                refused,
                self.max_tool_calls,
            )
        return made


def call_key(name: str, arguments: str) -> str:
    """A call's identity for the repeat check: its name and its arguments as JSON with sorted
    keys (the same arguments written in another order or spacing are the same call)."""
    try:
        canonical = json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser (a tool error)
        canonical = arguments
    return f"{name}\0{canonical}"


def call_results(turn: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The results each call (by :func:`call_key`) got in ``turn`` so far, in order (a
    resumed turn's calls count)."""
    # A result belongs to the call of that id in the assistant message before it: some
    # servers number their calls "call_0", "call_1" in every answer, so an id recurs.
    out: dict[str, list[str]] = {}
    asked: dict[Any, str] = {}
    for m in turn:
        if m.get("role") == "assistant":
            asked = {}
            for c in m.get("tool_calls") or ():
                fn = c.get("function") or {}
                asked[c.get("id")] = call_key(str(fn.get("name", "")), str(fn.get("arguments", "")))
        elif m.get("role") == "tool" and (key := asked.pop(m.get("tool_call_id"), None)):
            out.setdefault(key, []).append(str(m.get("content")))
    return out


def looping(history: dict[str, list[str]], call: ToolCall) -> bool:
    """Whether ``call`` would be the REPEAT_LIMIT-th of its name and arguments in a row to
    get the same result: the model asks again for what it already has. (The same command
    run again after an edit gets another result and is no loop.)"""
    got = history.get(call_key(call.name, call.arguments), [])[-(REPEAT_LIMIT - 1) :]
    return len(got) == REPEAT_LIMIT - 1 and len(set(got)) == 1


def turn_tokens(
    response: LLMResponse, request: list[dict[str, Any]], schemas: list[dict[str, Any]]
) -> int:
    """The tokens one call used, as the provider reported them (estimated when it did not,
    as the usage ledger counts them)."""
    counts = reported(response.usage or {})
    if counts is not None:
        return counts[0] + counts[1]
    prompt, completion = estimated(request, schemas, response.assistant_message())
    return prompt + completion


def _tried(stream: TurnStream | None, call: ToolCall) -> None:
    """A call that is not run is still shown as tried: the chat also learns from it that the
    model's next request is a new reply (``bot.bus.StreamEvent``), not a retried one."""
    if stream:
        stream.on_tool(call.name, call.arguments)


def _show_images(turn: list[dict[str, Any]], ctx: ToolContext, shown: int) -> int:
    """Put the images the batch's tools showed (``ctx.images`` from ``shown`` on) into the
    turn after its results; returns how many are in it now."""
    if len(ctx.images) > shown:
        turn.append(shown_message(ctx.images[shown:]))
    return len(ctx.images)


def _result(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def not_offered_result(name: str) -> str:
    return f"Error: the tool '{name}' is not available in this chat; answer without it."


def unfinished_calls(turn: list[dict[str, Any]]) -> list[ToolCall]:
    """The calls of the last assistant message that have no result yet, in order."""
    for i in range(len(turn) - 1, -1, -1):
        m = turn[i]
        if m.get("role") == "assistant":
            if not m.get("tool_calls"):
                return []
            done = {t.get("tool_call_id") for t in turn[i + 1 :] if t.get("role") == "tool"}
            return [
                ToolCall(
                    c.get("id", ""),
                    c.get("function", {}).get("name", ""),
                    c.get("function", {}).get("arguments", ""),
                )
                for c in m["tool_calls"]
                if c.get("id") not in done
            ]
    return []


def results_in_call_order(turn: list[dict[str, Any]]) -> None:
    """Put the results following the last assistant message with calls in the order of its
    calls, in place (strict chat templates pair results with calls by position)."""
    for i in range(len(turn) - 1, -1, -1):
        calls = turn[i].get("tool_calls") if turn[i].get("role") == "assistant" else None
        if not calls:
            continue
        end = i + 1
        while end < len(turn) and turn[end].get("role") == "tool":
            end += 1
        order = {c.get("id"): n for n, c in enumerate(calls)}
        turn[i + 1 : end] = sorted(
            turn[i + 1 : end], key=lambda m: order.get(m.get("tool_call_id"), len(order))
        )
        return


def close_open_tool_calls(turn: list[dict[str, Any]], keep: Collection[str] = ()) -> int:
    """Give every tool call that has no result an 'interrupted' result, in place; not the
    calls of the tools named in ``keep`` (resumable ones, run again by the resumed turn).

    Keeps the turn valid for the Chat Completions API after a cancel or a crash: the results of
    a call batch must directly follow the assistant message that made it. Returns how many
    calls were closed.
    """
    rebuilt: list[dict[str, Any]] = []
    closed = 0
    i = 0
    while i < len(turn):
        m = turn[i]
        rebuilt.append(m)
        i += 1
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            continue
        have = set()
        while i < len(turn) and turn[i].get("role") == "tool":
            have.add(turn[i].get("tool_call_id"))
            rebuilt.append(turn[i])
            i += 1
        for c in calls:
            if c.get("id") not in have and c.get("function", {}).get("name") not in keep:
                rebuilt.append(interrupted_result(c))
                closed += 1
    if closed:
        turn[:] = rebuilt
    return closed


def interrupted_result(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call.get("id", ""),
        "name": call.get("function", {}).get("name", ""),
        "content": INTERRUPTED_TOOL_RESULT,
    }


def answered(turn: list[dict[str, Any]]) -> bool:
    """Whether ``turn`` ends with an answer: an assistant message that made no tool calls."""
    last = turn[-1] if turn else None
    return last is not None and last.get("role") == "assistant" and not last.get("tool_calls")


def close_turn(turn: list[dict[str, Any]], note: str = NO_ANSWER_NOTE) -> bool:
    """End a turn that has no answer (failed, stopped, given up) with the assistant ``note``,
    in place, its open tool calls first given their 'interrupted' result; True if it did.

    Strict chat templates (Mistral's API, Mistral, Devstral and Gemma templates on llama.cpp
    or vLLM) refuse a user message right after a tool result or another user message: a
    stored turn always ends with the assistant, so the next one can begin. An empty turn
    (nothing was kept) stays empty.
    """
    if not turn or answered(turn):
        return False
    close_open_tool_calls(turn)
    turn.append({"role": "assistant", "content": note})
    return True
