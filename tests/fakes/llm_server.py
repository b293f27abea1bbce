"""A local OpenAI-compatible Chat Completions server for tests, crash tests and benchmarks.

Answers come from a FIFO script of steps (plain dicts, so they can also come from JSON); when
the script has nothing for a request, a deterministic default answers (``echo: <last user
line>``). Every completion request is logged. Three ways to run it:

* in-process: ``async with FakeLLM() as llm:`` -> ``llm.base_url``;
* in a background thread for sync tests: ``FakeLLM.start_in_thread()`` -> ``FakeLLMThread``;
* as its own process for crash tests: ``python -m tests.fakes.llm_server --port-file PATH``,
  driven over HTTP through ``/_control/*`` (``FakeLLMProcess`` / ``ControlClient`` wrap that).

``dialect="mistral"`` (``--dialect mistral``) makes it imitate one provider's rules and answers
(``tests.fakes.llm_dialects``); without one it is the permissive OpenAI-style fake below.

Step format (all keys optional except the one naming the kind)::

    {"text": "hello"}                                   assistant text, finish_reason "stop"
    {"tool_calls": [{"name": "exec", "arguments": {"command": "ls"}, "id": "call_x"}],
     "text": "optional content"}                        finish_reason "tool_calls"
    {"error": 429, "retry_after": 1}                    HTTP error, OpenAI error body
    {"disconnect": true}                                close the connection, no response
    {"hang": true}                                      never answer (until the server stops)
    {"delay": 2.5}                                      alone: the default answer, 2.5 s late

Modifiers on any step: ``delay`` (seconds before answering), ``when_user_contains`` (the step is
only used for a request whose last user message contains this substring; the first matching
step in the queue wins), ``finish_reason``, ``chunk_delay`` (seconds between streamed chunks;
also a stall, for idle timeouts), ``pieces`` (content deltas to stream, default 3),
``disconnect_after_chunks`` (streaming only), ``hold`` (streaming only: a name; the stream
stops before chunk ``hold_after_chunks``, default 2, until ``release(name)``: a test sees the
answer half written, for as long as it looks) and ``no_stream`` (answer a streamed request with
one JSON body, as servers without streaming do). Error steps also take ``retry_after`` (number
or string, sent verbatim), ``retry_after_ms``, ``message``, ``type``, ``code``, and ``in_body``
(HTTP 200 with the error in the body; streamed: after ``error_after_chunks`` content chunks).
``keepalive_before`` / ``keepalive_every`` (seconds): keep-alive comments (empty lines for a
plain answer) before the answer and in ``chunk_delay`` pauses. ``usage``: the usage object to
report instead of the fake's count (``None``: report none, as some servers do);
``cached_tokens``: that many of the prompt tokens reported cached (``prompt_tokens_details``).
What was reported is in the request log (``usage``). ``reasoning`` and
``failed_generation`` are read by dialects.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fakes.llm_dialects import (
    DEFAULT_ALIASES,
    DIALECTS,
    KEEPALIVE_COMMENT,
    ChatRequest,
    Dialect,
    DialectOptions,
    Frame,
    Refusal,
    make_dialect,
)
from tests.fakes.threaded import ServerThread

Step = dict[str, Any]

DEFAULT_MODEL = "fake-model"
MODES = ("echo", "strict")
ECHO_LIMIT = 200
# Long sessions send multi-megabyte histories; aiohttp's default 1 MiB cap would reject them.
MAX_BODY_BYTES = 512 * 1024 * 1024
STREAM_PIECES = 3
REPO_ROOT = Path(__file__).resolve().parents[2]

_STEP_KINDS = ("error", "disconnect", "hang", "tool_calls", "text")
_STEP_KEYS = frozenset(
    {
        *_STEP_KINDS,
        "delay",
        "when_user_contains",
        "finish_reason",
        "chunk_delay",
        "pieces",
        "no_stream",
        "disconnect_after_chunks",
        "hold",
        "hold_after_chunks",
        "retry_after",
        "retry_after_ms",
        "message",
        "type",
        "code",
        # Read by dialects (tests/fakes/llm_dialects.py); keep-alives by every fake.
        "reasoning",
        "in_body",
        "error_after_chunks",
        "failed_generation",
        "keepalive_before",
        "keepalive_every",
        "usage",
        "cached_tokens",
    }
)
_VALID_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_CONTENT_TYPES = (str, list, type(None))

# status -> (error type, error code, message), worded like the real API's answers.
_ERROR_DEFAULTS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Bad request (scripted by the fake LLM)."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_denied", None, "You are not allowed to use this model."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached (scripted by the fake LLM)."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}


# --- step helpers ------------------------------------------------------------------------------


def reply(text: str, **opts: Any) -> Step:
    """A text answer: ``reply("hi", delay=0.5)``."""
    return check_step({"text": text, **opts})


def call(
    name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None
) -> dict:
    """One tool call for ``tool_step``; a str ``arguments`` is sent verbatim (e.g. broken JSON)."""
    spec: dict[str, Any] = {"name": name, "arguments": {} if arguments is None else arguments}
    if id is not None:
        spec["id"] = id
    return spec


def tool_step(*calls: dict | tuple[str, Any], text: str | None = None, **opts: Any) -> Step:
    """An answer with tool calls: ``tool_step(call("exec", {"command": "ls"}))`` or
    ``tool_step(("exec", {"command": "ls"}), ("read_file", {"path": "a"}))``."""
    specs = [c if isinstance(c, dict) else call(c[0], c[1]) for c in calls]
    step: Step = {"tool_calls": specs, **opts}
    if text is not None:
        step["text"] = text
    return check_step(step)


def error(status: int, *, retry_after: float | str | None = None, **opts: Any) -> Step:
    """An HTTP error answer: ``error(429, retry_after=1)``, ``error(400, code="...")``."""
    step: Step = {"error": status, **opts}
    if retry_after is not None:
        step["retry_after"] = retry_after
    return check_step(step)


def disconnect(**opts: Any) -> Step:
    """Close the connection without answering."""
    return check_step({"disconnect": True, **opts})


def hang(**opts: Any) -> Step:
    """Never answer; the connection is dropped when the server stops."""
    return check_step({"hang": True, **opts})


def check_step(step: Any) -> Step:
    """Return ``step`` if it is a well-formed step; raise ValueError naming the problem.

    Checked when scripted, not when served, so a typo fails the test that wrote it.
    """
    if not isinstance(step, dict):
        raise ValueError(f"a step must be a dict, got {type(step).__name__}")
    unknown = set(step) - _STEP_KEYS
    if unknown:
        raise ValueError(f"unknown step keys {sorted(unknown)} in {step!r}")
    kinds = [k for k in ("error", "disconnect", "hang", "tool_calls") if k in step]
    if len(kinds) > 1:
        raise ValueError(f"a step has one kind, got {kinds} in {step!r}")
    if "error" in step and not (isinstance(step["error"], int) and 400 <= step["error"] <= 599):
        raise ValueError(f"'error' must be an HTTP status 400-599 in {step!r}")
    if "tool_calls" in step:
        calls = step["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise ValueError(f"'tool_calls' must be a non-empty list in {step!r}")
        for spec in calls:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise ValueError(f"each tool call needs a 'name' in {step!r}")
    if "text" in step and not isinstance(step["text"], str | None):
        raise ValueError(f"'text' must be a string in {step!r}")
    for key in ("delay", "chunk_delay", "keepalive_before", "keepalive_every"):
        if key in step and not (isinstance(step[key], int | float) and step[key] >= 0):
            raise ValueError(f"{key!r} must be a number >= 0 in {step!r}")
    if "hold" in step and not isinstance(step["hold"], str):
        raise ValueError(f"'hold' must be a name (a string) in {step!r}")
    if "hold_after_chunks" in step and not (
        isinstance(step["hold_after_chunks"], int) and step["hold_after_chunks"] >= 0
    ):
        raise ValueError(f"'hold_after_chunks' must be an integer >= 0 in {step!r}")
    if not kinds and "text" not in step and set(step) - {"delay", "when_user_contains"}:
        raise ValueError(f"step has no kind (text, tool_calls, error, disconnect, hang): {step!r}")
    return step


def step_kind(step: Step) -> str:
    """The outcome a step produces: error, disconnect, hang, tool_calls, text or default."""
    for kind in _STEP_KINDS:
        if kind in step:
            return kind
    return "default"


def load_script(data: Any) -> list[Step]:
    """Steps from decoded JSON: a list of steps, ``{"steps": [...]}`` or a single step."""
    if isinstance(data, dict) and "steps" in data:
        data = data["steps"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ValueError("a script is a list of steps, {'steps': [...]} or one step")
    return [check_step(s) for s in data]


# --- request validation (pure) -----------------------------------------------------------------


def validate_request(body: Any) -> tuple[str, str | None] | None:
    """``(message, param)`` describing why a real server would answer 400, or None if valid."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object.", None
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "you must provide a model parameter", "model"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array.", "messages"
    tools = body.get("tools")
    if tools is not None:
        problem = _tools_problem(tools)
        if problem:
            return problem, "tools"
    problem = history_problem(messages)
    return (problem, "messages") if problem else None


