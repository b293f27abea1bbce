"""Budgets that hold (issue 31): a model call is refused before it is made once a limit of its
scope is spent; a call already under way finishes, and is counted.

Cheap on the message path: the totals of the current local day and month (``agent.timezone``)
are kept in memory, seeded once at start from this month's ledger file(s) and then added to by
the provider's meter, record by record. :meth:`Budget.check` compares a few numbers.

Scopes: ``total`` (every call but the outage probe), ``chat`` (a person's turns, by chat:
purposes ``turn`` and ``tool_iteration``, and the chat's scheduled agent jobs) and
``background`` (consolidation, Dream, heartbeat, scheduled agent jobs). A refused call
raises :class:`BudgetSpent`, an :class:`LLMError`: a person's turn answers with its text
(what is spent, and when it resets), the heartbeat tells nobody, consolidation archives the
raw text instead (no message is lost), Dream waits.

What lasts across restarts is one small file, ``<state>/budget.json``: the limits an admin set
from chat (``/budget``; the state folder, not the config, because a system service's config is
read-only to the daemon and the change must hold after a restart anyway) and which 80% / 100%
notices went to the admins this period, written before a notice is sent (a crash in between
loses that notice, never doubles it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from bot import durable
from bot.config import Config
from bot.llm import LLMError
from bot.spend.ledger import read_records
from bot.spend.limits import NAMES, PERIODS, UNITS, Period, Scope, Unit, limit_name
from bot.spend.record import BACKGROUND, JOB, PROBE, TASK, TOOL_ITERATION, TURN, CallRecord
from bot.spend.report import day_bounds

log = logging.getLogger(__name__)

FILE = "budget.json"
DAMAGED = ".damaged"  # budget.json's name with this: an unreadable one, kept aside
CHAT_PURPOSES = frozenset({TURN, TOOL_ITERATION})
# Held to their chat's limit as well: anyone let in may schedule an agent job in a chat, and
# a job run every few minutes was a way round a spent per-chat limit; and a background task,
# charged to the chat that started it (``Budget.charge_to``).
CHAT_AND_BACKGROUND = frozenset({JOB, TASK})
NOTICE_LEVELS = (80, 100)  # percent of a limit at which the admins are told, once a period
Meter = Callable[[CallRecord], Awaitable[None]]
Notify = Callable[[str], Awaitable[None]]
Clock = Callable[[], datetime]
SMALL_STEP_BACK = timedelta(days=1)  # a clock set back less: the day's totals are kept
UNSET = object()  # an override's absence (None is a lifted limit)


class BudgetSpent(LLMError):
    """A limit of the call's scope is spent: the call was not made. ``user_message`` says
    which, and when it resets."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.user_message = text


@dataclass(slots=True)
class Tally:
    tokens: int = 0
    cost: float = 0.0

    def add(self, rec: CallRecord) -> None:
        self.tokens += rec.prompt_tokens + rec.completion_tokens
        if rec.cost is not None:
            self.cost += rec.cost

    def used(self, unit: Unit) -> float:
        return self.tokens if unit == "tokens" else self.cost


@dataclass(slots=True)
class _Period:
    """One local day's or month's totals."""

    key: str  # "2026-12-06" or "2026-12"
    total: Tally = field(default_factory=Tally)
    background: Tally = field(default_factory=Tally)
    chats: dict[str, Tally] = field(default_factory=dict)

    def add(self, rec: CallRecord, chat: str) -> None:
        """Count ``rec``; ``chat``: the chat it is charged to (``Budget.chat_of``)."""
        self.total.add(rec)
        if rec.purpose in BACKGROUND:
            self.background.add(rec)
        if rec.purpose in CHAT_PURPOSES or rec.purpose in CHAT_AND_BACKGROUND:
            tally = self.chats.get(chat)
            if tally is None:
                tally = self.chats[chat] = Tally()
            tally.add(rec)

    def tally(self, scope: Scope, chat: str = "") -> Tally:
        if scope == "total":
            return self.total
        if scope == "background":
            return self.background
        return self.chats.get(chat) or Tally()


