"""The dialects of OpenAI-compatible servers: one profile per provider, one place for them all.

Every server that speaks Chat Completions speaks it a little differently: which token parameter
a model takes, whether it may be given a temperature, whether ``stream_options`` is refused,
which reasoning fields must travel back with an assistant message (or must not), what a tool
call id may look like, whether ``content: null`` is accepted, where the usage of a stream is,
which errors are worth retrying. A ``Dialect`` says all that for one endpoint; the request body
and the messages sent are built from it here, never by conditions spread through the client.

A dialect comes from ``llm.provider`` (or the base URL's host, or the model's name, where that
is safe), then ``llm.dialect`` overrides single fields, then what the endpoint itself taught us:
a 400 that names a parameter (``'max_tokens' is not supported``) changes that field for the rest
of the process (``learn``), so an endpoint behind a proxy memobot cannot identify still works.

Sources for each rule are cited next to it; docs/providers.md lists them per provider.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import string
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

ProviderName = Literal[
    "openai",
    "azure",
    "deepseek",
    "gemini",
    "mistral",
    "groq",
    "openrouter",
    "anthropic",
    "ollama",
    "vllm",
    "llamacpp",
    "lmstudio",
    "generic",
]
PROVIDERS: tuple[str, ...] = get_args(ProviderName)
TokenParameter = Literal["max_tokens", "max_completion_tokens"]
ReasoningBack = Literal["never", "with_calls"]
ToolCallIds = Literal["any", "alnum9", "word"]

# Gemini 3 takes this in place of a thought signature for a call it did not make (another
# model's, or one from before a switch): https://ai.google.dev/gemini-api/docs/thought-signatures
GEMINI_DUMMY_SIGNATURE = "skip_thought_signature_validator"
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class Dialect:
    """What one endpoint accepts and how it answers. Field names are ``llm.dialect``'s keys
    (in camelCase there)."""

    provider: str = "generic"
    # The parameter that carries llm.maxTokens. OpenAI's reasoning models refuse max_tokens.
    token_parameter: TokenParameter = "max_tokens"
    # False: temperature is left out (OpenAI's reasoning models take only the default).
    send_temperature: bool = True
    # ``stream_options: {"include_usage": true}`` with streamed requests; False where the
    # server refuses unknown fields (Mistral's older API, Groq before 2025).
    stream_usage: bool = True
    # An assistant message's ``reasoning_content`` sent back with its tool calls (DeepSeek's
    # thinking mode refuses a tool turn without it), or never (most servers ignore it, some
    # refuse it: DeepSeek R1, OpenAI's strict schema).
    reasoning_back: ReasoningBack = "never"
    # Gemini's ``extra_content`` (thought signatures) on tool calls, sent back as received.
    extra_content_back: bool = False
    # OpenRouter's ``reasoning_details``, sent back with the assistant message that made calls.
    reasoning_details_back: bool = False
    # What a tool call id may look like: any string; exactly 9 letters and digits (Mistral);
    # letters, digits, "_" and "-" (Anthropic's tool_use ids).
    tool_call_ids: ToolCallIds = "any"
    # False: an assistant message with tool calls and no text says ``content: ""`` (older
    # llama.cpp and LM Studio refuse null).
    null_content: bool = True
    # How the API key travels: "bearer" (Authorization) or "api-key" (Azure's own header).
    auth: Literal["bearer", "api-key"] = "bearer"
    # Error codes (``error.code`` in a 4xx body) that a new try can cure: Groq's
    # tool_use_failed is a sampled tool call that did not parse.
    retry_codes: frozenset[str] = frozenset({"tool_use_failed"})
    # The model's chat template writes the opening <think> itself (DeepSeek-R1 distills, QwQ
    # on llama.cpp, LM Studio or vLLM without a reasoning parser): a streamed text is
    # reasoning until "</think>", and is held back from the chat until then.
    template_opens_think: bool = False

    def with_overrides(self, overrides: dict[str, Any]) -> Dialect:
        known = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in overrides.items() if k in known})

    # -- the request ---------------------------------------------------------------------------

    def body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float,
        tools: list[dict[str, Any]] | None = None,
        force_tool: str | None = None,
        stream: bool = False,
    ) -> bytes:
        """The serialised request: parameters this dialect takes, messages as it takes them."""
        body: dict[str, Any] = {"model": model, "messages": self.messages(messages)}
        body[self.token_parameter] = max_tokens
        if self.send_temperature:
            body["temperature"] = temperature
        if stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = (
                {"type": "function", "function": {"name": force_tool}} if force_tool else "auto"
            )
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` as this dialect takes them. A message that needs no change is the same
        object, and the list too when none does (a long history costs a few dict lookups per
        message); the input is not changed."""
        fit_ids = self.tool_call_ids != "any"
        seen: set[str] = set()  # ids given to calls so far: each unique in the conversation
        repeats: dict[str, int] = {}  # an id -> the repeat count of its last stand-in
        # The last call batch's ids -> the ids their calls were given, in order (an old
        # session may hold one id twice in a batch), and how many results each has had.
        block: dict[str, list[str]] = {}
        answered: dict[str, int] = {}
        out = messages
        for i, m in enumerate(messages):
            role = m.get("role")
            fixed = m
            if role == "assistant":
                if "tool_calls" in m or "reasoning_content" in m or "reasoning_details" in m:
                    fixed = self._assistant(m)
                if fit_ids:
                    block, answered = {}, {}
                    fixed = self._fit_call_ids(fixed, seen, repeats, block)
            elif role == "tool" and fit_ids:
                call_id = m.get("tool_call_id")
                if isinstance(call_id, str):
                    given_ids = block.get(call_id)
                    if given_ids:
                        n = answered[call_id] = answered.get(call_id, 0) + 1
                        given = given_ids[min(n, len(given_ids)) - 1]
                    else:
                        given = fit_tool_call_id(call_id, self.tool_call_ids)
                    if given != call_id:
                        fixed = {**m, "tool_call_id": given}
            if fixed is not m:
                if out is messages:
                    out = list(messages)
                out[i] = fixed
        return out

    def _fit_call_ids(
        self,
        m: dict[str, Any],
        seen: set[str],
        repeats: dict[str, int],
        block: dict[str, list[str]],
    ) -> dict[str, Any]:
        """``m`` with call ids of this dialect's form, none used before in the conversation
        (Anthropic refuses a repeated one; LM Studio gives the first call of every answer the
        same id). Stand-ins are derived from the id and its repeat count: the same history
        gets the same ids in every request. The count goes on from the id's last one (every
        count before it is taken), so an id repeated n times costs n tries, not n squared."""
        calls = m.get("tool_calls")
        if not isinstance(calls, list):
            return m
        fitted = []
        for c in calls:
            call_id = c.get("id") if isinstance(c, dict) else None
            if not isinstance(call_id, str):
                fitted.append(c)
                continue
            repeat = repeats.get(call_id, 0)
            given = fit_tool_call_id(
                f"{call_id}#{repeat}" if repeat else call_id, self.tool_call_ids
            )
            while given in seen:
                repeat += 1
                given = fit_tool_call_id(f"{call_id}#{repeat}", self.tool_call_ids)
            seen.add(given)
            repeats[call_id] = repeat
            block.setdefault(call_id, []).append(given)
            fitted.append(c if given == call_id else {**c, "id": given})
        if all(a is b for a, b in zip(fitted, calls, strict=True)):
            return m
        return {**m, "tool_calls": fitted}

    def _assistant(self, m: dict[str, Any]) -> dict[str, Any]:
        calls = m.get("tool_calls")
        update: dict[str, Any] = {}
        drop: list[str] = []
        if calls:
            fitted = [self._call(c) for c in calls]
            if any(a is not b for a, b in zip(fitted, calls, strict=True)):
                update["tool_calls"] = fitted
            if m.get("content") is None and not self.null_content:
                update["content"] = ""
        if calls and self.reasoning_back == "with_calls":
            if not isinstance(m.get("reasoning_content"), str):
                # DeepSeek checks the field is there; a message another model wrote has none.
                update["reasoning_content"] = ""
        elif "reasoning_content" in m:
            drop.append("reasoning_content")
        if "reasoning_details" in m and not (calls and self.reasoning_details_back):
            drop.append("reasoning_details")
        if not update and not drop:
            return m
        fixed = {k: v for k, v in m.items() if k not in drop}
        fixed.update(update)
        return fixed

    def _call(self, call: Any) -> Any:
        if not isinstance(call, dict):
            return call
        fixed = call
        if self.extra_content_back:
            if self.provider == "gemini" and not _has_signature(call.get("extra_content")):
                fixed = {
                    **fixed,
                    "extra_content": {"google": {"thought_signature": GEMINI_DUMMY_SIGNATURE}},
                }
        elif "extra_content" in fixed:
            fixed = {k: v for k, v in fixed.items() if k != "extra_content"}
        return fixed

    # -- what an endpoint teaches ----------------------------------------------------------------

    def learn(self, detail: str) -> tuple[Dialect, str] | None:
        """The dialect a refusal's text (a 400 or 422 body's message) asks for, and what
        changed in words; None when the text names nothing this dialect can change."""
        text = detail.lower()
        for needle, field_name, value, said in _LESSONS:
            if needle.search(text):  # the first that matches is the lesson, learnt or not
                if getattr(self, field_name) == value:
                    return None
                return replace(self, **{field_name: value}), said
        return None


