"""A local fake of Discord's wire: the REST API (v10) and the gateway WebSocket, for tests.

The real discord.py talks to it once its two endpoint constants point here (see
``FakeDiscord.patch``): ``discord.http.Route.BASE`` -> ``api_base`` and
``DiscordWebSocket.DEFAULT_GATEWAY`` -> ``gateway_url``. The gateway speaks plain JSON text
frames: HELLO, then READY (the guilds as unavailable stubs) and one GUILD_CREATE per guild after
IDENTIFY, HEARTBEAT_ACK for every heartbeat, RESUMED for a RESUME; tests push MESSAGE_CREATE
events with ``send_message``. The REST side answers login (``/users/@me``,
``/oauth2/applications/@me``), records every ``POST /channels/{id}/messages`` and
``/typing`` call (and ``PATCH`` edits, with the content each message showed before:
``unchanged_edits``), serves channels and attachment bytes, and plays scripted failures
(``fail_next``), e.g. a 429 with ``retry_after`` or a 403. Message components (buttons) are
kept with each message; ``press`` clicks one as a member or DM user (an INTERACTION_CREATE of
type 3, as Discord sends it), and ``POST /interactions/{id}/{token}/callback`` records the
bot's answer (``interaction_answers``); an interaction answered twice gets Discord's 400.

Discord's own rules are kept, with windows short enough for tests (both configurable):

- every ``POST /channels/{id}/messages`` answer carries ``X-RateLimit-Limit``, ``-Remaining``,
  ``-Reset``, ``-Reset-After`` and ``-Bucket``; a channel takes ``rate_limit`` messages per
  ``rate_window`` seconds (Discord: 5 per 5 s) and answers the next one with a 429, JSON
  ``retry_after`` and the same headers;
- IDENTIFY with a token the gateway does not accept closes with 4004, and IDENTIFY asking for a
  privileged intent the application is not allowed (``allowed_intents``) closes with 4014;
- ``send_reconnect`` (op 7) and ``invalidate_session`` (op 9, resumable or not) ask the client
  to reconnect, as Discord does when it moves or drops a session.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

API_PREFIX = "/api/v10"
# What a bot may upload in one message to a server without boosts (Discord: 10 MiB since 2024).
UPLOAD_LIMIT = 10 * 1024 * 1024
TOKEN = "fake-discord-token"
BOT_ID = 1_100_000_000_000_000_001
GUILD_ID = 1_100_000_000_000_000_100
TEXT_CHANNEL_ID = 1_100_000_000_000_000_200
OTHER_CHANNEL_ID = 1_100_000_000_000_000_201
THREAD_ID = 1_100_000_000_000_000_300
TIMESTAMP = "2025-01-01T12:00:00.000000+00:00"
# Intents Discord only grants when they are switched on in the Developer Portal.
GUILD_MEMBERS, GUILD_PRESENCES, MESSAGE_CONTENT = 1 << 1, 1 << 8, 1 << 15
PRIVILEGED_INTENTS = GUILD_MEMBERS | GUILD_PRESENCES | MESSAGE_CONTENT
RATE_LIMIT = 5  # messages per channel per window, as Discord
RATE_WINDOW = 5.0  # seconds; tests pass a shorter one

_ids = itertools.count(1_200_000_000_000_000_000)


def snowflake() -> str:
    return str(next(_ids))


def user(user_id: int | str, name: str, *, bot: bool = False) -> dict[str, Any]:
    return {
        "id": str(user_id),
        "username": name,
        "global_name": name.title(),
        "discriminator": "0",
        "avatar": None,
        "bot": bot,
    }


BOT_USER = user(BOT_ID, "memobot", bot=True)


def text_channel(channel_id: int, name: str, guild_id: int = GUILD_ID) -> dict[str, Any]:
    return {
        "id": str(channel_id),
        "type": 0,
        "guild_id": str(guild_id),
        "name": name,
        "position": 0,
        "permission_overwrites": [],
        "nsfw": False,
        "parent_id": None,
        "topic": None,
        "last_message_id": None,
        "rate_limit_per_user": 0,
    }


def thread(thread_id: int, parent_id: int, name: str, guild_id: int = GUILD_ID) -> dict[str, Any]:
    return {
        "id": str(thread_id),
        "type": 11,  # public thread
        "guild_id": str(guild_id),
        "parent_id": str(parent_id),
        "owner_id": str(BOT_ID),
        "name": name,
        "message_count": 0,
        "member_count": 1,
        "rate_limit_per_user": 0,
        "thread_metadata": {
            "archived": False,
            "auto_archive_duration": 1440,
            "archive_timestamp": TIMESTAMP,
            "locked": False,
        },
    }


def guild(
    guild_id: int = GUILD_ID,
    channels: list[dict[str, Any]] | None = None,
    threads: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A GUILD_CREATE payload as Discord sends it to a bot without the members intent."""
    return {
        "id": str(guild_id),
        "name": "Test Guild",
        "icon": None,
        "owner_id": "1300000000000000001",
        "features": [],
        "roles": [
            {
                "id": str(guild_id),
                "name": "@everyone",
                "permissions": "1071698660929",
                "position": 0,
                "color": 0,
                "hoist": False,
                "managed": False,
                "mentionable": False,
                "flags": 0,
            }
        ],
        "emojis": [],
        "stickers": [],
        "channels": channels
        if channels is not None
        else [
            text_channel(TEXT_CHANNEL_ID, "general", guild_id),
            text_channel(OTHER_CHANNEL_ID, "random", guild_id),
        ],
        "threads": threads
        if threads is not None
        else [thread(THREAD_ID, TEXT_CHANNEL_ID, "a thread", guild_id)],
        "members": [
            {
                "user": BOT_USER,
                "roles": [],
                "joined_at": TIMESTAMP,
                "deaf": False,
                "mute": False,
                "flags": 0,
            }
        ],
        "member_count": 3,
        "large": False,
        "unavailable": False,
        "joined_at": TIMESTAMP,
        "voice_states": [],
        "presences": [],
        "stage_instances": [],
        "guild_scheduled_events": [],
        "mfa_level": 0,
        "verification_level": 0,
        "explicit_content_filter": 0,
        "default_message_notifications": 0,
        "afk_timeout": 300,
        "premium_tier": 0,
        "preferred_locale": "en-US",
        "system_channel_flags": 0,
        "nsfw_level": 0,
        "premium_progress_bar_enabled": False,
    }


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # discord.py decodes a body only when Content-Type is exactly "application/json".
    return web.Response(
        body=json.dumps(body).encode(),
        status=status,
        headers={**(headers or {}), "Content-Type": "application/json"},
    )


