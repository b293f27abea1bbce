"""Dialects for the fake LLM server: each imitates one provider's OpenAI-compatible endpoint.

``FakeLLM(dialect="mistral")`` (also ``FakeLLM.start_in_thread(dialect=...)`` and
``python -m tests.fakes.llm_server --dialect mistral``) makes the fake answer as that provider
does, in two ways:

* it VALIDATES each request by the provider's rules, refusing what the provider refuses with
  the provider's status code, words and error body shape;
* it SHAPES each answer (plain JSON and SSE) as the provider does: tool-call ids, reasoning
  fields, ``extra_content``, tool-call index quirks, chunk layout, keep-alive comments, usage,
  ``[DONE]`` present or not, error bodies of scripted ``error`` steps.

Every rule cites its source in a comment: a documentation page or an issue address; "reported"
means the only source is the text of issue 36 (/work/wt/ISSUE-36.md, item number given).

Dialects: openai, azure, deepseek, gemini, mistral, groq, openrouter, anthropic, ollama, vllm,
llamacpp, lmstudio; ``None`` (the default), "openai-compatible" and "generic" are the fake of
before dialects, byte for byte.

Options next to ``dialect`` (FakeLLM keyword arguments; ``--strict-template``, ``--old-build``,
``--object-arguments`` in process mode) select a provider's older or optional behaviour:

* ``strict_template`` (vllm, llamacpp): the chat template insists that user and assistant
  messages alternate (Mistral, Devstral, Gemma templates). None (default): decided by the model
  name (mistral, devstral, magistral, ministral, mixtral, codestral, pixtral, gemma).
* ``old_build``: groq before mid-2024 refuses ``stream_options``; llamacpp before mid-2025 and
  lmstudio of 2024 refuse ``content: null`` in an assistant message with tool calls; ollama
  before 0.4.7 sends streamed tool calls without ``index``; vllm up to 0.10 names its reasoning
  field ``reasoning_content`` instead of ``reasoning``; deepseek answers "deepseek-reasoner" by
  the rules of R1 (January 2025) instead of those of the V3.2 thinking mode.
* ``object_arguments`` (llamacpp builds of March 2026): tool-call ``arguments`` sent as a JSON
  object instead of a string, streamed too.

The model name selects per-model rules where the provider has them: OpenAI reasoning models
(gpt-5*, o1*, o3*, o4*), DeepSeek's thinking models (deepseek-reasoner, deepseek-v4*) and R1
(a model id with "r1"), Gemini 3 (thought signatures) and 2.x, thinking models of local servers
(qwen3, gpt-oss, deepseek-r1, qwq, magistral, ... answer with reasoning).

Step keys that only dialects read (all optional; see ``tests.fakes.llm_server`` for the rest):
``reasoning`` (the reasoning text of the answer, in the dialect's field; default: a short text
for a thinking model, none otherwise), ``in_body`` (on an error step: HTTP 200 with the error in
the body, or for a stream an error event after ``error_after_chunks`` content chunks, as
OpenRouter does), ``failed_generation`` (on Groq's ``tool_use_failed`` error),
``keepalive_before`` / ``keepalive_every`` (seconds of keep-alive comments, or blank lines for a
plain request, before the answer and inside ``chunk_delay`` pauses, as DeepSeek under load).
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Step = dict[str, Any]
# One write to the SSE stream, and whether it carries answer text (benchmarks time the first).
Frame = tuple[bytes, bool]

DEFAULT_ALIASES = ("openai-compatible", "generic")
KEEPALIVE_COMMENT = b": keep-alive\n\n"
ALNUM = string.ascii_letters + string.digits
MISTRAL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
# Model families whose Hugging Face chat templates refuse a history that does not alternate.
STRICT_TEMPLATE_MODELS = re.compile(
    r"mistral|devstral|magistral|ministral|mixtral|codestral|pixtral|gemma", re.I
)
MISTRAL_FAMILY = re.compile(r"mistral|devstral|magistral|ministral|mixtral|codestral|pixtral", re.I)
THINKING_MODELS = re.compile(r"reasoner|r1|qwen3|qwq|gpt-oss|think|magistral|deepseek-v4", re.I)


@dataclass(frozen=True, slots=True)
class DialectOptions:
    """A provider's older or optional behaviour (module docstring)."""

    strict_template: bool | None = None
    old_build: bool = False
    object_arguments: bool = False


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What a dialect sees of one chat request; ``headers`` have lower-cased names."""

    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: dict[str, Any]

    @property
    def model(self) -> str:
        model = self.body.get("model")
        return model if isinstance(model, str) else ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages")
        return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer refusing the request: ``body`` is the provider's JSON (a dict or a list)."""

    status: int
    body: Any
    message: str
    outcome: str = "invalid"  # or "unauthorized" (the request log's outcome)