def _has_signature(extra: Any) -> bool:
    google = extra.get("google") if isinstance(extra, dict) else None
    return isinstance(google, dict) and bool(google.get("thought_signature"))


# (what the refusal says, the field, its new value, the log's words). Wordings: OpenAI
# "Unsupported parameter: 'max_tokens' is not supported with this model. Use
# 'max_completion_tokens' instead." and "Unsupported value: 'temperature' does not support 0.7
# with this model. Only the default (1) value is supported."; Mistral "Extra inputs are not
# permitted" naming stream_options, Groq "property 'stream_options' is unsupported", and
# Mistral "Tool call id was ... but must be a-z, A-Z, 0-9, with a length of 9."; DeepSeek
# "The `reasoning_content` in the thinking mode must be passed back to the API." and
# "Missing `reasoning_content` field in the assistant message at message index 2"
# (https://github.com/continuedev/continue/issues/9831), R1's "Please remove the
# reasoning_content from your message" (https://github.com/Euyug/Mirai-Gpt-Plugin/issues/4,
# https://api-docs.deepseek.com/guides/reasoning_model), Gemini's "Unknown name
# \"reasoning_content\""; content null: LM Studio "'content' field must be a string",
# llama.cpp "Expected 'content' to be a string or an array" (an HTTP 500), OpenAI "expected a
# string, got null", pydantic "Input should be a valid string".
# Gaps are bounded and the words must refuse: a refusal about something else that merely
# names a field, or echoes the request (pydantic's "input"), teaches nothing. Not lessons:
# vLLM's "'max_tokens' or 'max_completion_tokens' is too large" (the context is full) and
# Mistral's "must have either content or tool_calls, but not none" (an empty message).
_REFUSES = (
    r"(?:unsupported|not support|unknown|unrecognized|unexpected|extra|not permitted"
    r"|not allowed|cannot find)"
)
_LESSONS: tuple[tuple[re.Pattern[str], str, Any, str], ...] = (
    (
        re.compile(
            r"max_tokens'?`?.{0,30}(?:is )?not supported|unsupported parameter.{0,20}max_tokens"
            r"|use .?max_completion_tokens.? instead"
        ),
        "token_parameter",
        "max_completion_tokens",
        "sending max_completion_tokens instead of max_tokens",
    ),
    (
        # The other way: Mistral (422 "Extra inputs are not permitted" at max_completion_tokens)
        # and Azure's older api-versions ("Unrecognized request argument supplied:
        # max_completion_tokens") refuse it, when llm.provider says openai for them.
        re.compile(
            rf"max_completion_tokens.{{0,60}}{_REFUSES}|{_REFUSES}.{{0,60}}max_completion_tokens"
        ),
        "token_parameter",
        "max_tokens",
        "sending max_tokens instead of max_completion_tokens",
    ),
    (
        re.compile(
            r"temperature.{0,60}(?:unsupported|not support|only the default)"
            r"|unsupported.{0,30}temperature"
        ),
        "send_temperature",
        False,
        "leaving temperature out",
    ),
    (
        re.compile(rf"stream_options.{{0,60}}{_REFUSES}|{_REFUSES}.{{0,60}}stream_options"),
        "stream_usage",
        False,
        "leaving stream_options out",
    ),
    (
        re.compile(r"reasoning_content.{0,40}must be passed back|missing.{0,3}reasoning_content"),
        "reasoning_back",
        "with_calls",
        "sending reasoning_content back with tool calls",
    ),
    (
        re.compile(
            rf"reasoning_content.{{0,60}}{_REFUSES}|{_REFUSES}.{{0,60}}reasoning_content"
            r"|remove (?:the )?reasoning_content"
        ),
        "reasoning_back",
        "never",
        "leaving reasoning_content out",
    ),
    (
        re.compile(r"tool.?call.?id.{0,300}(?:length of 9|a-z, a-z, 0-9)"),  # the id is quoted
        "tool_call_ids",
        "alnum9",
        "rewriting tool call ids to 9 letters and digits",
    ),
    (
        re.compile(
            r"content'?.{0,40}(?:\bnull\b|must be a string|to be a string|is not a string"
            r"|should be a valid string)"
        ),
        "null_content",
        False,
        'sending content "" instead of null with tool calls',
    ),
)