def budget_chat(session: str) -> str:
    """The chat a session's calls count against for ``budget.perChat``: a Telegram forum
    topic (``telegram:-100123:7``) and a Slack thread (``slack:C0123:1700000000.0001``) are
    sessions of their own, but their chat's limit is shared, or anyone could open a new topic
    or thread for a fresh one. (A Discord thread has an id of its own: it is its own chat.)"""
    channel, _, chat = session.partition(":")
    return f"{channel}:{chat.partition(':')[0]}" if chat else session


@dataclass(frozen=True, slots=True)
class Spent:
    scope: Scope
    period: Period
    unit: Unit
    used: float
    limit: float
    resets: datetime  # local

    def text(self, tz_name: str) -> str:
        whose = {
            "total": "This bot's",
            "chat": "This chat's",
            "background": "The background work's",
        }[self.scope]
        when = self.resets.strftime("%H:%M on %Y-%m-%d")
        return (
            f"{whose} {self.period} model budget is spent ({amount(self.unit, self.used)} of "
            f"{amount(self.unit, self.limit)}), so this was not sent to the model. It resets "
            f"at {when} ({tz_name}); an admin can raise it with /budget."
        )


def amount(unit: Unit, value: float) -> str:
    return f"{int(value):,} tokens" if unit == "tokens" else f"{value:,.4f} (cost)"


def _tz_name(tz: ZoneInfo) -> str:
    return getattr(tz, "key", None) or str(tz)


