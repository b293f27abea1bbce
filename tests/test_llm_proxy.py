"""The model behind a proxy: ``llm.proxy`` (http or socks5), a socks proxy from the
environment, and NO_PROXY; the same rule for the doctor's token checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.config import LLMConfig
from bot.llm import LLMProvider, LLMUnavailable
from bot.service.probes import TokenProbe, check_token
from tests.fakes.llm_server import FakeLLM
from tests.fakes.socks_proxy import Connect, FakeSocks5
from tests.fakes.telegram_api import FakeBotAPI
from tests.helpers import closed_port

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_from_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def socks() -> AsyncIterator[FakeSocks5]:
    async with FakeSocks5() as proxy:
        yield proxy


def provider(base_url: str, **settings: Any) -> LLMProvider:
    retry = {"attempts": 1}
    return LLMProvider(
        LLMConfig.model_validate({"baseUrl": base_url, "model": "m", "retry": retry, **settings})
    )


async def ask(p: LLMProvider, text: str, stream: bool = False) -> str:
    try:
        on_text = (lambda _: None) if stream else None
        response = await p.chat([{"role": "user", "content": text}], on_text=on_text)
    finally:
        await p.close()
    return response.content or ""


def port_of(llm: FakeLLM) -> int:
    return int(llm.base_url.rsplit(":", 1)[1].split("/")[0])


async def test_a_socks5_proxy_carries_plain_and_streamed_calls(llm, socks):
    assert await ask(provider(llm.base_url, proxy=socks.url), "plain") == "echo: plain"
    assert await ask(provider(llm.base_url, proxy=socks.url), "streamed", True) == (
        "echo: streamed"
    )
    # socks5: memobot resolves the name itself and hands the proxy an address.
    assert socks.connects == [Connect("127.0.0.1", port_of(llm), by_name=False)] * 2
    assert len(llm.requests) == 2


async def test_socks5h_leaves_the_name_to_the_proxy(llm, socks):
    url = llm.base_url.replace("127.0.0.1", "localhost")
    proxy = socks.url.replace("socks5://", "socks5h://")
    assert await ask(provider(url, proxy=proxy), "by name") == "echo: by name"
    assert socks.connects == [Connect("localhost", port_of(llm), by_name=True)]


async def test_a_socks_proxy_from_the_environment_is_used_and_no_proxy_heard(
    llm, socks, monkeypatch
):
    """ALL_PROXY=socks5://... is common on desktops; aiohttp alone would speak plain http to
    that port ("Bad status line")."""
    monkeypatch.setenv("ALL_PROXY", socks.url)
    assert await ask(provider(llm.base_url), "from the environment") == (
        "echo: from the environment"
    )
    assert len(socks.connects) == 1
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert await ask(provider(llm.base_url), "direct") == "echo: direct"
    assert len(socks.connects) == 1  # NO_PROXY: not through the proxy
    # The config's proxy wins over the environment's NO_PROXY.
    assert await ask(provider(llm.base_url, proxy=socks.url), "configured") == "echo: configured"
    assert len(socks.connects) == 2


async def test_an_http_proxy_in_the_config_carries_the_calls(llm):
    # baseUrl points nowhere; only a proxy that forwards the absolute URL reaches the fake.
    nowhere = f"http://127.0.0.1:{closed_port()}/v1"
    proxy = llm.base_url.rsplit("/v1", 1)[0]
    assert await ask(provider(nowhere, proxy=proxy), "via http") == "echo: via http"
    assert await ask(provider(nowhere, proxy=proxy), "streamed", True) == "echo: streamed"
    # The request names the host it was meant for; the proxy is where it was sent.
    assert [r["headers"]["host"] for r in llm.requests] == [nowhere.split("/")[2]] * 2


async def test_an_unreachable_proxy_is_named_and_the_fallback_answers(llm):
    dead = f"socks5://127.0.0.1:{closed_port()}"
    p = provider(
        llm.base_url,
        proxy=dead,
        fallbacks=[{"model": "local", "proxy": ""}],  # "" : the fallback goes direct
    )
    assert await ask(p, "anyone there?") == "echo: anyone there?"
    assert [r["model"] for r in llm.requests] == ["local"]
    with pytest.raises(LLMUnavailable) as info:
        await ask(provider(llm.base_url, proxy=dead), "hi")
    text = str(info.value)
    assert f"cannot reach the LLM endpoint {llm.base_url} through the proxy {dead}" in text
    assert "Connection error: socks proxy: " in text and "Couldn't connect to proxy" in text


def test_a_fallback_inherits_the_proxy_unless_it_sets_its_own():
    cfg = LLMConfig.model_validate(
        {"proxy": "socks5h://127.0.0.1:1080", "fallbacks": [{"model": "a"}, {"proxy": ""}]}
    )
    assert [c.proxy for c in cfg.endpoints()] == ["socks5h://127.0.0.1:1080"] * 2 + [""]


async def test_the_doctor_reaches_a_platform_through_socks5h(socks):
    """python-socks has no "socks5h" scheme: the doctor once failed on a proxy the channel
    itself used without trouble."""
    async with FakeBotAPI() as api:
        url = f"{api.base_url}{api.token}/getMe".replace("127.0.0.1", "localhost")
        proxy = socks.url.replace("socks5://", "socks5h://")
        check = await check_token(TokenProbe("telegram", "GET", url, {}, api.token), proxy)
    assert check.status == "ok", check
    assert [c.by_name for c in socks.connects] == [True]


async def test_a_proxy_password_from_the_environment_is_never_shown(monkeypatch):
    """A password in ALL_PROXY is not in the config, so the log filter does not know it."""
    monkeypatch.setenv("ALL_PROXY", f"socks5://me:hunter2@127.0.0.1:{closed_port()}")
    with pytest.raises(LLMUnavailable) as info:
        await ask(provider("http://127.0.0.1:9/v1"), "hi")
    assert "through the proxy socks5://me:***@127.0.0.1:" in str(info.value)
    assert "hunter2" not in str(info.value)
