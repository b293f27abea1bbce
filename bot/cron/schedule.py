"""When a job runs: pure functions over aware datetimes (no clock, no files).

Three kinds, with nanobot's names: ``at`` (one local date-time), ``every`` (a period in
seconds) and ``cron`` (a 5-field expression evaluated in the job's IANA zone by cronsim, which
handles the two daylight-saving transitions the way Debian's cron does: a daily job whose local
time falls in the skipped hour runs once right after the jump, one in the repeated hour runs
once, at its first pass).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

Kind = Literal["at", "every", "cron"]
# The shortest period of a repeating job that runs a model turn, unless an admin insists
# (``cron add --force``): one every few seconds is a flood of model calls and messages.
MIN_EVERY_SECONDS = 60


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message is written for the person (or model)."""


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; "" is the system zone. ScheduleError for an unknown name."""
    if not name:
        return system_zone()
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin"
        ) from None


def system_zone() -> ZoneInfo:
    """The machine's IANA zone ($TZ, else /etc/localtime, else UTC).

    Not ``datetime.now().astimezone()``: that is a fixed offset, wrong after the next
    daylight-saving change.
    """
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        target = str(Path("/etc/localtime").resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for name in candidates:
        if name:
            try:
                return ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                continue
    return ZoneInfo("UTC")


def to_iso(moment: datetime) -> str:
    """A stored instant: UTC, seconds, ``Z``."""
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def compact(moment: datetime) -> str:
    """An instant for message ids: no ``:`` (a channel reads the part after the last colon of
    a reply-to id as a platform message id), e.g. ``20261224T080000Z``."""
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: Kind
    tz: str  # IANA name the schedule is read in ("" never stored: resolved when made)
    at: str = ""  # the local date-time as given (kind "at")
    every_seconds: int = 0  # kind "every"
    cron_expr: str = ""  # kind "cron"

    @classmethod
    def make(
        cls,
        *,
        at: str | None = None,
        every_seconds: int | None = None,
        cron_expr: str | None = None,
        tz: str,
    ) -> Schedule:
        """Exactly one of ``at``, ``every_seconds``, ``cron_expr``; ScheduleError otherwise."""
        options = (("at", at), ("every_seconds", every_seconds), ("cron_expr", cron_expr))
        given = [name for name, value in options if value not in (None, "")]
        if len(given) != 1:
            raise ScheduleError(
                "give exactly one of at (a local date-time like 2026-12-24T09:00), "
                f"every_seconds or cron_expr (got {', '.join(given) or 'none'})"
            )
        zone(tz)
        if at:
            schedule = cls("at", tz, at=at.strip())
            schedule.at_moment()
            return schedule
        if every_seconds is not None:
            if isinstance(every_seconds, bool) or int(every_seconds) < 1:
                raise ScheduleError("every_seconds must be a whole number of seconds, at least 1")
            return cls("every", tz, every_seconds=int(every_seconds))
        expr = " ".join(str(cron_expr).split())
        if len(expr.split(" ")) != 5:
            raise ScheduleError(
                f"cron_expr {expr!r} must have 5 fields: minute hour day-of-month month "
                "day-of-week, e.g. '0 8 * * 1' for Mondays at 08:00"
            )
        try:
            CronSim(expr, datetime.now(zone(tz)))
        except CronSimError as exc:
            raise ScheduleError(f"cron_expr {expr!r} is not valid: {exc}") from None
        return cls("cron", tz, cron_expr=expr)

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.tz)

    def at_moment(self) -> datetime:
        """The instant of an ``at`` schedule; a time without an offset is local to ``tz``."""
        try:
            moment = datetime.fromisoformat(self.at)
        except ValueError:
            raise ScheduleError(
                f"at {self.at!r} is not an ISO 8601 date-time such as 2026-12-24T09:00"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=self.zone)
        return moment.astimezone(UTC)

    def first_run(self, now: datetime) -> datetime:
        """The first occurrence of a new job made at ``now``. ScheduleError for an ``at``
        in the past (a reminder that can never fire is a mistake worth saying)."""
        if self.kind == "at":
            moment = self.at_moment()
            if moment <= now:
                raise ScheduleError(
                    f"at {self.at} ({describe_moment(moment, self.zone)}) is in the past"
                )
            return moment
        if self.kind == "every":
            return now + timedelta(seconds=self.every_seconds)
        return self._cron_after(now)

    def next_after(self, occurrence: datetime, now: datetime) -> datetime | None:
        """The first occurrence later than both ``occurrence`` and ``now``, or None (a
        one-off). Missed occurrences between them are skipped, never fired one by one."""
        if self.kind == "at":
            return None
        after = max(occurrence, now)
        if self.kind == "every":
            period = timedelta(seconds=self.every_seconds)
            steps = (after - occurrence) // period + 1
            return occurrence + steps * period
        return self._cron_after(after)

    def _cron_after(self, after: datetime) -> datetime:
        # Read in the job's zone (astimezone sets the fold right inside a repeated hour).
        local = after.astimezone(self.zone)
        return next(CronSim(self.cron_expr, local)).astimezone(UTC)

    def describe(self) -> str:
        """The schedule in words, e.g. "every 2 h", "cron '0 8 * * 1' (Europe/Berlin)"."""
        if self.kind == "at":
            return f"once at {self.at} ({self.tz})"
        if self.kind == "every":
            return f"every {describe_period(self.every_seconds)}"
        return f"cron '{self.cron_expr}' ({self.tz})"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "tz": self.tz}
        if self.kind == "at":
            data["at"] = self.at
        elif self.kind == "every":
            data["every_seconds"] = self.every_seconds
        else:
            data["cron_expr"] = self.cron_expr
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        return cls(
            data["kind"],
            data.get("tz") or "UTC",
            at=data.get("at", ""),
            every_seconds=int(data.get("every_seconds", 0)),
            cron_expr=data.get("cron_expr", ""),
        )


def describe_period(seconds: int) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}"
    return f"{seconds} s"


def describe_moment(moment: datetime, tz: ZoneInfo, now: datetime | None = None) -> str:
    """An instant as a person checks it: "Thu 24 Dec 2026 09:00 CET", and "(in 3 h 5 min)"
    when ``now`` is given."""
    local = moment.astimezone(tz)
    text = f"{local:%a} {local.day} {local:%b %Y %H:%M} {local.tzname()}"
    if local.second:
        text = f"{local:%a} {local.day} {local:%b %Y %H:%M:%S} {local.tzname()}"
    if now is not None:
        text += f" ({describe_until(moment - now)})"
    return text


def describe_until(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds <= 0:
        return "due now"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d"] if days else []
    if hours:
        parts.append(f"{hours} h")
    if minutes and not days:
        parts.append(f"{minutes} min")
    if not parts:
        parts.append(f"{secs} s")
    return "in " + " ".join(parts)