_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")
_WORD_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@functools.lru_cache(maxsize=8192)
def fit_tool_call_id(call_id: str, rule: ToolCallIds) -> str:
    """``call_id`` if it fits ``rule``, else a stable stand-in that does: the same id gives the
    same stand-in in every request, so a call and its result still match and the request
    prefix stays the same for the provider's prompt cache."""
    if rule == "any":
        return call_id
    pattern = _ALNUM9 if rule == "alnum9" else _WORD_ID
    if pattern.fullmatch(call_id):
        return call_id
    digest = int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=8).digest(), "big")
    out = []
    for _ in range(9):
        digest, r = divmod(digest, len(_ID_ALPHABET))
        out.append(_ID_ALPHABET[r])
    return "".join(out)


def new_tool_call_id() -> str:
    """An id for a call a server sent without one: 9 letters and digits, which every dialect
    takes (Mistral takes nothing else)."""
    import secrets

    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


# -- the profiles ---------------------------------------------------------------------------------

_BASE = Dialect()
PROFILES: dict[str, Dialect] = {
    # https://platform.openai.com/docs/api-reference/chat/create: max_tokens is deprecated and
    # "not compatible with o-series models"; max_completion_tokens works for every model. Its
    # request schema is strict: unknown message fields are refused.
    "openai": replace(_BASE, provider="openai", token_parameter="max_completion_tokens"),
    # https://learn.microsoft.com/azure/ai-foundry/openai/reference: the key in an api-key
    # header, api-version in the query of /openai/deployments/<name>/... paths.
    "azure": replace(_BASE, provider="azure", auth="api-key"),
    # https://api-docs.deepseek.com/guides/thinking_mode: in thinking mode a tool turn needs the
    # reasoning_content of each assistant message that made calls.
    "deepseek": replace(_BASE, provider="deepseek", reasoning_back="with_calls"),
    # https://ai.google.dev/gemini-api/docs/openai and /thought-signatures: each tool call's
    # extra_content.google.thought_signature must come back (Gemini 3).
    "gemini": replace(_BASE, provider="gemini", extra_content_back=True),
    # https://docs.mistral.ai/api/: ids of 9 letters and digits; older deployments refuse
    # unknown fields (stream_options) with 422; usage comes in the last chunk anyway.
    "mistral": replace(_BASE, provider="mistral", tool_call_ids="alnum9", stream_usage=False),
    # https://console.groq.com/docs/openai: usage in x_groq.usage of the last chunk;
    # stream_options refused by older deployments.
    "groq": replace(_BASE, provider="groq", stream_usage=False),
    # https://openrouter.ai/docs/use-cases/reasoning-tokens: reasoning_details must come back
    # with tool calls to keep the reasoning (Gemini 3, Claude) going.
    "openrouter": replace(_BASE, provider="openrouter", reasoning_details_back=True),
    # https://docs.anthropic.com/en/api/openai-sdk: tool_use ids are ^[a-zA-Z0-9_-]+$.
    "anthropic": replace(_BASE, provider="anthropic", tool_call_ids="word"),
    # https://github.com/ollama/ollama/blob/main/docs/openai.md
    "ollama": replace(_BASE, provider="ollama"),
    # https://docs.vllm.ai/en/latest/features/reasoning_outputs.html: reasoning_content taken
    # back in assistant messages (templates of gpt-oss, Qwen3 use it).
    "vllm": replace(_BASE, provider="vllm", reasoning_back="with_calls"),
    # llama.cpp's server: reasoning_content in and out; builds before mid 2025 refuse
    # content null (https://github.com/ggml-org/llama.cpp/issues/12779).
    "llamacpp": replace(
        _BASE, provider="llamacpp", reasoning_back="with_calls", null_content=False
    ),
    # LM Studio 2024 refused content null with tool calls (lmstudio-bug-tracker issue 95).
    "lmstudio": replace(_BASE, provider="lmstudio", null_content=False),
    "generic": _BASE,
}

