"""Run an async fake server on its own event loop in a daemon thread, for sync tests and for
tests that drive memobot as a subprocess."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ServerThread:
    """Runs ``start()`` on a private loop in a thread; ``stop()`` runs the stop coroutine there."""

    def __init__(
        self,
        start: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None]],
        name: str,
        start_timeout: float = 10.0,
    ) -> None:
        self._start, self._stop = start, stop
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            raise TimeoutError(f"{name} thread did not start")
        if self._failure is not None:
            raise RuntimeError(f"{name} failed to start") from self._failure

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the starting thread, which re-raises
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the server's loop (where its state lives) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join the thread. Idempotent."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
