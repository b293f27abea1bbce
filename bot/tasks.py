"""Background tasks: work that outlives the turn that started it, reported back exactly once.

The ``spawn`` tool (``bot.tools.spawn``) starts a task: a turn of kind TASK in a session of
its own, ``task:<id>``, accepted through the durable intake like any message, so it is
checkpointed, resumed after a crash, confined and reaped like any turn. Its prompt is the task
text and the workspace, nothing of the parent's history. It runs with the rights the parent
turn had, stored with it: the parent's privacy scope and the tools the parent was offered,
less ``spawn`` (depth 1), ``message`` and ``cron`` (a task speaks only through its report).

When the task's turn has ended, its result is told in the chat that started it as a REPORT
turn: a durable pending entry of that chat with the id ``task-<id>``, delivered through the
ledger like a reminder and kept in the chat's history (a follow-up there sees it). The intake's
seen ids make the report once-only: a restart between the task's end and its report finds the
task "running" here with no work left in its session, and reports it then (``reconcile``).

The durable record of each task (who started it, where, its label and state) is
``<state>/tasks/tasks.json``, replaced whole through ``bot.durable`` under a lock: a small store of
its own rather than session metadata, because ``/tasks``, the limits and ``memobot tasks``
ask about every task at once, and reading every ``task:*`` session for that would load whole
transcripts. The session stays the truth about the work; this file is the index of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from zoneinfo import ZoneInfo

from bot import durable
from bot.bus import InboundMessage, Intake
from bot.kinds import REPORT_KEY, TASK_KEY, Sender, with_kind
from bot.privacy import PrivacyScope
from bot.spend.report import Totals, recent
from bot.wording import counted

log = logging.getLogger(__name__)

CHANNEL = "task"  # a task's session is "task:<id>"
# Tools a task is never offered: no task of a task, and it speaks only through its report.
EXCLUDED_TOOLS = frozenset({"spawn", "message", "cron"})
ENDED_KEPT = 200  # ended tasks kept in the store for /tasks and `memobot tasks`
ID_TRIES = 8  # fresh ids tried when one names an older task's session
State = Literal["running", "done", "failed", "stopped", "timed out"]
ENDED_STATES = ("done", "failed", "stopped", "timed out")


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task as the store keeps it. ``parent``: the session key of the chat that started
    it; ``starter``: the sender id of the person whose turn started it."""

    id: str
    parent: str
    starter: str
    label: str
    state: str = "running"
    started: float = 0.0  # wall-clock seconds
    ended: float | None = None
    wait: bool = False
    admin: bool = False  # the starter is an admin
    group: bool = True  # the starter wrote in a group
    cancel: bool = False  # `memobot tasks cancel`: the gateway stops it when it sees this
    # The parent chat's /model choice when it was spawned (a name in llm.models; None:
    # llm.model). Absent from records written before it was kept: None.
    model: str | None = None
    # The spawn call that started it ("<parent message id>/<batch>/<call id>"): a resumed
    # parent turn running that call again gets this task back instead of a second one.
    call: str = ""
    # Where its result went when it ended: "turn" (the wait: true turn took it), "chat" (its
    # report); "" while it runs, and in records written before this was kept.
    told: str = ""

    @property
    def sender(self) -> Sender:
        return Sender(self.starter, self.admin, self.group)

    @property
    def session_key(self) -> str:
        return f"{CHANNEL}:{self.id}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        return cls(
            str(data["id"]),
            str(data["parent"]),
            str(data["starter"]),
            str(data.get("label") or ""),
            str(data.get("state") or "running"),
            float(data.get("started") or 0.0),
            None if data.get("ended") is None else float(data["ended"]),
            bool(data.get("wait")),
            data.get("admin") is True,
            data.get("group") is not False,
            data.get("cancel") is True,
            data["model"] if isinstance(data.get("model"), str) else None,
            str(data.get("call") or ""),
            str(data.get("told") or ""),
        )