def _tools_problem(tools: Any) -> str | None:
    if not isinstance(tools, list):
        return "'tools' must be an array."
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict):
            return f"Invalid 'tools[{i}]': expected {{'type': 'function', 'function': {{...}}}}."
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            return f"Missing required parameter: 'tools[{i}].function.name'."
    return None


def history_problem(messages: list[Any]) -> str | None:
    """Why ``messages`` is not a valid Chat Completions history, or None.

    Enforces what the real API enforces: known roles, content present, and every assistant
    ``tool_calls`` answered by exactly one tool message per call id before the next non-tool
    message (and no tool message without such a call).
    """
    # Hot loop for 3,000-message benchmark requests: no per-message string building.
    unanswered: set[str] = set()  # call ids of the current tool block still waiting
    block: set[str] = set()  # all call ids of the current tool block
    for i, msg in enumerate(messages):
        if type(msg) is not dict:
            return f"Invalid 'messages[{i}]': expected an object."
        role = msg.get("role")
        if role not in _VALID_ROLES:
            return f"Invalid value for 'messages[{i}].role': {role!r}."
        content = msg.get("content")
        if not isinstance(content, _CONTENT_TYPES):
            return f"Invalid type for 'messages[{i}].content': expected a string or an array."
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in unanswered:
                return _tool_message_problem(i, call_id, block)
            unanswered.discard(call_id)
            if content is None:
                return f"Missing required parameter: 'messages[{i}].content'."
            continue
        if unanswered:
            return _unanswered_problem(unanswered, f"messages[{i}]")
        if block:
            block = set()
        calls = msg.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            ids_or_problem = _tool_call_ids(calls, f"messages[{i}]")
            if isinstance(ids_or_problem, str):
                return ids_or_problem
            unanswered, block = set(ids_or_problem), set(ids_or_problem)
        elif content is None and not (role == "assistant" and msg.get("function_call")):
            return f"Missing required parameter: 'messages[{i}].content'."
    if unanswered:
        return _unanswered_problem(unanswered, "the end of messages")
    return None


# What may follow each role under a strict chat template (None: the start, after the system
# prompt). Mistral's API: "Unexpected role 'user' after role 'tool'" (mistral_common's
# validator; github.com/zed-industries/zed/issues/37021); the Mistral and Gemma templates on
# vLLM and llama.cpp: "conversation roles must alternate user/assistant/user/assistant/..."
# (github.com/vllm-project/vllm/issues/6862, github.com/microsoft/autogen/issues/3597).
_STRICT_NEXT: dict[str | None, frozenset[str]] = {
    None: frozenset({"user"}),
    "user": frozenset({"assistant"}),
    "assistant": frozenset({"user", "tool"}),
    "tool": frozenset({"assistant", "tool"}),
}


