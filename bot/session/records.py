"""The shape of what a session file may hold, checked on load (DESIGN.md section 4).

A session file is written by memobot, but the agent's own tools can reach it, and a disk or a
hand edit can damage it: every record is untrusted input. These checks are pure functions over
parsed JSON. They never reformat a good record (the file format and the prompt prefix stay
exactly as written); they say what is wrong with a bad one and, for metadata, what is left of
it once the bad parts are removed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator


class _Strict(BaseModel):
    # Unknown keys are kept (a newer memobot, a provider's extra fields); known ones must have
    # the type the code reads them as.
    model_config = ConfigDict(extra="allow", strict=True)


class _Function(_Strict):
    name: str
    arguments: str


class _ToolCall(_Strict):
    id: str
    function: _Function
    type: str = "function"


class MessageRecord(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: Any = None  # any JSON: the history sanitizer turns what the API refuses into text
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    timestamp: str | None = None
    answered_by: str | None = None

    @model_validator(mode="after")
    def _tool_result_names_its_call(self) -> MessageRecord:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs a tool_call_id")
        return self


class FileRefRecord(_Strict):
    """A file a pending turn names, fetched by its channel when the turn runs (bot.media)."""

    id: str
    name: str = ""
    size: int | None = None
    mimetype: str = ""
    url: str = ""
    extra: dict[str, Any] = Field(default_factory=dict)


class PendingEntry(_Strict):
    id: str | None  # required: redeliveries are recognised and turns finished by it
    sender_id: str = ""
    text: str = ""
    media: list[str] = Field(default_factory=list)
    files: list[FileRefRecord] = Field(default_factory=list)  # not fetched yet
    reply_to: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    received_at: str | None = None


class OutboxEntry(_Strict):
    id: str
    channel: str
    chat_id: str
    text: str
    reply_to: str | None = None
    state: Literal["queued", "sending", "failed"] = "queued"
    next: int = Field(default=0, ge=0)  # the first piece not known to have gone out
    pieces: list[str] | None = None  # the answer as split for its channel (when > 1 piece)
    media: list[str] = Field(default_factory=list)  # files sent after the pieces
    reason: str | None = None  # "failed": why the platform refused it
    failed_at: float | int | None = None


class ApprovalRecord(_Strict):
    """A tool call waiting for (or answered by) a person: bot.gate.approval."""

    id: str
    call_id: str
    tool: str
    summary: str
    key: str
    asked_by: str
    is_group: bool = False
    owner: bool = False  # an unattended turn's question: an admin answers it
    asked_in: list[list[str]] | None = None  # owner: the admins' chats it was asked in
    asked_at: float | int
    deadline: float | int
    state: Literal["waiting", "once", "always", "deny", "timeout", "stopped"]
    by: str | None = None
    press: str | None = None


class ClosedApproval(_Strict):
    id: str
    state: str
    by: str | None = None
    press: str | None = None
    at: float | int | None = None


class PreviewEntry(_Strict):
    """A streamed answer's preview messages (bot/delivery.py): edited into the answer."""

    reply_to: str | None = None
    ids: list[str] = Field(default_factory=list)


class Checkpoint(_Strict):
    phase: Literal["awaiting_tools", "awaiting_approval", "tools_completed", "final_response"]
    message_id: str | None = None
    messages: list[MessageRecord] = Field(min_length=1)
    at: str | None = None
    approval: ApprovalRecord | None = None  # awaiting_approval: the question
    answer_file: str | None = None  # final_response: the whole answer, when it was cut

    @model_validator(mode="after")
    def _final_answer_is_text(self) -> Checkpoint:
        last = self.messages[-1]
        if self.phase == "final_response" and (
            last.role != "assistant" or not isinstance(last.content, str | None)
        ):
            raise ValueError("a final_response checkpoint must end with the assistant's text")
        if self.phase == "awaiting_approval" and self.approval is None:
            raise ValueError("an awaiting_approval checkpoint needs its approval")
        return self