class TaskStore:
    """``<state>/tasks/tasks.json``: every task's record, replaced whole under a lock (the
    gateway and ``memobot tasks`` may write it at once)."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "tasks"
        self.path = self.folder / "tasks.json"
        self.lock_path = self.folder / "tasks.lock"

    def load(self) -> dict[str, TaskRecord]:
        """Every record; ValueError when the file is not a task list, OSError when it cannot
        be read or is not a regular file (a link, a FIFO: never followed nor waited on)."""
        try:
            raw = durable.read_regular(self.path)
        except FileNotFoundError:
            return {}
        data = json.loads(raw.decode("utf-8"))
        items = data.get("tasks", []) if isinstance(data, dict) else None
        if not isinstance(items, list):
            # Never rewritten then (``update`` loads first): the owner mends it, nothing lost.
            raise ValueError(f'{self.path} is not a task list ({{"tasks": [...]}})')
        out: dict[str, TaskRecord] = {}
        for item in items:
            try:
                rec = TaskRecord.from_dict(item)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("tasks: unreadable record in %s left out: %s", self.path, exc)
                continue
            out[rec.id] = rec
        return out

    def update(self, change: Callable[[dict[str, TaskRecord]], Any]) -> Any:
        """Apply ``change`` to the records under the lock and write them durably."""
        with durable.exclusive(self.lock_path):
            records = self.load()
            result = change(records)
            ended = sorted(
                (r for r in records.values() if r.state != "running"), key=lambda r: r.ended or 0
            )
            for old in ended[: max(0, len(ended) - ENDED_KEPT)]:
                del records[old.id]
            text = json.dumps({"tasks": [asdict(r) for r in records.values()]}, indent=1)
            durable.replace_file(self.path, text + "\n")
            return result

    def stamp(self) -> tuple[int, int, int] | None:
        """Changes whenever the file is replaced (inode, mtime, size); None if absent."""
        return durable.stamp(self.path)

    def request_cancel(self, task_id: str) -> TaskRecord | None:
        """Ask the gateway to stop a running task (``memobot tasks cancel``); None when no
        such task runs."""

        def change(records: dict[str, TaskRecord]) -> TaskRecord | None:
            rec = records.get(task_id)
            if rec is None or rec.state != "running":
                return None
            records[task_id] = replace(rec, cancel=True)
            return records[task_id]

        result: TaskRecord | None = self.update(change)
        return result

    def put(self, record: TaskRecord) -> None:
        self.update(lambda records: records.__setitem__(record.id, record))

    def end(self, task_id: str, state: str, now: float, told: str = "") -> TaskRecord | None:
        """Mark a running task ended (its result ``told`` to the "turn" or the "chat"); None
        when it was not running (ended before). An end told the turn by a waiting turn that
        was stopped before it took the result becomes the chat's when it is reported."""

        def change(records: dict[str, TaskRecord]) -> TaskRecord | None:
            rec = records.get(task_id)
            if rec is None or rec.state != "running":
                if rec is not None and rec.told == "turn" and told == "chat":
                    records[task_id] = replace(rec, told="chat")
                return None
            records[task_id] = replace(rec, state=state, ended=now, told=told)
            return records[task_id]

        result: TaskRecord | None = self.update(change)
        return result


def scope_record(scope: PrivacyScope) -> dict[str, Any]:
    return {
        "audience": scope.audience,
        "session_key": scope.session_key,
        "admin": scope.admin,
        "owner_memory": scope.owner_memory,
        "media": None if scope.media is None else str(scope.media),
    }


def scope_from_record(data: Any, fallback: PrivacyScope) -> PrivacyScope:
    """The parent's scope a task was stored with; ``fallback`` (the least: a group's scope
    of the task's own session) when the record is not one."""
    try:
        audience = data["audience"]
        if audience not in ("owner", "guest", "group"):
            return fallback
        media = data.get("media")
        return PrivacyScope(
            audience,
            str(data["session_key"]),
            bool(data["admin"]),
            bool(data["owner_memory"]),
            None if media is None else PurePosixPath(str(media)),
        )
    except (KeyError, TypeError):
        return fallback


def task_tools(parent_offered: set[str] | None, all_tools: set[str]) -> set[str]:
    """A task's tools: the parent turn's (None: all), less EXCLUDED_TOOLS."""
    base = all_tools if parent_offered is None else parent_offered & all_tools
    return base - EXCLUDED_TOOLS


