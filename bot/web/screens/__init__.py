"""The panel's screens: one module each, listed here in the nav's order.

A screen module has ``NAV`` (its path and label in the nav, or None for one not linked
there) and ``routes(panel)``, its aiohttp routes; every handler runs behind the server's
guard (Host, Origin, session, CSRF), so a screen never checks those itself. Adding a screen is
a module and one line below.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

SCREEN_MODULES = (
    "bot.web.screens.overview",
    "bot.web.screens.chat",
    "bot.web.screens.chats",
    "bot.web.screens.memory",
    "bot.web.screens.access",
    "bot.web.screens.approvals",
    "bot.web.screens.schedule",
    "bot.web.screens.tasks",
    "bot.web.screens.usage",
    "bot.web.screens.tools",
    "bot.web.screens.settings",
    "bot.web.screens.logs",
)


@functools.cache
def load() -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(m) for m in SCREEN_MODULES)


def nav() -> list[tuple[str, str]]:
    """(path, label) of every screen in the nav, in order."""
    return [s.NAV for s in load() if s.NAV is not None]
