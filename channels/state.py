"""Small per-channel state on disk (state/channels/<name>.json), written atomically."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from bot.private import make_private_dirs

log = logging.getLogger(__name__)


class ChannelState:
    def __init__(self, state_dir: Path, name: str) -> None:
        self.path = state_dir / "channels" / f"{name}.json"

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("channel state %s unreadable (%s); starting from empty", self.path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, data: dict[str, Any]) -> None:
        """tmp + fsync + rename: a crash leaves the old state or the new one, never half."""
        make_private_dirs(self.path.parent)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        # The rename itself must survive a power cut too, or an old offset could come back.
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
