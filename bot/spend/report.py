"""Reading the usage ledger back: totals over local days, grouped, worded for a person or as
JSON. ``memobot usage``, ``/usage``, ``memobot status`` and the panel's Usage screen read
through here, so they never disagree."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

from bot.spend.ledger import read_records
from bot.spend.record import CallRecord
from bot.wording import counted

By = Literal["session", "purpose", "model", "day"]
BY: tuple[By, ...] = ("session", "purpose", "model", "day")


@dataclass(slots=True)
class Totals:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated_calls: int = 0  # the provider sent no usage: tokens estimated
    unpriced_calls: int = 0  # no llm.prices entry for the model: tokens only
    costs: dict[str, float] = field(default_factory=dict)  # by currency

    def add(self, rec: CallRecord) -> None:
        self.calls += 1
        self.prompt_tokens += rec.prompt_tokens
        self.completion_tokens += rec.completion_tokens
        self.cached_tokens += rec.cached_tokens
        self.estimated_calls += rec.estimated
        if rec.cost is None:
            self.unpriced_calls += 1
        else:
            currency = rec.currency or "USD"
            self.costs[currency] = self.costs.get(currency, 0.0) + rec.cost

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost(self) -> float | None:
        """The cost in the one currency the priced calls were in; None when no call was
        priced, or when they were in several (``costs`` has each)."""
        if len(self.costs) != 1:
            return None
        return round(next(iter(self.costs.values())), 9)

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cost": self.cost,
            "currency": next(iter(self.costs)) if len(self.costs) == 1 else None,
            "costs": {k: round(v, 9) for k, v in sorted(self.costs.items())},
            "estimated_calls": self.estimated_calls,
            "unpriced_calls": self.unpriced_calls,
        }

    def cost_text(self) -> str:
        """ "0.0123 USD", several currencies joined with "+", "" when nothing was priced."""
        return " + ".join(f"{v:,.4f} {k}" for k, v in sorted(self.costs.items()))

    def describe(self) -> str:
        """One line: "3 calls, 12,345 tokens (10,000 prompt of which 2,000 cached, 2,345
        completion), 0.0123 USD", saying when tokens were estimated or calls unpriced."""
        if not self.calls:
            return "no model calls"
        cached = f" of which {self.cached_tokens:,} cached" if self.cached_tokens else ""
        text = (
            f"{counted(self.calls, 'call')}, {self.tokens:,} tokens ({self.prompt_tokens:,} "
            f"prompt{cached}, {self.completion_tokens:,} completion)"
        )
        if self.costs:
            text += f", {self.cost_text()}"
        notes = []
        if self.estimated_calls:
            notes.append(f"{self.estimated_calls:,} estimated")
        if self.unpriced_calls:
            notes.append(f"{self.unpriced_calls:,} without a price")
        return text + (f" ({'; '.join(notes)})" if notes else "")


def day_bounds(first: date, last: date, tz: ZoneInfo) -> tuple[str, str]:
    """The UTC instants (as the ledger writes them) from the start of local day ``first`` to
    the end of local day ``last``."""

    def utc(day: date) -> str:
        moment = datetime.combine(day, time(), tzinfo=tz).astimezone(UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    return utc(first), utc(last + timedelta(days=1))


def local_day(at: str, tz: ZoneInfo) -> str:
    return datetime.fromisoformat(at).astimezone(tz).date().isoformat()


def _key(by: By, tz: ZoneInfo) -> Callable[[CallRecord], str]:
    if by == "day":
        return lambda rec: local_day(rec.at, tz)
    return lambda rec: getattr(rec, by) or "(none)"


@dataclass(slots=True)
class Report:
    since: date
    until: date
    by: By | None
    total: Totals
    groups: dict[str, Totals]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "total": self.total.as_json(),
        }
        if self.by is not None:
            out["by"] = self.by
            out["groups"] = {k: t.as_json() for k, t in self.ordered()}
        return out

    def ordered(self) -> list[tuple[str, Totals]]:
        """Days in order; anything else the largest first."""
        if self.by == "day":
            return sorted(self.groups.items())
        return sorted(self.groups.items(), key=lambda kv: (-kv[1].tokens, kv[0]))

    def table(self) -> list[str]:
        """The report as aligned lines for a terminal."""
        head = f"usage {self.since.isoformat()} to {self.until.isoformat()}"
        rows = [(k, t) for k, t in self.ordered()] if self.by else []
        rows.append(("total", self.total))
        name = self.by or ""
        width = max([len(name), *(len(k) for k, _ in rows)])
        lines = [
            head + (f", by {self.by}" if self.by else ""),
            f"{name:<{width}}  {'calls':>7}  {'prompt':>12}  {'cached':>12}  "
            f"{'completion':>12}  cost",
        ]
        for key, t in rows:
            lines.append(
                f"{key:<{width}}  {t.calls:>7,}  {t.prompt_tokens:>12,}  {t.cached_tokens:>12,}  "
                f"{t.completion_tokens:>12,}  {t.cost_text() or '-'}"
            )
        return lines + self.notes()

    def notes(self) -> list[str]:
        """What the figures cannot say: calls estimated, calls without a price."""
        out = []
        if self.total.estimated_calls:
            out.append(
                f"{counted(self.total.estimated_calls, 'call')} without usage from the "
                "provider: tokens estimated."
            )
        if self.total.unpriced_calls:
            out.append(
                f"{counted(self.total.unpriced_calls, 'call')} of a model without a price in "
                "llm.prices: tokens only."
            )
        return out