def alternation_problem(messages: list[Any]) -> str | None:
    """Why a server enforcing a strict chat template refuses the order of ``messages``'s
    roles, or None (system messages aside; run after ``history_problem``)."""
    last: str | None = None
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role in ("system", "developer"):
            continue
        if role not in _STRICT_NEXT[last]:
            after = f"after role '{last}'" if last else "as the first message after the system"
            return (
                f"Unexpected role '{role}' {after} (messages[{i}]): conversation roles must "
                "alternate user/assistant/user/assistant/..."
            )
        last = role
    return None


def _tool_message_problem(i: int, call_id: Any, block: set[str]) -> str:
    if not isinstance(call_id, str):
        return f"Missing required parameter: 'messages[{i}].tool_call_id'."
    why = "answered twice" if call_id in block else "not a preceding tool call"
    return (
        "Invalid parameter: messages with role 'tool' must be a response to a preceding "
        f"message with 'tool_calls' (messages[{i}]: tool_call_id {call_id!r} is {why})."
    )


def _unanswered_problem(unanswered: set[str], where: str) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        f"to each 'tool_call_id'. The following tool_call_ids did not have response messages "
        f"before {where}: {', '.join(sorted(unanswered))}"
    )


def _tool_call_ids(calls: Any, where: str) -> list[str] | str:
    """The call ids of an assistant message's ``tool_calls``, or a problem description."""
    if not isinstance(calls, list) or not calls:
        return f"Invalid '{where}.tool_calls': expected a non-empty array."
    ids: list[str] = []
    for j, tc in enumerate(calls):
        problem = _tool_call_problem(tc)
        if problem is None and tc["id"] in ids:
            problem = f"duplicate tool call id {tc['id']!r}"
        if problem is not None:
            return f"Invalid '{where}.tool_calls[{j}]': {problem}."
        ids.append(tc["id"])
    return ids


def _tool_call_problem(tc: Any) -> str | None:
    fn = tc.get("function") if type(tc) is dict else None
    if type(fn) is not dict or not isinstance(tc.get("id"), str):
        return "expected an object with 'id' and 'function'"
    if tc.get("type", "function") != "function":
        return f"'type' must be 'function', got {tc.get('type')!r}"
    if not isinstance(fn.get("name"), str):
        return "missing 'function.name'"
    # The API wants arguments as a JSON *string*; a dict here is a client bug.
    if not isinstance(fn.get("arguments"), str):
        return "'function.arguments' must be a string"
    return None


def last_user_text(messages: Any) -> str:
    """Text of the last user message (text parts joined), or "" if there is none."""
    if not isinstance(messages, list):
        return ""
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    p.get("text", "") for p in content if isinstance(p, dict) and "text" in p
                )
            return ""
    return ""


def echo_text(user_text: str) -> str:
    """The default answer: ``echo: `` + the first line of the user's text, at most 200 chars."""
    first = user_text.strip().split("\n", 1)[0].strip() if user_text else ""
    return f"echo: {first[:ECHO_LIMIT]}"


# --- response bodies (pure) --------------------------------------------------------------------


def error_body(status: int, step: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAI-style error body for ``status``; ``step`` may override message/type/code."""
    step = step or {}
    etype, code, message = _ERROR_DEFAULTS.get(
        status,
        ("server_error" if status >= 500 else "invalid_request_error", None, f"HTTP {status}"),
    )
    return {
        "error": {
            "message": step.get("message", message),
            "type": step.get("type", etype),
            "param": step.get("param"),
            "code": step.get("code", code),
        }
    }


def make_message(step: Step, user_text: str, next_call_id: Any) -> tuple[dict[str, Any], str]:
    """The assistant message and finish_reason for a text, tool_calls or default step.

    ``next_call_id`` is a zero-argument callable giving fresh ids like ``call_7``.
    """
    if "tool_calls" in step:
        calls = []
        for spec in step["tool_calls"]:
            args = spec.get("arguments", {})
            calls.append(
                {
                    "id": spec.get("id") or next_call_id(),
                    "type": "function",
                    "function": {
                        "name": spec["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        message = {"role": "assistant", "content": step.get("text"), "tool_calls": calls}
        return message, step.get("finish_reason", "tool_calls")
    content = step["text"] if "text" in step else echo_text(user_text)
    return {"role": "assistant", "content": content}, step.get("finish_reason", "stop")


def usage_for(request_bytes: int, message: Mapping[str, Any]) -> dict[str, int]:
    """Rough token counts (4 bytes a token), cheap enough for benchmarks."""
    out = len(message.get("content") or "")
    for tc in message.get("tool_calls") or ():
        out += len(tc["function"]["name"]) + len(tc["function"]["arguments"])
    prompt, completion = max(1, request_bytes // 4), max(1, out // 4)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(
    cid: str, created: int, model: str, message: dict, finish: str, usage: dict | None
) -> dict[str, Any]:
    body = {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }
    if usage is None:
        del body["usage"]  # a server that counts nothing
    return body


def _pieces(text: str, n: int = STREAM_PIECES) -> list[str]:
    """Split text into at most n non-empty pieces, as a model would stream it."""
    if not text:
        return []
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def completion_chunks(
    cid: str,
    created: int,
    model: str,
    message: dict,
    finish: str,
    usage: dict | None,
    pieces: int = STREAM_PIECES,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` sequence the real API streams for ``message``.

    Role first, then content deltas, then per tool call a header delta (index, id, name, empty
    arguments) followed by argument pieces, then an empty delta with finish_reason, then (if
    ``usage`` is given, i.e. ``stream_options.include_usage``) a usage chunk with no choices.
    """

    def chunk(delta: dict, finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if usage is not None:
            body["usage"] = None
        return body

    content = message.get("content")
    chunks = [chunk({"role": "assistant", "content": "" if content is not None else None})]
    chunks += [chunk({"content": piece}) for piece in _pieces(content or "", pieces)]
    for index, tc in enumerate(message.get("tool_calls") or ()):
        header = {"index": index, "id": tc["id"], "type": "function"}
        header["function"] = {"name": tc["function"]["name"], "arguments": ""}
        chunks.append(chunk({"tool_calls": [header]}))
        args = tc["function"]["arguments"]
        # An object (llama.cpp of March 2026, a dialect) cannot be cut: it goes whole.
        for piece in _pieces(args) if isinstance(args, str) else [args]:
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, finish))
    if usage is not None:
        tail = chunk({})
        tail["choices"], tail["usage"] = [], usage
        chunks.append(tail)
    return chunks


