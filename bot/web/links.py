"""One-time login links. ``memobot web`` and the gateway are different processes: the
command writes the link's token into ``<state>/web/links.json`` and the server that gets the
link crosses it out there. Only the token's sha256 is stored, so the file alone lets nobody in.

A token is random (``secrets.token_urlsafe``), works once and expires after
``LINK_TTL_SECONDS``. Every change is a read, change and durable write under an flock, so
two requests with one link (or a gateway and a ``memobot web`` serving side by side) cannot
both log in, and a used link stays used across a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bot import durable

LINK_TTL_SECONDS = 600.0
MAX_OPEN_LINKS = 20  # the oldest unused ones are dropped beyond this
FOLDER = "web"
FILE = "links.json"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class LinkBook:
    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.folder = state_dir / FOLDER
        self.path = self.folder / FILE
        self.clock = clock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        with durable.exclusive(self.folder / ".lock"):
            try:
                entries = json.loads(self.path.read_text(encoding="utf-8"))["links"]
            except FileNotFoundError:
                entries = []
            except (OSError, ValueError, KeyError, TypeError):
                entries = []  # a damaged file: every link in it is refused, new ones work
            now = self.clock()
            entries = [e for e in entries if isinstance(e, dict) and e.get("expires", 0) > now]
            yield entries
            text = json.dumps({"links": entries[-MAX_OPEN_LINKS:]})
            durable.replace_file(self.path, text, mode=0o600, chmod=0o600)

    def issue(self) -> str:
        """A new token, valid once for LINK_TTL_SECONDS."""
        token = secrets.token_urlsafe(32)
        with self._locked() as entries:
            entries.append({"sha256": _digest(token), "expires": self.clock() + LINK_TTL_SECONDS})
        return token

    def holds(self, token: str) -> bool:
        """Whether ``token`` may be one of the book's: a read, no lock and no write (a flood
        of guesses costs no disk writes; :meth:`consume` decides)."""
        if not token or len(token) > 200:
            return False
        wanted = _digest(token).encode("ascii")
        try:
            entries = json.loads(self.path.read_text(encoding="utf-8"))["links"]
            return any(
                hmac.compare_digest(str(e.get("sha256", "")).encode("utf-8"), wanted)
                for e in entries
                if isinstance(e, dict)
            )
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def consume(self, token: str) -> bool:
        """True once for a token ``issue`` gave that has not expired; it is then gone."""
        if not token or len(token) > 200:
            return False
        wanted = _digest(token)
        with self._locked() as entries:
            for i, entry in enumerate(entries):
                stored = str(entry.get("sha256", "")).encode("utf-8")
                if hmac.compare_digest(stored, wanted.encode("ascii")):
                    del entries[i]
                    return True
        return False
