"""The job store: ``<state>/cron/jobs.json``, one JSON document, shared by the gateway and the
``memobot cron`` command line.

Every change is a read-modify-write under an exclusive ``flock`` on ``jobs.lock``, written to a
temporary file, fsynced, renamed over the old one and the folder fsynced: a crash leaves the old
or the new document, never a torn one, and a change is durable before the caller goes on (the
scheduler relies on that: an occurrence is recorded as "firing" before it is published).
Readers need no lock. The gateway notices a change by the file's inode, mtime and size.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from bot import durable
from bot.cron.schedule import Schedule, from_iso, to_iso
from bot.private import replace_durably

log = logging.getLogger(__name__)

T = TypeVar("T")
Deliver = Literal["agent", "text"]
STORE_VERSION = 1


@dataclass(slots=True)
class Job:
    id: str
    session: str  # the chat (session key) that made the job; it is delivered there
    message: str
    schedule: Schedule
    deliver: Deliver = "agent"
    created_at: str = ""
    by_admin: bool = False  # made in an admin's chat (or the command line)
    is_group: bool = True  # the chat is a group: its turns do not see the owner's memory
    next_run: str | None = None  # the next occurrence (UTC ISO); None: nothing left
    # The occurrence being handed to intake: recorded before it is published, cleared once
    # intake took it ("accepted" or "duplicate"). {"due", "message_id", "late"}.
    firing: dict[str, Any] | None = None
    last_message_id: str | None = None  # the last occurrence intake took (maybe still running)
    last_run: str | None = None

    @property
    def next_moment(self) -> datetime | None:
        return from_iso(self.next_run) if self.next_run else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session": self.session,
            "message": self.message,
            "schedule": self.schedule.to_dict(),
            "deliver": self.deliver,
            "created_at": self.created_at,
            "by_admin": self.by_admin,
            "is_group": self.is_group,
            "next_run": self.next_run,
            "firing": self.firing,
            "last_message_id": self.last_message_id,
            "last_run": self.last_run,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=str(data["id"]),
            session=str(data["session"]),
            message=str(data.get("message", "")),
            schedule=Schedule.from_dict(data["schedule"]),
            deliver="text" if data.get("deliver") == "text" else "agent",
            created_at=str(data.get("created_at", "")),
            by_admin=bool(data.get("by_admin", False)),
            is_group=bool(data.get("is_group", True)),
            next_run=data.get("next_run"),
            firing=data.get("firing"),
            last_message_id=data.get("last_message_id"),
            last_run=data.get("last_run"),
        )


@dataclass(slots=True)
class Jobs:
    """The whole document: the jobs and the heartbeat's own record."""

    jobs: list[Job] = field(default_factory=list)
    heartbeat: dict[str, Any] = field(default_factory=dict)

    def get(self, job_id: str) -> Job | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def of_session(self, key: str) -> list[Job]:
        return [j for j in self.jobs if j.session == key]

    def next_due(self) -> Job | None:
        timed = [j for j in self.jobs if j.next_run]
        return min(timed, key=lambda j: j.next_moment or datetime.max) if timed else None

    def new_id(self) -> str:
        while True:
            job_id = uuid.uuid4().hex[:8]
            if self.get(job_id) is None:
                return job_id


def new_job(
    jobs: Jobs,
    *,
    session: str,
    message: str,
    schedule: Schedule,
    now: datetime,
    deliver: Deliver = "agent",
    by_admin: bool = False,
    is_group: bool = True,
) -> Job:
    """A job added to ``jobs`` (ScheduleError when it could never run)."""
    job = Job(
        id=jobs.new_id(),
        session=session,
        message=message,
        schedule=schedule,
        deliver=deliver,
        created_at=to_iso(now),
        by_admin=by_admin,
        is_group=is_group,
        next_run=to_iso(schedule.first_run(now)),
    )
    jobs.jobs.append(job)
    return job


class JobStore:
    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "cron"
        self.path = self.folder / "jobs.json"
        self.lock_path = self.folder / "jobs.lock"

    def stamp(self) -> tuple[int, int, int] | None:
        """Changes whenever the document is replaced (inode, mtime, size); None if absent."""
        return durable.stamp(self.path)

    def load(self) -> Jobs:
        """The current document (empty if there is none). A job that does not parse is
        logged and left out of the result; it stays in the file until the next write."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Jobs()
        data = json.loads(raw)
        jobs = []
        for item in data.get("jobs") or []:
            try:
                jobs.append(Job.from_dict(item))
            except (KeyError, TypeError, ValueError) as exc:
                log.error("cron: unreadable job in %s left out: %s (%r)", self.path, exc, item)
        return Jobs(jobs, dict(data.get("heartbeat") or {}))

    def update(self, change: Callable[[Jobs], T]) -> T:
        """Apply ``change`` to the current document under the lock and write it durably
        (only when ``change`` did not raise). Returns what ``change`` returned."""
        with durable.exclusive(self.lock_path):
            jobs = self.load()
            before = self._dump(jobs)
            result = change(jobs)
            after = self._dump(jobs)
            if after != before:
                self._write(after)
            return result

    @staticmethod
    def _dump(jobs: Jobs) -> str:
        data = {
            "version": STORE_VERSION,
            "jobs": [j.to_dict() for j in jobs.jobs],
            "heartbeat": jobs.heartbeat,
        }
        return json.dumps(data, indent=1, ensure_ascii=False) + "\n"

    def _write(self, text: str) -> None:
        replace_durably(self.path, text)
