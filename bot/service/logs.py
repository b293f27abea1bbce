"""Log output for people, journald and machines: ``--log-format text|json``.

Text is one line per event. Under journald (``JOURNAL_STREAM`` names our stderr) the journal adds
its own timestamp, so ours is dropped and the line starts with a ``<N>`` syslog priority, which
journald turns into the entry's priority (``journalctl -p warning`` then works). JSON is one
object per line with time, level, logger, message and, when the message names one, the session.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
NOISY_LOGGERS = ("httpx", "httpx2", "openai", "httpcore", "asyncio")
# Log calls name the session as "session=<key>" (bot.loop, bot.llm): that is the one convention.
_SESSION = re.compile(r"\bsession=([^\s,;)]+)")
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def stderr_is_journal() -> bool:
    """True when stderr is the journal's stream (systemd.exec(5), ``$JOURNAL_STREAM``)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


class JournalFormatter(logging.Formatter):
    """``<priority>LEVEL logger: message``: journald keeps the time and strips the prefix."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = _SYSLOG_PRIORITY.get(record.levelno, 6)
        # A multi-line message (a traceback) would become several journal entries, only the
        # first with our priority; keep it one entry.
        return f"<{priority}>" + super().format(record).replace("\n", "\n    ")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        session = getattr(record, "session", None)
        if session is None and (m := _SESSION.search(message)):
            session = m.group(1)
        if session is not None:
            out["session"] = session
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def make_formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if stderr_is_journal():
        return JournalFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def setup_logging(level: int, fmt: LogFormat = "text") -> None:
    """Configure the root logger to write one line (or one JSON object) per event to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