class ResumeInfo(_Strict):
    message_id: str | None = None
    attempts: int = Field(default=0, ge=0)


_ENTRY_LISTS: dict[str, TypeAdapter[Any]] = {
    "pending": TypeAdapter(PendingEntry),
    "outbox": TypeAdapter(OutboxEntry),
    "previews": TypeAdapter(PreviewEntry),
    "seen_ids": TypeAdapter(str | None, config=ConfigDict(strict=True)),
    "approvals_closed": TypeAdapter(ClosedApproval),
    "approved_calls": TypeAdapter(str, config=ConfigDict(strict=True)),
    "notices": TypeAdapter(str, config=ConfigDict(strict=True)),
}
_FIELDS: dict[str, TypeAdapter[Any]] = {
    "key": TypeAdapter(str, config=ConfigDict(strict=True)),
    "created_at": TypeAdapter(str, config=ConfigDict(strict=True)),
    "runtime_checkpoint": TypeAdapter(Checkpoint),
    "resume": TypeAdapter(ResumeInfo),
    "interrupted": TypeAdapter(dict[str, Any], config=ConfigDict(strict=True)),
    "chat_model": TypeAdapter(str, config=ConfigDict(strict=True)),
}
_MESSAGE = TypeAdapter(MessageRecord)
_COUNT = TypeAdapter(int, config=ConfigDict(strict=True))


@dataclass(frozen=True, slots=True)
class Checked:
    """One session line after the shape check.

    ``record`` is what the loader uses: the line itself when it is good, a metadata record
    with its bad fields removed, or None when nothing of the line can be used. ``problems``
    says what was wrong, for the log and for ``memobot doctor``; empty when the line is good.
    ``last_consolidated`` is None when the metadata record's pointer is unusable (the loader
    then keeps the previous one).
    """

    record: dict[str, Any] | None
    problems: tuple[str, ...] = ()
    is_metadata: bool = False
    last_consolidated: int | None = None


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def check_record(value: Any) -> Checked:
    """The shape check of one parsed session line; see ``Checked``. Never raises."""
    if not isinstance(value, dict):
        return Checked(None, (f"a JSON {type(value).__name__}, not a message or metadata record",))
    if value.get("_type") == "metadata":
        return check_metadata_record(value)
    try:
        _MESSAGE.validate_python(value)
    except ValidationError as exc:
        return Checked(None, (f"message {_describe(exc)}",))
    return Checked(value)


def _pointer(value: dict[str, Any], problems: list[str]) -> int | None:
    lc_raw = value.get("last_consolidated")
    if lc_raw is None:
        return 0
    try:
        lc: int | None = _COUNT.validate_python(lc_raw)
    except ValidationError:
        lc = None
    if lc is None or lc < 0:
        problems.append(f"last_consolidated {json.dumps(lc_raw)[:40]} is not a count")
        return None
    return lc


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def hot_problem(hot: Any) -> str | None:
    """What is wrong with a snapshot's ``hot`` field (where the file stands), or None."""
    if not isinstance(hot, dict):
        return "hot is not a JSON object"
    for name in ("base", "archived_bytes", "tail_at"):
        if not _is_count(hot.get(name)):
            return f"hot.{name} is not a count"
    if "count" in hot and not _is_count(hot["count"]):
        return "hot.count is not a count"
    if not isinstance(hot.get("gen"), str):
        return "hot.gen is not a string"
    return None


def check_metadata_record(value: dict[str, Any]) -> Checked:
    if "changes" in value:
        return _check_changes_record(value)
    meta = value.get("metadata", {})
    if not isinstance(meta, dict):
        return Checked(None, ("metadata is not a JSON object",), is_metadata=True)
    problems: list[str] = []
    lc = _pointer(value, problems)
    clean, field_problems = clean_metadata(meta)
    problems += field_problems
    record = value if not problems else {**value, "metadata": clean}
    if "hot" in value and (problem := hot_problem(value["hot"])):
        problems.append(problem)
        record = {k: v for k, v in record.items() if k != "hot"}
    return Checked(record, tuple(problems), is_metadata=True, last_consolidated=lc)