@dataclass
class Failure:
    """A scripted answer for the next matching POST to a channel."""

    status: int
    retry_after: float | None = None
    via: bool = True  # discord.py treats a 429 without "Via" as a Cloudflare ban (not retried)
    body: dict[str, Any] | None = None
    path_contains: str = "/messages"
    stall: float = 0.0  # seconds before answering (status 0: then carry on as if unscripted)


@dataclass
class Call:
    method: str
    path: str
    channel_id: str | None
    body: Any
    at: float = 0.0
    status: int = 200
    result: Any = None  # the message Discord answered with (POST .../messages)
    before: str | None = None  # PATCH of a message: the content it showed when the edit came
    files: list[tuple[str, bytes]] = field(default_factory=list)  # (filename, data) uploaded


class FakeDiscord:
    """``async with FakeDiscord() as api:`` -> ``api.api_base``, ``api.gateway_url``."""

    def __init__(
        self,
        token: str = TOKEN,
        guilds: list[dict[str, Any]] | None = None,
        *,
        allowed_intents: int = PRIVILEGED_INTENTS,
        rate_limit: int = RATE_LIMIT,
        rate_window: float = RATE_WINDOW,
    ) -> None:
        self.token = token
        self.gateway_token = token  # what IDENTIFY must carry; a test may revoke it
        self.allowed_intents = allowed_intents  # privileged intents enabled for the bot
        self.rate_limit = rate_limit
        self.rate_window = rate_window
        self._windows: dict[str, tuple[float, int]] = {}  # channel -> (window start, count)
        self.closes: list[int] = []  # close codes the gateway sent
        self.guilds = guilds if guilds is not None else [guild()]
        self.calls: list[Call] = []
        self.identifies: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self.attachments: dict[str, bytes] = {}
        # message id -> the bot's message as the channel shows it now (content, edits)
        self.shown_messages: dict[str, dict[str, Any]] = {}
        self.attachment_delay = 0.0  # seconds before an attachment download is answered
        self.dm_channels: dict[str, dict[str, Any]] = {}
        self.logins = 0
        self.login_failures: list[int] = []  # statuses for the next GET /users/@me calls
        self._sockets: list[web.WebSocketResponse] = []
        self._seq = 0
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get(f"{API_PREFIX}/users/@me", self._me)
        app.router.add_get(f"{API_PREFIX}/oauth2/applications/@me", self._application)
        app.router.add_get(f"{API_PREFIX}/gateway", self._gateway_info)
        app.router.add_get(f"{API_PREFIX}/gateway/bot", self._gateway_info)
        app.router.add_get(f"{API_PREFIX}/channels/{{channel_id}}", self._get_channel)
        app.router.add_post(f"{API_PREFIX}/users/@me/channels", self._open_dm)
        app.router.add_post(f"{API_PREFIX}/channels/{{channel_id}}/messages", self._post_message)
        app.router.add_patch(
            f"{API_PREFIX}/channels/{{channel_id}}/messages/{{message_id}}", self._edit_message
        )
        app.router.add_delete(
            f"{API_PREFIX}/channels/{{channel_id}}/messages/{{message_id}}", self._delete_message
        )
        app.router.add_post(f"{API_PREFIX}/channels/{{channel_id}}/typing", self._typing)
        app.router.add_get("/attachments/{name}", self._attachment)
        app.router.add_post(
            f"{API_PREFIX}/interactions/{{interaction_id}}/{{token}}/callback", self._callback
        )
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return self.url + API_PREFIX

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    @contextmanager
    def patch(self) -> Iterator[None]:
        """Point discord.py's REST base and default gateway at this server."""
        import discord.http
        import yarl
        from discord.gateway import DiscordWebSocket

        old_base, old_gateway = discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
        discord.http.Route.BASE = self.api_base
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.gateway_url)
        try:
            yield
        finally:
            discord.http.Route.BASE = old_base
            DiscordWebSocket.DEFAULT_GATEWAY = old_gateway

    # -- what tests drive --------------------------------------------------------------------

    def fail_next(self, status: int, **opts: Any) -> None:
        self.failures.append(Failure(status, **opts))

    async def drop_connections(self, code: int = 4000) -> None:
        """Close every gateway connection, as Discord does on a restart or a network blip."""
        for ws in list(self._sockets):
            self._sockets.remove(ws)
            await ws.close(code=code, message=b"dropped by the test")

    async def send_reconnect(self) -> None:
        """op 7 RECONNECT on every connection: the client must reconnect and RESUME."""
        await self._send_op(7, None)

    async def invalidate_session(self, resumable: bool) -> None:
        """op 9 INVALID_SESSION: resumable -> RESUME again; not -> a fresh IDENTIFY."""
        await self._send_op(9, resumable)

    async def _send_op(self, op: int, data: Any) -> None:
        for ws in list(self._sockets):
            self._sockets.remove(ws)  # the client drops it; identified again after (RE)SUME
            await ws.send_str(json.dumps({"op": op, "d": data}))

    def add_attachment(self, filename: str, data: bytes, content_type: str) -> dict[str, Any]:
        """Store bytes to download; returns the attachment object for a message."""
        att_id = snowflake()
        name = f"{att_id}-{filename}"
        self.attachments[name] = data
        return {
            "id": att_id,
            "filename": filename,
            "size": len(data),
            "content_type": content_type,
            "url": f"{self.url}/attachments/{name}",
            "proxy_url": f"{self.url}/attachments/{name}",
        }

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send a DISPATCH event to every identified gateway connection."""
        for ws in list(self._sockets):
            await self._send_event(ws, event, data)

    async def send_message(
        self,
        channel_id: int | str,
        author: dict[str, Any],
        content: str,
        *,
        guild_id: int | None = GUILD_ID,
        mentions: list[dict[str, Any]] | None = None,
        mention_everyone: bool = False,
        referenced: dict[str, Any] | None = None,
        attachments: list[dict[str, Any]] | None = None,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """Push a MESSAGE_CREATE; ``guild_id=None`` makes it a DM. Returns the payload."""
        payload = self.message_payload(
            channel_id,
            author,
            content,
            guild_id=guild_id,
            mentions=mentions,
            mention_everyone=mention_everyone,
            referenced=referenced,
            attachments=attachments,
            message_id=message_id,
        )
        if guild_id is None:
            self.dm_channels[str(channel_id)] = {
                "id": str(channel_id),
                "type": 1,
                "recipients": [author],
                "last_message_id": payload["id"],
            }
        await self.dispatch("MESSAGE_CREATE", payload)
        return payload

    @staticmethod
    def message_payload(
        channel_id: int | str,
        author: dict[str, Any],
        content: str,
        *,
        guild_id: int | None = GUILD_ID,
        mentions: list[dict[str, Any]] | None = None,
        mention_everyone: bool = False,
        referenced: dict[str, Any] | None = None,
        attachments: list[dict[str, Any]] | None = None,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "id": message_id or snowflake(),
            "channel_id": str(channel_id),
            "author": author,
            "content": content,
            "timestamp": TIMESTAMP,
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": mention_everyone,
            "mentions": mentions or [],
            "mention_roles": [],
            "attachments": attachments or [],
            "embeds": [],
            "pinned": False,
            "type": 19 if referenced else 0,
            "flags": 0,
            "components": [],
        }
        if guild_id is not None:
            payload["guild_id"] = str(guild_id)
            payload["member"] = {
                "roles": [],
                "joined_at": TIMESTAMP,
                "deaf": False,
                "mute": False,
                "flags": 0,
            }
        if referenced is not None:
            payload["message_reference"] = {
                "type": 0,
                "message_id": referenced["id"],
                "channel_id": referenced["channel_id"],
                **({"guild_id": str(guild_id)} if guild_id is not None else {}),
            }
            payload["referenced_message"] = referenced
        return payload

    def posts(self, channel_id: int | str | None = None) -> list[Call]:
        """Recorded ``POST .../messages`` calls that succeeded, oldest first."""
        return [
            c
            for c in self.calls
            if c.path.endswith("/messages")
            and c.method == "POST"
            and (channel_id is None or c.channel_id == str(channel_id))
            and c.status == 200
        ]

    def shown(self, channel_id: int | str | None = None) -> list[dict[str, Any]]:
        """The bot's messages a channel shows now (posted, edited, not deleted), oldest
        first: ``id``, ``content``, ``edits``."""
        return [
            {"id": mid, **m}
            for mid, m in sorted(self.shown_messages.items(), key=lambda kv: int(kv[0]))
            if channel_id is None or m["channel_id"] == str(channel_id)
        ]

    def edits(self, channel_id: int | str | None = None) -> list[Call]:
        """Recorded ``PATCH .../messages/<id>`` calls that succeeded, oldest first."""
        return [
            c
            for c in self.calls
            if c.method == "PATCH"
            and (channel_id is None or c.channel_id == str(channel_id))
            and c.status == 200
        ]

    def unchanged_edits(self, channel_id: int | str | None = None) -> list[Call]:
        """Accepted edits whose content is what the message already showed: Discord takes
        them (and counts them against the channel's rate limit) though nothing changes."""
        return [
            c
            for c in self.edits(channel_id)
            if "content" in c.body and c.body["content"] == c.before
        ]

    # -- components (buttons) ---------------------------------------------------------------

    @staticmethod
    def buttons(post: Call) -> list[dict[str, Any]]:
        """The buttons a posted message carries (every action row)."""
        rows = (post.body or {}).get("components") or []
        return [c for row in rows for c in row.get("components") or [] if c.get("type") == 2]

    async def press(
        self, post: Call, custom_id: str, author: dict[str, Any], *, guild_id: int | None = None
    ) -> str:
        """Click the button ``custom_id`` on the bot's message ``post`` as ``author``; a
        message without that button cannot be clicked (AssertionError). Returns the
        interaction id."""
        ids = [b.get("custom_id") for b in self.buttons(post)]
        assert custom_id in ids, f"no button {custom_id!r} on that message (buttons: {ids})"
        interaction_id = snowflake()
        data: dict[str, Any] = {
            "id": interaction_id,
            "application_id": str(BOT_ID),
            "type": 3,
            "token": f"itoken-{interaction_id}",
            "version": 1,
            "channel_id": post.channel_id,
            "message": post.result,
            "data": {"custom_id": custom_id, "component_type": 2},
            "locale": "en-US",
            "app_permissions": "0",
            "entitlements": [],
            "authorizing_integration_owners": {},
            "attachment_size_limit": 10 * 1024 * 1024,
            "channel": {"id": post.channel_id, "type": 0 if guild_id is not None else 1},
            "context": 0 if guild_id is not None else 1,
        }
        if guild_id is not None:
            data["guild_id"] = str(guild_id)
            data["guild_locale"] = "en-US"
            data["member"] = {
                "user": author,
                "roles": [],
                "joined_at": TIMESTAMP,
                "deaf": False,
                "mute": False,
                "flags": 0,
                "permissions": "0",
            }
        else:
            data["user"] = author
        await self.dispatch("INTERACTION_CREATE", data)
        return interaction_id

    def interaction_answers(self, interaction_id: str | None = None) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.path.endswith("/callback")
            and c.status == 204
            and (interaction_id is None or f"/interactions/{interaction_id}/" in c.path)
        ]

    async def _callback(self, request: web.Request) -> web.Response:
        interaction_id = request.match_info["interaction_id"]
        body = await request.json() if request.can_read_body else None
        answered = self.interaction_answers(interaction_id)
        call = await self._record(request, body)
        if answered:
            call.status = 400
            await self._notify()
            return _json(
                {"message": "Interaction has already been acknowledged.", "code": 40060}, 400
            )
        call.status = 204
        await self._notify()
        return web.Response(status=204)

    def typings(self) -> list[Call]:
        return [c for c in self.calls if c.path.endswith("/typing")]

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until ``predicate()`` is true; re-checked after every request."""

        async def _wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        await asyncio.wait_for(_wait(), timeout)

    async def wait_posts(
        self,
        n: int,
        channel_id: int | str | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[Call]:
        await self.wait_for(lambda: len(self.posts(channel_id)) >= n, timeout)
        return self.posts(channel_id)

    async def wait_identified(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        await self.wait_for(lambda: bool(self._sockets), timeout)

    # -- gateway -----------------------------------------------------------------------------

    async def _send_event(self, ws: web.WebSocketResponse, event: str, data: Any) -> None:
        self._seq += 1
        await ws.send_str(json.dumps({"op": 0, "t": event, "s": self._seq, "d": data}))

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 45_000}}))
        try:
            async for frame in ws:
                if frame.type != web.WSMsgType.TEXT:
                    continue
                msg = json.loads(frame.data)
                op = msg.get("op")
                if op == 1:
                    await ws.send_str(json.dumps({"op": 11}))
                elif op == 2:
                    await self._identify(ws, msg["d"])
                elif op == 6:
                    self.resumes.append(msg["d"])
                    if msg["d"].get("token") != self.gateway_token:  # as IDENTIFY: 4004
                        await self._close(ws, 4004, b"Authentication failed.")
                        continue
                    await self._send_event(ws, "RESUMED", {})
                    await self._notify(ws_added=ws)
        finally:
            if ws in self._sockets:
                self._sockets.remove(ws)
        return ws

    async def _identify(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        self.identifies.append(data)
        if data.get("token") != self.gateway_token:
            await self._close(ws, 4004, b"Authentication failed.")
            return
        if int(data.get("intents", 0)) & PRIVILEGED_INTENTS & ~self.allowed_intents:
            await self._close(ws, 4014, b"Disallowed intent(s).")
            return
        ready = {
            "v": 10,
            "user": BOT_USER,
            "guilds": [{"id": g["id"], "unavailable": True} for g in self.guilds],
            "session_id": f"session-{len(self.identifies)}",
            "resume_gateway_url": self.gateway_url,
            "application": {"id": str(BOT_ID), "flags": 0},
            "private_channels": [],
        }
        await self._send_event(ws, "READY", ready)
        for g in self.guilds:
            await self._send_event(ws, "GUILD_CREATE", g)
        await self._notify(ws_added=ws)

    async def _close(self, ws: web.WebSocketResponse, code: int, reason: bytes) -> None:
        self.closes.append(code)
        await ws.close(code=code, message=reason)
        await self._notify()

    async def _notify(self, ws_added: web.WebSocketResponse | None = None) -> None:
        async with self._changed:
            if ws_added is not None and ws_added not in self._sockets:
                self._sockets.append(ws_added)
            self._changed.notify_all()

    # -- REST --------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    @staticmethod
    def _unauthorized() -> web.Response:
        return _json({"message": "401: Unauthorized", "code": 0}, status=401)

    async def _me(self, request: web.Request) -> web.Response:
        self.logins += 1
        if not self._authorized(request):
            return self._unauthorized()
        if self.login_failures:
            status = self.login_failures.pop(0)
            return _json({"message": f"scripted {status}", "code": 0}, status=status)
        return _json(BOT_USER)

    async def _application(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return _json(
            {
                "id": str(BOT_ID),
                "name": "memobot",
                "icon": None,
                "description": "",
                "bot_public": False,
                "bot_require_code_grant": False,
                "owner": user(1_300_000_000_000_000_001, "owner"),
                "verify_key": "0" * 64,
                "flags": 0,
            }
        )

    async def _gateway_info(self, request: web.Request) -> web.Response:
        return _json(
            {
                "url": self.gateway_url,
                "shards": 1,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 999,
                    "reset_after": 0,
                    "max_concurrency": 1,
                },
            }
        )

    async def _get_channel(self, request: web.Request) -> web.Response:
        channel_id = request.match_info["channel_id"]
        if channel_id in self.dm_channels:
            return _json(self.dm_channels[channel_id])
        for g in self.guilds:
            for c in [*g.get("channels", []), *g.get("threads", [])]:
                if c["id"] == channel_id:
                    return _json({**c, "guild_id": g["id"]})
        return _json({"message": "Unknown Channel", "code": 10003}, status=404)

    async def _open_dm(self, request: web.Request) -> web.Response:
        """Create DM: the bot's direct-message channel with a user (the same one each time)."""
        if not self._authorized(request):
            return self._unauthorized()
        recipient = str((await request.json()).get("recipient_id", ""))
        await self._record(request, {"recipient_id": recipient})
        for channel in self.dm_channels.values():
            if [r.get("id") for r in channel.get("recipients", [])] == [recipient]:
                return _json(channel)
        channel = {"id": snowflake(), "type": 1, "recipients": [user(recipient, "someone")]}
        self.dm_channels[channel["id"]] = channel
        return _json(channel)

    @staticmethod
    async def _read_multipart(request: web.Request) -> tuple[Any, list[tuple[str, bytes]]]:
        body: Any = {}
        files: list[tuple[str, bytes]] = []
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            data = await part.read()  # type: ignore[union-attr]
            if part.name == "payload_json":  # type: ignore[union-attr]
                body = json.loads(data)
            else:
                files.append((part.filename or "", bytes(data)))  # type: ignore[union-attr]
        return body, files

    def uploads(self, channel_id: int | str | None = None) -> list[tuple[str, bytes]]:
        """(filename, content) of every file posted, in order (to ``channel_id`` only)."""
        return [
            f
            for c in self.calls
            if c.files and (channel_id is None or c.channel_id == str(channel_id))
            for f in c.files
        ]

    async def _record(self, request: web.Request, body: Any) -> Call:
        call = Call(
            request.method,
            request.path,
            request.match_info.get("channel_id"),
            body,
            asyncio.get_running_loop().time(),
        )
        self.calls.append(call)
        return call

    async def _scripted(self, request: web.Request) -> web.Response | None:
        for i, failure in enumerate(self.failures):
            if failure.path_contains in request.path:
                del self.failures[i]
                await asyncio.sleep(failure.stall)
                if failure.status == 0:
                    return None
                headers = {"Via": "1.1 google"} if failure.via else {}
                body = dict(failure.body or {"message": f"scripted {failure.status}", "code": 0})
                if failure.retry_after is not None:
                    body.update(retry_after=failure.retry_after, **{"global": False})
                    headers["Retry-After"] = str(failure.retry_after)
                    headers["X-RateLimit-Scope"] = "user"
                return _json(body, status=failure.status, headers=headers)
        return None

    def _rate_headers(self, channel_id: str) -> tuple[dict[str, str], float | None]:
        """Count one message against the channel's window: (headers, None) when it may go,
        (headers, retry_after) when the window is full. The window starts at its first
        message, as Discord's buckets do."""
        now = time.monotonic()
        start, count = self._windows.get(channel_id, (now, 0))
        if now - start >= self.rate_window:
            start, count = now, 0
        reset_after = max(0.0, start + self.rate_window - now)
        refused = count >= self.rate_limit
        if not refused:
            count += 1
            self._windows[channel_id] = (start, count)
        headers = {
            "X-RateLimit-Limit": str(self.rate_limit),
            "X-RateLimit-Remaining": str(self.rate_limit - count),
            "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}",
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Bucket": "fake-channel-messages",
        }
        return headers, (reset_after if refused else None)

    async def _post_message(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        files: list[tuple[str, bytes]] = []
        if request.content_type.startswith("multipart/"):
            # discord.py sends a file as multipart: payload_json plus files[n] parts.
            body, files = await self._read_multipart(request)
            if sum(len(data) for _, data in files) > UPLOAD_LIMIT:
                call = await self._record(request, body)
                call.status = 413
                await self._notify()
                return _json({"message": "Request entity too large", "code": 40005}, 413)
        else:
            body = await request.json()
        call = await self._record(request, body)
        call.files = files
        failure = await self._scripted(request)
        if failure is not None:
            call.status = failure.status
            await self._notify()
            return failure
        channel_id = request.match_info["channel_id"]
        headers, retry_after = self._rate_headers(channel_id)
        if retry_after is not None:
            call.status = 429
            await self._notify()
            body429 = {
                "message": "You are being rate limited.",
                "retry_after": round(retry_after, 3),
                "global": False,
            }
            headers.update(
                {
                    "Retry-After": f"{retry_after:.3f}",
                    "X-RateLimit-Scope": "user",
                    "Via": "1.1 google",
                }
            )
            return _json(body429, status=429, headers=headers)
        guild_id = next(
            (
                g["id"]
                for g in self.guilds
                for c in [*g.get("channels", []), *g.get("threads", [])]
                if c["id"] == channel_id
            ),
            None,
        )
        message = self.message_payload(
            channel_id,
            BOT_USER,
            body.get("content") or "",
            guild_id=int(guild_id) if guild_id else None,
        )
        self.shown_messages[message["id"]] = {
            "channel_id": channel_id,
            "content": message["content"],
            "edits": 0,
        }
        message["components"] = body.get("components") or []
        call.result = message
        await self._notify()
        return _json(message, headers=headers)

    async def _edit_message(self, request: web.Request) -> web.Response:
        """PATCH a message: Discord's edit (counted against the channel's window, as sends)."""
        if not self._authorized(request):
            return self._unauthorized()
        body = await request.json()
        call = await self._record(request, body)
        failure = await self._scripted(request)
        if failure is not None:
            call.status = failure.status
            await self._notify()
            return failure
        channel_id = request.match_info["channel_id"]
        shown = self.shown_messages.get(request.match_info["message_id"])
        if shown is None or shown["channel_id"] != channel_id:
            call.status = 404
            await self._notify()
            return _json({"message": "Unknown Message", "code": 10008}, status=404)
        headers, retry_after = self._rate_headers(channel_id)
        if retry_after is not None:
            call.status = 429
            await self._notify()
            body429 = {
                "message": "You are being rate limited.",
                "retry_after": round(retry_after, 3),
                "global": False,
            }
            headers.update(
                {
                    "Retry-After": f"{retry_after:.3f}",
                    "X-RateLimit-Scope": "user",
                    "Via": "1.1 google",
                }
            )
            return _json(body429, status=429, headers=headers)
        content = body.get("content")
        if content is not None:
            if len(content) > 2000:
                call.status = 400
                await self._notify()
                return _json(
                    {"message": "Invalid Form Body", "code": 50035, "errors": {"content": {}}},
                    status=400,
                )
            call.before = shown["content"]
            shown["content"] = content
        shown["edits"] += 1
        message = self.message_payload(
            channel_id, BOT_USER, shown["content"], message_id=request.match_info["message_id"]
        )
        await self._notify()
        return _json(message, headers=headers)

    async def _delete_message(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        call = await self._record(request, None)
        if self.shown_messages.pop(request.match_info["message_id"], None) is None:
            call.status = 404
            await self._notify()
            return _json({"message": "Unknown Message", "code": 10008}, status=404)
        await self._notify()
        return web.Response(status=204)

    async def _typing(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        call = await self._record(request, None)
        failure = await self._scripted(request)
        if failure is not None:
            call.status = failure.status
            await self._notify()
            return failure
        await self._notify()
        return web.Response(status=204)

    async def _attachment(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.attachment_delay)
        data = self.attachments.get(request.match_info["name"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data)
