"""One model call as the usage ledger keeps it: who asked for what, what it took, what it cost.

Tokens are the provider's own figures (``usage`` of the answer, the last chunk of a stream with
``stream_options.include_usage``). A provider that sends none gets an estimate
(:mod:`bot.tokens`) and the record says so (``estimated``). The cost is priced from
``llm.prices`` by the model's configured name; a model without a price has no cost (None),
never a guessed one. Cached tokens are part of the prompt tokens, as OpenAI counts them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from bot.config import PriceConfig
from bot.tokens import estimate_message_tokens, estimate_text_tokens

# Why a call was made. A person's turn is "turn" for its first call and "tool_iteration" for
# each call that follows tool results; a heartbeat's or a scheduled job's calls are all theirs.
TURN = "turn"
TOOL_ITERATION = "tool_iteration"
HEARTBEAT = "heartbeat"
JOB = "job"
CONSOLIDATION = "consolidation"
DREAM = "dream"
PROBE = "probe"  # the one-token request that finds the end of a model outage
# A background task's calls (bot.tasks): background work, so a chat's own budget is not
# renewed for each task it starts (a task's session is a chat of its own).
TASK = "task"
PURPOSES = (TURN, TOOL_ITERATION, HEARTBEAT, JOB, CONSOLIDATION, DREAM, PROBE, TASK)
# Work nobody waits for (the budgets of issue 31 treat it apart).
BACKGROUND = frozenset({HEARTBEAT, JOB, CONSOLIDATION, DREAM, TASK})

PER = 1_000_000  # prices are per million tokens


class CallRecord(NamedTuple):
    """One line of ``<state>/usage/YYYY-MM.jsonl``. Immutable like a frozen dataclass, and
    made in a sixth of its time: a report reads a month of them (100,000 for a busy bot)."""

    id: str  # unique per call: a resumed turn's new call is a new record
    at: str  # UTC, "2026-12-06T17:50:01Z": sorts and compares as text
    session: str
    purpose: str
    model: str
    endpoint: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    estimated: bool
    cost: float | None
    currency: str | None

    @property
    def month(self) -> str:
        return self.at[:7]

    def line(self) -> bytes:
        record: dict[str, Any] = {
            "id": self.id,
            "at": self.at,
            "session": self.session,
            "purpose": self.purpose,
            "model": self.model,
            "endpoint": self.endpoint,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }
        if self.estimated:
            record["estimated"] = True
        if self.cost is not None:
            record["cost"] = self.cost
            record["currency"] = self.currency
        return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, obj: Any) -> CallRecord | None:
        """The record on a ledger line, or None for a line that is not one. (A month of a
        busy installation is 100,000 lines: the checks are written to be cheap.)"""
        try:
            at, session = obj["at"], obj["session"]
            counts = (obj["prompt_tokens"], obj["completion_tokens"], obj["cached_tokens"])
        except (KeyError, TypeError, IndexError):
            return None
        if type(at) is not str or type(session) is not str:
            return None
        if any(type(n) is not int or n < 0 for n in counts):  # a bool is no count either
            return None
        cost = obj.get("cost")
        priced = type(cost) is float or type(cost) is int
        return cls(
            str(obj.get("id", "")),
            at,
            session,
            str(obj.get("purpose", "")),
            str(obj.get("model", "")),
            str(obj.get("endpoint", "")),
            *counts,
            obj.get("estimated") is True,
            float(cost) if priced else None,
            str(obj.get("currency") or "USD") if priced else None,
        )


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reported(usage: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(prompt, completion, cached) tokens as the provider reported them, or None when it did
    not (no usage, or one without both counts). Cached: OpenAI's
    ``prompt_tokens_details.cached_tokens``, DeepSeek's ``prompt_cache_hit_tokens``."""
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = _count(usage.get("prompt_cache_hit_tokens"))
    return prompt, completion, min(cached or 0, prompt)


def estimated(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    answer: dict[str, Any],
) -> tuple[int, int]:
    """(prompt, completion) tokens estimated from what was sent and what came back."""
    prompt = sum(estimate_message_tokens(m) for m in messages)
    if tools:
        prompt += estimate_text_tokens(json.dumps(tools, ensure_ascii=False))
    return prompt, estimate_message_tokens(answer)


def cost_of(
    price: PriceConfig | None, prompt: int, completion: int, cached: int
) -> tuple[float | None, str | None]:
    """What the tokens cost at ``price`` (per million), and its currency; (None, None) when
    there is no price."""
    if price is None:
        return None, None
    cached_price = price.input if price.cached_input is None else price.cached_input
    paid = (prompt - cached) * price.input + cached * cached_price + completion * price.output
    total = paid / PER
    return round(total, 9), price.currency


def make_record(
    *,
    session: str,
    purpose: str,
    model: str,
    endpoint: str,
    usage: Mapping[str, Any],
    prices: Mapping[str, PriceConfig],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    answer: Callable[[], dict[str, Any]],
) -> CallRecord:
    """The ledger's record of one answered call (``answer()`` gives its assistant message,
    asked only when the provider reported no usage)."""
    counts = reported(usage)
    guessed = counts is None
    if counts is None:
        prompt, completion = estimated(messages, tools, answer())
        counts = (prompt, completion, 0)
    prompt, completion, cached = counts
    cost, currency = cost_of(prices.get(model), prompt, completion, cached)
    return CallRecord(
        secrets.token_hex(8),
        now_utc(),
        session,
        purpose,
        model,
        endpoint,
        prompt,
        completion,
        cached,
        guessed,
        cost,
        currency,
    )
