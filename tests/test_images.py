"""A photo goes to the model in the turn it arrived (and when the model reads it again), never
in every later request (issue 27, finding 9: four 9 MB photos made 50 MB requests)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from bot.context import ContextBuilder
from bot.images import MAX_INLINE_IMAGE_BYTES
from bot.session import SessionStore
from tests.fakes.llm_server import FakeLLM, call, hang, reply, tool_step
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import Harness, make_config, request_messages, telegram_in_process

ALICE = 1001
KEY = f"telegram:{ALICE}"
JPEG = b"\xff\xd8\xff\xe0" + os.urandom(600_000)
B64 = base64.b64encode(JPEG).decode()


def telegram(tmp_path: Path, llm: FakeLLM, api: FakeBotAPI):
    settings = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(ALICE)],
        "pollTimeoutSeconds": 2,
    }
    cfg = make_config(tmp_path, llm.base_url, channels={"telegram": settings})
    return telegram_in_process(cfg, tmp_path / "config.json")


def body_text(request: dict) -> str:
    return json.dumps(request["body"])


async def test_a_photo_is_sent_in_its_own_turn_only(tmp_path, llm, api) -> None:
    async with telegram(tmp_path, llm, api) as (stack, _, _):
        api.photo(JPEG, caption="what is this?")
        await api.wait_sent_async(1)
        for i, text in enumerate(("and now?", "and then?"), start=2):
            api.private_text(text)
            await api.wait_sent_async(i)
        session = stack.store.get(KEY)
        held = session.held_bytes
    first, second, third = llm.requests
    assert B64 in body_text(first)
    assert B64 not in body_text(second) and B64 not in body_text(third)
    # Later requests are small: the photo is a label naming its file.
    assert len(body_text(second)) < 20_000 and len(body_text(third)) < 20_000
    photo_turn = request_messages(second)[1]
    assert photo_turn["content"].startswith("what is this?")
    [saved] = (tmp_path / "ws" / "media" / "telegram" / str(ALICE)).glob("*.jpg")
    assert f"[image: media/telegram/{ALICE}/{saved.name}, 585.9 KB;" in photo_turn["content"]
    assert "read_file shows it again" in photo_turn["content"]
    # The stored form is what every later request repeats: the prefix stays byte-identical.
    assert request_messages(third)[:3] == request_messages(second)[:3]
    # Neither memory nor the session file (checkpoints included) holds the photo.
    assert held < 50_000
    data = (tmp_path / "state" / "sessions" / f"telegram%3A{ALICE}.jsonl").read_bytes()
    assert B64.encode() not in data and len(data) < 50_000
    assert SessionStore(tmp_path / "state").history(KEY)[0]["content"] == photo_turn["content"]


async def test_the_model_reads_the_photo_again_for_one_turn(tmp_path, llm, api) -> None:
    async with telegram(tmp_path, llm, api) as _:
        api.photo(JPEG, caption="keep this")
        await api.wait_sent_async(1)
        [saved] = (tmp_path / "ws" / "media" / "telegram" / str(ALICE)).glob("*.jpg")
        path = f"media/telegram/{ALICE}/{saved.name}"
        llm.script(
            tool_step(call("read_file", {"path": path}, id="look")),
            reply("It is the same picture."),
        )
        api.private_text("look at it again")
        await api.wait_sent_async(2)
        api.private_text("thanks")
        await api.wait_sent_async(3)
    _, asked, shown, later = llm.requests
    assert B64 not in body_text(asked)
    messages = request_messages(shown)
    result = next(m for m in messages if m.get("role") == "tool")
    assert result["content"] == (
        f"'{path}' is an image (585.9 KB); it is shown to you right after these tool results."
    )
    picture = messages[-1]
    assert picture["role"] == "user"
    assert picture["content"][1]["image_url"]["url"] == f"data:image/jpeg;base64,{B64}"
    assert B64 not in body_text(later)
    stored = request_messages(later)[messages.index(picture)]
    assert stored["content"].startswith("[memobot: the image(s) read_file showed")
    assert f"[image: {path}, 585.9 KB;" in stored["content"]


async def test_read_file_refuses_a_picture_that_is_not_one(tmp_path, llm, api) -> None:
    fake = tmp_path / "ws" / "fake.png"
    async with telegram(tmp_path, llm, api) as _:
        fake.write_bytes(b"\0\1\2 not a png")
        llm.script(tool_step(call("read_file", {"path": "fake.png"})), reply("ok"))
        api.private_text("look at fake.png")
        await api.wait_sent_async(1)
    result = next(m for m in request_messages(llm.requests[1]) if m.get("role") == "tool")
    assert result["content"].startswith("Error: 'fake.png' looks like a binary file")
    assert all(
        m["role"] != "user" or isinstance(m["content"], str)
        for m in request_messages(llm.requests[1])
    )


async def test_checkpoints_of_a_photo_turn_do_not_hold_the_photo(tmp_path, llm, api) -> None:
    llm.script(tool_step(call("list_dir", {}), text="looking"), hang())
    async with telegram(tmp_path, llm, api) as (stack, _, _):
        api.photo(JPEG, caption="file this")
        await llm.wait_for_requests(2)  # the tool ran; its checkpoints are on disk
        data = stack.store.get(KEY).path.read_bytes()
        checkpoint = stack.store.get(KEY).metadata["runtime_checkpoint"]
    assert B64 in body_text(llm.requests[1])  # the turn's own requests still carry it
    assert checkpoint["phase"] == "tools_completed"
    assert checkpoint["messages"][0]["content"].startswith("file this")
    assert B64.encode() not in data and len(data) < 50_000


async def test_a_photo_stored_by_an_older_version_is_not_sent_again(tmp_path, llm) -> None:
    old = SessionStore(tmp_path / "state")
    parts = [
        {"type": "text", "text": "look\n[runtime context: metadata, not an instruction]"},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{B64}"}},
    ]
    session = old.get("cli:t")
    old.append(session, [{"role": "user", "content": parts}, {"role": "assistant", "content": "a"}])
    async with Harness(make_config(tmp_path, llm.base_url), tmp_path / "config.json") as h:
        assert await h.ask("and now?") == "echo: and now?"
        assert h.stack.store.get("cli:t").held_bytes < len(B64)
    [request] = llm.requests
    assert B64 not in body_text(request)
    assert request_messages(request)[1]["content"].startswith("look\n[runtime context")


def test_a_photo_too_large_to_show_is_named_not_sent(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    big = ws / "media" / "telegram" / "1" / "big.jpg"
    big.parent.mkdir(parents=True)
    big.write_bytes(b"\xff\xd8\xff" + b"\0" * (MAX_INLINE_IMAGE_BYTES + 1024 * 1024))
    msg = ContextBuilder(ws).user_message("see", "telegram", "1", media=[str(big)])
    [part] = msg["content"]
    assert part["text"].endswith(
        "[image: media/telegram/1/big.jpg, 11.0 MB: too large to show (the limit is 10.0 MB)]"
    )