_HOSTS: tuple[tuple[str, str], ...] = (
    ("api.openai.com", "openai"),
    (".openai.azure.com", "azure"),
    (".cognitiveservices.azure.com", "azure"),
    (".services.ai.azure.com", "azure"),
    ("api.deepseek.com", "deepseek"),
    ("generativelanguage.googleapis.com", "gemini"),
    ("api.mistral.ai", "mistral"),
    ("api.groq.com", "groq"),
    ("openrouter.ai", "openrouter"),
    ("api.anthropic.com", "anthropic"),
)
# Default ports of local servers that nothing else uses by default.
_PORTS = {11434: "ollama", 1234: "lmstudio"}
# OpenAI's reasoning models (also behind a router's "openai/" prefix or an Azure deployment of
# that name): gpt-5, gpt-5.1-mini, o1, o3-mini, o4-mini, ...
_OPENAI_REASONING = re.compile(r"^(?:[\w.-]+/)?(?:o\d|gpt-5)", re.IGNORECASE)
# Mistral's models need its ids wherever they are served (vLLM, llama.cpp, mlx, Ollama).
_MISTRAL_FAMILY = re.compile(
    r"mistral|mixtral|devstral|magistral|codestral|ministral|pixtral", re.IGNORECASE
)
# Models whose template opens the reasoning block (on servers that may leave it in the text).
_TEMPLATE_THINK = re.compile(r"r1[-_]distill|deepseek[-_:]?r1|qwq", re.IGNORECASE)
_LOCAL = frozenset({"ollama", "vllm", "llamacpp", "lmstudio", "generic"})
# DeepSeek R1 refuses reasoning_content in input messages.
_DEEPSEEK_R1 = re.compile(r"deepseek[-_/]?r1|(?:^|/)r1[-_]", re.IGNORECASE)