def _sse(data: Mapping[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def _split(text: str, n: int) -> list[str]:
    """At most n non-empty pieces, as llm_server._pieces cuts content."""
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, n)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _delta(chunk: Mapping[str, Any]) -> dict[str, Any]:
    choices = chunk.get("choices") or []
    return choices[0].get("delta") or {} if choices else {}


def _role(msg: Mapping[str, Any]) -> str:
    return str(msg.get("role", ""))


def _number(value: Any) -> str:
    """A JSON number as OpenAI's messages print it: 0.7, 0, 1.5."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


class Dialect:
    """The fake's behaviour for one provider; subclasses override what differs.

    Called by the server, in this order: ``authorize`` (headers, path, query), the generic
    validation (its problems worded by ``refuse``), ``check`` (the provider's own rules), then
    for an answer ``call_ids`` and ``shape`` (the message), ``plain`` or ``stream`` (the wire).
    """

    name = "generic"
    # Fields the reasoning text goes in, on the message and on stream deltas.
    reasoning_fields: tuple[str, ...] = ()
    # The stream's last line is "data: [DONE]".
    done = True
    # Usage is in the stream even without stream_options.include_usage.
    usage_always = False
    # "pieces": OpenAI's layout (a header delta with id and name, then argument pieces);
    # "whole": each call complete in one delta.
    tool_layout = "pieces"
    keepalive = KEEPALIVE_COMMENT
    extra_paths: tuple[str, ...] = ()

    def __init__(self, options: DialectOptions) -> None:
        self.options = options
        # Seeded: ids look random but a test run repeats them.
        self._rng = random.Random(f"fake-llm-{self.name}")

    # -- requests --

    def authorize(self, req: ChatRequest, api_key: str | None) -> Refusal | None:
        """The fake's ``api_key`` (if set) as a Bearer token, as OpenAI checks it."""
        if api_key is not None and req.headers.get("authorization") != f"Bearer {api_key}":
            refusal = self.refuse(401, "Incorrect API key provided.", code="invalid_api_key")
            return Refusal(refusal.status, refusal.body, refusal.message, "unauthorized")
        return None

    def check(self, req: ChatRequest) -> Refusal | None:
        """The provider's own rules, after the generic Chat Completions validation."""
        return None

    def refuse(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: Any = None,
        type: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Refusal:
        """A refusal in this provider's error shape (OpenAI's unless overridden)."""
        kind = type or ("server_error" if status >= 500 else "invalid_request_error")
        error = {"message": message, "type": kind, "param": param, "code": code, **(extra or {})}
        return Refusal(status, {"error": error}, message)

    def error_step(self, step: Step) -> Refusal:
        """The answer to a scripted ``error`` step (its status, message, type, code)."""
        status = step["error"]
        return self.refuse(
            status,
            step.get("message", f"Scripted error {status} (fake LLM, {self.name} dialect)."),
            code=step.get("code"),
            type=step.get("type"),
        )

    def error_in_body(self, step: Step) -> dict[str, Any]:
        """The ``error`` object of an ``in_body`` error step (HTTP 200)."""
        return {"code": step["error"], "message": step.get("message", "Provider returned error")}

    # -- answers --

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        """Ids for one answer's tool calls (those a step does not name itself)."""
        return lambda: "call_" + "".join(self._rng.choices(ALNUM, k=24))

    def thinks(self, model: str) -> bool:
        return bool(self.reasoning_fields) and bool(THINKING_MODELS.search(model))

    def reasoning_text(self, step: Step, req: ChatRequest, user_text: str) -> str | None:
        if "reasoning" in step:
            return step["reasoning"] or None
        if self.thinks(req.model):
            return f"The user wrote {user_text.strip()[:40]!r}; I should answer it."
        return None

    def shape(
        self, message: dict[str, Any], finish: str, step: Step, req: ChatRequest, user_text: str
    ) -> tuple[dict[str, Any], str]:
        """The assistant message and finish_reason as this provider sends them."""
        reasoning = self.reasoning_text(step, req, user_text)
        if reasoning:
            for name in self.reasoning_fields:
                message[name] = self.reasoning_value(name, reasoning)
        return message, finish

    def reasoning_value(self, field_name: str, text: str) -> Any:
        return text

    def plain(self, body: dict[str, Any], req: ChatRequest) -> dict[str, Any]:
        """The non-streamed response body (``llm_server.completion_body``'s, adjusted)."""
        return body

    def stream(
        self, chunks: list[dict[str, Any]], message: dict[str, Any], req: ChatRequest, step: Step
    ) -> list[Frame]:
        """The SSE writes for ``chunks`` (``llm_server.completion_chunks``'s, OpenAI's layout)."""
        pieces = int(step.get("pieces", 3))
        chunks = self._with_reasoning(chunks, message, pieces)
        if self.layout_for(message) != "pieces" and message.get("tool_calls"):
            chunks = self._relayout_calls(chunks, message)
        frames = [(_sse(c), bool(_delta(c).get("content"))) for c in self.adjust_chunks(chunks)]
        if self.done:
            frames.append((_sse("[DONE]"), False))
        return self.prefix_frames() + frames

    def layout_for(self, message: Mapping[str, Any]) -> str:
        return self.tool_layout

    def adjust_chunks(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return chunks

    def prefix_frames(self) -> list[Frame]:
        return []

    def stream_call(self, index: int, call: Mapping[str, Any]) -> dict[str, Any]:
        """One whole tool call as a stream delta (``tool_layout == "whole"``)."""
        delta = {"index": index, "id": call["id"], "type": "function"}
        delta["function"] = dict(call["function"])
        for key in ("extra_content",):
            if key in call:
                delta[key] = call[key]
        return delta

    def _with_reasoning(
        self, chunks: list[dict[str, Any]], message: dict[str, Any], pieces: int
    ) -> list[dict[str, Any]]:
        fields = [f for f in self.reasoning_fields if f in message]
        if not fields or not chunks:
            return chunks
        text = message[fields[0]]
        text = text if isinstance(text, str) else ""
        thoughts = [
            _envelope(chunks[0], {f: self.reasoning_value(f, piece) for f in fields})
            for piece in _split(text, pieces)
        ]
        return [chunks[0], *thoughts, *chunks[1:]]

    def _relayout_calls(
        self, chunks: list[dict[str, Any]], message: dict[str, Any]
    ) -> list[dict[str, Any]]:
        rest = [c for c in chunks if "tool_calls" not in _delta(c)]
        at = next(
            (i for i, c in enumerate(rest) if c["choices"] and c["choices"][0]["finish_reason"]),
            len(rest),
        )
        calls = [
            _envelope(rest[0], {"tool_calls": [self.stream_call(i, call)]})
            for i, call in enumerate(message["tool_calls"])
        ]
        return rest[:at] + calls + rest[at:]


def _envelope(template: Mapping[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """A chunk like ``template`` (id, model, created, ...) with another delta, no finish."""
    chunk = dict(template)
    chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
    return chunk


# --- OpenAI ------------------------------------------------------------------------------------

# "gpt-5", "o1-mini", "o3", "o4-mini", optionally behind a router's "openai/".
OPENAI_REASONING = re.compile(r"^(openai/)?(gpt-5|o1|o3|o4)", re.I)
OPENAI_NO_TEMPERATURE = re.compile(r"^(openai/)?(o3|o4)", re.I)


def openai_reasoning_problem(model: str, body: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """``(message, param, code)`` OpenAI answers a reasoning model's request with, or None."""
    if not OPENAI_REASONING.match(model):
        return None
    if "max_tokens" in body:
        # https://github.com/griptape-ai/ComfyUI-Griptape/issues/312 (gpt-5), and
        # https://github.com/teilomillet/gollm/issues/33 (o1, o3-mini): the exact words.
        return (
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "max_tokens",
            "unsupported_parameter",
        )
    temperature = body.get("temperature")
    if temperature is None:
        return None
    if OPENAI_NO_TEMPERATURE.match(model):
        # o3/o4 refuse the parameter itself, even at the default:
        # https://github.com/openai/openai-python/issues/2104 (o3-mini, temperature=0).
        return (
            "Unsupported parameter: 'temperature' is not supported with this model.",
            "temperature",
            "unsupported_parameter",
        )
    if temperature != 1:
        # o1 and gpt-5 accept only the default 1:
        # https://github.com/leafo/lua-openai/issues/12 (o1-mini, 0.5); issue 36 item 1.
        return (
            f"Unsupported value: 'temperature' does not support {_number(temperature)} with "
            "this model. Only the default (1) value is supported.",
            "temperature",
            "unsupported_value",
        )
    return None


class OpenAI(Dialect):
    """api.openai.com: reasoning models refuse ``max_tokens`` and most temperatures."""

    name = "openai"

    def check(self, req: ChatRequest) -> Refusal | None:
        problem = openai_reasoning_problem(req.model, req.body)
        if problem is None:
            return None
        message, param, code = problem
        return self.refuse(400, message, param=param, code=code)


# --- Azure OpenAI ------------------------------------------------------------------------------

AZURE_CLASSIC = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")


class Azure(Dialect):
    """Azure OpenAI: classic ``/openai/deployments/<name>/chat/completions?api-version=...``
    with an ``api-key`` header, and the v1 API ``/openai/v1/chat/completions`` (no
    api-version); the fake's ``/v1/chat/completions`` is served as the v1 API."""

    name = "azure"
    extra_paths = (
        "/openai/deployments/{deployment}/chat/completions",
        "/openai/v1/chat/completions",
    )

    def authorize(self, req: ChatRequest, api_key: str | None) -> Refusal | None:
        classic = AZURE_CLASSIC.match(req.path)
        given = req.headers.get("api-key")
        if not classic and given is None:
            # The v1 API takes the key as a Bearer token too (the OpenAI SDK's way):
            # https://learn.microsoft.com/en-us/azure/ai-foundry/openai/api-version-lifecycle
            bearer = req.headers.get("authorization", "")
            given = bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
        if not given or (api_key is not None and given != api_key):
            # The classic endpoints read only the api-key header; the words and body shape:
            # https://github.com/SciSharp/BotSharp/issues/386
            message = (
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
                "to provide a valid key for an active subscription and use a correct regional "
                "API endpoint for your resource."
            )
            return Refusal(
                401, {"error": {"code": "401", "message": message}}, message, "unauthorized"
            )
        if classic and not req.query.get("api-version"):
            # A classic path without ?api-version= is a 404, not a 400:
            # https://github.com/MicrosoftDocs/azure-docs/issues/114602
            return Refusal(
                404,
                {"error": {"code": "404", "message": "Resource not found"}},
                "Resource not found",
            )
        return None

    def check(self, req: ChatRequest) -> Refusal | None:
        # A deployment of a reasoning model has OpenAI's rules ("For GPT 5.1 models on Azure"):
        # https://github.com/anomalyco/opencode/issues/37964
        classic = AZURE_CLASSIC.match(req.path)
        for model in (req.model, classic.group(1) if classic else ""):
            problem = openai_reasoning_problem(model, req.body)
            if problem is not None:
                message, param, code = problem
                return self.refuse(400, message, param=param, code=code)
        return None

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        refusal = super().refuse(status, message, **kw)
        refusal.body["error"]["code"] = kw.get("code") or str(status)
        return refusal

    def prefix_frames(self) -> list[Frame]:
        # The first streamed event carries only the prompt's content-filter results:
        # https://github.com/AbanteAI/archive-old-cli-mentat/issues/429 (its exact shape).
        safe = {"filtered": False, "severity": "safe"}
        results = {k: safe for k in ("hate", "self_harm", "sexual", "violence")}
        first = {
            "id": "",
            "choices": [],
            "created": 0,
            "model": "",
            "object": "",
            "system_fingerprint": None,
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": results}],
        }
        return [(_sse(first), False)]


# --- DeepSeek ----------------------------------------------------------------------------------


class DeepSeek(Dialect):
    """api.deepseek.com: thinking models (deepseek-reasoner in V3.2, deepseek-v4*) answer with
    ``reasoning_content`` and need it back on every assistant message that made tool calls;
    R1 refuses it back. Keep-alive comments while the server is busy."""

    name = "deepseek"
    # https://api-docs.deepseek.com/guides/thinking_mode: "reasoning_content ... at the same
    # level as content", in messages and in stream deltas.
    reasoning_fields = ("reasoning_content",)
    # https://api-docs.deepseek.com/quick_start/rate_limit: under load a stream gets
    # ": keep-alive" comments and a plain request empty lines until the answer starts.
    keepalive = KEEPALIVE_COMMENT

    def is_r1(self, model: str) -> bool:
        return "r1" in model.lower() or (self.options.old_build and "reasoner" in model)

    def thinks(self, model: str) -> bool:
        lowered = model.lower()
        return "reasoner" in lowered or "r1" in lowered or lowered.startswith("deepseek-v4")

    def check(self, req: ChatRequest) -> Refusal | None:
        if self.is_r1(req.model):
            return self._r1_problem(req)
        if not self.thinks(req.model):
            return None
        for i, msg in enumerate(req.messages):
            if _role(msg) != "assistant" or not msg.get("tool_calls"):
                continue
            if isinstance(msg.get("reasoning_content"), str):
                continue
            if "reasoner" in req.model:
                # deepseek-reasoner (V3.2, December 2025 on), the exact words:
                # https://github.com/continuedev/continue/issues/9831
                message = (
                    f"Missing `reasoning_content` field in the assistant message at message "
                    f"index {i}. For more information, please refer to "
                    "https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
                )
            else:
                # deepseek-v4-* (April 2026 on): https://github.com/decolua/9router/issues/773;
                # the rule: https://api-docs.deepseek.com/guides/thinking_mode ("for turns
                # that do perform tool calls, the reasoning_content must be fully passed back
                # ... in all subsequent requests"); issue 36 item 2.
                message = (
                    "The `reasoning_content` in the thinking mode must be passed back to the API."
                )
            return self.refuse(400, message, code="invalid_request_error")
        return None

    def _r1_problem(self, req: ChatRequest) -> Refusal | None:
        messages = req.messages
        for msg in messages:
            if "reasoning_content" in msg:
                # https://github.com/Euyug/Mirai-Gpt-Plugin/issues/4 (the words, January 2025);
                # https://api-docs.deepseek.com/guides/reasoning_model ("if the
                # reasoning_content field is included in the sequence of input messages, the
                # API will return a 400 error"); issue 36 item 2.
                return self.refuse(
                    400,
                    "The reasoning_content is an intermediate result for display purposes only "
                    "and will not be included in the context for inference. Please remove the "
                    "reasoning_content from your message to reduce network traffic.",
                    code="invalid_request_error",
                )
        for i in range(1, len(messages)):
            a, b = _role(messages[i - 1]), _role(messages[i])
            if a == b and a in ("user", "assistant"):
                # https://github.com/open-webui/open-webui/issues/9266 (the words).
                return self.refuse(
                    400,
                    f"{req.model} does not support successive user or assistant messages "
                    f"(messages[{i - 1}] and messages[{i}] in your input). You should "
                    "interleave the user/assistant messages in the message sequence.",
                    code="invalid_request_error",
                )
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        counter = iter(range(1000))
        return lambda: f"call_{next(counter)}_" + "".join(self._rng.choices(ALNUM, k=24))


# --- Gemini ------------------------------------------------------------------------------------

# Signatures a client may send for calls Gemini did not make (another model's history):
# https://ai.google.dev/gemini-api/docs/thought-signatures ("dummy" signatures).
GEMINI_DUMMY_SIGNATURES = frozenset(
    {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}
)


class Gemini(Dialect):
    """generativelanguage.googleapis.com/v1beta/openai: Gemini 3 signs its tool calls and
    refuses the current turn's calls without their signature; errors come as a JSON list;
    streamed parallel calls all carry ``index: 0``."""

    name = "gemini"
    # Streamed calls come whole, one per delta, every one with index 0 (each with its own id):
    # https://github.com/NousResearch/hermes-agent/issues/62940 ("Google's OpenAI-compat layer
    # does not increment tool_calls[].index for parallel calls"); issue 36 item 6.
    tool_layout = "whole"
    # The stream ends without "data: [DONE]": reported (issue 36, the list of what works).
    done = False

    def __init__(self, options: DialectOptions) -> None:
        super().__init__(options)
        self.signatures: set[str] = set()

    @staticmethod
    def signs(model: str) -> bool:
        return "gemini-3" in model.lower()

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # A list holding one error object:
        # https://discuss.ai.google.dev/t/openai-api-compatibility-broken-due-to-thought-signature-on-gemini-3-pro-preview/109823
        names = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 503: "UNAVAILABLE"}  # fmt: skip
        error = {"code": status, "message": message, "status": names.get(status, "UNKNOWN")}
        return Refusal(status, [{"error": error}], message)

    def check(self, req: ChatRequest) -> Refusal | None:
        if not self.signs(req.model):
            return None
        messages = req.messages
        last_user = max((i for i, m in enumerate(messages) if _role(m) == "user"), default=-1)
        for i in range(last_user + 1, len(messages)):
            calls = messages[i].get("tool_calls") if _role(messages[i]) == "assistant" else None
            if not calls:
                continue
            # The first call of each step carries the step's signature ("when there are
            # parallel function calls, only the first function call part ... will have a
            # signature"); Gemini 3 validates those of the current turn strictly:
            # https://ai.google.dev/gemini-api/docs/thought-signatures; issue 36 item 2.
            first = calls[0] if isinstance(calls[0], dict) else {}
            extra = first.get("extra_content")
            google = extra.get("google") if isinstance(extra, dict) else None
            signature = google.get("thought_signature") if isinstance(google, dict) else None
            if signature in self.signatures or signature in GEMINI_DUMMY_SIGNATURES:
                continue
            name = (first.get("function") or {}).get("name", "")
            # The words: the discuss.ai.google.dev thread above.
            return self.refuse(
                400,
                "Function call is missing a thought_signature in functionCall parts. This is "
                "required for tools to work correctly, and missing thought_signature may lead "
                "to degraded model performance. Additional data, function call "
                f"`default_api:{name}` , position {i}. please refer to "
                "https://ai.google.dev/gemini-api/docs/thought-signatures for more details.",
            )
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        return lambda: "function-call-" + "".join(self._rng.choices(string.digits, k=20))

    def shape(
        self, message: dict[str, Any], finish: str, step: Step, req: ChatRequest, user_text: str
    ) -> tuple[dict[str, Any], str]:
        message, finish = super().shape(message, finish, step, req, user_text)
        calls = message.get("tool_calls")
        if not calls:
            return message, finish
        if self.signs(req.model):
            signature = "".join(self._rng.choices(ALNUM + "+/", k=48))
            self.signatures.add(signature)
            calls[0]["extra_content"] = {"google": {"thought_signature": signature}}
        if not self.signs(req.model) or req.stream:
            # Gemini 2.x says "stop" after tool calls: https://github.com/microsoft/autogen/issues/4878;
            # Gemini 3 too when streaming: https://github.com/googleapis/python-genai/issues/2868
            finish = "stop" if finish == "tool_calls" else finish
        return message, finish

    def stream_call(self, index: int, call: Mapping[str, Any]) -> dict[str, Any]:
        return super().stream_call(0, call)


# --- Mistral -----------------------------------------------------------------------------------

# Top-level fields of Mistral's chat completion request (https://docs.mistral.ai/api/):
# anything else is "extra_forbidden".
MISTRAL_FIELDS = frozenset(
    {"model", "messages", "temperature", "top_p", "max_tokens", "stream", "stop", "random_seed",
     "response_format", "tools", "tool_choice", "presence_penalty", "frequency_penalty", "n",
     "prediction", "parallel_tool_calls", "prompt_mode", "safe_prompt", "metadata"}
)  # fmt: skip
MISTRAL_MESSAGE_FIELDS = {
    "system": frozenset({"role", "content"}),
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "tool_calls", "prefix"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
MISTRAL_CALL_FIELDS = frozenset({"id", "type", "function", "index"})
# mistral_common's role transitions (src/mistral_common/protocol/instruct/validator.py,
# _validate_message_order: after a tool result only a tool result or an assistant message):
# https://github.com/mistralai/mistral-common
MISTRAL_NEXT_ROLES = {
    "system": {"system", "user", "assistant"},
    "user": {"user", "assistant", "system"},
    "assistant": {"assistant", "user", "tool"},
    "tool": {"assistant", "tool"},
}


def mistral_id_problem(messages: list[dict[str, Any]]) -> str | None:
    """Mistral's words for the first tool-call id that is not 9 letters or digits."""
    for msg in messages:
        ids = [tc.get("id") for tc in msg.get("tool_calls") or () if isinstance(tc, dict)]
        if _role(msg) == "tool":
            ids.append(msg.get("tool_call_id"))
        for call_id in ids:
            if not (isinstance(call_id, str) and MISTRAL_ID.match(call_id)):
                # mistral_common MistralRequestValidatorV3 (the rule and the words), served
                # by Mistral's API (https://github.com/nearai/ironclaw/issues/1241) and by
                # servers of Mistral models; issue 36 item 4.
                return f"Tool call id was {call_id} but must be a-z, A-Z, 0-9, with a length of 9."
    return None


def mistral_ids(rng: random.Random) -> Callable[[], str]:
    return lambda: "".join(rng.choices(ALNUM, k=9))


class Mistral(Dialect):
    """api.mistral.ai: 9-character tool-call ids, strict role order, no unknown fields."""

    name = "mistral"
    # Usage comes with the last chunk whether asked for or not ("Usage data is included by
    # default"): https://github.com/dnakov/anon-kode/issues/53
    usage_always = True

    def refuse(self, status: int, message: Any, **kw: Any) -> Refusal:
        # {"object": "error", "message", "type", "param", "code"}:
        # https://github.com/datapizza-labs/datapizza-ai/issues/98
        body = {
            "object": "error",
            "message": message,
            "type": kw.get("type") or "invalid_request_error",
            "param": kw.get("param"),
            "code": kw.get("code"),
        }
        return Refusal(status, body, message if isinstance(message, str) else json.dumps(message))

    def check(self, req: ChatRequest) -> Refusal | None:
        return self._extra_fields(req) or self._ids(req) or self._order(req)

    def _extra_fields(self, req: ChatRequest) -> Refusal | None:
        details = []
        for name in req.body:
            if name not in MISTRAL_FIELDS:
                value = req.body[name]
                # stream_options: https://github.com/dnakov/anon-kode/issues/53 (reported at
                # ["body", "stream_options", "include_usage"]); max_completion_tokens:
                # https://github.com/editor-code-assistant/eca/issues/231; issue 36 item 5.
                loc: list[Any] = ["body", name]
                if isinstance(value, dict) and value:
                    key = next(iter(value))
                    loc, value = [*loc, key], value[key]
                details.append([*loc, value])
        for i, msg in enumerate(req.messages):
            allowed = MISTRAL_MESSAGE_FIELDS.get(_role(msg), frozenset())
            for name in msg:
                if name not in allowed:
                    # reasoning_content: https://github.com/charmbracelet/crush/issues/1590;
                    # a user "name": https://github.com/Gage-Technologies/mistral-go/pull/2
                    details.append(["body", "messages", i, _role(msg), name, msg[name]])
            for j, tc in enumerate(msg.get("tool_calls") or ()):
                for name in tc if isinstance(tc, dict) else ():
                    if name not in MISTRAL_CALL_FIELDS:
                        # The same pydantic model (extra="forbid") one level down, e.g.
                        # Gemini's extra_content on a call of another model's history.
                        loc = ["body", "messages", i, "assistant", "tool_calls", j, name]
                        details.append([*loc, tc[name]])
        if not details:
            return None
        detail = [
            {
                "type": "extra_forbidden",
                "loc": d[:-1],
                "msg": "Extra inputs are not permitted",
                "input": d[-1],
            }
            for d in details
        ]
        # 422, the list under "detail" and "message" (the API of late 2025):
        # https://github.com/partITech/php-mistral/issues/76
        body = {
            "object": "Error",
            "detail": detail,
            "message": detail,
            "type": "invalid_request_error",
            "code": 3001,
        }
        return Refusal(422, body, f"Extra inputs are not permitted: {detail[0]['loc']}")

    def _ids(self, req: ChatRequest) -> Refusal | None:
        problem = mistral_id_problem(req.messages)
        if problem is None:
            return None
        # https://github.com/editor-code-assistant/eca/issues/233 (type and code).
        return self.refuse(400, problem, type="invalid_function_call", code="3280")

    def _order(self, req: ChatRequest) -> Refusal | None:
        messages = req.messages
        for i in range(1, len(messages)):
            before, now = _role(messages[i - 1]), _role(messages[i])
            if now not in MISTRAL_NEXT_ROLES.get(before, set()):
                # https://github.com/avante-corp/avante.nvim/issues/2562 (words, type, code);
                # issue 36 item 3.
                return self.refuse(
                    400,
                    f"Unexpected role '{now}' after role '{before}'",
                    type="invalid_request_message_order",
                    code="3230",
                )
        for msg in messages:
            if _role(msg) == "assistant" and not msg.get("content") and not msg.get("tool_calls"):
                # https://github.com/OpenHands/OpenHands/issues/8685 (the words).
                return self.refuse(
                    400, "Assistant message must have either content or tool_calls, but not none."
                )
        if messages and _role(messages[-1]) == "assistant" and not messages[-1].get("prefix"):
            # https://github.com/0xPlaygrounds/rig/pull/1130 (the words).
            return self.refuse(
                400,
                "Expected last role User or Tool (or Assistant with prefix True) for serving but "
                "got assistant",
                type="invalid_request_message_order",
            )
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        return mistral_ids(self._rng)


# --- Groq --------------------------------------------------------------------------------------

GROQ_MESSAGE_FIELDS = {
    "system": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "function_call", "reasoning"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
GROQ_REASONING_MODELS = re.compile(r"gpt-oss|qwen3|qwq|deepseek-r1", re.I)


class Groq(Dialect):
    """api.groq.com/openai/v1: refuses unknown message properties, ``tool_use_failed`` when
    the model's call cannot be parsed, ``stream_options`` refused by 2024 builds."""

    name = "groq"
    # Reasoning models answer with "reasoning" (Groq's reasoning_format "parsed"); Groq
    # accepts it back on assistant messages of those models:
    # https://github.com/vercel/ai/pull/8057
    reasoning_fields = ("reasoning",)

    def thinks(self, model: str) -> bool:
        return bool(GROQ_REASONING_MODELS.search(model))

    def check(self, req: ChatRequest) -> Refusal | None:
        if self.options.old_build and "stream_options" in req.body:
            # https://github.com/vercel/ai/pull/1578 (May 2024, the words); issue 36 item 5.
            return self.refuse(
                400, "property 'stream_options' is unsupported, did you mean 'stream'?"
            )
        for i, msg in enumerate(req.messages):
            role = _role(msg)
            for name in msg:
                if name == "reasoning" and role == "assistant" and not self.thinks(req.model):
                    # https://github.com/vercel/ai/pull/8057 (the words).
                    return self.refuse(
                        400, f"messages[{i}].reasoning: reasoning is not supported with this model"
                    )
                if name not in GROQ_MESSAGE_FIELDS.get(role, frozenset()):
                    # https://github.com/NousResearch/hermes-agent/issues/11089 (reasoning_content,
                    # the words); https://github.com/ServiceStack/llms/issues/17 (a user field).
                    return self.refuse(
                        400,
                        f"'messages.{i}' : for 'role:{role}' the following must be satisfied"
                        f"[('messages.{i}' : property '{name}' is unsupported)]",
                    )
        return None

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # Groq's error objects have no "param" or "code" unless there is one:
        # https://github.com/vercel/ai/pull/1578
        error: dict[str, Any] = {
            "message": message,
            "type": kw.get("type") or "invalid_request_error",
        }
        if kw.get("code") is not None:
            error["code"] = kw["code"]
        error.update(kw.get("extra") or {})
        return Refusal(status, {"error": error}, message)

    def error_step(self, step: Step) -> Refusal:
        if step.get("code") != "tool_use_failed":
            return super().error_step(step)
        # https://github.com/groq/groq-typescript/issues/28 (words and fields); Groq answers
        # it when the model wrote a call it cannot parse: another try usually works, so it is
        # transient to a client (issue 36 item 8).
        return self.refuse(
            step["error"],
            step.get(
                "message",
                "Failed to call a function. Please adjust your prompt. See 'failed_generation' "
                "for more details.",
            ),
            code="tool_use_failed",
            extra={"failed_generation": step.get("failed_generation", "")},
        )


# --- OpenRouter --------------------------------------------------------------------------------


class OpenRouter(Dialect):
    """openrouter.ai/api/v1: SSE comments while it routes, reasoning in ``reasoning`` and
    ``reasoning_details``, errors of a started generation in a 200 answer."""

    name = "openrouter"
    # https://openrouter.ai/docs/use-cases/reasoning-tokens: "reasoning" (text) and
    # "reasoning_details" (typed blocks, to be sent back unchanged) on messages and deltas.
    reasoning_fields = ("reasoning", "reasoning_details")
    # "Full usage details are always included" (stream_options.include_usage has no effect):
    # https://openrouter.ai/docs/sdks/python/api-reference/components/chatstreamoptions
    usage_always = True
    keepalive = b": OPENROUTER PROCESSING\n\n"

    def reasoning_value(self, field_name: str, text: str) -> Any:
        if field_name == "reasoning_details":
            return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
        return text

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # {"error": {"code": <number>, "message", "metadata"?}}: https://openrouter.ai/docs/errors
        return Refusal(status, {"error": {"code": status, "message": message}}, message)

    def prefix_frames(self) -> list[Frame]:
        # "OpenRouter occasionally sends comments to prevent connection timeouts":
        # https://openrouter.ai/docs/api-reference/streaming
        return [(self.keepalive, False), (self.keepalive, False)]

    def adjust_chunks(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for chunk in chunks:
            chunk["provider"] = "FakeProvider"
        return chunks

    def plain(self, body: dict[str, Any], req: ChatRequest) -> dict[str, Any]:
        body["provider"] = "FakeProvider"
        return body

    def error_in_body(self, step: Step) -> dict[str, Any]:
        """The ``error`` object of a failure after the answer started (HTTP 200): "any error
        occurred while the LLM is producing the output will be emitted in the response body
        or as an SSE data event" (https://openrouter.ai/docs/errors); issue 36 item 8."""
        status = step["error"]
        message = step.get("message", "Provider returned error")
        return {"code": status, "message": message, "metadata": {"provider_name": "FakeProvider"}}


# --- Anthropic (OpenAI SDK compatibility) ------------------------------------------------------


class Anthropic(Dialect):
    """api.anthropic.com/v1 for the OpenAI SDK (https://docs.anthropic.com/en/api/openai-sdk):
    ``n`` must be 1, temperatures above 1 are capped (not refused), most other fields are
    ignored; the Messages API's rules on content and tool_use ids still apply."""

    name = "anthropic"

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # {"type": "error", "error": {"type", "message"}}: https://docs.anthropic.com/en/api/errors
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 429: "rate_limit_error", 500: "api_error",
                 529: "overloaded_error"}  # fmt: skip
        kind = kw.get("type") or kinds.get(status, "api_error")
        return Refusal(
            status, {"type": "error", "error": {"type": kind, "message": message}}, message
        )

    def check(self, req: ChatRequest) -> Refusal | None:
        n = req.body.get("n")
        if n is not None and n != 1:
            # "n: Must be exactly 1": https://docs.anthropic.com/en/api/openai-sdk
            return self.refuse(400, "n: Must be exactly 1")
        messages = [m for m in req.messages if _role(m) not in ("system", "developer")]
        seen: set[str] = set()
        for i, msg in enumerate(messages):
            content = msg.get("content")
            empty = content in (None, "", []) and not msg.get("tool_calls")
            empty = empty and _role(msg) in ("user", "assistant")
            if empty and not (i == len(messages) - 1 and _role(msg) == "assistant"):
                # https://github.com/CoreInfraAI/opencode-plugin/pull/6 (the words).
                return self.refuse(
                    400,
                    f"messages.{i}: all messages must have non-empty content except for the "
                    "optional final assistant message",
                )
            for tc in msg.get("tool_calls") or ():
                call_id = tc.get("id") if isinstance(tc, dict) else None
                if call_id in seen:
                    # "tool_use ids must be unique" (a repeated call_0 of another server):
                    # https://github.com/NVIDIA-NeMo/Switchyard/issues/502
                    return self.refuse(400, f"messages.{i}.content: `tool_use` ids must be unique")
                seen.add(call_id)
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        return lambda: "toolu_01" + "".join(self._rng.choices(ALNUM, k=22))


# --- Ollama ------------------------------------------------------------------------------------


class Ollama(Dialect):
    """localhost:11434/v1: thinking in ``reasoning``, each streamed call whole in one chunk
    (``index: 0`` on all of them; no ``index`` at all before 0.4.7)."""

    name = "ollama"
    # https://github.com/dirac-run/dirac/pull/227 (raw SSE of Ollama 0.34: delta.reasoning).
    reasoning_fields = ("reasoning",)
    tool_layout = "whole"

    def check(self, req: ChatRequest) -> Refusal | None:
        for msg in req.messages:
            if msg.get("content") is None and not msg.get("tool_calls"):
                # "content is only optional if tool calls are present" (openai/openai.go);
                # the words: https://github.com/SAIL-Research-Lab/cheetahclaws/pull/72
                return self.refuse(400, "invalid message content type: <nil>")
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        return lambda: (
            "call_" + "".join(self._rng.choices(string.ascii_lowercase + string.digits, k=8))
        )

    def shape(
        self, message: dict[str, Any], finish: str, step: Step, req: ChatRequest, user_text: str
    ) -> tuple[dict[str, Any], str]:
        message, finish = super().shape(message, finish, step, req, user_text)
        if message.get("tool_calls") and message.get("content") is None:
            message["content"] = ""  # Ollama's tool-call messages carry "" (its Go zero value)
        return message, finish

    def stream_call(self, index: int, call: Mapping[str, Any]) -> dict[str, Any]:
        delta = super().stream_call(0, call)
        if self.options.old_build:
            # No "index" before 0.4.7: https://github.com/ollama/ollama/issues/7881
            del delta["index"]
        # Otherwise "index" is 0 for every call of the answer (models without a registered
        # parser): https://github.com/ollama/ollama/issues/15497 (still open),
        # https://github.com/ollama/ollama/issues/15457
        return delta


# --- vLLM and llama.cpp: chat templates --------------------------------------------------------


def alternation_problem(messages: list[dict[str, Any]]) -> bool:
    """True if a strict template refuses ``messages``: after an optional first system message,
    user and assistant must alternate, starting with user; tool results and assistant messages
    with tool calls are skipped (Mistral v0.3's template: the block "checks for alternating
    user/assistant messages, skipping tool calling messages",
    https://github.com/nomic-ai/gpt4all/issues/3255)."""
    rest = [
        m
        for m in messages
        if not (_role(m) == "tool" or (_role(m) == "assistant" and m.get("tool_calls")))
    ]
    if rest and _role(rest[0]) == "system":
        rest = rest[1:]
    return any(_role(m) != ("user" if k % 2 == 0 else "assistant") for k, m in enumerate(rest))


def template_words(model: str) -> str:
    """The exception the model family's chat template raises."""
    if "gemma" in model.lower():
        # https://github.com/nextai-translator/raycast-openai-translator/issues/34 (gemma-3)
        return "Conversation roles must alternate user/assistant/user/assistant/..."
    if "devstral" in model.lower():
        # https://github.com/mistralai/mistral-vibe/issues/1006 (Devstral Small 2)
        return (
            "After the optional system message, conversation roles must alternate user and "
            "assistant roles except for tool calls and results."
        )
    # https://github.com/vllm-project/vllm/issues/6862 (Mistral-7B-Instruct-v0.3)
    return (
        "After the optional system message, conversation roles must alternate "
        "user/assistant/user/assistant/..."
    )


class _TemplateServer(Dialect):
    """A server rendering the model's Hugging Face chat template (vLLM, llama.cpp)."""

    def strict(self, model: str) -> bool:
        if self.options.strict_template is not None:
            return self.options.strict_template
        return bool(STRICT_TEMPLATE_MODELS.search(model))

    def thinks(self, model: str) -> bool:
        return bool(THINKING_MODELS.search(model)) and not MISTRAL_FAMILY.search(model)


class VLLM(_TemplateServer):
    """vLLM's OpenAI server: reasoning in ``reasoning`` (``reasoning_content`` up to 0.10),
    template errors as 400, Mistral models validated by mistral_common."""

    name = "vllm"

    def __init__(self, options: DialectOptions) -> None:
        super().__init__(options)
        # "reasoning used to be called reasoning_content":
        # https://docs.vllm.ai/en/stable/features/reasoning_outputs/ (0.10 and before:
        # https://docs.vllm.ai/en/v0.10.0/features/reasoning_outputs.html)
        self.reasoning_fields = ("reasoning_content",) if options.old_build else ("reasoning",)

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # {"object": "error", "message", "type", "param", "code": <status>}:
        # https://github.com/vllm-project/vllm/issues/6862
        kind = kw.get("type") or ("BadRequestError" if status < 500 else "InternalServerError")
        body = {
            "object": "error",
            "message": message,
            "type": kind,
            "param": kw.get("param"),
            "code": status,
        }
        return Refusal(status, body, message)

    def check(self, req: ChatRequest) -> Refusal | None:
        if MISTRAL_FAMILY.search(req.model):
            # Mistral models served with their tokenizer: mistral_common's id rule; issue 36
            # item 4 ("vLLM / llama.cpp / mlx serving Mistral models").
            problem = mistral_id_problem(req.messages)
            if problem is not None:
                return self.refuse(400, problem)
        if self.strict(req.model) and alternation_problem(req.messages):
            # A template's raise_exception is a 400 in vLLM (issue 6862 above); issue 36 item 3.
            return self.refuse(400, template_words(req.model))
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        # vLLM's Mistral tool parser makes 9-character ids; other parsers "chatcmpl-tool-<hex>".
        if MISTRAL_FAMILY.search(req.model):
            return mistral_ids(self._rng)
        return lambda: "chatcmpl-tool-" + "".join(self._rng.choices("0123456789abcdef", k=32))


class LlamaCpp(_TemplateServer):
    """llama.cpp's llama-server: ``reasoning_content`` deltas, template errors as 500,
    ``content: null`` refused by builds before mid-2025, object arguments in March 2026."""

    name = "llamacpp"
    # https://github.com/ggml-org/llama.cpp/pull/12379 ("streaming of tool calls and
    # thoughts"): reasoning in reasoning_content.
    reasoning_fields = ("reasoning_content",)

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # {"error": {"code": <status>, "message", "type"}}:
        # https://github.com/mistralai/mistral-vibe/issues/1006
        kind = kw.get("type") or ("server_error" if status >= 500 else "invalid_request_error")
        return Refusal(
            status, {"error": {"code": status, "message": message, "type": kind}}, message
        )

    def check(self, req: ChatRequest) -> Refusal | None:
        if self.options.old_build:
            for msg in req.messages:
                if (
                    _role(msg) == "assistant"
                    and msg.get("tool_calls")
                    and msg.get("content") is None
                ):
                    # https://github.com/ggml-org/llama.cpp/issues/13471 (version 5350, May
                    # 2025: "If I change the content: null to content: '' it works"); the
                    # status: reported (issue 36 item 9).
                    return self.refuse(500, "Expected 'content' to be a string or an array")
        if self.strict(req.model) and alternation_problem(req.messages):
            # The Jinja exception as llama-server reports it, HTTP 500:
            # https://github.com/mistralai/mistral-vibe/issues/1006; issue 36 item 3.
            words = template_words(req.model)
            message = (
                "\n------------\nWhile executing CallExpression at line 189, column 32 in "
                "source:\n...== 0) %}\u21b5            {{- raise_exception('"
                f"{words[:30]}...\n                                           ^\n"
                f"Error: Jinja Exception: {words}"
            )
            return self.refuse(500, message)
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        # Random 32-character ids: https://github.com/NousResearch/hermes-agent/issues/70724
        return lambda: "".join(self._rng.choices(ALNUM, k=32))

    def shape(
        self, message: dict[str, Any], finish: str, step: Step, req: ChatRequest, user_text: str
    ) -> tuple[dict[str, Any], str]:
        message, finish = super().shape(message, finish, step, req, user_text)
        if self.options.object_arguments:
            # Builds of March 2026 send arguments as a JSON object: reported (issue 36 item 6).
            for tc in message.get("tool_calls") or ():
                args = tc["function"]["arguments"]
                try:
                    tc["function"]["arguments"] = json.loads(args)
                except ValueError:
                    pass  # a scripted broken string stays a string
        return message, finish

    def layout_for(self, message: Mapping[str, Any]) -> str:
        # An object cannot be cut into string pieces: each call comes whole.
        return "whole" if self.options.object_arguments else "pieces"


# --- LM Studio ---------------------------------------------------------------------------------

LMSTUDIO_ID_BASE = 193629320  # the shape of LM Studio's ids (9 digits), below


class LMStudio(Dialect):
    """LM Studio's server: ``<think>`` blocks inside ``content`` (no reasoning parser), tool-call
    ids repeated from one answer to the next, ``content: null`` refused by 2024 builds."""

    name = "lmstudio"

    def thinks(self, model: str) -> bool:
        return bool(THINKING_MODELS.search(model))

    def refuse(self, status: int, message: str, **kw: Any) -> Refusal:
        # {"error": "<words>"}: reported (issue 36 item 9; the words are those LM Studio logs).
        return Refusal(status, {"error": message}, message)

    def check(self, req: ChatRequest) -> Refusal | None:
        if self.options.old_build:
            for msg in req.messages:
                if msg.get("content") is None:
                    # https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/261 (December
                    # 2024, the words); issue 36 item 9.
                    return self.refuse(
                        400,
                        "Invalid 'content': 'content' field must be a string or an array of "
                        "objects.",
                    )
        return None

    def call_ids(self, req: ChatRequest) -> Callable[[], str]:
        # Nine digits (https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/830), counted
        # from the same number in every answer: the first call of each answer has the same id
        # (reported: issue 36, "LM Studio's repeated ids").
        counter = iter(range(LMSTUDIO_ID_BASE, LMSTUDIO_ID_BASE + 1000))
        return lambda: str(next(counter))

    def shape(
        self, message: dict[str, Any], finish: str, step: Step, req: ChatRequest, user_text: str
    ) -> tuple[dict[str, Any], str]:
        reasoning = self.reasoning_text(step, req, user_text)
        if reasoning:
            # Without a reasoning parser the model's <think> block stays in the text:
            # reported (issue 36 item 7); https://github.com/bytedance/deer-flow/pull/2062
            # ("<think> tags leaking into visible content").
            message["content"] = f"<think>{reasoning}</think>\n\n{message.get('content') or ''}"
        return message, finish


_DIALECTS: dict[str, type[Dialect]] = {
    cls.name: cls
    for cls in (OpenAI, Azure, DeepSeek, Gemini, Mistral, Groq, OpenRouter, Anthropic, Ollama,
                VLLM, LlamaCpp, LMStudio)
}  # fmt: skip
DIALECTS: tuple[str, ...] = (*_DIALECTS, "generic")


def make_dialect(name: str | None, options: DialectOptions | None = None) -> Dialect | None:
    """The dialect called ``name``; None for the default fake (None, "openai-compatible",
    "generic"). ValueError names the known dialects."""
    if name is None or name in DEFAULT_ALIASES:
        return None
    cls = _DIALECTS.get(name)
    if cls is None:
        known = ", ".join((*_DIALECTS, *DEFAULT_ALIASES))
        raise ValueError(f"unknown dialect {name!r}; known: {known}")
    return cls(options or DialectOptions())