def task_message(
    task_id: str,
    parent: str,
    sender: Sender,
    text: str,
    label: str,
    scope: PrivacyScope,
    offered: set[str] | None,
    model: str | None = None,
) -> InboundMessage:
    """The pending turn that is the task: in session ``task:<id>``, for the parent's sender,
    with the parent's scope, tools and model stored beside it."""
    info = {
        "id": task_id,
        "parent": parent,
        "label": label,
        "scope": scope_record(scope),
        "tools": None if offered is None else sorted(offered),
        "model": model,
    }
    msg = InboundMessage(
        CHANNEL,
        task_id,
        sender.id,
        text,
        message_id=f"task-{task_id}",
        metadata={TASK_KEY: info, "is_admin": sender.is_admin, "is_group": sender.is_group},
    )
    return with_kind(msg)


def task_info(msg: InboundMessage) -> dict[str, Any]:
    info = msg.metadata.get(TASK_KEY)
    return info if isinstance(info, dict) else {}


def task_model(msg: InboundMessage) -> str | None:
    """The model a task's turn uses: its parent chat's choice when it was spawned (None, as
    for a task stored before the choice was kept: llm.model)."""
    model = task_info(msg).get("model")
    return model if isinstance(model, str) else None


def report_text(rec: TaskRecord, state: str, result: str) -> str:
    head = f"Task {rec.id} ({rec.label})" if rec.label else f"Task {rec.id}"
    if state == "done":
        return f"{head} finished:\n\n{result}".rstrip()
    return f"{head} {state}." + (f"\n\n{result}" if result else "")


def report_message(rec: TaskRecord, text: str) -> InboundMessage:
    """The report of a task as a pending turn of the chat that started it: its id is the
    task's, so a second report of the same task is a duplicate the intake refuses."""
    channel, _, chat_id = rec.parent.partition(":")
    msg = InboundMessage(
        channel,
        chat_id,
        rec.starter,
        text,
        message_id=f"task-{rec.id}",
        metadata={REPORT_KEY: {"id": rec.id}, "is_admin": rec.admin, "is_group": rec.group},
    )
    return with_kind(msg)


def result_of(messages: list[dict[str, Any]]) -> str:
    """A finished task's result: the last assistant text of its session."""
    for m in reversed(messages):
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]:
            return str(m["content"])
    return ""


def age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def describe(
    records: list[TaskRecord], now: float, usage: Mapping[str, Totals] | None = None
) -> list[str]:
    """One line per task: id, state, age, label, and its model use this month where the
    usage ledger (``usage``: totals by session) has it."""
    lines = []
    for r in sorted(records, key=lambda r: r.started):
        line = f"{r.id}  {r.state:<9}  {age((r.ended or now) - r.started):>6}  {r.label or '-'}"
        used = usage_words((usage or {}).get(r.session_key))
        if used:
            line += f"  ({used})"
        lines.append(line)
    return lines


def usage_words(used: Totals | None) -> str:
    """A task's model use as /tasks, `memobot tasks` and the panel say it ("" for none):
    "3 model calls, 1,200 tokens, $0.01" (the cost where llm.prices prices its model)."""
    if used is None or not used.calls:
        return ""
    cost = f", {used.cost_text()}" if used.costs else ""
    return f"{counted(used.calls, 'model call')}, {used.tokens:,} tokens{cost}"


def usage_by_task(state_dir: Path, tz: ZoneInfo) -> dict[str, Totals]:
    """This month's model use by session, from the usage ledger (tasks' are ``task:<id>``)."""
    return recent(state_dir, tz).by_session