def _delta_content(chunk: Mapping[str, Any]) -> Any:
    choices = chunk.get("choices") or ()
    return choices[0]["delta"].get("content") if choices else None


def _refusal(status: int, outcome: str, message: str, param: str | None) -> Refusal:
    """A refusal by the default fake, in OpenAI's words and shape."""
    return Refusal(
        status, error_body(status, {"message": message, "param": param}), message, outcome
    )


def sse(data: Mapping[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


# --- the server --------------------------------------------------------------------------------


class FakeLLM:
    """The fake server. ``script``, ``reset``, ``configure``, ``requests`` are thread-safe.

    Args:
        host, port: where to listen (port 0 picks a free one).
        mode: what answers when no scripted step matches: "echo" (``echo: <last user line>``)
            or "strict" (HTTP 500 with outcome "unscripted", to catch unplanned calls).
        delay: seconds before each *default* answer (scripted steps use their own ``delay``).
        log_bodies: keep each request's parsed body in the log (off for benchmarks).
        validate: reject invalid histories with 400 like a real server.
        strict_alternation: also reject, with 400, roles out of the order strict chat
            templates enforce (``alternation_problem``: Mistral's API, Mistral and Gemma
            templates on vLLM and llama.cpp).
        max_log: keep only the newest N log entries (None: all).
        api_key: if set, requests without ``Authorization: Bearer <api_key>`` get 401.
        models: ids listed by ``GET /v1/models``.
        script: initial steps.
        dialect: imitate a provider ("mistral", "gemini", ...: ``tests.fakes.llm_dialects``);
            None, "openai-compatible" or "generic": the fake as it always was.
        strict_template, old_build, object_arguments: a dialect's older or optional
            behaviour (``DialectOptions``).
        report_usage: False: no answer reports its usage (a server that counts nothing).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: str = "echo",
        delay: float = 0.0,
        log_bodies: bool = True,
        validate: bool = True,
        strict_alternation: bool = False,
        max_log: int | None = None,
        api_key: str | None = None,
        models: Iterable[str] = (DEFAULT_MODEL,),
        script: Iterable[Step] = (),
        dialect: str | None = None,
        strict_template: bool | None = None,
        old_build: bool = False,
        object_arguments: bool = False,
        report_usage: bool = True,
    ) -> None:
        self.host = host
        self.report_usage = report_usage
        self.port = port
        self.log_bodies = log_bodies
        self.validate = validate
        self.strict_alternation = strict_alternation
        self.api_key = api_key
        self.models = list(models)
        options = DialectOptions(strict_template, old_build, object_arguments)
        self.dialect: Dialect | None = make_dialect(dialect, options)
        self.dialect_name = self.dialect.name if self.dialect else None
        self.mode = "echo"
        self.delay = 0.0
        self.configure(mode=mode, delay=delay)
        self._lock = threading.Condition()
        self._queue: list[Step] = []
        self._log: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_log)
        self._transcriptions: list[dict[str, Any]] = []
        self._seq = 0
        self._call_seq = 0
        self._completion_seq = 0
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._outages: list[tuple[float, Step]] = []  # (until, monotonic clock) -> error step
        # Streams held at a name (a step's ``hold``) until ``release``: name -> its event.
        self._holds: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.script(*script)

    # -- control (any thread) --

    def configure(self, *, mode: str | None = None, delay: float | None = None) -> None:
        """Change the default mode and/or the default-answer delay while running."""
        if mode is not None:
            if mode not in MODES:
                raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
            self.mode = mode
        if delay is not None:
            self.delay = float(delay)

    def script(self, *steps: Step) -> None:
        """Append steps to the FIFO queue (validated now; ValueError on a malformed step)."""
        checked = [check_step(s) for s in steps]
        with self._lock:
            self._queue.extend(checked)

    def outage(self, *phases: tuple[float, Step]) -> None:
        """Answer every request with an error for a while, phase after phase, from now:
        ``outage((30, error(500)), (30, error(429, retry_after=5)))``. Scripted steps wait."""
        now = time.monotonic()
        with self._lock:
            self._outages = []
            for seconds, step in phases:
                now += seconds
                self._outages.append((now, check_step(step)))

    def release(self, name: str) -> None:
        """Let the streams held at ``name`` go on, and any that reaches it later (any thread)."""
        with self._lock:
            event = self._holds.setdefault(name, asyncio.Event())
            loop = self._loop
        if loop is None:
            event.set()  # not serving yet: nothing waits on it
        else:
            loop.call_soon_threadsafe(event.set)

    def reset(self) -> None:
        """Drop queued steps and the request log; restart id counters."""
        with self._lock:
            self._queue.clear()
            self._log.clear()
            self._seq = self._call_seq = self._completion_seq = 0

    @property
    def pending(self) -> int:
        """Number of scripted steps not yet used."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of the request log, oldest first (see ``_record`` for the fields)."""
        with self._lock:
            return list(self._log)

    def wait_for_requests_sync(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least n completion requests have arrived (TimeoutError otherwise).

        For a thread other than the server's (the server keeps running meanwhile).
        """
        with self._lock:
            if not self._lock.wait_for(lambda: self._seq >= n, timeout):
                raise TimeoutError(f"fake LLM saw {self._seq} requests, expected {n}")
            return list(self._log)

    # Same signature as the thread and process variants, hence a timeout argument.
    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """Wait (without blocking the loop) until at least n completion requests arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._seq >= n:
                    return list(self._log)
                seen = self._seq
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fake LLM saw {seen} requests, expected {n}")
            await asyncio.sleep(0.005)

    # -- lifecycle (the server's loop) --

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to give the openai SDK as ``base_url``: ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._handle_chat)
            app.router.add_get(f"{prefix}/models", self._handle_models)
            app.router.add_post(f"{prefix}/audio/transcriptions", self._handle_transcription)
        for path in self.dialect.extra_paths if self.dialect else ():
            app.router.add_post(path, self._handle_chat)
        app.router.add_post("/_control/script", self._handle_control_script)
        app.router.add_get("/_control/requests", self._handle_control_requests)
        app.router.add_post("/_control/reset", self._handle_control_reset)
        app.router.add_post("/_control/config", self._handle_control_config)
        app.router.add_get("/_control/status", self._handle_control_status)
        # No access log: it would cost more than the answer itself in benchmarks.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # set by start()
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop serving; delayed and hanging requests are dropped without an answer."""
        if self._runner is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        await asyncio.sleep(0)  # let woken handlers close their connections
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self) -> FakeLLM:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @classmethod
    def start_in_thread(cls, **kwargs: Any) -> FakeLLMThread:
        """Run a new FakeLLM(**kwargs) on its own event loop in a daemon thread."""
        return FakeLLMThread(cls(**kwargs))

    # -- request handling --

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        rejection = self._rejection(request, body)
        if rejection is not None:
            self._record(
                request, body, rejection.outcome, rejection.status, None, rejection.message
            )
            return web.json_response(rejection.body, status=rejection.status)

        user_text = last_user_text(body.get("messages"))
        step, entry = self._take_step(request, body, user_text)
        delay = step.get("delay", self.delay if entry["outcome"] == "default" else 0.0)
        if delay and await self._stopped_within(delay):
            return self._drop(request)

        kind = entry["outcome"]
        if kind == "error" and step.get("in_body"):
            return await self._error_in_body(request, body, step, user_text)
        if kind == "error":
            return self._error_response(step)
        if kind == "unscripted":
            msg = "fake LLM (strict mode): no scripted step matches this request"
            return web.json_response(error_body(500, {"message": msg}), status=500)
        if kind == "disconnect":
            return self._drop(request)
        if kind == "hang":
            assert self._stopping is not None
            await self._stopping.wait()
            return self._drop(request)
        return await self._answer(request, body, step, user_text, len(raw), entry)

    def _rejection(self, request: web.Request, body: Any) -> Refusal | None:
        """The answer refusing the request, or None to answer it."""
        if self.dialect is not None:
            return self._dialect_rejection(self.dialect, request, body)
        if self.api_key is not None:
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return _refusal(401, "unauthorized", "Incorrect API key provided.", None)
        if not isinstance(body, dict):
            return _refusal(400, "invalid", "The request body must be a JSON object.", None)
        if self.validate:
            problem = validate_request(body)
            if problem is not None:
                return _refusal(400, "invalid", problem[0], problem[1])
        if self.strict_alternation:
            order = alternation_problem(body.get("messages") or [])
            if order is not None:
                return _refusal(400, "invalid", order, "messages")
        return None

    def _dialect_rejection(
        self, dialect: Dialect, request: web.Request, body: Any
    ) -> Refusal | None:
        """As ``_rejection``, in the dialect's words: its authorization, the generic checks,
        then its own rules."""
        view = self._view(request, body)
        refusal = dialect.authorize(view, self.api_key)
        if refusal is not None:
            return refusal
        if not isinstance(body, dict):
            return dialect.refuse(400, "The request body must be a JSON object.")
        if not self.validate:
            return None
        problem = validate_request(body)
        if problem is not None:
            return dialect.refuse(400, problem[0], param=problem[1])
        return dialect.check(view)

    @staticmethod
    def _view(request: web.Request, body: Any) -> ChatRequest:
        headers = {k.lower(): v for k, v in request.headers.items()}
        return ChatRequest(
            request.path, dict(request.query), headers, body if isinstance(body, dict) else {}
        )

    def _take_step(
        self, request: web.Request, body: dict, user_text: str
    ) -> tuple[Step, dict[str, Any]]:
        """Pop the first queued step matching this request and log the request."""
        with self._lock:
            step: Step | None = None
            now = time.monotonic()
            step = next((s for until, s in self._outages if now < until), None)
            for i, candidate in enumerate(self._queue if step is None else ()):
                needle = candidate.get("when_user_contains")
                if needle is None or needle in user_text:
                    step = self._queue.pop(i)
                    break
            if step is not None:
                outcome = step_kind(step)
            else:
                outcome = "unscripted" if self.mode == "strict" else "default"
            status: int | None = 200
            if step is not None and outcome == "error" and not step.get("in_body"):
                status = step["error"]
            elif outcome == "unscripted":
                status = 500
            elif outcome in ("disconnect", "hang"):
                status = None
            entry = self._record(request, body, outcome, status, step, None, user_text)
            return step or {}, entry

    def _record(
        self,
        request: web.Request,
        body: Any,
        outcome: str,
        status: int | None,
        step: Step | None,
        problem: str | None,
        user_text: str | None = None,
    ) -> dict[str, Any]:
        """Append a log entry. Fields:

        seq (1-based), time (epoch seconds), method, path, query, headers (lower-cased names),
        body (parsed JSON, or None when log_bodies=False), model, stream, n_messages,
        last_user (text of the last user message), outcome (text, tool_calls, default, error,
        disconnect, hang, unscripted, invalid, unauthorized), status (HTTP status; None for
        disconnect/hang), step (the scripted step used, or None), error (why a request was
        rejected), reply (the assistant message sent, filled in when answered), answered_at
        (epoch seconds when the answer began, after any ``delay``; None until then), usage
        (the usage object the answer reported, None when it reported none or was no answer).
        """
        is_dict = isinstance(body, dict)
        messages = body.get("messages") if is_dict else None
        entry: dict[str, Any] = {
            "seq": 0,
            "time": time.time(),
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": body if self.log_bodies else None,
            "model": body.get("model") if is_dict else None,
            "stream": bool(body.get("stream")) if is_dict else False,
            "n_messages": len(messages) if isinstance(messages, list) else 0,
            "last_user": user_text if user_text is not None else last_user_text(messages),
            "outcome": outcome,
            "status": status,
            "step": step,
            "error": problem,
            "reply": None,
            "answered_at": None,
            "usage": None,
        }
        with self._lock:  # re-entrant use from _take_step is fine: Condition wraps an RLock
            self._seq += 1
            entry["seq"] = self._seq
            self._log.append(entry)
            self._lock.notify_all()
        return entry

    def _next_call_id(self) -> str:
        with self._lock:
            self._call_seq += 1
            return f"call_{self._call_seq}"

    def _next_completion_id(self) -> str:
        with self._lock:
            self._completion_seq += 1
            return f"chatcmpl-fake{self._completion_seq}"

    async def _stopped_within(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if the server began stopping meanwhile.

        Waiting on the stop event (not a bare sleep) keeps shutdown quick with slow steps.
        """
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    async def _held(self, name: str) -> bool:
        """Wait until ``release(name)``; True if the server began stopping meanwhile."""
        assert self._stopping is not None
        with self._lock:
            released = self._holds.setdefault(name, asyncio.Event())
        waits = [
            asyncio.ensure_future(released.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self._stopping.is_set()

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        """Close the connection without answering; aiohttp ignores the unsent response."""
        if request.transport is not None:
            request.transport.close()
        return web.Response()

    def _error_response(self, step: Step) -> web.Response:
        status = step["error"]
        headers = {}
        if "retry_after" in step:
            headers["Retry-After"] = str(step["retry_after"])
        if "retry_after_ms" in step:
            headers["retry-after-ms"] = str(step["retry_after_ms"])
        body = self.dialect.error_step(step).body if self.dialect else error_body(status, step)
        return web.json_response(body, status=status, headers=headers)

    async def _error_in_body(
        self, request: web.Request, body: dict, step: Step, user_text: str
    ) -> web.StreamResponse:
        """An error step with ``in_body``: HTTP 200 and the error in the body, or for a stream
        the step's text (``error_after_chunks`` pieces of it) then an error event, as OpenRouter
        reports a generation that failed once started."""
        if self.dialect is not None:
            error = self.dialect.error_in_body(step)
        else:
            error = {
                "code": step["error"],
                "message": step.get("message", "Provider returned error"),
            }
        if not body.get("stream"):
            return web.json_response({"error": error})
        cid, created = self._next_completion_id(), int(time.time())
        model = body.get("model") or DEFAULT_MODEL
        message = {"role": "assistant", "content": step.get("text") or echo_text(user_text)}
        role, *rest = completion_chunks(cid, created, model, message, "stop", None)
        pieces = [c for c in rest if c["choices"][0]["delta"].get("content")]
        failed = dict(role, error=error)
        failed["choices"] = [
            {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "error"}
        ]
        shown = pieces[: int(step.get("error_after_chunks", 0))]
        frames = [(sse(role), False), *((sse(c), True) for c in shown), (sse(failed), False)]
        if self.dialect is not None:
            frames = self.dialect.prefix_frames() + frames
        return await self._stream_frames(request, step, frames, {}, self._keepalive())

    def _keepalive(self) -> bytes:
        return self.dialect.keepalive if self.dialect else KEEPALIVE_COMMENT

    async def _answer(
        self,
        request: web.Request,
        body: dict,
        step: Step,
        user_text: str,
        request_bytes: int,
        entry: dict[str, Any],
    ) -> web.StreamResponse:
        dialect = self.dialect
        view = self._view(request, body)
        ids = dialect.call_ids(view) if dialect else self._next_call_id
        message, finish = make_message(step, user_text, ids)
        if dialect is not None:
            message, finish = dialect.shape(message, finish, step, view, user_text)
        entry["reply"] = message
        entry["answered_at"] = time.time()
        cid, created = self._next_completion_id(), int(time.time())
        model = body.get("model") or DEFAULT_MODEL
        usage: dict[str, Any] | None = usage_for(request_bytes, message)
        if step.get("cached_tokens") and usage is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": step["cached_tokens"]}
        if "usage" in step:
            usage = step["usage"]
        if not self.report_usage:
            usage = None
        if not body.get("stream") or step.get("no_stream"):
            entry["usage"] = usage
            reply = completion_body(cid, created, model, message, finish, usage)
            if dialect is not None:
                reply = dialect.plain(reply, view)
            if step.get("keepalive_before"):
                return await self._late_json(request, step, reply)
            return web.json_response(reply)
        options = body.get("stream_options") or {}
        wanted = options.get("include_usage") or (dialect is not None and dialect.usage_always)
        with_usage = usage if wanted else None
        entry["usage"] = with_usage
        pieces = int(step.get("pieces", STREAM_PIECES))
        chunks = completion_chunks(cid, created, model, message, finish, with_usage, pieces)
        keepalive = step.get("keepalive_before") or step.get("keepalive_every")
        if dialect is None and not keepalive:
            return await self._stream(request, step, chunks, entry)
        if dialect is not None:
            frames = dialect.stream(chunks, message, view, step)
        else:
            frames = [(sse(c), bool(_delta_content(c))) for c in chunks]
            frames.append((sse("[DONE]"), False))
        return await self._stream_frames(request, step, frames, entry, self._keepalive())

    async def _late_json(self, request: web.Request, step: Step, reply: dict) -> web.StreamResponse:
        """A plain answer preceded by ``keepalive_before`` seconds of empty lines (DeepSeek
        under load: https://api-docs.deepseek.com/quick_start/rate_limit)."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            if await self._keep_alive(resp, step["keepalive_before"], step, b"\n"):
                self._drop(request)
                return resp
            await resp.write(json.dumps(reply).encode())
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp

    async def _stream_frames(
        self,
        request: web.Request,
        step: Step,
        frames: list[Frame],
        entry: dict[str, Any],
        keepalive: bytes,
    ) -> web.StreamResponse:
        """``_stream`` for a dialect's frames: one write each, ``chunk_delay`` before each (kept
        alive with comments when the step has ``keepalive_every``), ``keepalive_before``
        seconds of comments first, ``disconnect_after_chunks`` counting frames."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cut = step.get("disconnect_after_chunks")
        pause = step.get("chunk_delay", 0)
        try:
            if await self._keep_alive(resp, step.get("keepalive_before", 0), step, keepalive):
                self._drop(request)
                return resp
            for i, (data, has_content) in enumerate(frames):
                if i == cut or (pause and await self._keep_alive(resp, pause, step, keepalive)):
                    self._drop(request)
                    return resp
                if has_content and "first_content_at" not in entry:
                    entry["first_content_at"] = time.monotonic()
                await resp.write(data)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream (e.g. it timed out); nothing to tell it
        return resp

    async def _keep_alive(
        self, resp: web.StreamResponse, seconds: float, step: Step, filler: bytes
    ) -> bool:
        """Wait ``seconds``, writing ``filler`` every ``keepalive_every`` seconds if the step
        has it; True if the server began stopping meanwhile."""
        every = step.get("keepalive_every")
        if not seconds:
            return False
        if not every:
            return await self._stopped_within(seconds)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await resp.write(filler)
            if await self._stopped_within(min(every, left)):
                return True
        return False

    async def _stream(
        self,
        request: web.Request,
        step: Step,
        chunks: list[dict[str, Any]],
        entry: dict[str, Any],
    ) -> web.StreamResponse:
        """Write the chunks; ``entry["first_content_at"]`` (monotonic) notes when the first
        content chunk was written (benchmarks measure from the model's first token)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cut = step.get("disconnect_after_chunks")
        pause = step.get("chunk_delay", 0)
        hold, held_at = step.get("hold"), step.get("hold_after_chunks", 2)
        try:
            if cut is None and not pause and hold is None:
                # One write: benchmarks measure the client, not our syscalls.
                entry["first_content_at"] = time.monotonic()
                await resp.write(b"".join(map(sse, chunks)) + sse("[DONE]"))
            else:
                for i, chunk in enumerate(chunks):
                    if i == cut or (pause and await self._stopped_within(pause)):
                        self._drop(request)
                        return resp
                    if hold is not None and i == held_at and await self._held(hold):
                        self._drop(request)
                        return resp
                    delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                    if delta.get("content") and "first_content_at" not in entry:
                        entry["first_content_at"] = time.monotonic()
                    await resp.write(sse(chunk))
                await resp.write(sse("[DONE]"))
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream (e.g. it timed out); nothing to tell it
        return resp

    async def _handle_transcription(self, request: web.Request) -> web.Response:
        """OpenAI's audio endpoint: multipart form with ``file`` and ``model``; the answer is
        a deterministic "transcript" naming the model, the file and its size."""
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField) or not form.get("model"):
            body = {"error": {"message": "file and model are required", "type": "invalid"}}
            return web.json_response(body, status=400)
        size = len(upload.file.read())
        with self._lock:
            self._transcriptions.append({"model": form["model"], "filename": upload.filename})
        return web.json_response(
            {"text": f"transcript by {form['model']} of {upload.filename} ({size} bytes)"}
        )

    @property
    def transcriptions(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._transcriptions)

    async def _handle_models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    # -- control endpoints, for a server running in another process --

    async def _handle_control_script(self, request: web.Request) -> web.Response:
        try:
            steps = load_script(await request.json())
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            return web.json_response({"error": str(exc)}, status=400)
        self.script(*steps)
        return web.json_response({"queued": len(steps), "pending": self.pending})

    async def _handle_control_requests(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", "0"))
        return web.json_response([e for e in self.requests if e["seq"] > since])

    async def _handle_control_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def _handle_control_config(self, request: web.Request) -> web.Response:
        try:
            options = await request.json()
            self.configure(mode=options.get("mode"), delay=options.get("delay"))
        except (ValueError, AttributeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return await self._handle_control_status(request)

    async def _handle_control_status(self, request: web.Request) -> web.Response:
        with self._lock:
            seen = self._seq
        status = {"pending": self.pending, "requests": seen, "mode": self.mode, "delay": self.delay}
        status["dialect"] = self.dialect_name
        return web.json_response(status)


# --- thread mode -------------------------------------------------------------------------------


class FakeLLMThread:
    """A FakeLLM serving from a daemon thread with its own loop, for sync tests.

    Everything but ``stop`` delegates to the FakeLLM (``handle.llm``), whose control methods
    are thread-safe.
    """

    def __init__(self, llm: FakeLLM, start_timeout: float = 10.0) -> None:
        self.llm = llm
        self._server = ServerThread(llm.start, llm.stop, "fake-llm", start_timeout)

    @property
    def base_url(self) -> str:
        return self.llm.base_url

    @property
    def url(self) -> str:
        return self.llm.url

    @property
    def port(self) -> int:
        return self.llm.port

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.llm.requests

    @property
    def pending(self) -> int:
        return self.llm.pending

    def script(self, *steps: Step) -> None:
        self.llm.script(*steps)

    def reset(self) -> None:
        self.llm.reset()

    def configure(self, *, mode: str | None = None, delay: float | None = None) -> None:
        self.llm.configure(mode=mode, delay=delay)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        return self.llm.wait_for_requests_sync(n, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join the thread. Idempotent."""
        self._server.stop(timeout)

    def __enter__(self) -> FakeLLMThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --- process mode ------------------------------------------------------------------------------


class ControlClient:
    """Drives a FakeLLM in another process through ``/_control/*`` (stdlib only, sync)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout = timeout
        # An HTTP(S)_PROXY in the environment must never see loopback test traffic.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ValueError(f"fake LLM control {path}: {exc.read().decode()}") from exc

    def script(self, *steps: Step) -> int:
        """Append steps; returns the number of steps now pending."""
        return int(self._call("POST", "/_control/script", list(steps))["pending"])

    def requests(self, since: int = 0) -> list[dict[str, Any]]:
        """The request log (entries with seq > since)."""
        return list(self._call("GET", f"/_control/requests?since={since}"))

    def reset(self) -> None:
        self._call("POST", "/_control/reset", {})

    def configure(self, *, mode: str | None = None, delay: float | None = None) -> dict:
        options = {k: v for k, v in (("mode", mode), ("delay", delay)) if v is not None}
        return dict(self._call("POST", "/_control/config", options))

    def status(self) -> dict[str, Any]:
        """``{"pending", "requests", "mode", "delay", "dialect"}``."""
        return dict(self._call("GET", "/_control/status"))

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while self.status()["requests"] < n:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fake LLM saw fewer than {n} requests")
            time.sleep(0.01)
        return self.requests()


class FakeLLMProcess(ControlClient):
    """``python -m tests.fakes.llm_server`` as a child process, with its control client.

    Survives the test's own crash-and-restart of memobot, since it is a separate process.
    """

    def __init__(self, proc: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        super().__init__(f"http://127.0.0.1:{port}")
        self.proc = proc
        self.port = port
        self.workdir = workdir
        self.base_url = f"{self.url}/v1"

    @classmethod
    def spawn(
        cls,
        workdir: str | os.PathLike[str] | None = None,
        *,
        script: Iterable[Step] = (),
        mode: str | None = None,
        delay: float | None = None,
        dialect: str | None = None,
        strict_template: bool | None = None,
        old_build: bool = False,
        object_arguments: bool = False,
        extra_args: Iterable[str] = (),
        start_timeout: float = 15.0,
    ) -> FakeLLMProcess:
        """Start the server process; returns once it listens. Its stderr goes to
        ``<workdir>/fake_llm.log`` (workdir defaults to a new temporary folder). ``dialect``
        and its options as for ``FakeLLM``."""
        wd = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="fake-llm-"))
        wd.mkdir(parents=True, exist_ok=True)
        port_file = wd / "fake_llm.port"
        port_file.unlink(missing_ok=True)
        args = [sys.executable, "-m", "tests.fakes.llm_server", "--port-file", str(port_file)]
        steps = [check_step(s) for s in script]
        if steps:
            script_file = wd / "fake_llm_script.json"
            script_file.write_text(json.dumps(steps))
            args += ["--script", str(script_file)]
        if mode is not None:
            args += ["--mode", mode]
        if delay is not None:
            args += ["--delay", str(delay)]
        if dialect is not None:
            args += ["--dialect", dialect]
        if strict_template is not None:
            args.append("--strict-template" if strict_template else "--no-strict-template")
        args += ["--old-build"] if old_build else []
        args += ["--object-arguments"] if object_arguments else []
        args += list(extra_args)
        with open(wd / "fake_llm.log", "ab") as log_file:
            proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log_file, stderr=log_file)
        deadline = time.monotonic() + start_timeout
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() >= deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log = (wd / "fake_llm.log").read_text(errors="replace")
                raise RuntimeError(f"fake LLM process did not start:\n{log}")
            time.sleep(0.01)
        return cls(proc, int(port_file.read_text()), wd)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code (0 on a clean shutdown)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return int(self.proc.returncode)

    def __enter__(self) -> FakeLLMProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def write_port_file(path: Path, port: int) -> None:
    """Write atomically, so a reader polling for the file never sees it half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(str(port))
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.fakes.llm_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--port-file", type=Path, help="write the port here once listening")
    p.add_argument("--script", type=Path, help="JSON file: a list of steps or {'steps': [...]}")
    p.add_argument("--mode", choices=MODES, default="echo", help="answer when nothing is scripted")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before each default answer")
    p.add_argument("--no-validate", action="store_true", help="accept invalid histories")
    p.add_argument("--no-log-bodies", action="store_true", help="do not keep request bodies")
    p.add_argument("--max-log", type=int, default=None, help="keep only the newest N log entries")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument(
        "--dialect",
        choices=(*DIALECTS, *DEFAULT_ALIASES),
        default=None,
        help="imitate a provider (tests/fakes/llm_dialects.py); default: the generic fake",
    )
    p.add_argument(
        "--strict-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vllm/llamacpp: refuse histories that do not alternate (default: by model name)",
    )
    p.add_argument("--old-build", action="store_true", help="the dialect's older behaviour")
    p.add_argument(
        "--object-arguments", action="store_true", help="llamacpp: arguments as JSON objects"
    )
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT."""
    script = load_script(json.loads(args.script.read_text())) if args.script else []
    llm = FakeLLM(
        host=args.host,
        port=args.port,
        mode=args.mode,
        delay=args.delay,
        log_bodies=not args.no_log_bodies,
        validate=not args.no_validate,
        max_log=args.max_log,
        api_key=args.api_key,
        script=script,
        dialect=args.dialect,
        strict_template=args.strict_template,
        old_build=args.old_build,
        object_arguments=args.object_arguments,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await llm.start()
    if args.port_file:
        write_port_file(args.port_file, llm.port)
    print(f"fake LLM listening on {llm.base_url}", file=sys.stderr, flush=True)
    await stop.wait()
    await llm.stop()


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
