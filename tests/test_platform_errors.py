"""Platform errors classified right (issue 35): a method the server does not know is not a bad
token. The real python-telegram-bot against the fake Bot API taught to answer so; each SDK's
mapping on its own."""

from __future__ import annotations

import os
from types import SimpleNamespace

from telegram.error import BadRequest, InvalidToken, NetworkError

from bot.cli import cmd_status
from bot.gateway import STATUS_FILE, write_status
from bot.service.doctor import check_running_channels
from channels.errors import FatalChannelError, FeatureUnavailable, PermanentError, TransientError
from channels.telegram_channel import send_error
from tests.fakes.llm_server import reply
from tests.fakes.telegram_api import BOT_USERNAME, FakeBotAPI, strip_html
from tests.test_telegram import running

ALICE = 1001
GROUP = -1001234
BOT = f"@{BOT_USERNAME}"
ANSWER = (
    "Here is **the plan** for today, step by step:\n\n"
    "1. Wake up and drink a glass of water before anything else.\n"
    "2. Walk for twenty minutes, whatever the weather says.\n"
    "3. Write the report, then send it to `team@example.org`."
)
FAST = {
    "streamEditIntervalSeconds": 0.1,
    "rateLimits": {
        "chat": {"messages": 50, "perSeconds": 1, "burst": 5},
        "group": {"messages": 50, "perSeconds": 1},
    },
}


def _shown(api: FakeBotAPI, chat: int) -> list[str]:
    return [m["text"] for m in api.shown(chat)]


def _rendered(tg, text: str) -> list[str]:
    return [strip_html(p) for p in tg.channel.render(text)]


# -- a method the server does not know -------------------------------------------------------


async def test_a_server_without_drafts_turns_drafts_off_not_the_token(tmp_path, llm, capsys):
    llm.script(reply(ANSWER, pieces=6, chunk_delay=0.08), reply("And a second answer."))
    # A self-hosted telegram-bot-api older than Bot API 9.3: 404 "Not Found: method not found".
    async with (
        FakeBotAPI(missing_methods=("sendMessageDraft",)) as api,
        running(tmp_path, llm, api, **FAST) as tg,
    ):
        api.private_text("plan my day")
        await api.wait_for_async(lambda: _shown(api, ALICE) == _rendered(tg, ANSWER), 15)
        polls = len(api.calls("getUpdates"))
        api.private_text("and then?")
        await api.wait_for_async(lambda: "And a second answer." in _shown(api, ALICE), 10)
        # The token is fine: still connected, still polling, nothing failed.
        assert tg.channel.state == "connected" and tg.channel.fatal is None
        assert len(api.calls("getUpdates")) > polls
        # Asked once; from then on the answer is shown as an edited message, one message.
        assert len(api.calls("sendMessageDraft")) == 1
        assert len(api.sent(ALICE)) == 2 and api.calls("editMessageText")
        assert set(tg.channel.features_off) == {"drafts"}
        # memobot status, from the gateway's status file, says so.
        status = {"pid": os.getpid(), "channels": {"telegram": tg.channel.status()}}
        write_status(tmp_path / "state" / STATUS_FILE, status)
        cfg = tg.stack.loop.cfg
        capsys.readouterr()
        cmd_status(cfg, tmp_path / "config.json")
        checks = list(check_running_channels(cfg))
    [line] = [line for line in capsys.readouterr().out.splitlines() if "telegram:" in line]
    assert "telegram: connected" in line and "drafts off" in line and "sendMessageDraft" in line
    [check] = checks  # memobot doctor too: a warning, not a failed channel
    assert check.status == "warn" and "drafts off" in check.text


def test_only_a_401_on_a_send_is_the_token():
    not_found = InvalidToken("Not Found: method not found")
    drafts = send_error(not_found, "sendMessageDraft")
    assert isinstance(drafts, FeatureUnavailable) and drafts.feature == "drafts"
    # On a method every server has, a 404 is the chat or the message: this message fails.
    message = send_error(not_found, "sendMessage")
    assert type(message) is PermanentError and "sendMessage" in str(message)
    assert isinstance(send_error(InvalidToken("Unauthorized"), "sendMessage"), FatalChannelError)
    unknown = send_error(BadRequest("Bad Request: method not found"), "sendMessageDraft")
    assert isinstance(unknown, FeatureUnavailable)
    assert isinstance(send_error(NetworkError("Internal Server Error"), "x"), TransientError)


def test_discord_and_slack_read_a_401_and_a_404_as_telegram_does():
    import discord

    from channels.discord_channel import map_send_error
    from channels.slack_channel import map_api_error

    def http(status: int) -> discord.HTTPException:
        response = SimpleNamespace(status=status, reason="scripted", headers={})
        factory = discord.NotFound if status == 404 else discord.HTTPException
        return factory(response, {"message": f"{status}: scripted", "code": 0})

    gone = map_send_error(http(404), "Edit Message")
    assert type(gone) is PermanentError and "Edit Message" in str(gone)
    assert isinstance(map_send_error(http(401), "Create Message"), FatalChannelError)
    # Slack names an unknown method; a refused token is a code of its own (or a 401).
    unknown = map_api_error(200, "unknown_method", method="chat.postMessage")
    assert type(unknown) is PermanentError and "chat.postMessage" in str(unknown)
    stream = map_api_error(200, "unknown_method", method="chat.startStream")
    assert isinstance(stream, FeatureUnavailable) and stream.feature == "native streams"
    assert type(map_api_error(404, None, method="chat.update")) is PermanentError
    assert isinstance(map_api_error(401, None, method="chat.update"), FatalChannelError)
    assert isinstance(map_api_error(200, "token_revoked"), FatalChannelError)
