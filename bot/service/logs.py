"""Log output for people, journald and machines: ``--log-format text|json``.

Text is one line per event. Under journald (``JOURNAL_STREAM`` names our stderr) the journal adds
its own timestamp, so ours is dropped and the line starts with a ``<N>`` syslog priority, which
journald turns into the entry's priority (``journalctl -p warning`` then works). JSON is one
object per line with time, level, logger, message and, when the message names one, the session.

Every record, from our loggers and every library's, passes one ``SecretFilter`` on its way to
the handler: known secret values (config keys and tokens, everything a ``${VAR}`` placeholder
produced, learned again at each config load) and well-known token shapes become ``***``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import Literal
from urllib.parse import quote

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
NOISY_LOGGERS = ("httpx", "httpx2", "openai", "httpcore", "asyncio")
# Log calls name the session as "session=<key>" (bot.loop, bot.llm): that is the one convention.
# A colon or full stop right after the key is the sentence's ("session=telegram:1: failed").
_SESSION = re.compile(r"\bsession=([^\s,;)]+?)[:.]?(?=[\s,;)]|$)")
REDACTED = "***"
# Shorter values are not treated as secrets: hiding every "8" or "true" would wreck the logs.
MIN_SECRET_CHARS = 6
# Token shapes hidden even when no config declared them (a key pasted into a message, a token
# in a library's URL).
_TOKEN_SHAPES = re.compile(
    "|".join(
        (
            r"(?<![A-Za-z0-9_-])\d{5,}:[A-Za-z0-9_-]{30,}",  # Telegram bot token
            r"\bxox[abposer]-[A-Za-z0-9-]{8,}",  # Slack bot / user tokens
            r"\bxapp-[A-Za-z0-9-]{8,}",  # Slack app-level token
            r"\bsk-[A-Za-z0-9_-]{16,}",  # OpenAI-style API keys (sk-..., sk-proj-...)
            r"\b[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,}",  # Discord
        )
    )
)
_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"<>]+@")
# A query parameter whose name says it carries a credential: ?key=, ?api_key=, ?access_token=.
SECRET_PARAM = re.compile(r"(?i)key|token|secret|passw(?:or)?d|pwd|sig|auth|credential")
_URL_QUERY_SECRET = re.compile(
    r"([?&][A-Za-z0-9_.-]*(?i:key|token|secret|passw(?:or)?d|pwd|sig|auth|credential)"
    r"[A-Za-z0-9_.-]*=)[^&#\s'\"<>]+"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{6,}")
_TELEGRAM_PATH = re.compile(r"(/bot)[0-9]+:[^/\s'\"]+")
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class SecretFilter(logging.Filter):
    """Replaces secrets with ``***`` in a record's message, its %-args, exception and stack text.

    Installed on memobot's handlers, so it sees every library's records too. The message is
    rendered here (``args`` cleared) so no formatter can put a secret back in. Never drops a
    record. Thread-safe: secrets may be added while other threads log.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._lock = threading.Lock()

    def add(self, values: Iterable[str | None]) -> None:
        """Remember secret values (also as they look percent-encoded in a URL)."""
        new = set()
        for value in values:
            if not value or len(value) < MIN_SECRET_CHARS:
                continue
            new.add(value)
            new.add(quote(value, safe=""))
        with self._lock:
            if new <= self._secrets:
                return
            self._secrets |= new
            # Longest first, so a secret that contains another is hidden whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def forget(self) -> None:
        """Forget every secret: for a process that starts over with another config (each test
        of a suite run loads its own; kept, thousands of them made every log line slow)."""
        with self._lock:
            self._secrets = set()
            self._pattern = None

    def redact(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(REDACTED, text)
        text = _TOKEN_SHAPES.sub(REDACTED, text)
        text = _TELEGRAM_PATH.sub(rf"\1{REDACTED}", text)
        text = _BEARER.sub(rf"\1{REDACTED}", text)
        text = _URL_QUERY_SECRET.sub(rf"\1{REDACTED}", text)
        return _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", text)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call must still be logged, and still be redacted
            message = f"{record.msg!r} (log arguments did not fit: {record.args!r})"
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = _PLAIN.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


_PLAIN = logging.Formatter()
# One filter for the process: config loads (start, SIGHUP) add to it, every handler uses it.
SECRETS = SecretFilter()


def remember_secrets(values: Iterable[str | None]) -> None:
    """Values that must never appear in a log line from now on."""
    SECRETS.add(values)


def redact(text: str) -> str:
    return SECRETS.redact(text)


def has_token_shape(text: str) -> bool:
    """``text`` holds what the filter hides by its shape alone (a bot token, an sk- key, a
    Bearer credential, a Telegram token in a URL's path), wherever it was written."""
    return any(p.search(text) for p in (_TOKEN_SHAPES, _TELEGRAM_PATH, _BEARER))


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


# Control characters but the line break and the tab: an ESC sequence in a name or a message
# would drive the terminal the log is read in (clear it, rewrite a line, retitle it).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def one_event(text: str) -> str:
    """A formatted record as the text log writes it: each control character as its escape
    (``\\x1b``) and every line after the first indented, so nothing a message quotes (a
    name holding a line break or a CR) reads as a line, or an event, of its own."""
    text = _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text.replace("\n", "\n    ")


class TextFormatter(logging.Formatter):
    """The text log: ``time LEVEL logger: message``, one event to a line (:func:`one_event`)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return one_event(super().format(record))


class JournalFormatter(logging.Formatter):
    """``<priority>LEVEL logger: message``: journald keeps the time and strips the prefix."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = _SYSLOG_PRIORITY.get(record.levelno, 6)
        # A multi-line message (a traceback) would become several journal entries, only the
        # first with our priority; keep it one entry.
        return f"<{priority}>" + one_event(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        session = session_of(record)
        if session is not None:
            out["session"] = session
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # as SecretFilter left it
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False)


def session_of(record: logging.LogRecord) -> str | None:
    """The session a record is about: its ``session`` attribute, else the message's
    ``session=<key>``."""
    session = getattr(record, "session", None)
    if session is None and (m := _SESSION.search(record.getMessage())):
        session = m.group(1)
    return None if session is None else str(session)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def make_formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if stderr_is_journal():
        return JournalFormatter()
    return TextFormatter()


# Loggers of SDKs that log, with a full traceback, what memobot then reports itself in one line
# (the mcp SDK's SSE client on every dropped stream: a server restart, a redeploy).
REPORTED_BY_MEMOBOT = ("mcp.client.sse",)


class DemoteToDebug(logging.Filter):
    """A record memobot reports in its own words: one DEBUG line, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {first}", None
            record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def setup_logging(level: int, fmt: LogFormat = "text") -> None:
    """Configure the root logger to write one line (or one JSON object) per event to stderr.

    Warnings and uncaught exceptions (any thread) go through the same handler, so the secret
    filter sees them too.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    handler.addFilter(SECRETS)
    remember_secrets([os.environ.get("OPENAI_API_KEY")])
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    for name in REPORTED_BY_MEMOBOT:
        sdk = logging.getLogger(name)
        sdk.filters = [f for f in sdk.filters if not isinstance(f, DemoteToDebug)]
        sdk.addFilter(DemoteToDebug())
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("memobot").critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread else "?"
    logging.getLogger("memobot").critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
