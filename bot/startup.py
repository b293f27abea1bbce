"""Garbage collection around start-up.

Starting memobot imports a few hundred modules (pydantic models, the openai SDK's types, a
chat SDK) and allocates objects that all live until the process ends: the cyclic collector's
passes over them meanwhile find nothing and cost about a tenth of the start's CPU. So it is
off from the start of :func:`bot.cli.main` until :func:`started` (the channels are up, the
agent is ready), which also freezes what start-up made, so later passes skip it.
"""

from __future__ import annotations

import gc


def starting() -> None:
    gc.disable()


def started(*, freeze: bool = True) -> None:
    """Collection back on (idempotent); ``freeze``: start-up's objects are left out of it."""
    if gc.isenabled():
        return
    if freeze:
        gc.freeze()
    gc.enable()