def detect_provider(base_url: str) -> str:
    """The provider a base URL belongs to ("openai" for no URL), else "generic"."""
    if not base_url:
        return "openai"
    try:
        parts = urlsplit(base_url)
        # "api.openai.com." is the same host (a fully qualified name); any text before an
        # "@" is user info, not the host (the client sends the request where this says).
        host, port = (parts.hostname or "").lower().rstrip("."), parts.port
    except ValueError:
        return "generic"
    for suffix, name in _HOSTS:
        if host == suffix.lstrip(".") or (suffix.startswith(".") and host.endswith(suffix)):
            return name
    if port in _PORTS:
        return _PORTS[port]
    return "generic"


def dialect_for(
    provider: str, base_url: str, model: str, overrides: dict[str, Any] | None = None
) -> Dialect:
    """The dialect of one endpoint: its provider's profile ("auto": detected), adjusted for
    the model, then ``overrides`` (``llm.dialect``) on top."""
    name = detect_provider(base_url) if provider == "auto" else provider
    dialect = PROFILES.get(name, _BASE)
    if _OPENAI_REASONING.search(model) and name not in ("openrouter", "anthropic", "ollama"):
        # OpenRouter and Anthropic translate max_tokens themselves; Ollama's gpt-oss is not
        # one of these (the pattern does not match it anyway).
        dialect = replace(dialect, token_parameter="max_completion_tokens", send_temperature=False)
    if _MISTRAL_FAMILY.search(model):
        dialect = replace(dialect, tool_call_ids="alnum9")
    if _DEEPSEEK_R1.search(model):
        dialect = replace(dialect, reasoning_back="never")
    if name in _LOCAL and _TEMPLATE_THINK.search(model):
        dialect = replace(dialect, template_opens_think=True)
    return dialect.with_overrides(overrides or {})


