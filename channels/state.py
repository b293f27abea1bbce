"""Small per-channel state on disk (state/channels/<name>.json), written atomically."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from bot.private import make_private_dirs, replace_durably

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

    def save(self, data: dict[str, Any], durable: bool = True) -> None:
        """tmp + fsync + rename: a crash leaves the old state or the new one, never half.
        ``durable`` False skips the fsyncs: after a power cut the previous state may be back."""
        make_private_dirs(self.path.parent)
        replace_durably(self.path, json.dumps(data), sync=durable)