_LIST_OPS = ("drop", "put", "add")


def _check_changes_record(value: dict[str, Any]) -> Checked:
    """A metadata record that carries changes to the one before it (see bot.session)."""
    changes = value.get("changes")
    if not isinstance(changes, dict):
        return Checked(None, ("metadata changes are not a JSON object",), is_metadata=True)
    problems: list[str] = []
    lc = _pointer(value, problems)
    snap = value.get("snap")
    if not (
        isinstance(snap, list)
        and len(snap) == 2
        and _is_count(snap[0])
        and isinstance(snap[1], str)
    ):
        problems.append("snap is not [offset, generation]")
    clean: dict[str, Any] = {}
    for part, body in changes.items():
        if part == "set" and isinstance(body, dict):
            clean[part], found = clean_metadata(body)
            problems += found
        elif part == "unset" and isinstance(body, list):
            clean[part] = [k for k in body if isinstance(k, str)]
            if len(clean[part]) != len(body):
                problems.append("changes.unset holds a key that is not a string")
        elif part == "lists" and isinstance(body, dict):
            clean[part] = _clean_list_ops(body, problems)
        else:
            problems.append(f"changes.{part[:40]} is not understood")
    record = value if not problems else {**value, "changes": clean}
    return Checked(record, tuple(problems), is_metadata=True, last_consolidated=lc)


def _clean_list_ops(lists: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for name, ops in lists.items():
        if not isinstance(ops, dict) or not set(ops) <= set(_LIST_OPS):
            problems.append(f"changes.lists.{name[:40]} is not drop/put/add")
            continue
        entry = _ENTRY_LISTS.get(name)
        kept: dict[str, Any] = {}
        for op, items in ops.items():
            if not isinstance(items, list):
                problems.append(f"changes.lists.{name}.{op} is not a list")
                continue
            good = []
            for i, item in enumerate(items):
                if op == "drop":
                    ok = item is None or isinstance(item, str | int)
                    if not ok:
                        problems.append(f"changes.lists.{name}.drop[{i}] is not an id")
                elif entry is not None:
                    try:
                        entry.validate_python(item)
                        ok = True
                    except ValidationError as exc:
                        ok = False
                        problems.append(f"changes.lists.{name}.{op}[{i}]: {_describe(exc)}")
                else:
                    ok = True
                if ok:
                    good.append(item)
            kept[op] = good
        clean[name] = kept
    return clean


def clean_metadata(meta: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``meta`` without the fields (or list entries) of the wrong shape, and what they were.

    A bad field is dropped rather than the whole record: each metadata record is a full
    snapshot, so the record's good fields (a newer pending turn, an answer in the outbox) are
    the most recent truth there is, while an older record would bring back turns and answers
    that were already finished. A list keeps its good entries. Returns ``meta`` itself when
    nothing is wrong.
    """
    problems: list[str] = []
    clean: dict[str, Any] = {}
    for name, value in meta.items():
        if value is None:
            clean[name] = value
            continue
        entry = _ENTRY_LISTS.get(name)
        if entry is not None:
            if not isinstance(value, list):
                problems.append(f"metadata.{name} is a JSON {type(value).__name__}, not a list")
                continue
            kept = []
            for i, item in enumerate(value):
                try:
                    entry.validate_python(item)
                except ValidationError as exc:
                    problems.append(f"metadata.{name}[{i}]: {_describe(exc)}")
                else:
                    kept.append(item)
            clean[name] = kept if len(kept) != len(value) else value
            continue
        adapter = _FIELDS.get(name)
        if adapter is not None:
            try:
                adapter.validate_python(value)
            except ValidationError as exc:
                problems.append(f"metadata.{name}: {_describe(exc)}")
                continue
        clean[name] = value
    return (clean if problems else meta), problems
