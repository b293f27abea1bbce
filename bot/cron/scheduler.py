"""The scheduler: turns due jobs and heartbeat ticks into inbound messages, exactly once.

Each occurrence has a durable message id (``cron:<job>:<due>``, ``heartbeat:<due>``). The order
of writes makes every crash point safe:

1. the occurrence is recorded as ``firing`` in the job store (fsynced);
2. it is published on the bus: intake makes it a pending turn of its session, or answers
   "duplicate" when that id was taken before;
3. on "accepted" or "duplicate" the job moves on (next occurrence; a one-off is removed).

A crash before 1 leaves the job due: it fires at the next start. A crash between 1 and 3 leaves
``firing``: the next start publishes the same id again, and intake's dedup lets it in at most
once. After 3 the turn is a pending turn like any message, resumed by recovery, and its answer
goes through the delivery ledger. So an occurrence fires once, never zero times or twice.

A job whose previous occurrence is still pending in its session waits (never stacks); an
occurrence more than ``cron.maxLateMinutes`` old is skipped and logged; a recurring job that
missed several occurrences fires once, marked late, then goes on from now.

"Run now" (the panel) records an extra occurrence the same way, with a message id of its own
request (``cron:<job>:now-<token>``) and ``manual`` set: it goes through steps 1 to 3 like a
due one, so a double click or a resubmitted form fires it once, and it leaves the job's
schedule as it was. Every occurrence handed over or skipped, and how its turn ended, goes to
the run log (bot.cron.runs), which the panel shows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bot import failpoints, workspace_files
from bot.bus import InboundMessage, Intake, MessageBus
from bot.config import Config
from bot.cron import heartbeat
from bot.cron.runs import RunLog
from bot.cron.schedule import compact, describe_moment, from_iso, to_iso, zone
from bot.cron.store import Job, Jobs, JobStore
from bot.kinds import CRON_KEY, HEARTBEAT_KEY, NARROWED_KEY
from bot.provenance import Provenance
from bot.session import SessionStore

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
# An occurrence handed over later than this after its due time is marked late.
LATE_AFTER = timedelta(seconds=60)
SENDER = "memobot-scheduler"
# A "run now" request's token (the panel's form): a resubmitted form names the same one.
RUN_TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


def utc_now() -> datetime:
    return datetime.now(UTC)


def late_note(due: datetime, tz: Any) -> str:
    return f"[late: was due at {describe_moment(due, tz)}] "


def job_message(job: Job) -> InboundMessage:
    """The inbound message of the occurrence recorded in ``job.firing``."""
    assert job.firing is not None
    channel, _, chat_id = job.session.partition(":")
    due = from_iso(job.firing["due"])
    text = job.message
    if job.firing.get("late"):
        text = late_note(due, job.schedule.zone) + text
    if job.deliver == "agent":
        text = f"[scheduled task {job.id}, {job.schedule.describe()}: do it now] {text}"
    return InboundMessage(
        channel,
        chat_id,
        SENDER,
        text,
        message_id=job.firing["message_id"],
        metadata={
            CRON_KEY: {
                "job_id": job.id,
                "deliver": job.deliver,
                "due": job.firing["due"],
                "late": bool(job.firing.get("late")),
            },
            # A job a non-admin made runs, unattended, with a group member's rights.
            "is_admin": job.by_admin,
            "is_group": job.is_group or not job.by_admin,
            **({} if job.by_admin else {NARROWED_KEY: job.session}),
        },
    )


class Scheduler:
    """Fires due jobs and heartbeat ticks; ``start()``/``stop()`` with the gateway.

    ``channels``: only jobs of these channels fire (the gateway's running ones); the others
    wait. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        cfg: Config,
        store: JobStore,
        bus: MessageBus,
        sessions: SessionStore,
        channels: set[str],
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.provenance = Provenance(cfg.agent.state_path, cfg.agent.workspace_path)
        self.bus = bus
        self.sessions = sessions
        self.channels = channels
        self.clock = clock
        self.tz = zone(cfg.agent.timezone)
        self.deliver_to = heartbeat.deliver_to(cfg)
        self._task: asyncio.Task[None] | None = None
        self._stamp: tuple[int, int, int] | bool | None = False  # False: never read
        self._jobs = Jobs()
        self._own_write = False
        self._earliest: datetime | None = None  # no job can be due before this
        self._told: set[str] = set()  # things logged once (a waiting job, a bad store)
        self._nowhere_seen: datetime | None = None  # the heartbeat with no chat: last look
        self.runs = RunLog(cfg.agent.state_path)
        # One tick at a time: "run now" hands its occurrence over between ticks, never beside
        # one that might publish the same recorded occurrence again.
        self._ticking = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        target = self.cfg.heartbeat.deliver_to
        if self.cfg.heartbeat.interval_minutes > 0 and target:
            channel = target.partition(":")[0]
            if channel not in self.channels:
                log.warning(
                    "heartbeat: heartbeat.deliverTo is %s, but channel %s is not running in "
                    "this gateway; its results wait until it is (enable channels.%s)",
                    target,
                    channel,
                    channel,
                )
        self._task = asyncio.create_task(self._run(), name="scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("scheduler tick failed; trying again in %.0f s", TICK_SECONDS)
            await asyncio.sleep(TICK_SECONDS)

    def snapshot(self) -> dict[str, Any]:
        """For the gateway's status file: how many jobs, which is due next."""
        nxt = self._jobs.next_due()
        return {
            "jobs": len(self._jobs.jobs),
            "next": {"id": nxt.id, "at": nxt.next_run, "session": nxt.session} if nxt else None,
        }

    # -- one tick --------------------------------------------------------------------------

    async def tick(self) -> None:
        """Fire whatever is due now. Re-reads the store when it changed (the CLI, the tool).

        All occurrences due in one tick are recorded in one store write and moved on in
        another: two fsyncs per tick, however many jobs fire at 09:00.
        """
        async with self._ticking:
            await self._tick()

    async def run_now(self, job_id: str, token: str) -> str:
        """Fire job ``job_id`` once now, outside its schedule, through the same recorded
        occurrence as a due one (the module's steps 1 to 3). ``token`` names the request: the
        same token again (a double click, a resubmitted form) fires nothing more. Returns
        what happened, in words for the person who asked."""
        if not RUN_TOKEN.match(token):
            return "That request is not valid; reload the page and try again."
        message_id = f"cron:{job_id}:now-{token}"
        async with self._ticking:
            if not await self._refresh():
                return f"The job store cannot be read now ({self.store.path}); see the log."
            current = self._jobs.get(job_id)
            if current is None:
                return f"There is no job {job_id} (any more)."
            if current.session.partition(":")[0] not in self.channels:
                return (
                    f"Job {job_id} is for {current.session}, a channel this gateway does not "
                    "run; it cannot run now."
                )
            if current.last_message_id == message_id:
                return f"Job {job_id} was already run for this request."
            if await self._pending(current.session, current.last_message_id):
                return f"Job {job_id}'s previous run is still going; it was not started again."
            now = self.clock()

            def record(jobs: Jobs) -> tuple[str, Job | None]:
                job = jobs.get(job_id)
                if job is None:
                    return f"There is no job {job_id} (any more).", None
                if job.firing:
                    if job.firing.get("message_id") == message_id:
                        return f"Job {job_id} is being run for this request already.", None
                    return f"Job {job_id} is being run this moment; try again shortly.", None
                if job.last_message_id == message_id:
                    return f"Job {job_id} was already run for this request.", None
                job.firing = {
                    "due": to_iso(now),
                    "message_id": message_id,
                    "late": False,
                    "manual": True,
                }
                return "", job

            refused, job = await self._update(record)
            if job is None:
                return refused
            failpoints.hit("cron_recorded")
            verdict = (await self._hand_over([job])).get(job_id)
        if verdict == "refused":
            return f"memobot is shutting down: job {job_id} runs once it starts again."
        if verdict == "duplicate":  # this request's occurrence was taken long ago
            return f"Job {job_id} was already run for this request."
        return f"Job {job_id} was started now ({job.session})."

    async def _tick(self) -> None:
        if not await self._refresh():
            return
        now = self.clock()
        if self._earliest is not None and now >= self._earliest:
            await self._jobs_tick(now)
        if self.cfg.heartbeat.interval_minutes > 0:
            if self.deliver_to is not None:
                await self._heartbeat(now)
            else:
                await self._heartbeat_nowhere(now)

    async def _jobs_tick(self, now: datetime) -> None:
        ready: list[Job] = []  # recorded, to be published
        fresh: dict[str, dict[str, Any]] = {}  # job id -> the occurrence to record
        late: list[Job] = []
        for job in list(self._jobs.jobs):
            if job.session.partition(":")[0] not in self.channels:
                self._once(
                    f"channel:{job.id}",
                    "cron job %s session=%s waits: its channel is not running in this gateway",
                    job.id,
                    job.session,
                )
                continue
            due = job.next_moment
            if job.firing:
                ready.append(job)
            elif due is None or due > now:
                continue
            elif await self._pending(job.session, job.last_message_id):
                self._once(
                    f"wait:{job.next_run}:{job.id}",
                    "cron job %s session=%s: the previous run is still going; this one waits",
                    job.id,
                    job.session,
                )
            elif self._too_late(due, now):
                late.append(job)
            else:
                fresh[job.id] = {
                    "due": job.next_run,
                    "message_id": f"cron:{job.id}:{compact(due)}",
                    "late": now - due > LATE_AFTER,
                }
        if late:
            await self._skip(late, now)
        if fresh:
            expected = {j.id: j.next_run for j in self._jobs.jobs if j.id in fresh}

            def record(jobs: Jobs) -> list[Job]:
                recorded = []
                for job in jobs.jobs:
                    firing = fresh.get(job.id)
                    # Changed meanwhile (removed or edited by the CLI): nothing to fire.
                    if firing and not job.firing and job.next_run == expected[job.id]:
                        job.firing = firing
                        recorded.append(job)
                return recorded

            ready += await self._update(record)
            failpoints.hit("cron_recorded")
        if ready:
            await self._hand_over(ready)

    async def _refresh(self) -> bool:
        stamp = self.store.stamp()
        if stamp == self._stamp:
            return True
        try:
            self._jobs = await asyncio.to_thread(self.store.load)
        except (OSError, ValueError) as exc:
            self._once(
                "store",
                "cron: cannot read %s (%s); jobs wait until it is fixed",
                self.store.path,
                exc,
            )
            return False
        self._told.discard("store")
        # Idle ticks (nothing due yet) stop here: no walk over the jobs every second.
        firing = any(j.firing for j in self._jobs.jobs)
        moments = [m for j in self._jobs.jobs if (m := j.next_moment) is not None]
        self._earliest = datetime.min.replace(tzinfo=UTC) if firing else min(moments, default=None)
        if self._stamp is not False and not self._own_write:
            nxt = self._jobs.next_due()
            log.info(
                "cron: the job store changed: %d job(s)%s",
                len(self._jobs.jobs),
                f", next {nxt.id} at {nxt.next_run}" if nxt else "",
            )
        self._stamp = stamp
        self._own_write = False
        return True

    async def _update(self, change: Callable[[Jobs], Any]) -> Any:
        result = await asyncio.to_thread(self.store.update, change)
        self._own_write = True  # read our own write back, without logging it as news
        await self._refresh()
        return result

    def _once(self, key: str, fmt: str, *args: Any) -> None:
        if key not in self._told:
            self._told.add(key)
            log.warning(fmt, *args)

    async def _pending(self, key: str, message_id: str | None) -> bool:
        """Is ``message_id`` still a pending (unfinished) turn of session ``key``?"""
        if not message_id:
            return False
        state = await asyncio.to_thread(self.sessions.peek_state, key)
        return state is not None and state.is_pending(message_id)

    def _too_late(self, due: datetime, now: datetime) -> bool:
        return now - due > timedelta(minutes=self.cfg.cron.max_late_minutes)

    async def _hand_over(self, ready: list[Job]) -> dict[str, Intake]:
        """Publish each recorded occurrence; the ones intake took move on in one write.
        Returns intake's verdict for each job id."""
        taken: dict[str, str] = {}  # job id -> message id
        verdicts: dict[str, Intake] = {}
        for job in ready:
            assert job.firing is not None
            verdict = verdicts[job.id] = await self.bus.publish_inbound(job_message(job))
            failpoints.hit("cron_published")
            if verdict == "refused":
                continue  # shutting down: still recorded, published again at the next start
            taken[job.id] = job.firing["message_id"]
            await asyncio.to_thread(
                self.runs.append,
                "fired",
                job.firing["message_id"],
                job=job.id,
                session=job.session,
                intake=verdict,
                manual=bool(job.firing.get("manual")),
            )
            log.info(
                "cron job %s fired session=%s id=%s intake=%s%s",
                job.id,
                job.session,
                job.firing["message_id"],
                verdict,
                " (late)" if job.firing.get("late") else "",
            )
        if not taken:
            return verdicts
        now = self.clock()

        def moved_on(jobs: Jobs) -> None:
            for current in list(jobs.jobs):
                firing = current.firing
                if current.id not in taken or not firing:
                    continue
                if firing.get("message_id") != taken[current.id]:
                    continue
                due = from_iso(firing["due"])
                current.firing = None
                current.last_message_id = firing["message_id"]
                current.last_run = to_iso(now)
                if firing.get("manual"):
                    continue  # run now: the schedule stays as it was
                nxt = current.schedule.next_after(due, now)
                if nxt is None:
                    jobs.jobs.remove(current)  # a one-off: done
                else:
                    current.next_run = to_iso(nxt)

        await self._update(moved_on)
        return verdicts

    async def _skip(self, late: list[Job], now: datetime) -> None:
        expected = {j.id: j.next_run for j in late}

        def skipped(jobs: Jobs) -> None:
            for current in list(jobs.jobs):
                if current.firing or current.next_run != expected.get(current.id, "-"):
                    continue
                nxt = current.schedule.next_after(from_iso(current.next_run or ""), now)
                if nxt is None:
                    jobs.jobs.remove(current)
                else:
                    current.next_run = to_iso(nxt)

        await self._update(skipped)
        for job in late:
            due_id = f"cron:{job.id}:{compact(from_iso(job.next_run or ''))}"
            await asyncio.to_thread(
                self.runs.append, "skipped", due_id, job=job.id, session=job.session
            )
            log.warning(
                "cron job %s session=%s: the occurrence due %s was missed by %.0f min, more "
                "than cron.maxLateMinutes (%g); skipped%s",
                job.id,
                job.session,
                job.next_run,
                (now - from_iso(job.next_run or "")).total_seconds() / 60,
                self.cfg.cron.max_late_minutes,
                " and the one-off job removed" if job.schedule.kind == "at" else "",
            )

    # -- heartbeat -------------------------------------------------------------------------

    async def _heartbeat_nowhere(self, now: datetime) -> None:
        """No chat to tell the heartbeat's results: said once, and only once HEARTBEAT.md has
        a task the heartbeat would run (until then it has nothing to do, and a warning at
        every start only taught people to ignore warnings). Looked at once per interval."""
        period = timedelta(minutes=self.cfg.heartbeat.interval_minutes)
        if self._nowhere_seen is not None and now < self._nowhere_seen + period:
            return
        self._nowhere_seen = now
        if await asyncio.to_thread(self._read_tasks):
            self._once(
                "heartbeat:nowhere",
                "heartbeat: HEARTBEAT.md has open tasks, but there is no chat to tell the "
                "results in (no heartbeat.deliverTo, and no admin of an enabled channel); "
                "set heartbeat.deliverTo (e.g. telegram:12345) or channels.<name>.admins. "
                "Until then the heartbeat does not run",
            )

    async def _heartbeat(self, now: datetime) -> None:
        record = self._jobs.heartbeat
        period = timedelta(minutes=self.cfg.heartbeat.interval_minutes)
        if record.get("firing"):
            await self._hand_over_heartbeat(dict(record["firing"]))
            return
        if not record.get("next_run"):
            await self._set_heartbeat(lambda hb: hb.update(next_run=to_iso(now + period)))
            return
        due = from_iso(record["next_run"])
        if due > now:
            return
        after = to_iso(due + ((now - due) // period + 1) * period)  # the grid, from now on
        tasks = await asyncio.to_thread(self._read_tasks)
        if not tasks or self._too_late(due, now):
            if tasks:
                log.warning(
                    "heartbeat due %s missed by more than cron.maxLateMinutes; skipped",
                    record["next_run"],
                )
            await self._set_heartbeat(lambda hb: hb.update(next_run=after))
            return
        if await self._pending(heartbeat.SESSION, record.get("last_message_id")):
            self._once(
                f"wait:{record['next_run']}:heartbeat",
                "heartbeat: the previous run is still going; this one waits",
            )
            return
        late = now - due > LATE_AFTER
        note = late_note(due, self.tz) if late else ""
        firing = {
            "due": record["next_run"],
            "message_id": f"heartbeat:{compact(due)}",
            "text": heartbeat.task_text(tasks, note),
            "deliver_to": self.deliver_to,
            # Who wrote these tasks decides the run's rights; kept with the firing so a
            # restart hands over the same turn.
            "shaped_by": await asyncio.to_thread(self.provenance.untrusted, heartbeat.FILE),
        }

        def fire(hb: dict[str, Any]) -> None:
            hb["firing"] = firing

        await self._set_heartbeat(fire)
        failpoints.hit("heartbeat_recorded")
        await self._hand_over_heartbeat(firing)

    def _read_tasks(self) -> list[str]:
        workspace = self.cfg.agent.workspace_path
        return heartbeat.open_tasks(workspace_files.read_text_or_empty(workspace, heartbeat.FILE))

    async def _set_heartbeat(self, change: Callable[[dict[str, Any]], None]) -> None:
        def apply(jobs: Jobs) -> None:
            change(jobs.heartbeat)

        await self._update(apply)

    async def _hand_over_heartbeat(self, firing: dict[str, Any]) -> None:
        channel, _, chat_id = heartbeat.SESSION.partition(":")
        shaped_by = firing.get("shaped_by")
        if shaped_by:
            self._once(
                f"narrowed:{firing['message_id']}",
                "heartbeat: %s was last written in %s, not by an admin; it runs without exec, "
                "file writes or the owner's memory (edit or touch the file yourself to trust it)",
                heartbeat.FILE,
                shaped_by,
            )
        msg = InboundMessage(
            channel,
            chat_id,
            SENDER,
            firing["text"],
            message_id=firing["message_id"],
            metadata={
                HEARTBEAT_KEY: {"deliver_to": firing["deliver_to"], "due": firing["due"]},
                # Tasks a non-admin wrote run with a group member's rights (bot.provenance).
                "is_admin": not shaped_by,
                "is_group": bool(shaped_by) or not heartbeat.private_chat(firing["deliver_to"]),
                **({NARROWED_KEY: shaped_by} if shaped_by else {}),
            },
        )
        verdict = await self.bus.publish_inbound(msg)
        failpoints.hit("heartbeat_published")
        if verdict == "refused":
            return
        now = self.clock()
        period = timedelta(minutes=self.cfg.heartbeat.interval_minutes)

        def moved_on(hb: dict[str, Any]) -> None:
            if (hb.get("firing") or {}).get("message_id") != firing["message_id"]:
                return
            due = from_iso(firing["due"])
            hb["firing"] = None
            hb["last_message_id"] = firing["message_id"]
            hb["next_run"] = to_iso(due + ((now - due) // period + 1) * period)

        await self._set_heartbeat(moved_on)
        log.info("heartbeat fired id=%s intake=%s", firing["message_id"], verdict)
        await asyncio.to_thread(
            self.runs.append,
            "fired",
            firing["message_id"],
            job="heartbeat",
            session=heartbeat.SESSION,
            intake=verdict,
        )


def describe_jobs(jobs: list[Job], now: datetime) -> list[str]:
    """One line per job, for ``memobot cron list`` and ``/cron``: id, session, schedule, next
    run (local time), message."""
    lines = []
    for job in sorted(jobs, key=lambda j: j.next_run or "9"):
        moment = job.next_moment
        when = describe_moment(moment, job.schedule.zone, now) if moment else "nothing left to run"
        kind = " [text]" if job.deliver == "text" else ""
        lines.append(
            f"{job.id}  {job.session}  {job.schedule.describe()}  next: {when}{kind}  "
            f"{json.dumps(job.message, ensure_ascii=False)}"
        )
    return lines