def summarise(
    records: Iterable[CallRecord], key: Callable[[CallRecord], str] | None = None
) -> tuple[Totals, dict[str, Totals]]:
    total, groups = Totals(), {}
    for rec in records:
        total.add(rec)
        if key is not None:
            k = key(rec)
            group = groups.get(k)
            if group is None:
                group = groups[k] = Totals()
            group.add(rec)
    return total, groups


def report(
    state_dir: Path,
    tz: ZoneInfo,
    since: date,
    until: date,
    by: By | None = None,
    session: str | None = None,
) -> Report:
    """The calls of local days ``since`` to ``until`` (both included), of one ``session`` or
    of all."""
    start, end = day_bounds(since, until, tz)
    records = read_records(state_dir, start, end)
    if session is not None:
        records = (r for r in records if r.session == session)
    total, groups = summarise(records, _key(by, tz) if by else None)
    return Report(since, until, by, total, groups)


def today(tz: ZoneInfo, now: datetime | None = None) -> date:
    return (now or datetime.now(UTC)).astimezone(tz).date()


def window(
    tz: ZoneInfo, since: date | None, until: date | None, now: datetime | None = None
) -> tuple[date, date]:
    """The local days a report covers when ``since`` or ``until`` is not given: up to today,
    from the first of ``until``'s month (``memobot usage`` and the panel alike)."""
    until = until or today(tz, now)
    return since or until.replace(day=1), until


@dataclass(slots=True)
class Recent:
    """Today's and this month's totals (local days), and this month's by purpose and session."""

    today: Totals
    month: Totals
    by_purpose: dict[str, Totals]
    by_session: dict[str, Totals]


def recent(
    state_dir: Path, tz: ZoneInfo, session: str | None = None, now: datetime | None = None
) -> Recent:
    """One read of this month's ledger (and the last UTC month's, near its start)."""
    day = today(tz, now)
    first = day.replace(day=1)
    start, end = day_bounds(first, day, tz)
    today_start, _ = day_bounds(day, day, tz)
    month, today_totals = Totals(), Totals()
    by_purpose: dict[str, Totals] = {}
    by_session: dict[str, Totals] = {}
    for rec in read_records(state_dir, start, end):
        if session is not None and rec.session != session:
            continue
        month.add(rec)
        by_purpose.setdefault(rec.purpose, Totals()).add(rec)
        by_session.setdefault(rec.session, Totals()).add(rec)
        if rec.at >= today_start:
            today_totals.add(rec)
    return Recent(today_totals, month, by_purpose, by_session)


def status_text(state_dir: Path, tz: ZoneInfo) -> str:
    """``memobot status``'s usage row."""
    seen = recent(state_dir, tz)
    return f"today {seen.today.describe()}; this month {seen.month.describe()}"


def chat_text(state_dir: Path, tz: ZoneInfo, session: str | None) -> str:
    """The answer to ``/usage``: ``session``'s own figures, or (None: an admin) everyone's,
    with this month's split by purpose and the chats that used most."""
    seen = recent(state_dir, tz, session)
    whose = f"this chat ({session})" if session is not None else "every chat"
    lines = [
        f"Model usage of {whose}:",
        f"today: {seen.today.describe()}",
        f"this month: {seen.month.describe()}",
    ]
    if seen.by_purpose:
        ranked = sorted(seen.by_purpose.items(), key=lambda kv: -kv[1].tokens)
        lines.append("this month by purpose:")
        lines += [f"  {name}: {t.describe()}" for name, t in ranked]
    if session is None and seen.by_session:
        ranked = sorted(seen.by_session.items(), key=lambda kv: -kv[1].tokens)[:5]
        lines.append("this month's busiest chats:")
        lines += [f"  {name or '(none)'}: {t.describe()}" for name, t in ranked]
    return "\n".join(lines)
