"""Pairing: a stranger's private message gets a one-time code; the owner approves it.

With ``channels.<name>.dmPolicy: "pairing"`` (the default while allowFrom is empty) a private
message from someone allowFrom does not list is not processed; it is answered once with a
code of 8 characters from an alphabet without look-alikes (no 0/O, 1/I/L), valid one hour.
At most 3 codes wait per channel and a sender gets at most one reply per hour.
``memobot pairing approve CODE`` (or ``/approve CODE`` from an admin) moves the sender to the
approved list, which adds to (never rewrites) the config's allowFrom. Groups never pair.

One file per channel, ``<state>/pairing/<channel>.json``, written atomically (temporary file,
fsync, rename, fsync of the folder) under an flock, so the CLI and the running gateway can both
change it. The gateway reads it again whenever its mtime changes: an approval counts at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bot import durable
from bot.invocation import command_for
from bot.private import replace_durably
from channels.refused import shown_name, shown_who

log = logging.getLogger(__name__)
_T = TypeVar("_T")

ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L
CODE_LENGTH = 8
CODE_TTL_SECONDS = 3600.0
MAX_PENDING = 3
REPLY_INTERVAL_SECONDS = 3600.0
FOLDER = "pairing"
APPROVED_TEXT = "You have been approved: you can talk to me now."


def new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))


def normalise_code(code: str) -> str:
    return code.strip().upper().replace("-", "").replace(" ", "")


def code_text(code: str, channel: str, sender_id: str) -> str:
    """The one reply a stranger gets."""
    return (
        f"I don't know you yet. To be let in, give the owner of this bot this code: {code}\n"
        f"(valid for 1 hour; they approve it with: memobot pairing approve {code}, or "
        f"/approve {code} in their own chat). Your {channel} id is {sender_id}."
    )


@dataclass(frozen=True, slots=True)
class Approved:
    channel: str
    sender_id: str
    name: str
    chat_id: str
    approved_at: float

    @property
    def who(self) -> str:
        return shown_who(self.sender_id, self.name)


@dataclass(frozen=True, slots=True)
class Request:
    """A code waiting for the owner."""

    channel: str
    code: str
    sender_id: str
    name: str
    created: float

    @property
    def who(self) -> str:
        return shown_who(self.sender_id, self.name)

    def minutes_left(self, now: float) -> float:
        return max(0.0, (CODE_TTL_SECONDS - (now - self.created)) / 60)


@dataclass(frozen=True, slots=True)
class Listing:
    """``memobot pairing list`` of one channel: the codes waiting, the people let in."""

    waiting: list[Request]
    approved: list[Approved]


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_durably(path, json.dumps(data, indent=1))


class PairingStore:
    """The pairing file of one channel. Thread-safe and process-safe (flock)."""

    def __init__(
        self, state_dir: Path, channel: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.channel = channel
        self.folder = state_dir / FOLDER
        self.path = self.folder / f"{channel}.json"
        self.clock = clock
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) last read
        self._approved: frozenset[str] = frozenset()

    # -- reading --

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"approved": [], "pending": [], "replied": {}}
        except (OSError, ValueError) as exc:
            # Never guess: a damaged file lets nobody in through pairing until it is fixed.
            log.error("pairing file %s cannot be read (%s); no paired ids apply", self.path, exc)
            return {"approved": [], "pending": [], "replied": {}, "damaged": True}
        data.setdefault("approved", [])
        data.setdefault("pending", [])
        data.setdefault("replied", {})
        return data

    def approved_ids(self) -> frozenset[str]:
        """The approved sender ids; read again when the file changed (one stat per call)."""
        seen = durable.stamp(self.path)
        if seen != self._seen:
            self._approved = frozenset(str(a["id"]) for a in self._read()["approved"])
            self._seen = seen
        return self._approved

    # -- changing (read, change, write under the lock) --

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with durable.exclusive(self.folder / ".lock"):
            data = self._read()
            if data.get("damaged"):
                raise OSError(f"pairing file {self.path} is damaged; fix or remove it")
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                _write_atomic(self.path, data)

    def _prune(self, data: dict[str, Any], now: float) -> None:
        data["pending"] = [p for p in data["pending"] if now - p["created"] < CODE_TTL_SECONDS]
        data["replied"] = {
            k: t for k, t in data["replied"].items() if now - t < REPLY_INTERVAL_SECONDS
        }

    def request(self, sender_id: str, name: str, chat_id: str) -> str | None:
        """A code to send to this stranger, or None: no reply now (one was sent within the
        hour, or the channel already has its 3 pending codes)."""
        name = shown_name(name)  # the stranger's to choose: shown by the panel and the log
        now = self.clock()
        with self._locked() as data:
            self._prune(data, now)
            if sender_id in data["replied"]:
                return None
            if any(str(a["id"]) == sender_id for a in data["approved"]):
                return None  # approved meanwhile: the next message goes through
            if len(data["pending"]) >= MAX_PENDING:
                log.warning(
                    "channel %s: pairing request from %s ignored: %d codes already wait "
                    "(memobot pairing list)",
                    self.channel,
                    sender_id,
                    MAX_PENDING,
                )
                return None
            code = new_code()
            data["pending"].append(
                {"code": code, "id": sender_id, "name": name, "chat_id": chat_id, "created": now}
            )
            data["replied"][sender_id] = now
        log.warning(
            "channel %s: pairing code issued to %s%s; approve with: memobot pairing approve %s",
            self.channel,
            sender_id,
            f" ({name})" if name else "",
            code,
        )
        return code

    def approve(self, code: str) -> Approved | None:
        """Approve the sender holding ``code``; None when no such code waits (or it expired)."""
        code = normalise_code(code)
        now = self.clock()
        with self._locked() as data:
            self._prune(data, now)
            match = next((p for p in data["pending"] if p["code"] == code), None)
            if match is None:
                return None
            data["pending"] = [p for p in data["pending"] if p is not match]
            data["approved"] = [a for a in data["approved"] if str(a["id"]) != match["id"]]
            entry = {
                "id": match["id"],
                "name": match.get("name", ""),
                "chat_id": match.get("chat_id", match["id"]),
                "approved_at": now,
                "notified": False,
            }
            data["approved"].append(entry)
        log.info("channel %s: %s approved through pairing", self.channel, match["id"])
        return Approved(self.channel, entry["id"], entry["name"], entry["chat_id"], now)

    def refuse(self, code: str) -> Request | None:
        """Drop the waiting ``code`` (its sender gets no new one within the hour: their
        reply time stays); the entry it was, or None when no such code waits."""
        code = normalise_code(code)
        with self._locked() as data:
            self._prune(data, self.clock())
            match = next((p for p in data["pending"] if p["code"] == code), None)
            if match is None:
                return None
            data["pending"] = [p for p in data["pending"] if p is not match]
        log.info("channel %s: pairing request of %s refused", self.channel, match["id"])
        return self._request(match)

    def _request(self, entry: dict[str, Any]) -> Request:
        return Request(
            self.channel, entry["code"], str(entry["id"]), entry.get("name", ""), entry["created"]
        )

    def revoke(self, sender_id: str) -> bool:
        with self._locked() as data:
            before = len(data["approved"])
            data["approved"] = [a for a in data["approved"] if str(a["id"]) != sender_id]
            data["pending"] = [p for p in data["pending"] if p["id"] != sender_id]
            return len(data["approved"]) != before

    def unannounced(self) -> list[Approved]:
        return [
            Approved(self.channel, str(a["id"]), a.get("name", ""), a["chat_id"], a["approved_at"])
            for a in self._read()["approved"]
            if not a.get("notified")
        ]

    def announced(self, sender_id: str, approved_at: float) -> None:
        with self._locked() as data:
            for a in data["approved"]:
                if str(a["id"]) == sender_id and a["approved_at"] == approved_at:
                    a["notified"] = True

    def snapshot(self) -> dict[str, Any]:
        data = self._read()
        self._prune(data, self.clock())
        return data

    def listing(self) -> Listing:
        data = self.snapshot()
        return Listing(
            [self._request(p) for p in data["pending"]],
            [
                Approved(
                    self.channel, str(a["id"]), a.get("name", ""), a.get("chat_id", ""),
                    a.get("approved_at", 0.0),
                )
                for a in data["approved"]
            ],
        )  # fmt: skip


Announce = Callable[[str, str, str, str], Awaitable[bool]]
ANNOUNCE_EVERY_SECONDS = 2.0


async def announce_approvals(
    found: list[PairingStore], announce: Announce, every: float = ANNOUNCE_EVERY_SECONDS
) -> None:
    """Tell each newly approved person, once, in their chat (runs in the gateway).

    ``announce(channel, chat_id, text, marker)`` sends a permanent message exactly once per
    marker (the agent loop's ledger); the pairing file's "notified" flag only saves the check.
    """
    while True:
        for store in found:
            try:
                waiting = await asyncio.to_thread(store.unannounced)
                for a in waiting:
                    marker = f"pairing:{a.channel}:{a.sender_id}:{a.approved_at}"
                    await announce(a.channel, a.chat_id, APPROVED_TEXT, marker)
                    await asyncio.to_thread(store.announced, a.sender_id, a.approved_at)
            except OSError as exc:
                log.error("pairing announcements for %s failed: %s", store.channel, exc)
        await asyncio.sleep(every)


def stores(state_dir: Path, channels: list[str] | None = None) -> list[PairingStore]:
    """The pairing stores of ``channels``, or of every channel that has a pairing file."""
    if channels is None:
        folder = state_dir / FOLDER
        channels = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
    return [PairingStore(state_dir, c) for c in channels]


def _first(state_dir: Path, act: Callable[[PairingStore], _T | None]) -> _T | None:
    """``act`` on each channel's store until one has the code (its answer), else None."""
    for store in stores(state_dir):
        found = act(store)
        if found is not None:
            return found
    return None


def approve_code(state_dir: Path, code: str) -> Approved | None:
    return _first(state_dir, lambda store: store.approve(code))


def no_code_text(code: str) -> str:
    """What the owner is told when ``code`` waits nowhere (CLI and panel alike)."""
    return f"No waiting pairing code {normalise_code(code)} (codes expire after 1 h)."


def refused_text(channel: str, sender_id: str) -> str:
    return f"Refused {channel} user {sender_id}; no new code for them within the hour."


def refuse_code(state_dir: Path, code: str) -> Request | None:
    """The refused request, or None when no channel has ``code`` waiting."""
    return _first(state_dir, lambda store: store.refuse(code))


def revoke_paired(state_dir: Path, channel: str, sender_id: str) -> str:
    """Take back an approval made through pairing (CLI and panel alike); what to tell the
    owner (it starts with "Revoked" when there was one)."""
    if PairingStore(state_dir, channel).revoke(sender_id):
        return f"Revoked {channel} user {sender_id}: pairing lets them in no more."
    return f"{channel} user {sender_id} was not approved through pairing."


# -- the CLI: memobot pairing list | approve CODE | refuse CODE | revoke CHANNEL ID ----------


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    pairing = sub.add_parser(
        "pairing",
        parents=[common],
        help="let new people in: list, approve, refuse or revoke pairing codes (dmPolicy pairing)",
        description='With channels.<name>.dmPolicy "pairing" (the default while allowFrom is '
        "empty), a stranger's private message is answered with a one-time code (valid 1 "
        "hour); the gateway logs it too. Approving the code lets that person "
        "in at once, also in a running gateway; approved ids live in the state folder and add "
        "to the config's allowFrom.",
    )
    verbs = pairing.add_subparsers(dest="pairing_command", metavar="SUBCOMMAND", required=True)
    verbs.add_parser(
        "list", parents=[common], help="show waiting codes and approved ids, per channel"
    )
    approve = verbs.add_parser(
        "approve", parents=[common], help="let in the person who was given CODE"
    )
    approve.add_argument("code", help="the 8-character code the person received")
    refuse = verbs.add_parser(
        "refuse", parents=[common], help="drop the waiting CODE: that person is not let in"
    )
    refuse.add_argument("code", help="the 8-character code the person received")
    revoke = verbs.add_parser(
        "revoke", parents=[common], help="take back an approval made through pairing"
    )
    revoke.add_argument("channel", help="telegram, discord or slack")
    revoke.add_argument("id", help="the person's user id on that channel")


def run(args: argparse.Namespace, state_dir: Path, config_path: Path) -> int:
    if args.pairing_command == "approve":
        approved = approve_code(state_dir, args.code)
        if approved is None:
            print(no_code_text(args.code))
            return 1
        print(f"Approved {approved.channel} user {approved.who}. They will be told.")
        add = f"channels add {approved.channel} --owner {approved.sender_id}"
        owner = command_for(config_path, add)
        print(
            "They are a guest, not an admin. If this is you, the owner, make yourself the "
            f"admin with: {owner} (then restart the gateway)"
        )
        return 0
    if args.pairing_command == "refuse":
        refused = refuse_code(state_dir, args.code)
        if refused is None:
            print(no_code_text(args.code))
            return 1
        print(refused_text(refused.channel, refused.sender_id))
        return 0
    if args.pairing_command == "revoke":
        text = revoke_paired(state_dir, args.channel, str(args.id))
        print(text)
        return 0 if text.startswith("Revoked") else 1
    found = stores(state_dir)
    if not found:
        print("No pairing requests yet.")
    now = time.time()
    for store in found:
        listing = store.listing()
        print(f"{store.channel}:")
        for p in listing.waiting:
            print(f"  waiting  {p.code}  {p.who}, {p.minutes_left(now):.0f} min left")
        for a in listing.approved:
            print(f"  approved {a.who}")
        if not listing.waiting and not listing.approved:
            print("  nothing")
    return 0
