"""The recent runs of scheduled jobs and the heartbeat, and how each ended: a bounded log.

``<state>/cron/runs.jsonl``: one JSON object a line, appended. The job store keeps only a
job's last run and forgets a one-off once it ran; this log is what the panel's Schedule
screen shows as recent runs. The scheduler appends ``fired`` (intake took the occurrence),
``skipped`` (missed by more than cron.maxLateMinutes); the turn appends ``finished`` with
its outcome (ok, failed, stopped; a heartbeat's "nothing to tell" is ok). A line is
``{"at", "event", "id", "job", "session", ...}``, ``id`` the occurrence's message id.

It is a record for people, not a source of truth: nothing decides anything from it (the
exactly-once guarantee lives in the job store and intake), so it is appended without fsync,
and an unreadable line is skipped. It stays small: past ``TRIM_BYTES`` it is cut back to its
last ``KEEP`` lines (under its own lock).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot import durable
from bot.private import make_private_dirs, replace_durably

log = logging.getLogger(__name__)

FILE = "runs.jsonl"
KEEP = 200  # lines kept at a trim; the panel shows the most recent runs
TRIM_BYTES = 100 * 1024
SHOWN = 30


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Run:
    """One occurrence: when it was handed over (or skipped) and how it ended."""

    id: str
    job: str  # the job's id, or "heartbeat"
    session: str
    at: str  # when it fired or was skipped (UTC ISO)
    manual: bool  # "run now" (the panel), not a due occurrence
    outcome: str  # "running", "ok", "failed", "stopped", "skipped (late)", "duplicate"
    finished_at: str = ""


class RunLog:
    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "cron"
        self.path = self.folder / FILE
        self.lock_path = self.folder / "runs.lock"

    def append(self, event: str, occurrence_id: str, **fields: Any) -> None:
        """One line; never raises for a disk problem (logged: the run itself goes on)."""
        line = {"at": now_iso(), "event": event, "id": occurrence_id, **fields}
        text = json.dumps(line, ensure_ascii=False) + "\n"
        try:
            make_private_dirs(self.folder)
            with durable.exclusive(self.lock_path):
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a+", encoding="utf-8") as fh:
                    end = os.fstat(fd).st_size
                    if end and os.pread(fd, 1, end - 1) != b"\n":
                        text = "\n" + text  # after a torn line: that one stays on its own
                    fh.write(text)
                    fh.flush()
                    size = os.fstat(fd).st_size
                if size > TRIM_BYTES:
                    self._trim()
        except OSError as exc:
            log.warning("cron: cannot write the run log %s: %s", self.path, exc)

    def _trim(self) -> None:
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        if len(lines) > KEEP:
            replace_durably(self.path, "\n".join(lines[-KEEP:]) + "\n", sync=False)

    def recent(self, limit: int = SHOWN) -> list[Run]:
        """The last ``limit`` occurrences, newest first, each with its outcome so far."""
        try:
            raw = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        runs: dict[str, Run] = {}
        for text in raw.splitlines():
            try:
                line = json.loads(text)
                occurrence = str(line["id"])
                event = line["event"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn or foreign line: this log is for reading only
            if event in ("fired", "skipped"):
                runs.pop(occurrence, None)  # keeps the order of the latest event
                outcome = "running" if event == "fired" else "skipped (late)"
                if line.get("intake") == "duplicate":
                    outcome = "taken before (duplicate)"
                runs[occurrence] = Run(
                    occurrence,
                    str(line.get("job", "")),
                    str(line.get("session", "")),
                    str(line.get("at", "")),
                    bool(line.get("manual")),
                    outcome,
                )
            elif event == "finished" and occurrence in runs:
                old = runs[occurrence]
                runs[occurrence] = Run(
                    old.id,
                    old.job,
                    old.session,
                    old.at,
                    old.manual,
                    str(line.get("outcome", "?")),
                    str(line.get("at", "")),
                )
        return list(reversed(runs.values()))[:limit]
