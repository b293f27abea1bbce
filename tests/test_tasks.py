"""Background tasks (bot.tasks, the spawn tool), in-process against the fake model: started
at once, reported back in the chat that started them exactly once, with the parent's rights at
most, stopped only by their starter or an admin, held to the limits."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from bot.bus import InboundMessage, OutboundMessage
from bot.kinds import APPROVAL_KEY
from bot.session import SessionStore
from bot.tasks import TaskStore
from tests.fakes.llm_server import FakeLLM, reply, tool_step
from tests.helpers import Harness, make_config, request_messages

TASK = "TASKTEXT: count the files"
# The task's tool holds until the test says go: a long tool call without a real wait.
HOLD = "while [ ! -e go ]; do sleep 0.01; done; echo counted 42"


@pytest.fixture
async def llm():
    async with FakeLLM() as server:
        yield server


def harness(tmp_path: Path, server: FakeLLM, **agent) -> Harness:
    cfg = make_config(tmp_path, server.base_url, agent={**agent})
    return Harness(cfg, tmp_path / "config.json", channels=("cli", "telegram"))


async def until(check, seconds: float = 15.0):
    """``check()``'s first true value, looked at each loop pass (no fixed sleep)."""
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return value


def reports(h: Harness) -> list[OutboundMessage]:
    return [m for m in h.outbox if m.final and m.text.startswith("Task ")]


def tool_results(llm: FakeLLM, said: str) -> list[str]:
    """The tool results the model was sent in the requests whose user message has ``said``."""
    return [
        m["content"]
        for r in llm.requests
        if any(m["role"] == "user" and said in str(m["content"]) for m in request_messages(r))
        for m in request_messages(r)[-1:]
        if m["role"] == "tool"
    ]


def task_request(llm: FakeLLM) -> dict:
    """The task's first model request: the one whose person's message is the task."""
    return next(
        r
        for r in llm.requests
        if any(m["role"] == "user" and "TASKTEXT" in str(m["content"]) for m in request_messages(r))
    )


def task_steps(result: str = "There are 42 files.") -> list[dict]:
    return [
        tool_step(("exec", {"command": HOLD}), when_user_contains="TASKTEXT"),
        reply(result, when_user_contains="TASKTEXT"),
    ]


async def say(h: Harness, text: str, *, chat: str = "g1", sender: str = "u1", **meta) -> str:
    """A Telegram message from ``sender``; its final answer's text."""
    mid = f"m{time.monotonic_ns()}"
    fut = h.expect(mid)
    msg = InboundMessage("telegram", chat, sender, text, message_id=mid, metadata=meta)
    assert await h.stack.bus.publish_inbound(msg) == "accepted"
    return (await asyncio.wait_for(fut, 15)).text