# -- what comes back -------------------------------------------------------------------------------

# Reasoning a server left inside the text (LM Studio without a reasoning parser, many local
# models): a leading <think>...</think> block, or the tail of one whose opening tag the chat
# template wrote (DeepSeek-R1 distills, QwQ): "...reasoning...</think>answer".
_LEADING_THINK = re.compile(
    r"\A\s*<(think|thinking|reasoning)>(.*?)(?:</\1>\s*|\Z)", re.DOTALL | re.IGNORECASE
)
_TRAILING_CLOSE = re.compile(r"\A(.*?)</(think|thinking|reasoning)>\s*", re.DOTALL | re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of a content string that may open with a reasoning block.
    An unclosed block is all reasoning (the answer has not started yet, or never did)."""
    if "<" not in text:
        return "", text
    m = _LEADING_THINK.match(text)
    if m:
        return m.group(2).strip(), text[m.end() :]
    m = _TRAILING_CLOSE.match(text)
    # Only a prefix that reads as plain reasoning: a text that quotes the tag is about it.
    if m and "<" not in m.group(1) and "`" not in m.group(1):
        return m.group(1).strip(), text[m.end() :]
    return "", text


_TAGS = ("think", "thinking", "reasoning")
_OPENERS = tuple(f"<{t}>" for t in _TAGS)
_CLOSERS = tuple(f"</{t}>" for t in _TAGS)
_CLOSER_OF = {t: re.compile(f"</{t}>", re.IGNORECASE) for t in _TAGS}
_LONGEST_TAG = max(len(t) for t in _CLOSERS)
_ANY_CLOSER = re.compile("|".join(_CLOSERS), re.IGNORECASE)
_NOT_SPACE = re.compile(r"\S")
_MARK = re.compile(r"[<`]")


class ReasoningSplitter:
    """``split_reasoning(text)[1]`` for a text that only grows (a stream's), in time linear
    in the text over all the calls: split_reasoning of the whole text on every piece made a
    streamed answer with a "<" in it, or a long <think> block, quadratic (20,000 pieces of
    HTML: 30 s of the event loop's CPU).

    Whether the text has a reasoning block is decided by its first non-space character
    (an opening tag) or its first "<" or "`" (a closing tag, the opening one left in the
    template): once decided, only the new part of the text is read."""

    __slots__ = ("_close", "_end", "_lead", "_scan", "_state")

    def __init__(self, opened: bool = False) -> None:
        """``opened``: the model's chat template wrote the opening tag (``Dialect.
        template_opens_think``), so the text is reasoning until a closing tag."""
        self._state = "open"  # "open" (not known yet), "plain", "block", "answer"
        self._lead = -1  # where the first non-space character is, once there is one
        self._scan = 0  # where the reading goes on
        self._close: re.Pattern[str] | None = None  # the open block's closing tag
        self._end = 0  # where the answer starts (after the closing tag)
        if opened:
            self._state, self._close = "block", _ANY_CLOSER

    def answer(self, text: str) -> str:
        """The part of ``text`` a person may see; ``text`` extends the one of the last call."""
        if self._state == "open":
            self._decide(text)
        if self._state == "block":
            assert self._close is not None
            m = self._close.search(text, self._scan)
            if m is None:
                # The closing tag may be cut between this piece and the next.
                self._scan = max(self._scan, len(text) - _LONGEST_TAG)
                return ""
            self._state, self._end = "answer", m.end()
        if self._state == "answer":
            return text[self._end :].lstrip()
        return text  # "plain", or "open": no block (yet) that split_reasoning would take out

    def _decide(self, text: str) -> None:
        if self._lead < 0:
            m = _NOT_SPACE.search(text, self._scan)
            if m is None:
                self._scan = len(text)
                return
            self._lead = self._scan = m.start()
        lead = self._lead
        if text[lead] == "<":
            head = text[lead : lead + _LONGEST_TAG].lower()
            for tag, opener in zip(_TAGS, _OPENERS, strict=True):
                if head.startswith(opener):
                    self._state, self._close = "block", _CLOSER_OF[tag]
                    self._scan = lead + len(opener)
                    return
            if len(head) < _LONGEST_TAG and any(o.startswith(head) for o in _OPENERS):
                return  # an opening tag, perhaps, cut short
        m = _MARK.search(text, self._scan)
        if m is None:
            self._scan = len(text)
            return
        self._scan = at = m.start()
        rest = text[at : at + _LONGEST_TAG].lower()
        if rest[0] == "`":
            self._state = "plain"  # split_reasoning: a text that quotes a tag is about it
            return
        for closer in _CLOSERS:
            if rest.startswith(closer):
                self._state, self._end = "answer", at + len(closer)
                return
        if not any(c.startswith(rest) for c in _CLOSERS):
            self._state = "plain"


def reasoning_of(message: dict[str, Any]) -> str:
    """A message's (or a delta's) reasoning text, whichever field its server uses:
    ``reasoning_content`` (DeepSeek, vLLM, llama.cpp) or ``reasoning`` (OpenRouter, Ollama,
    newer vLLM)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def merge_reasoning_details(into: list[dict[str, Any]], pieces: Any) -> None:
    """Add streamed ``reasoning_details`` pieces to ``into``: pieces of one block (the same
    ``index`` and ``type``) are joined, as OpenRouter's docs ask before sending them back."""
    if not isinstance(pieces, list):
        return
    for piece in pieces:
        if not isinstance(piece, dict):
            continue
        last = into[-1] if into else None
        same = (
            last is not None
            and "index" in piece
            and last.get("index") == piece.get("index")
            and last.get("type") == piece.get("type")
        )
        if not same:
            into.append(dict(piece))
            continue
        assert last is not None
        for key, value in piece.items():
            if key in ("text", "summary", "data") and isinstance(value, str):
                last[key] = (last.get(key) or "") + value
            elif value is not None:
                last[key] = value