class TaskBoard:
    """The running side of tasks, owned by the agent loop: limits, starting, waiting, the
    end of each task and its one report. ``accept`` is the durable intake; ``dispatch``
    queues an accepted message on its session."""

    def __init__(
        self,
        store: TaskStore,
        *,
        max_tasks: int,
        max_per_chat: int,
        timeout_seconds: float,
        accept: Callable[[InboundMessage], Awaitable[Intake]],
        dispatch: Callable[[InboundMessage], None],
        outside_slot: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None,
        clock: Callable[[], float] = time.time,
        result: Callable[[str], Awaitable[str]] | None = None,
        poll: float = 1.0,
    ) -> None:
        self.store = store
        self.poll = poll  # seconds between two looks at the store while a task runs
        self.max_tasks = max_tasks
        self.max_per_chat = max_per_chat
        self.timeout_seconds = timeout_seconds
        self._accept = accept
        self._dispatch = dispatch
        self.clock = clock
        self._result = result  # a task's result, read from its session (by its key)
        # A waiting parent turn gives its slot back, so its task can have one.
        self._outside_slot = outside_slot or contextlib.nullcontext
        # A wait: true spawn waiting for its task's result.
        self._waiters: dict[str, _Handoff] = {}
        # Running tasks' stop calls, for a cancel asked in the store (``watch``).
        self._stops: dict[str, Callable[[], object]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # limits checked and a task recorded as one step
        # Tasks of an earlier run that the start's reconcile found with no work and reports:
        # a resumed spawn call does not queue them again (``unqueued``).
        self._settling: set[str] = set()

    async def records(self) -> dict[str, TaskRecord]:
        return await asyncio.to_thread(self.store.load)

    async def time_left(self, task_id: str) -> float:
        """Seconds until the task's timeout, counted from its start: a resumed task (a restart,
        a crash loop) does not get its whole time again."""
        try:
            rec = (await self.records()).get(task_id)
        except (OSError, ValueError) as exc:
            log.error("cannot read the task store: %s", exc)
            rec = None
        return self.left(rec)

    def left(self, rec: TaskRecord | None) -> float:
        """``time_left`` of a record read already (None: not in the store, its whole time)."""
        if rec is None:
            return self.timeout_seconds
        return max(0.0, rec.started + self.timeout_seconds - self.clock())

    def watch(self, task_id: str, stop: Callable[[], object]) -> Callable[[], None]:
        """Call ``stop`` once a cancel of this running task is asked in the store by another
        process (``memobot tasks cancel``, a panel served without the gateway); returns the
        call that ends the watch. A cancel asked in this process (``/stop ID``, the panel)
        stops the turn directly and needs no watch. One watch serves every running task, and
        only while one runs: a look at the file's stamp every ``poll`` seconds, read only
        when it changed. (Not inotify: a watch of the folder goes deaf when the folder is
        replaced, and is platform code to keep for one stat a second.)"""
        self._stops[task_id] = stop
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_store(), name="task-cancels")

        def unwatch() -> None:
            if self._stops.get(task_id) is stop:
                del self._stops[task_id]
            if not self._stops and self._watcher is not None:
                self._watcher.cancel()
                self._watcher = None

        return unwatch

    async def _watch_store(self) -> None:
        seen: tuple[int, int, int] | None = (-1, -1, -1)
        while self._stops:
            stamp = await asyncio.to_thread(self.store.stamp)
            if stamp != seen:
                seen = stamp
                try:
                    records = await self.records()
                except (OSError, ValueError) as exc:  # read again once the file changes
                    log.error("cannot read the task store: %s", exc)
                    records = {}
                for task_id, stop in list(self._stops.items()):
                    rec = records.get(task_id)
                    if rec is not None and rec.cancel:
                        log.info("task cancel asked in the task store id=%s", task_id)
                        del self._stops[task_id]
                        stop()
            await asyncio.sleep(self.poll)

    async def start(
        self,
        parent: str,
        sender: Sender,
        text: str,
        label: str,
        scope: PrivacyScope,
        offered: set[str] | None,
        wait: bool,
        *,
        model: str | None = None,
        call: str = "",
    ) -> TaskRecord | str:
        """Record and queue a new task; a refusal's text when a limit holds it back.

        ``model``: the parent chat's model (a name in llm.models), the task's too. ``call``:
        the spawn call's key in the parent session: the task that call started already, if
        any, is returned instead of a new one (a parent turn resumed after a crash or a
        restart runs its interrupted spawn call again), and waited for again with ``wait``.

        The caller stopped meanwhile (``/stop`` of the parent turn): the task, once recorded,
        is still queued (else it would stay "running" with no turn, holding a place of the
        limits) and reports to its chat, as nobody waits for it.
        """
        starting = asyncio.ensure_future(
            self._start(parent, sender, text, label, scope, offered, wait, model, call)
        )
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._unwait)
            raise

    def _unwait(self, started: asyncio.Future[TaskRecord | str]) -> None:
        """A start whose caller was stopped: its ``wait`` will never be called."""
        if started.cancelled():
            return
        if (exc := started.exception()) is not None:
            log.error("task start failed after its spawn call was stopped: %s", exc)
            return
        rec = started.result()
        if isinstance(rec, TaskRecord):
            self._waiters.pop(rec.id, None)

    async def _start(
        self,
        parent: str,
        sender: Sender,
        text: str,
        label: str,
        scope: PrivacyScope,
        offered: set[str] | None,
        wait: bool,
        model: str | None,
        call: str,
    ) -> TaskRecord | str:
        async with self._lock:
            records = await self.records()
            earlier = next(
                (r for r in records.values() if call and r.parent == parent and r.call == call),
                None,
            )
            if earlier is not None:
                log.info(
                    "task %s was started by this call already (%s) session=%s: not again",
                    earlier.id,
                    earlier.state,
                    parent,
                )
                if earlier.state == "running" and earlier.id not in self._settling:
                    await self._queue_again(earlier, sender, text, scope, offered)
                if wait and earlier.state == "running" and earlier.id not in self._waiters:
                    self._waiters[earlier.id] = _Handoff()
                return earlier
            running = [r for r in records.values() if r.state == "running"]
            if len(running) >= self.max_tasks:
                return (
                    f"refused: {len(running)} background task(s) already running, the most "
                    f"allowed (agent.maxTasks = {self.max_tasks}); wait for one to finish or "
                    "stop one with /stop ID"
                )
            here = [r for r in running if r.parent == parent]
            if len(here) >= self.max_per_chat:
                return (
                    f"refused: this chat already has {len(here)} background task(s) running "
                    f"(agent.maxTasksPerChat = {self.max_per_chat}); wait for one to finish"
                )
            for _ in range(ID_TRIES):
                task_id = secrets.token_hex(2)
                while task_id in records:
                    task_id = secrets.token_hex(3)
                rec = TaskRecord(
                    task_id,
                    parent,
                    sender.id,
                    label,
                    "running",
                    self.clock(),
                    None,
                    wait,
                    sender.is_admin,
                    sender.is_group,
                    model=model,
                    call=call,
                )
                # Recorded first: a crash before the intake leaves a running record with no
                # work, which reconcile reports as ended (never a task running unlisted).
                await asyncio.to_thread(self.store.put, rec)
                msg = task_message(task_id, parent, sender, text, label, scope, offered, model)
                taken = await self._accept(msg)
                if taken != "duplicate":
                    break
                # The id names an older task whose record left the store (ENDED_KEPT) but
                # whose session is still there: its pending turn was refused as a duplicate,
                # and the record would stay "running" and later report that task's result.
                log.info("task id %s names an older task's session: another id", task_id)
                await asyncio.to_thread(self.store.update, lambda r, i=task_id: r.pop(i, None))
                records[task_id] = rec  # not drawn again
            else:
                return "refused: no free task id found; try again"
            if taken == "refused":  # shutting down, or the disk refused the write
                await asyncio.to_thread(self.store.end, task_id, "failed", self.clock())
                return (
                    "refused: the task could not be stored (memobot is stopping, or a disk error)"
                )
            if wait:
                self._waiters[task_id] = _Handoff()
        self._dispatch(msg)
        log.info("task started id=%s parent=%s label=%r wait=%s", task_id, parent, label, wait)
        return rec

    async def _queue_again(
        self,
        rec: TaskRecord,
        sender: Sender,
        text: str,
        scope: PrivacyScope,
        offered: set[str] | None,
    ) -> None:
        """A crash may have come between the task's record and its pending turn: the turn is
        queued now. Taken once: a task whose session has its id (queued, running or done)
        is a duplicate to the intake. Under the lock, as ``unqueued`` looks."""
        msg = task_message(rec.id, rec.parent, sender, text, rec.label, scope, offered, rec.model)
        if await self._accept(msg) == "accepted":
            log.info("task %s had not been queued (a crash): queued now", rec.id)
            self._dispatch(msg)

    async def unqueued(self, task_id: str, has_work: Callable[[], Awaitable[bool]]) -> bool:
        """Whether a task an earlier run left "running" has no work (``has_work``: its
        session's), as one step with a resumed spawn call's queueing (``_queue_again``): True
        claims it, to be reported ended (the call then leaves it be); False, it runs. The
        lock is not held while it is reported (a waiting turn may need a slot meanwhile)."""
        async with self._lock:
            if await has_work():
                return False
            self._settling.add(task_id)
            return True

    async def result_again(self, rec: TaskRecord) -> str | None:
        """The result of an ended task as its waiting turn was given it, read again from the
        task's session: for a turn resumed after a crash that came between the handover and
        the turn's next checkpoint (the turn lost it; nothing reported it to the chat). None
        when it went to the chat, or cannot be read here."""
        if rec.told != "turn" or self._result is None:
            return None
        return report_text(rec, rec.state, await self._result(rec.session_key))

    async def wait(self, task_id: str, seconds: float) -> str | None:
        """The result of a ``wait: true`` task, or None when it did not end in ``seconds``
        (then it reports to the chat when it ends, as any task). The waiting turn holds no
        slot meanwhile. Cancelled (the turn stopped, a shutdown) after the task handed its
        result over, it hands the result back: ``ended`` then reports it to the chat."""
        handoff = self._waiters.get(task_id)
        if handoff is None:
            return None
        text: str | None = None
        try:
            async with self._outside_slot():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(seconds):
                        await asyncio.shield(handoff.result)
            # The task may have ended in the same loop pass as the timeout, or while this
            # turn queued for its slot again: the result is this turn's all the same.
            if handoff.result.done():
                # Recorded as the turn's before the turn has it: a crash after the turn's
                # next checkpoint finds the task ended (never reported again), one before
                # finds it told to the turn (the resumed call is given it again).
                ended, state = handoff.result.result()
                await asyncio.shield(
                    asyncio.to_thread(self.store.end, task_id, state, self.clock(), "turn")
                )
                text = ended
            return text
        finally:
            if self._waiters.get(task_id) is handoff:
                del self._waiters[task_id]
            if not handoff.taken.done():
                # Taken only when it is returned into the turn, with no pause before the
                # runner appends it to the turn.
                handoff.taken.set_result(text is not None)

    async def ended(self, task_id: str, state: str, result: str) -> None:
        """A task's turn has ended: its record ends, and its result goes to the ``wait: true``
        turn still waiting for it, else to its chat as a report, once: a waiting turn that is
        stopped in the same loop pass as it is handed the result hands it back, and it is
        reported (the report's id is the task's, so a second report is a duplicate). Called
        again for the same task (a restart in between), it reports nothing twice."""
        records = await self.records()
        rec = records.get(task_id)
        if rec is None:
            log.error("task ended that the store does not know id=%s", task_id)
            return
        if rec.state != "running":
            return  # ended and reported before (a resumed turn found its answer written)
        text = report_text(rec, state, result)
        handoff = self._waiters.pop(task_id, None)
        if handoff is not None and not handoff.result.done():
            handoff.result.set_result((text, state))
            # A shutdown meanwhile cancels this wait: the record stays "running", and the
            # next start reports it (reconcile) unless the resumed parent waits for it again.
            taken = await handoff.taken
        else:
            taken = False
        if taken:
            # The waiting turn recorded the end (told "turn") before it took the result.
            log.info("task ended id=%s state=%s: result returned to its turn", task_id, state)
            return
        report = report_message(rec, text)
        accepted = await self._accept(report)
        if accepted == "accepted":
            self._dispatch(report)
        log.info("task ended id=%s state=%s report=%s", task_id, state, accepted)
        if accepted == "refused":  # shutting down, or a disk error: reported at next start
            return
        await asyncio.to_thread(self.store.end, task_id, state, self.clock(), "chat")


class _Handoff:
    """A ``wait: true`` turn waiting for its task: ``ended`` puts the result in ``result``;
    the waiting turn answers in ``taken`` whether the result went into its turn (False: it
    was stopped first, and the result is reported to the chat instead)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.result: asyncio.Future[tuple[str, str]] = loop.create_future()  # text, state
        self.taken: asyncio.Future[bool] = loop.create_future()