class Budget:
    """The running totals, the limits (config, then /budget's overrides), the check before a
    call and the notices. One per process, built with the provider (``bot.app``)."""

    def __init__(
        self,
        cfg: Config,
        tz: ZoneInfo,
        notify: Notify | None = None,
        now: Clock | None = None,
    ) -> None:
        """``cfg``: the live config (a reload's new limits hold at once). ``notify``: tells
        the admins (an ``AdminNotice`` on the bus). ``now``: the clock (UTC), for tests."""
        self.cfg = cfg
        self.tz = tz
        self.notify = notify
        self.now = now or (lambda: datetime.now(UTC))
        self.path = cfg.agent.state_path / FILE
        self.overrides: dict[str, dict[str, Any]] = {}
        self._noticed: set[str] = set()
        self._due: list[str] = []  # notices decided, not yet recorded and sent
        self._paused_logged: set[str] = set()
        self._charged: dict[str, str] = {}  # a task's session -> the chat that started it
        self._saving = asyncio.Lock()
        self._damaged = False  # budget.json was there and could not be read
        self._latest = self._local()  # the latest clock reading seen (see _roll)
        day, month = self._keys()
        self.day, self.month = _Period(day), _Period(month)
        self._load()
        self._seed()

    # -- periods ----------------------------------------------------------------------------

    def _local(self) -> datetime:
        return self.now().astimezone(self.tz)

    def _keys(self) -> tuple[str, str]:
        today = self._local().date()
        return today.isoformat(), today.isoformat()[:7]

    def _roll(self) -> None:
        """A new local day (month) starts its totals from nothing. Only a later one, when the
        clock went back less than a day (NTP's small step back over midnight must not wipe
        today's totals); a larger step back is a wrong clock corrected, and its day counts."""
        now = self._local()
        back = self._latest - now > SMALL_STEP_BACK
        self._latest = now if back else max(self._latest, now)
        day, month = now.date().isoformat(), now.date().isoformat()[:7]
        if day > self.day.key or (back and day != self.day.key):
            self.day = _Period(day)
        if month > self.month.key or (back and month != self.month.key):
            self.month = _Period(month)

    def _period(self, period: Period) -> _Period:
        return self.day if period == "daily" else self.month

    def resets(self, period: Period) -> datetime:
        """The local moment ``period``'s totals start again."""
        today = self._local().date()
        if period == "daily":
            first = today + timedelta(days=1)
        else:
            first = date(today.year + today.month // 12, today.month % 12 + 1, 1)
        return datetime.combine(first, time(), tzinfo=self.tz)

    def _seed(self) -> None:
        """This local month's calls from the ledger: read once, at start."""
        today = self._local().date()
        start, end = day_bounds(today.replace(day=1), today, self.tz)
        today_start = day_bounds(today, today, self.tz)[0]
        try:
            for rec in read_records(self.cfg.agent.state_path, start, end):
                self.month.add(rec, self.chat_of(rec.session))
                if rec.at >= today_start:
                    self.day.add(rec, self.chat_of(rec.session))
        except OSError as exc:
            log.error("budget: cannot read the usage ledger, totals start at 0: %s", exc)

    # -- limits -----------------------------------------------------------------------------

    def limit(self, scope: Scope, period: Period, unit: Unit) -> float | None:
        """The limit in force: /budget's override if there is one, else the config's."""
        name = limit_name(scope, period, unit)
        override = self.overrides.get(name)
        if override is not None:
            value = override.get("value")
            return None if value is None else float(value)
        value = getattr(self.cfg.budget.limit(scope, period), unit)
        return None if value is None else float(value)

    def spent(self, session: str, purpose: str) -> Spent | None:
        """The first limit of a call's scopes that is used up, or None."""
        if purpose == PROBE:
            return None  # one token that finds the end of an outage
        self._roll()
        scopes: tuple[Scope, ...] = ("total",)
        if purpose in CHAT_AND_BACKGROUND:
            scopes = ("total", "background", "chat")
        elif purpose in BACKGROUND:
            scopes = ("total", "background")
        elif purpose in CHAT_PURPOSES:
            scopes = ("total", "chat")
        chat = self.chat_of(session)
        for scope in scopes:
            for period in PERIODS:
                tally = self._period(period).tally(scope, chat)
                for unit in UNITS:
                    limit = self.limit(scope, period, unit)
                    if limit is not None and tally.used(unit) >= limit:
                        return Spent(
                            scope, period, unit, tally.used(unit), limit, self.resets(period)
                        )
        return None

    def check(self, session: str, purpose: str) -> None:
        """Before a call: raise :class:`BudgetSpent` when a limit of its scope is spent."""
        spent = self.spent(session, purpose)
        if spent is None:
            return
        name = limit_name(spent.scope, spent.period, spent.unit)
        if spent.scope != "chat":
            # Logged once a period and limit: a paused heartbeat would repeat it every tick.
            key = f"{name}={spent.limit}@{self._period(spent.period).key}"
            if key not in self._paused_logged:
                self._paused_logged.add(key)
                log.warning(
                    "budget %s spent (%s of %s): model calls of its scope paused until %s",
                    name,
                    amount(spent.unit, spent.used),
                    amount(spent.unit, spent.limit),
                    spent.resets.isoformat(),
                )
        log.info(
            "model call refused session=%s purpose=%s: budget %s spent", session, purpose, name
        )
        raise BudgetSpent(spent.text(_tz_name(self.tz)))

    # -- counting and notices ---------------------------------------------------------------

    def charge_to(self, session: str, chat_session: str) -> None:
        """Charge ``session``'s calls to ``chat_session``'s chat: a background task's to the
        chat that started it, or a group member could spend past its per-chat limit by
        starting tasks (each in a session of its own). Known while the task runs in this
        process; a task's calls read from the ledger at start count as its own."""
        self._charged[session] = chat_session

    def chat_of(self, session: str) -> str:
        """The chat ``session``'s calls count against for ``budget.perChat``."""
        return budget_chat(self._charged.get(session, session))

    def observe(self, rec: CallRecord) -> None:
        """Add an answered call to the totals; decide the notices it makes due."""
        self._roll()
        chat = self.chat_of(rec.session)
        self.day.add(rec, chat)
        self.month.add(rec, chat)
        self._crossed(rec.purpose in BACKGROUND)

    def _crossed(self, background: bool) -> None:
        """Make due the notices of the installation-wide limits now at 80% or 100% that
        were not given this period (``background``: of the background limits too)."""
        for scope in ("total", "background") if background else ("total",):
            for period in PERIODS:
                used = self._period(period).tally(scope)
                for unit in UNITS:
                    limit = self.limit(scope, period, unit)
                    if limit is None:
                        continue
                    for level in NOTICE_LEVELS:
                        if used.used(unit) < limit * level / 100:
                            break  # the levels rise: none higher is reached either
                        key = self._notice_key(scope, period, unit, limit, level)
                        if key not in self._noticed:
                            self._noticed.add(key)
                            self._due.append(
                                self._notice_text(scope, period, unit, used.used(unit), limit)
                            )

    def _notice_key(
        self, scope: Scope, period: Period, unit: Unit, limit: float, level: int
    ) -> str:
        # The limit is in the key: a raised limit earns its own notices.
        return f"{self._period(period).key}/{limit_name(scope, period, unit)}={limit:g}/{level}"

    def _notice_text(
        self, scope: Scope, period: Period, unit: Unit, used: float, limit: float
    ) -> str:
        share = int(used * 100 / limit)
        what = "background work's" if scope == "background" else "whole bot's"
        head = (
            f"Budget: the {what} {period} limit ({limit_name(scope, period, unit)}) is at {share}%"
        )
        figures = f"{amount(unit, used)} of {amount(unit, limit)}"
        resets = self.resets(period).strftime("%Y-%m-%d %H:%M")
        if used >= limit:
            return (
                f"{head}: {figures}. Model calls of its scope are paused until {resets} "
                f"({_tz_name(self.tz)}); consolidation archives the raw text meanwhile. "
                "Raise or lift it with /budget."
            )
        return f"{head}: {figures}. Calls stop at 100% until {resets}."

    async def announce(self) -> None:
        """Record, then send, the notices ``observe`` made due."""
        if not self._due:
            return
        due, self._due = self._due, []
        try:
            await self._save()
        except OSError as exc:
            # Not sent: a notice that cannot be recorded could be sent again after a restart.
            log.error("budget: cannot record %d notice(s), not sent: %s", len(due), exc)
            return
        for text in due:
            log.warning("budget notice: %s", text)
            if self.notify is not None:
                await self.notify(text)

    def metered(self, record: Meter) -> Meter:
        """The provider's meter: the ledger's ``record``, with the totals kept up to date."""

        async def meter(rec: CallRecord) -> None:
            self.observe(rec)  # before the write: a call meanwhile sees it
            await record(rec)
            await self.announce()

        return meter

    # -- /budget ----------------------------------------------------------------------------

    async def command(self, args: str, who: str) -> str:
        """``/budget`` (an admin's): show the limits, or set one (``NAME VALUE``, ``NAME
        off``: no limit, ``NAME default``: the config's again)."""
        words = args.split()
        if not words:
            return self.describe()
        if len(words) != 2:
            return BUDGET_USAGE
        name, value_text = words[0].removeprefix("budget."), words[1].lower()
        if name not in NAMES:
            return f"No limit called {name!r}. " + BUDGET_USAGE
        scope, period, unit = NAMES[name]
        before = self.limit(scope, period, unit)
        previous = self.overrides.get(name)
        if value_text == "default":
            if self.overrides.pop(name, None) is None:
                return f"{name} already follows the config."
        else:
            value = _parse_value(unit, value_text)
            if value is UNSET:
                return f"{words[1]!r} is not a limit in {unit}. " + BUDGET_USAGE
            self.overrides[name] = {"value": value, "by": who, "at": _iso(self.now())}
        try:
            await self._save()
        except OSError as exc:
            log.error("budget: cannot record the change of %s by %s: %s", name, who, exc)
            if previous is None:
                self.overrides.pop(name, None)
            else:
                self.overrides[name] = previous
            return "I could not record the change (a disk problem; see the logs)."
        # A lowered limit may be at 80% or spent already: the admins hear of it now.
        self._crossed(background=True)
        await self.announce()
        after = self.limit(scope, period, unit)
        log.info(
            "budget %s changed by %s from chat: %s -> %s",
            name,
            who,
            _shown(before, unit),
            _shown(after, unit),
        )
        return (
            f"{name}: {_shown(before, unit)} -> {_shown(after, unit)} "
            "(kept over restarts; '/budget " + name + " default' goes back to the config)."
        )

    def describe(self) -> str:
        """Every limit in force with its use, and what is paused (/budget, /status)."""
        self._roll()
        lines = []
        for name, (scope, period, unit) in NAMES.items():
            limit = self.limit(scope, period, unit)
            if limit is None:
                continue
            by = self.overrides.get(name)
            origin = f" (set by {by.get('by')} {by.get('at')})" if by else ""
            if scope == "chat":
                chats = self._period(period).chats.values()
                top = max((t.used(unit) for t in chats), default=0)
                lines.append(
                    f"{name}: {amount(unit, limit)} per chat; the busiest chat used "
                    f"{amount(unit, top)}{origin}"
                )
                continue
            used = self._period(period).tally(scope).used(unit)
            state = " - SPENT, paused" if used >= limit else ""
            lines.append(f"{name}: {amount(unit, used)} of {amount(unit, limit)}{state}{origin}")
        lifted = [n for n, o in self.overrides.items() if o.get("value") is None]
        lines += [
            f"{name}: lifted (no limit) by {self.overrides[name].get('by')}" for name in lifted
        ]
        if not lines:
            return "No budget is set (budget in the config, or /budget NAME VALUE)."
        return "Budgets (local days, " + _tz_name(self.tz) + "):\n" + "\n".join(lines)

    def paused(self) -> list[str]:
        """The scopes whose calls are refused now, as "background (daily.tokens)" (status)."""
        out = []
        for scope, purpose in (("total", TURN), ("background", "consolidation")):
            spent = self.spent("", purpose)
            if spent is not None and (scope == "total" or spent.scope == "background"):
                out.append(f"{scope} ({limit_name(spent.scope, spent.period, spent.unit)})")
        return out

    # -- the file ---------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = json.loads(durable.read_regular(self.path).decode("utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Kept aside at the first save, not written over: the admins' overrides in it
            # are theirs to read back (a hand edit gone wrong, a disk error).
            self._damaged = True
            log.error(
                "budget: cannot read %s, the config's limits hold (the file is kept as %s "
                "at the next change): %s",
                self.path,
                self.path.name + DAMAGED,
                exc,
            )
            return
        overrides = data.get("overrides") if isinstance(data, dict) else None
        for name, entry in (overrides or {}).items():
            if name in NAMES and isinstance(entry, dict):
                value = entry.get("value")
                # 1e309 reads as inf, true as 1: neither is a limit (inf broke every display).
                usable = isinstance(value, int | float) and not isinstance(value, bool)
                if value is None or (usable and 0 < value < float("inf")):
                    self.overrides[name] = entry
                else:
                    log.error("budget: %s in %s is no limit: %r; ignored", name, self.path, value)
        notices = data.get("notified") if isinstance(data, dict) else None
        self._noticed = {n for n in notices or () if isinstance(n, str)}

    async def _save(self) -> None:
        # One write at a time, each of the state as it is then: a notice and a /budget
        # change at the same moment must not land in the wrong order.
        async with self._saving:
            day, month = self._keys()
            # Only this period's notices are worth keeping: the file stays small.
            current = sorted(n for n in self._noticed if n.startswith((day + "/", month + "/")))
            data = {"overrides": self.overrides, "notified": current}
            payload = json.dumps(data, indent=1, sort_keys=True) + "\n"
            await asyncio.to_thread(self._write, payload)

    def _write(self, payload: str) -> None:
        if self._damaged:
            aside = self.path.with_name(self.path.name + DAMAGED)
            try:
                durable.move(self.path, aside)
            except FileNotFoundError:
                pass
            log.warning("budget: the unreadable %s was kept as %s", self.path, aside)
            self._damaged = False
        durable.replace_file(self.path, payload)


BUDGET_USAGE = (
    "Usage: /budget (the limits and their use), /budget NAME VALUE, /budget NAME off (no "
    "limit), /budget NAME default (the config's). NAME: daily.tokens, daily.cost, "
    "monthly.tokens, monthly.cost, perChat.daily.tokens, background.daily.tokens, ..."
)


def _parse_value(unit: Unit, text: str) -> float | int | object | None:
    if text in ("off", "none", "unlimited"):
        return None
    cleaned = text.replace(",", "").replace("_", "")
    try:
        value: float | int = int(cleaned) if unit == "tokens" else float(cleaned)
    except ValueError:
        return UNSET
    if value <= 0 or value != value or value == float("inf"):
        return UNSET
    return value


def _shown(value: float | None, unit: Unit = "tokens") -> str:
    if value is None:
        return "no limit"
    return f"{int(value):,}" if unit == "tokens" else f"{value:g}"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def budget_line(cfg: Config, tz: ZoneInfo) -> str:
    """``memobot status``'s budget row, from the ledger and ``<state>/budget.json``."""
    budget = Budget(cfg, tz)
    paused = budget.paused()
    text = budget.describe().replace("\n", "; ")
    return text + (f" - paused: {', '.join(paused)}" if paused else "")
