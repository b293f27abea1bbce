"""The model behind a proxy: ``llm.proxy`` (http or socks5), a socks proxy from the
environment, and NO_PROXY; the same rule for the doctor's token checks."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import LLMConfig
from bot.llm import LLMProvider, LLMUnavailable
from bot.service.probes import TokenProbe, check_token
from tests.fakes.llm_server import FakeLLM
from tests.fakes.socks_proxy import Connect, FakeSocks5, pipe
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


async def test_no_proxy_is_read_once_as_curl_reads_it(llm, socks, monkeypatch):
    """memobot decides the route and the SDK is told it: left to re-read the environment by
    its own rules, the SDK sent a socks ALL_PROXY plain http where memobot had bypassed it."""
    monkeypatch.setenv("ALL_PROXY", socks.url)
    by_name = llm.base_url.replace("127.0.0.1", "localhost")
    for no_proxy, url in [
        (".localhost", by_name),  # curl: ".example.com" also means example.com itself
        (f"127.0.0.1:{port_of(llm)}", llm.base_url),  # an entry with the port
    ]:
        monkeypatch.setenv("NO_PROXY", no_proxy)
        assert await ask(provider(url), no_proxy) == f"echo: {no_proxy}"
    assert socks.connects == []
    monkeypatch.setenv("NO_PROXY", f"127.0.0.1:{port_of(llm) + 1}")  # another port: proxied
    assert await ask(provider(llm.base_url), "other port") == "echo: other port"
    assert len(socks.connects) == 1


async def test_environment_proxies_in_any_spelling_curl_takes(llm, socks, monkeypatch):
    monkeypatch.setenv("all_proxy", socks.url.replace("socks5://", "SOCKS5://"))
    assert await ask(provider(llm.base_url), "upper case") == "echo: upper case"
    assert len(socks.connects) == 1
    # No scheme: an http proxy, as for curl; the fake LLM forwards absolute URLs.
    nowhere = f"http://127.0.0.1:{closed_port()}/v1"
    monkeypatch.setenv("HTTP_PROXY", llm.base_url.split("//")[1].rsplit("/v1", 1)[0])
    assert await ask(provider(nowhere), "no scheme") == "echo: no scheme"
    assert llm.requests[-1]["headers"]["host"] == nowhere.split("/")[2]


async def test_a_proxy_memobot_cannot_use_is_named_and_the_rest_goes_on(llm, monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "socks4://me:hunter2@127.0.0.1:1080")
    p = provider(llm.base_url, fallbacks=[{"model": "ok", "proxy": "http://127.0.0.1:9"}])
    with pytest.raises(LLMUnavailable) as info:
        await ask(p, "hi")
    text = str(info.value)
    assert "(socks4://***@127.0.0.1:1080) is not one memobot can use" in text, text
    assert "hunter2" not in text
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert await ask(provider(llm.base_url), "bypassed") == "echo: bypassed"


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
        fallbacks=[{"model": "local", "proxy": ""}],  # not llm's proxy (and none in the env)
    )
    assert await ask(p, "anyone there?") == "echo: anyone there?"
    assert [r["model"] for r in llm.requests] == ["local"]
    with pytest.raises(LLMUnavailable) as info:
        await ask(provider(llm.base_url, proxy=dead), "hi")
    text = str(info.value)
    assert f"cannot reach the LLM endpoint {llm.base_url} through the proxy {dead}" in text
    assert "Connection error: socks proxy: " in text and "Couldn't connect to proxy" in text


async def test_a_socks_proxy_that_is_down_is_an_aiohttp_connection_error():
    """aiohttp-socks raises errors of its own; the one connector every channel, the model and
    the doctor use turns them into aiohttp's, which each of them already retries."""
    import aiohttp

    from bot.proxy import socks_connector

    for scheme in ("socks5", "socks5h"):
        dead = socks_connector(f"{scheme}://127.0.0.1:{closed_port()}")
        async with aiohttp.ClientSession(connector=dead) as http:
            with pytest.raises(aiohttp.ClientConnectionError, match=r"socks proxy: .*proxy"):
                await http.get("http://127.0.0.1:9/")


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
    assert "through the proxy socks5://***@127.0.0.1:" in str(info.value)
    assert "hunter2" not in str(info.value)


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    request = "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost".split()
    names = "subjectAltName=DNS:localhost,IP:127.0.0.1"
    subprocess.run(
        ["openssl", *request, "-keyout", str(key), "-out", str(cert), "-addext", names],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls_is_verified_and_ssl_cert_file_heard_direct_and_through_socks(
    llm, socks, tmp_path, monkeypatch
):
    """memobot no longer lets the SDK read the environment for the route; it must still
    verify certificates, and trust the ones SSL_CERT_FILE names, as before."""
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def terminate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port_of(llm))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(terminate, "127.0.0.1", 0, ssl=context)
    https = f"https://localhost:{server.sockets[0].getsockname()[1]}/v1"
    try:
        with pytest.raises(LLMUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await ask(provider(https), "untrusted")
        with pytest.raises(LLMUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await ask(provider(https, proxy=socks.url), "untrusted")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        assert await ask(provider(https), "trusted") == "echo: trusted"
        assert await ask(provider(https, proxy=socks.url), "via socks") == "echo: via socks"
        assert [c.port for c in socks.connects] == [server.sockets[0].getsockname()[1]] * 2
    finally:
        server.close()


async def test_the_doctor_asks_the_model_and_its_clock_through_the_proxy(llm, tmp_path):
    """The server's Date header (the clock check) came by a direct connection, or not at all
    where only the proxy leads to the server."""
    from bot.config import parse_config
    from bot.service.probes import check_llm
    from tests.helpers import config_dict

    nowhere = f"http://127.0.0.1:{closed_port()}/v1"
    proxy = llm.base_url.rsplit("/v1", 1)[0]
    cfg = parse_config(config_dict(tmp_path, nowhere, llm={"baseUrl": nowhere, "proxy": proxy}))
    probe = await check_llm(cfg, tmp_path / "config.json")
    assert probe.check.status == "ok", probe.check
    assert probe.date_header is not None  # only the proxy leads to the server
    dead = parse_config(
        config_dict(tmp_path, nowhere, llm={"proxy": f"socks5://127.0.0.1:{closed_port()}"})
    )
    probe = await check_llm(dead, tmp_path / "config.json")
    assert probe.check.status == "fail" and "llm.proxy" in probe.check.fix