async def test_spawn_answers_at_once_and_reports_once_into_the_chat_history(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(
        tool_step(("spawn", {"task": TASK, "label": "count"}), when_user_contains="research"),
        reply("I started it.", when_user_contains="research"),
        *task_steps(),
    )
    async with harness(tmp_path, llm) as h:
        answer = await say(h, "research please", is_admin=True, is_group=False)
        assert answer == "I started it."
        assert tool_results(llm, "research")[0].startswith("started task ")
        # The task is held in its tool: it is listed running, nothing reported yet.
        [rec] = TaskStore(tmp_path / "state").load().values()
        assert rec.state == "running" and rec.parent == "telegram:g1" and rec.label == "count"
        listing = await say(h, "/tasks", is_admin=True, is_group=False)
        assert rec.id in listing and "running" in listing and "count" in listing
        assert "1 model call," in listing  # its use so far, from the usage ledger
        assert reports(h) == []
        (tmp_path / "ws" / "go").touch()
        [report] = await until(lambda: reports(h))
        assert (report.channel, report.chat_id) == ("telegram", "g1")
        assert report.text == f"Task {rec.id} (count) finished:\n\nThere are 42 files."
        # Its own prompt: the task, no history of the parent chat.
        task_req = task_request(llm)
        assert "research please" not in json.dumps(task_req["body"]["messages"])
        assert "spawn" not in json.dumps(task_req["body"].get("tools"))  # depth 1
        # A follow-up in the chat has the report in its history.
        llm.script(reply("follow-up answered"))
        assert await say(h, "what did it find?", is_admin=True, is_group=False) == (
            "follow-up answered"
        )
        assert "There are 42 files." in json.dumps(request_messages(llm.requests[-1]))
        assert TaskStore(tmp_path / "state").load()[rec.id].state == "done"
        # Charged to the chat that started it, for budget.perChat.
        assert h.stack.loop.budget.chat_of(rec.session_key) == "telegram:g1"
    # Its model calls count as background work, under its own session.
    used = [
        json.loads(line)
        for f in (tmp_path / "state" / "usage").glob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert {u["purpose"] for u in used if u["session"] == rec.session_key} == {"task"}
    # Exactly once, also after a restart (reconcile finds the task ended and reported).
    async with harness(tmp_path, llm) as h2:
        await asyncio.sleep(0)
        await h2.stack.loop.reconcile_tasks()
        assert reports(h2) == []
    history = SessionStore(tmp_path / "state").history("telegram:g1")
    assert sum("There are 42 files." in str(m.get("content")) for m in history) == 1


async def test_wait_true_puts_the_result_into_the_parents_answer(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(
        tool_step(("spawn", {"task": TASK, "wait": True}), when_user_contains="research"),
        reply("The task says: done", when_user_contains="research"),
        reply("There are 42 files.", when_user_contains="TASKTEXT"),
    )
    async with harness(tmp_path, llm, maxConcurrentTurns=1) as h:
        # One turn slot: the waiting parent gives its slot to its task.
        assert await say(h, "research please", is_admin=True, is_group=False) == (
            "The task says: done"
        )
        assert "There are 42 files." in tool_results(llm, "research")[0]
        [rec] = TaskStore(tmp_path / "state").load().values()
        await until(lambda: TaskStore(tmp_path / "state").load()[rec.id].state == "done")
        assert reports(h) == []  # returned to its turn: not reported a second time


async def test_a_group_members_task_gets_only_the_groups_tools(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(
        tool_step(("spawn", {"task": TASK}), when_user_contains="research"),
        reply("started", when_user_contains="research"),
        tool_step(("exec", {"command": "echo pwned > owned"}), when_user_contains="TASKTEXT"),
        reply("tried", when_user_contains="TASKTEXT"),
    )
    async with harness(tmp_path, llm) as h:
        assert await say(h, "research please", is_admin=False, is_group=True) == "started"
        await until(lambda: reports(h))
    parent_tools = {t["function"]["name"] for t in llm.requests[0]["body"]["tools"]}
    task_req = task_request(llm)
    task_tools = {t["function"]["name"] for t in task_req["body"].get("tools") or []}
    assert "exec" not in parent_tools and "spawn" in parent_tools
    assert task_tools <= parent_tools - {"spawn"}
    assert not (tmp_path / "ws" / "owned").exists()  # the call was refused, not run


async def test_stop_id_only_by_its_starter_or_an_admin_and_only_in_its_chat(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(
        tool_step(("spawn", {"task": TASK, "label": "long"}), when_user_contains="research"),
        reply("started", when_user_contains="research"),
        *task_steps(),
    )
    cfg = {"groupTools": ["exec", "spawn"]}
    h = Harness(
        make_config(tmp_path, llm.base_url, channels={"telegram": {"token": "1:x", **cfg}}),
        tmp_path / "config.json",
        channels=("cli", "telegram"),
    )
    async with h:
        assert await say(h, "research please", sender="alice", is_admin=False, is_group=True)
        [rec] = TaskStore(tmp_path / "state").load().values()
        group = {"is_admin": False, "is_group": True}
        refused = await say(h, f"/stop {rec.id}", sender="mallory", **group)
        assert refused == f"Only the person who started task {rec.id}, or an admin, may stop it."
        elsewhere = await say(h, f"/stop {rec.id}", chat="g2", sender="alice", **group)
        assert elsewhere.startswith(f"No background task {rec.id} in this chat")
        assert TaskStore(tmp_path / "state").load()[rec.id].state == "running"
        assert await say(h, f"/stop {rec.id}", sender="alice", **group) == (
            f"Stopping task {rec.id}."
        )
        [report] = await until(lambda: reports(h))
        assert report.text.startswith(f"Task {rec.id} (long) stopped.")
        # The record is written as the task ends, beside its report (not before it).
        await until(lambda: TaskStore(tmp_path / "state").load()[rec.id].state == "stopped")


async def test_max_tasks_refuses_the_next_one_clearly(tmp_path: Path, llm: FakeLLM) -> None:
    spawn = tool_step(("spawn", {"task": TASK}), when_user_contains="research")
    llm.script(
        *[s for _ in range(3) for s in (spawn, reply("ok", when_user_contains="research"))],
        *[tool_step(("exec", {"command": HOLD}), when_user_contains="TASKTEXT")] * 2,
    )
    async with harness(tmp_path, llm, maxTasks=2, maxTasksPerChat=5) as h:
        for chat in ("a", "b", "c"):
            await say(h, "research please", chat=chat, is_admin=True, is_group=False)
        results = [
            m["content"]
            for r in llm.requests
            for m in request_messages(r)[-1:]
            if m["role"] == "tool" and "task" in m["content"]
        ]
        assert sum(r.startswith("started task") for r in results) == 2
        [refused] = [r for r in results if not r.startswith("started task")]
        assert "agent.maxTasks = 2" in refused and "refused" in refused
        (tmp_path / "ws" / "go").touch()
        await until(lambda: len(reports(h)) == 2)


async def test_the_timeout_stops_a_task_and_says_so(tmp_path: Path, llm: FakeLLM) -> None:
    llm.script(
        tool_step(("spawn", {"task": TASK}), when_user_contains="research"),
        reply("started", when_user_contains="research"),
        *task_steps(),
    )
    # 0.3 s: the task is held in its tool, so only the timeout can end it.
    async with harness(tmp_path, llm, taskTimeoutMinutes=0.005) as h:
        await say(h, "research please", is_admin=True, is_group=False)
        [report] = await until(lambda: reports(h))
        assert "timed out" in report.text


async def test_memobot_tasks_lists_shows_and_cancels_through_the_gateway(
    tmp_path: Path, llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    from argparse import Namespace

    from bot import tasks_commands

    llm.script(
        tool_step(("spawn", {"task": TASK, "label": "long"}), when_user_contains="research"),
        reply("started", when_user_contains="research"),
        *task_steps(),
    )
    async with harness(tmp_path, llm) as h:
        h.stack.loop.tasks.poll = 0.01  # the store's cancel watch, at the test's pace
        await say(h, "research please", is_admin=True, is_group=False)
        [rec] = TaskStore(tmp_path / "state").load().values()
        run = tasks_commands.run
        assert await asyncio.to_thread(run, Namespace(tasks_command="list"), h.cfg) == 0
        assert rec.id in capsys.readouterr().out
        assert await asyncio.to_thread(run, Namespace(tasks_command="show", id=rec.id), h.cfg) == 0
        assert "chat: telegram:g1" in capsys.readouterr().out
        cancel = Namespace(tasks_command="cancel", id=rec.id)
        assert await asyncio.to_thread(run, cancel, h.cfg) == 0
        [report] = await until(lambda: reports(h))
        assert report.text.startswith(f"Task {rec.id} (long) stopped.")
        assert await asyncio.to_thread(run, cancel, h.cfg) == 1  # no longer running


async def test_a_tasks_approval_question_is_asked_of_its_starter_in_the_starting_chat(
    tmp_path: Path, llm: FakeLLM
) -> None:
    llm.script(
        tool_step(("spawn", {"task": TASK, "label": "risky"}), when_user_contains="research"),
        reply("started", when_user_contains="research"),
        tool_step(("exec", {"command": "echo ran > ran.txt"}), when_user_contains="TASKTEXT"),
        reply("It ran.", when_user_contains="TASKTEXT"),
    )
    channels = {"telegram": {"token": "1:x", "groupTools": ["exec", "spawn"]}}
    cfg = make_config(tmp_path, llm.base_url, channels=channels, tools={"approval": "risky"})
    h = Harness(cfg, tmp_path / "config.json", channels=("cli", "telegram"))
    group = {"is_admin": False, "is_group": True}
    async with h:
        await say(h, "research please", sender="alice", **group)
        asked = await until(lambda: [m for m in h.outbox if APPROVAL_KEY in m.metadata])
        assert (asked[0].channel, asked[0].chat_id) == ("telegram", "g1")
        approval_id = asked[0].metadata[APPROVAL_KEY]["id"]

        async def press(sender: str) -> str:
            mid = f"p-{sender}"
            meta = {APPROVAL_KEY: {"id": approval_id, "choice": "once"}, **group}
            await h.stack.bus.publish_inbound(
                InboundMessage("telegram", "g1", sender, "", message_id=mid, metadata=meta)
            )
            return (await until(lambda: [m for m in h.outbox if m.reply_to == mid]))[0].text

        assert "Only the person who asked" in await press("mallory")
        assert not (tmp_path / "ws" / "ran.txt").exists()
        await press("alice")
        [report] = await until(lambda: reports(h))
        assert report.text.endswith("It ran.") and (tmp_path / "ws" / "ran.txt").exists()


async def test_an_id_naming_an_older_tasks_session_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids are 4 hex digits and ended records leave the store after ENDED_KEPT: a new task
    drawing the id of an older one whose session is still there gets another id, rather than
    a pending turn refused as a duplicate (never run, "running" for ever, and at the next
    start reported with the older task's result, maybe in another chat)."""
    from bot import tasks as tasks_mod
    from bot.intake import DurableIntake
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope

    state = tmp_path / "state"
    sessions = SessionStore(state)

    async def no_reply(msg, text):
        return None

    intake = DurableIntake(sessions, no_reply)
    scope = PrivacyScope("group", "telegram:g2", False, False, None)
    old = tasks_mod.task_message(
        "abcd", "telegram:g1", Sender("u1", True, False), "old", "", scope, None
    )
    assert await intake.accept(old) == "accepted"  # an older task's session; its record gone
    dispatched: list[InboundMessage] = []
    board = tasks_mod.TaskBoard(
        TaskStore(state),
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=intake.accept,
        dispatch=dispatched.append,
    )
    ids = iter(["abcd", "beef"])
    monkeypatch.setattr(tasks_mod.secrets, "token_hex", lambda n: next(ids))
    rec = await board.start("telegram:g2", Sender("u2", False, True), "new", "", scope, None, False)
    assert not isinstance(rec, str) and rec.id == "beef"
    assert [m.session_key for m in dispatched] == ["task:beef"]
    assert set(TaskStore(state).load()) == {"beef"}


async def test_a_resumed_task_keeps_its_timeout_from_its_start(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """After a restart the timeout counts from the task's start, not from zero again: a crash
    loop cannot keep a task running for ever."""
    from bot.intake import DurableIntake
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskRecord, task_message

    state = tmp_path / "state"
    sender = Sender("u1", True, False)
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)

    async def no_reply(msg, text):
        return None

    # A task started two hours ago by a run that crashed: its record and its pending turn.
    TaskStore(state).put(
        TaskRecord("abcd", "telegram:g1", "u1", "old", "running", time.time() - 7200)
    )
    pending = task_message("abcd", "telegram:g1", sender, TASK, "old", scope, None)
    assert await DurableIntake(SessionStore(state), no_reply).accept(pending) == "accepted"
    llm.script(*task_steps())
    async with harness(tmp_path, llm, taskTimeoutMinutes=60) as h:
        [report] = await until(lambda: reports(h))
        assert report.text.startswith("Task abcd (old) timed out.")


async def test_a_damaged_task_store_is_said_and_left_as_it_is(
    tmp_path: Path, llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tasks.json that is JSON but not a task list: /tasks, /stop ID and `memobot tasks`
    say they cannot read it (no crash, no traceback), and nothing rewrites it."""
    from argparse import Namespace

    from bot import tasks_commands

    store = TaskStore(tmp_path / "state")
    store.folder.mkdir(parents=True)
    store.path.write_text('[{"id": "abcd"}]\n')
    llm.script(reply("still here"))
    async with harness(tmp_path, llm) as h:
        assert "could not read the background tasks" in await say(h, "/tasks", is_admin=True)
        assert "could not read the background tasks" in await say(h, "/stop abcd", is_admin=True)
        assert await say(h, "hello", is_admin=True) == "still here"
        show = Namespace(tasks_command="show", id="abcd")
        assert await asyncio.to_thread(tasks_commands.run, show, h.cfg) == 1
        assert "cannot read the task store" in capsys.readouterr().err
    assert store.path.read_text() == '[{"id": "abcd"}]\n'


async def test_a_label_cannot_hide_or_reorder_what_is_shown(tmp_path: Path) -> None:
    """The label (the model's words) is shown in /tasks, reports and a terminal: a bidi
    override or an escape in it shows by its code point; a long one is cut."""
    from bot.kinds import Sender
    from bot.tasks import TaskBoard
    from bot.tools.base import ToolContext
    from bot.tools.spawn import SpawnTool

    async def accept(msg):
        return "accepted"

    board = TaskBoard(
        TaskStore(tmp_path),
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=lambda msg: None,
    )
    ctx = ToolContext(tmp_path, session_key="telegram:g1", sender=Sender("u1", False, True))
    label = "safe \u202egnp.exe\x1b[2J\n" + "x" * 500
    await SpawnTool(board).run({"task": "t", "label": label}, ctx)
    [rec] = TaskStore(tmp_path).load().values()
    assert "\u202e" not in rec.label and "\x1b" not in rec.label and "\n" not in rec.label
    assert "U+202E" in rec.label and "U+001B" in rec.label and len(rec.label) < 100


async def test_a_wait_that_times_out_as_its_task_ends_keeps_the_result(tmp_path: Path) -> None:
    """The task ends (its result handed to the waiting turn, so no report) in the loop pass
    in which the wait times out: the turn still gets the result, which is otherwise told
    nowhere."""
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard

    accepted: list[InboundMessage] = []

    async def accept(msg):
        accepted.append(msg)
        return "accepted"

    board = TaskBoard(
        TaskStore(tmp_path),
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=lambda msg: None,
    )
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    rec = await board.start("telegram:g1", Sender("u1", True, False), "t", "l", scope, None, True)
    assert not isinstance(rec, str)
    loaded = board.store.load()

    async def records():  # read without a pause, so ended() runs within one loop pass
        return loaded

    board.records = records  # type: ignore[method-assign]
    waiting = asyncio.create_task(board.wait(rec.id, 0))
    await asyncio.sleep(0)  # the wait has begun, its timeout is due in this pass
    await board.ended(rec.id, "done", "R")
    assert await waiting == f"Task {rec.id} (l) finished:\n\nR"
    assert [m.kind.value for m in accepted] == ["task"]  # the task itself; no report


def test_the_task_store_reads_only_a_regular_file(tmp_path: Path) -> None:
    """tasks.json is read through bot.durable.read_regular: a link (to a list the model could
    have written) is not followed, and a FIFO is refused at once instead of hanging the
    gateway's start; the command says it cannot read the store."""
    import os

    store = TaskStore(tmp_path)
    store.folder.mkdir()
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text('{"tasks": [{"id": "abcd", "parent": "telegram:1", "starter": "x"}]}')
    store.path.symlink_to(elsewhere)
    with pytest.raises(OSError):
        store.load()
    store.path.unlink()
    os.mkfifo(store.path)
    with pytest.raises(OSError, match="not a regular file"):
        store.load()


async def test_a_task_asks_the_model_its_chat_chose_when_it_was_spawned(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """/model in the parent chat: its task asks that model (kept with the task), not llm.model,
    also after the chat switches back; a record written before the model was kept reads as
    llm.model's."""
    from bot.tasks import TaskRecord
    from bot.tasks_commands import show_lines

    llm.script(
        tool_step(("spawn", {"task": TASK}), when_user_contains="research"),
        reply("started", when_user_contains="research"),
        reply("There are 42 files.", when_user_contains="TASKTEXT"),
    )
    cfg = make_config(tmp_path, llm.base_url, llm={"models": {"fast": {"model": "gpt-fast"}}})
    async with Harness(cfg, tmp_path / "config.json", channels=("cli", "telegram")) as h:
        admin = {"is_admin": True, "is_group": False}
        assert (await say(h, "/model fast", **admin)).startswith("This chat now uses fast")
        await say(h, "research please", **admin)
        await until(lambda: reports(h))
        [rec] = TaskStore(tmp_path / "state").load().values()
        assert rec.model == "fast" and "model: fast" in show_lines(rec)  # memobot tasks show
    assert task_request(llm)["body"]["model"] == "gpt-fast"
    old = {"id": "abcd", "parent": "telegram:g1", "starter": "u1", "label": "old"}
    assert TaskRecord.from_dict(old).model is None


async def test_a_wait_stopped_as_its_task_hands_it_the_result_reports_it_once(
    tmp_path: Path,
) -> None:
    """The task ends and hands its result to the waiting spawn in the loop pass in which the
    waiting turn is stopped (/stop, a shutdown): the turn never takes the result, so it is
    reported to the chat instead, once, rather than told nowhere."""
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard

    accepted: list[InboundMessage] = []

    async def accept(msg):
        accepted.append(msg)
        return "accepted"

    board = TaskBoard(
        TaskStore(tmp_path),
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=lambda msg: None,
    )
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    rec = await board.start("telegram:g1", Sender("u1", True, False), "t", "l", scope, None, True)
    assert not isinstance(rec, str)
    loaded = board.store.load()

    async def records():  # read without a pause, so ended() hands over within one loop pass
        return loaded

    board.records = records  # type: ignore[method-assign]
    waiting = asyncio.create_task(board.wait(rec.id, 60))
    await asyncio.sleep(0)  # the turn waits for its task
    ending = asyncio.create_task(board.ended(rec.id, "done", "R"))
    await asyncio.sleep(0)  # the result is handed over; the waiting turn has not run since
    waiting.cancel()  # ... and is stopped in that same pass
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await ending
    reported = [m for m in accepted if m.kind.value == "report"]
    assert [m.text for m in reported] == [f"Task {rec.id} (l) finished:\n\nR"]
    assert TaskStore(tmp_path).load()[rec.id].state == "done"
    del board.records  # read from the store again
    await board.ended(rec.id, "done", "R")  # a second end (a restart) reports nothing more
    assert len([m for m in accepted if m.kind.value == "report"]) == 1


async def test_a_cancel_in_the_store_stops_a_task_also_after_its_folder_was_replaced(
    tmp_path: Path,
) -> None:
    """`memobot tasks cancel` (another process) writes the store; the gateway's one watch of
    it stops the task. Also when the store's folder was replaced while the task ran (moved
    away, restored from a copy): a watch of the folder itself (inotify) went deaf then."""
    import os

    from bot.tasks import TaskBoard, TaskRecord

    store = TaskStore(tmp_path)
    store.put(TaskRecord("abcd", "telegram:g1", "u1", "l", "running", time.time()))

    async def accept(msg):
        return "accepted"

    board = TaskBoard(
        store,
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=print,
        poll=0.01,  # the test's pace; a second in use
    )
    read = asyncio.Event()
    real_records = board.records

    async def records():
        found = await real_records()
        read.set()
        return found

    board.records = records  # type: ignore[method-assign]
    stopped = asyncio.Event()
    unwatch = board.watch("abcd", stopped.set)
    await asyncio.wait_for(read.wait(), 5)  # the watch has read the store once
    os.rename(store.folder, tmp_path / "tasks.old")
    store.folder.mkdir()
    store.put(TaskRecord("abcd", "telegram:g1", "u1", "l", "running", time.time()))
    assert not stopped.is_set()
    assert await asyncio.to_thread(TaskStore(tmp_path).request_cancel, "abcd") is not None
    await asyncio.wait_for(stopped.wait(), 5)
    unwatch()
    assert board._watcher is None  # no task runs: nothing watches


async def test_a_parent_resumed_mid_spawn_gets_its_task_back_not_a_second_one(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """The parent turn is stopped inside its spawn call, after the task was recorded and
    queued but before the turn's checkpoint has the call's result (a crash, a shutdown).
    A fresh stack over the same state folder resumes the turn and runs the call again: it
    gets the same task back (keyed by the session, the turn and the call), no second task,
    one report."""
    llm.script(
        tool_step(("spawn", {"task": TASK, "label": "count"}), when_user_contains="research"),
        # A model told the spawn call did not finish, and calling it again.
        tool_step(("spawn", {"task": TASK, "label": "again"}), when_user_contains="not finish"),
        reply("I started it.", when_user_contains="research"),
        reply("There are 42 files.", when_user_contains="TASKTEXT"),
    )
    admin = {"is_admin": True, "is_group": False}
    mid = "m-research"
    async with harness(tmp_path, llm) as h1:
        board = h1.stack.loop.tasks
        real_start = board.start
        recorded = asyncio.Event()

        async def start_then_die(*args, **kwargs):
            rec = await real_start(*args, **kwargs)
            recorded.set()
            await asyncio.Event().wait()  # killed here, the task recorded and queued
            return rec

        board.start = start_then_die  # type: ignore[method-assign]
        msg = InboundMessage(
            "telegram", "g1", "u1", "research please", message_id=mid, metadata=admin
        )
        assert await h1.stack.bus.publish_inbound(msg) == "accepted"
        await asyncio.wait_for(recorded.wait(), 15)
        [first] = TaskStore(tmp_path / "state").load().values()
    # Nothing of the first stack is used again: a new store, board and loop over the folder.
    async with harness(tmp_path, llm) as h2:
        answer = await until(lambda: [m for m in h2.outbox if m.reply_to == mid and m.final])
        assert answer[0].text == "I started it."
        await until(lambda: reports(h1) + reports(h2))
        assert list(TaskStore(tmp_path / "state").load()) == [first.id]
        assert tool_results(llm, "research") == [
            f"started task {first.id}: count. Its result will be posted in this chat when it "
            f"ends (/tasks lists it, /stop {first.id} stops it)."
        ]
    assert len(reports(h1) + reports(h2)) == 1


async def test_a_wait_result_lost_by_a_crash_before_the_turn_kept_it_is_given_again(
    tmp_path: Path, llm: FakeLLM
) -> None:
    """wait: true: the task hands its result to the waiting turn and ends (no report), and the
    parent is stopped before its checkpoint holds the result. Resumed, the spawn call runs
    again and gets the result again, from the task's session: it reaches the chat once, in
    the parent's answer, and no task runs twice."""
    from bot.tools.spawn import SpawnTool

    llm.script(
        tool_step(("spawn", {"task": TASK, "wait": True}), when_user_contains="research"),
        reply("The task says: 42", when_user_contains="research"),
        reply("There are 42 files.", when_user_contains="TASKTEXT"),
    )
    admin = {"is_admin": True, "is_group": False}
    mid = "m-research"
    async with harness(tmp_path, llm) as h1:
        spawn = h1.stack.loop.turns.tools.get("spawn")
        assert isinstance(spawn, SpawnTool)
        real_run = spawn.run
        handed = asyncio.Event()

        async def run_then_die(args, ctx):
            result = await real_run(args, ctx)
            handed.set()
            await asyncio.Event().wait()  # killed before the turn's checkpoint kept it
            return result

        spawn.run = run_then_die  # type: ignore[method-assign]
        msg = InboundMessage(
            "telegram", "g1", "u1", "research please", message_id=mid, metadata=admin
        )
        assert await h1.stack.bus.publish_inbound(msg) == "accepted"
        await asyncio.wait_for(handed.wait(), 15)
        [rec] = TaskStore(tmp_path / "state").load().values()
        await until(lambda: TaskStore(tmp_path / "state").load()[rec.id].told == "turn")
    async with harness(tmp_path, llm) as h2:
        answer = await until(lambda: [m for m in h2.outbox if m.reply_to == mid and m.final])
        assert answer[0].text == "The task says: 42"
    assert tool_results(llm, "research") == [
        f"Task {rec.id} (TASKTEXT: count the files) finished:\n\nThere are 42 files."
    ]
    assert reports(h1) + reports(h2) == []
    assert list(TaskStore(tmp_path / "state").load()) == [rec.id]


def test_a_resumed_batch_keeps_its_results_in_call_order() -> None:
    """A batch [spawn, exec] cut by a crash: exec is marked interrupted, spawn is left open and
    run again, and its result is put back before exec's (strict templates pair by position)."""
    from bot.runner import INTERRUPTED_TOOL_RESULT, close_open_tool_calls, results_in_call_order

    def call(cid: str, name: str) -> dict:
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}

    turn = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("a", "spawn"), call("b", "exec")],
        },
    ]
    assert close_open_tool_calls(turn, {"spawn"}) == 1
    assert [m.get("tool_call_id") for m in turn[2:]] == ["b"]
    assert turn[2]["content"] == INTERRUPTED_TOOL_RESULT
    turn.append({"role": "tool", "tool_call_id": "a", "name": "spawn", "content": "started"})
    results_in_call_order(turn)
    assert [m.get("tool_call_id") for m in turn[2:]] == ["a", "b"]


async def test_a_wait_result_is_recorded_as_the_turns_before_the_turn_has_it(
    tmp_path: Path,
) -> None:
    """The record says the task ended, told to the turn, before the waiting spawn returns the
    result into the turn: a SIGKILL after the turn's next checkpoint kept the result can then
    not leave the task "running" for the next start to report to the chat a second time."""
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard

    accepted: list[InboundMessage] = []

    async def accept(msg):
        accepted.append(msg)
        return "accepted"

    board = TaskBoard(
        TaskStore(tmp_path),
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=lambda msg: None,
    )
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    rec = await board.start("telegram:g1", Sender("u1", True, False), "t", "l", scope, None, True)
    assert not isinstance(rec, str)
    ending = asyncio.create_task(board.ended(rec.id, "done", "R"))
    text = await board.wait(rec.id, 60)
    # Read at once, as a checkpoint written right now would be followed by the kill.
    on_disk = TaskStore(tmp_path).load()[rec.id]
    assert text == f"Task {rec.id} (l) finished:\n\nR"
    assert (on_disk.state, on_disk.told) == ("done", "turn")
    await ending
    assert [m.kind.value for m in accepted] == ["task"]  # no report


async def test_a_parent_stopped_inside_start_leaves_no_task_unqueued(tmp_path: Path) -> None:
    """/stop of the parent turn while its spawn is storing the task (the record written, the
    pending turn being taken): the task is still queued and, once it ends, reported to the
    chat (nobody waits for it any more). Cut there, it stayed "running" with no turn, holding
    an agent.maxTasks place until the next restart, and its end waited for a taker for ever."""
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard

    accepted: list[InboundMessage] = []
    dispatched: list[InboundMessage] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def accept(msg):
        accepted.append(msg)
        if msg.kind.value == "task":
            entered.set()
            await release.wait()
        return "accepted"

    board = TaskBoard(
        TaskStore(tmp_path),
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=dispatched.append,
    )
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    starting = asyncio.create_task(
        board.start("telegram:g1", Sender("u1", True, False), "t", "l", scope, None, True)
    )
    await entered.wait()
    starting.cancel()  # the parent turn is stopped here
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await until(lambda: dispatched)
    [task] = dispatched
    task_id = task.session_key.removeprefix("task:")
    await asyncio.wait_for(board.ended(task_id, "done", "R"), 5)
    assert [m.kind.value for m in accepted] == ["task", "report"]
    assert TaskStore(tmp_path).load()[task_id].told == "chat"


async def test_a_wait_stopped_while_it_records_the_handover_is_reported_and_says_so(
    tmp_path: Path,
) -> None:
    """The waiting turn is stopped while it writes "told the turn" into the record: it never
    took the result, so the task reports to the chat, and the record then says the chat (a
    resumed parent would otherwise be given the result again beside the report)."""
    import threading

    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard

    accepted: list[InboundMessage] = []

    async def accept(msg):
        accepted.append(msg)
        return "accepted"

    store = TaskStore(tmp_path)
    board = TaskBoard(
        store,
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=lambda msg: None,
    )
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    rec = await board.start("telegram:g1", Sender("u1", True, False), "t", "l", scope, None, True)
    assert not isinstance(rec, str)
    writing, release = threading.Event(), threading.Event()
    real_end = store.end

    def slow_end(task_id, state, now, told=""):
        ended = real_end(task_id, state, now, told)
        if told == "turn":  # written; the turn is stopped before it hears so
            writing.set()
            release.wait(5)
        return ended

    store.end = slow_end  # type: ignore[method-assign]
    waiting = asyncio.create_task(board.wait(rec.id, 60))
    ending = asyncio.create_task(board.ended(rec.id, "done", "R"))
    await asyncio.to_thread(writing.wait, 5)
    waiting.cancel()  # the turn is stopped mid-write
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await asyncio.wait_for(ending, 5)
    assert [m.kind.value for m in accepted] == ["task", "report"]
    on_disk = TaskStore(tmp_path).load()[rec.id]
    assert (on_disk.state, on_disk.told) == ("done", "chat")


async def test_a_spawn_run_again_queues_its_task_when_the_crash_came_before_it_was(
    tmp_path: Path,
) -> None:
    """SIGKILL between the task's record and its pending turn: the record says running, the
    task's session was never written. The parent's resumed spawn call (same key) gets the
    task back and queues it now (taken once: the intake knows its id), rather than leaving it
    to be reported "failed" without having run."""
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard

    accepted: list[InboundMessage] = []
    dispatched: list[InboundMessage] = []
    lose_it = True

    async def accept(msg):
        if lose_it:
            raise RuntimeError("killed before the pending turn was written")
        accepted.append(msg)
        return "accepted"

    def board() -> TaskBoard:
        return TaskBoard(
            TaskStore(tmp_path),
            max_tasks=5,
            max_per_chat=5,
            timeout_seconds=60,
            accept=accept,
            dispatch=dispatched.append,
        )

    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    sender = Sender("u1", True, False)
    args = ("telegram:g1", sender, "the text", "l", scope, None, False)
    with pytest.raises(RuntimeError):
        await board().start(*args, call="m1/1/c1")
    [rec] = TaskStore(tmp_path).load().values()
    assert rec.state == "running" and not dispatched
    lose_it = False
    again = await board().start(*args, call="m1/1/c1")
    assert not isinstance(again, str) and again.id == rec.id
    assert [m.session_key for m in dispatched] == [f"task:{rec.id}"]
    assert dispatched[0].text == "the text" and list(TaskStore(tmp_path).load()) == [rec.id]


async def test_a_task_claimed_by_the_starts_reconcile_is_not_queued_by_its_spawn_call(
    tmp_path: Path,
) -> None:
    """The start's reconcile found the task (left unqueued by a crash) with no work and
    reports it ended; the parent's resumed spawn call, coming after that look, leaves it be
    (queued then, it would run after its "failed" report). The look holds the board's lock,
    the report does not: a spawn call meanwhile is not held up."""
    from bot.kinds import Sender
    from bot.privacy import PrivacyScope
    from bot.tasks import TaskBoard, TaskRecord

    dispatched: list[InboundMessage] = []

    async def accept(msg):
        return "accepted"

    store = TaskStore(tmp_path)
    store.put(TaskRecord("abcd", "telegram:g1", "u1", "l", "running", 1.0, call="m1/1/c1"))
    board = TaskBoard(
        store,
        max_tasks=5,
        max_per_chat=5,
        timeout_seconds=60,
        accept=accept,
        dispatch=dispatched.append,
    )

    async def no_work() -> bool:
        return False

    assert await board.unqueued("abcd", no_work)
    scope = PrivacyScope("owner", "telegram:g1", True, True, None)
    args = ("telegram:g1", Sender("u1", True, False), "t", "l", scope, None, False)
    again = await asyncio.wait_for(board.start(*args, call="m1/1/c1"), 5)
    assert not isinstance(again, str) and again.id == "abcd"
    assert dispatched == []
