"""The panel's protections, against a real panel server on 127.0.0.1 with a real HTTP client:
login links, sessions, CSRF, Origin, Host, the login limit, the headers, and no secret in any
answer."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bot.app import build_gate
from bot.config import ConfigError, load_config
from bot.gate import launcher
from bot.pairing import PairingStore
from bot.tools.base import ToolContext, ToolRegistry
from bot.tools.shell import ExecTool
from bot.web.limits import AttemptLimiter
from bot.web.passwords import hash_password
from bot.web.server import Panel
from tests.helpers import config_dict
from tests.helpers.web import PAGES, PUBLIC_PAGES, browsing, panel_section, seed_task

NO_LLM = "http://127.0.0.1:9/v1"  # the panel's pages never call the model
PASSWORD = "correct horse battery staple"
SECRETS = {
    "llm": "sk-SECRETllmKEY0123456789",
    "telegram": "123456:SECRETtelegramTOKENabcdefghij",
    "discord": "SECRETdiscordTOKEN.abcdef.0123456789",
    "slack_bot": "xoxb-SECRET-slack-bot-token",
    "slack_app": "xapp-SECRET-slack-app-token",
    "search": "SECRETsearchKEY987654",
    "header": "Bearer SECRETheaderVALUE",
    "proxy_password": "SECRETproxyPASSWORD",
    "fallback": "sk-SECRETfallbackKEY",
    "mcp_env": "ghp_SECRETmcpENVvalue",
    "mcp_header": "SECRETmcpHEADER",
}


def write(tmp_path: Path, **web: Any) -> Path:
    data = config_dict(tmp_path, NO_LLM, web=panel_section(**web))
    data["llm"]["apiKey"] = SECRETS["llm"]
    data["llm"]["headers"] = {"X-Gateway": SECRETS["header"]}
    data["llm"]["proxy"] = f"http://me:{SECRETS['proxy_password']}@127.0.0.1:3128"
    data["llm"]["fallbacks"] = [{"model": "other", "apiKey": SECRETS["fallback"]}]
    data["tools"]["mcpServers"] = {
        "gh": {"command": "gh-mcp", "env": {"GH": SECRETS["mcp_env"]}},
        "web": {"url": "https://mcp.example.org/mcp", "headers": {"X": SECRETS["mcp_header"]}},
        "local": {"command": "mcp-local", "env": {"GITHUB_TOKEN": SECRETS["mcp_env"]}},
        "remote": {
            "url": "https://mcp.example.org/mcp",
            "headers": {"Authorization": SECRETS["mcp_header"]},
        },
    }
    data["tools"]["web"] = {"search": {"provider": "brave", "apiKey": SECRETS["search"]}}
    data["channels"] = {
        "telegram": {"token": SECRETS["telegram"], "allowFrom": ["1001"]},
        "discord": {"token": SECRETS["discord"]},
        "slack": {"botToken": SECRETS["slack_bot"], "appToken": SECRETS["slack_app"]},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    seed_task(tmp_path / "state")  # for PAGES' task page
    return path


def panel_on(tmp_path: Path, clock: Any = None, limiter: Any = None, **web: Any) -> Any:
    config = write(tmp_path, **web)
    cfg, _ = load_config(config)
    kw: dict[str, Any] = {"limiter": limiter}
    if clock is not None:
        kw["clock"] = clock
    return browsing(cfg, config, **kw)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_without_a_cookie_every_page_is_the_login_page(tmp_path):
    async with panel_on(tmp_path) as b:
        for path in PAGES:
            status, text, r = await b.get(path)
            assert status == 200 and r.url.path == "/login"
            assert "<title>Log in" in text and "Overview</a>" not in text
            assert " web</code>" in text  # says how to get a link


async def test_a_link_works_once_even_across_a_restart(tmp_path):
    async with panel_on(tmp_path) as b:
        link = b.link()
        status, text, r = await b.get(link.removeprefix(b.base))
        assert status == 200 and "You are logged in" in text
        assert 'http-equiv="refresh"' in text  # on to the overview, the cookie with it
        status, text, r = await b.get("/")
        assert status == 200 and "<title>Overview" in text
        # The same link again, from another browser: refused.
        b.http.cookie_jar.clear()
        status, text, _ = await b.get(link.removeprefix(b.base))
        assert status == 403 and "used already or has expired" in text
        status, text, r = await b.get("/")
        assert r.url.path == "/login"
        unused = b.link()
    # A restart (a new server over the same state folder): the used link stays used, an
    # unused one still works.
    cfg, _ = load_config(tmp_path / "config.json")
    async with browsing(cfg, tmp_path / "config.json") as b2:
        assert (await b2.get(link.removeprefix(b2.base)))[0] == 403
        assert (await b2.get(unused.removeprefix(b2.base)))[0] == 200


async def test_the_link_file_holds_no_token_and_is_private(tmp_path):
    async with panel_on(tmp_path) as b:
        link = b.link()
        token = link.split("token=", 1)[1]
        path = tmp_path / "state" / "web" / "links.json"
        assert token not in path.read_text()
        assert path.stat().st_mode & 0o777 == 0o600
        assert "#" not in link


async def test_an_expired_link_is_refused(tmp_path):
    clock = Clock()
    async with panel_on(tmp_path, clock=clock) as b:
        link = b.link()
        clock.now += 601
        status, text, _ = await b.get(link.removeprefix(b.base))
        assert status == 403 and "expired" in text
        fresh = b.link()
        clock.now += 599
        assert (await b.get(fresh.removeprefix(b.base)))[0] == 200


async def test_a_session_expires_after_12_hours_idle_and_logout_ends_it(tmp_path):
    clock = Clock()
    async with panel_on(tmp_path, clock=clock) as b:
        await b.login()
        clock.now += 11 * 3600
        assert (await b.get("/"))[2].url.path == "/"  # used: the idle time starts again
        clock.now += 12 * 3600 + 1
        status, text, r = await b.get("/")
        assert r.url.path == "/expired" and "expired" in text
        await b.login()
        csrf = await b.csrf("/")
        status, _, r = await b.post("/logout", {"csrf": csrf})
        assert status == 303 and r.headers["Location"] == "/logged-out"
        status, text, r = await b.get("/")
        assert r.url.path == "/login"


async def test_the_session_cookie_is_http_only_and_same_site_strict(tmp_path):
    async with panel_on(tmp_path) as b:
        async with b.http.get(b.link()) as r:
            cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    (tmp_path / "tls").mkdir()
    async with panel_on(tmp_path / "tls", publicUrl="https://bot.example.org") as b:
        # Behind the proxy: asked for on the listen address, with the public name.
        local = f"http://{b.panel.cfg.web.listen}/login?token={b.panel.links.issue()}"
        async with b.http.get(local, headers={"Host": "bot.example.org"}) as r:
            assert r.status == 200 and "Secure" in r.headers["Set-Cookie"]


async def _with_waiting_code(tmp_path: Path) -> str:
    code = PairingStore(tmp_path / "state", "telegram").request("2002", "@eve", "2002")
    assert code
    return code


async def test_a_change_needs_the_sessions_csrf_field(tmp_path):
    async with panel_on(tmp_path) as b:
        code = await _with_waiting_code(tmp_path)
        await b.login()
        csrf = await b.csrf()
        for form in ({"code": code}, {"code": code, "csrf": "wrong"}, {"code": code, "csrf": "é"}):
            status, text, _ = await b.post("/access/refuse", form)
            assert status == 403 and "token" in text
        assert PairingStore(tmp_path / "state", "telegram").listing().waiting
        # Another session's token is no good either.
        other = b.panel.sessions.create()
        status, _, _ = await b.post("/access/refuse", {"code": code, "csrf": other.csrf})
        assert status == 403
        status, _, r = await b.post("/access/refuse", {"code": code, "csrf": csrf})
        assert status == 303 and r.headers["Location"] == "/access"
        assert not PairingStore(tmp_path / "state", "telegram").listing().waiting
        _, text, _ = await b.get("/access")
        assert "Refused telegram user 2002" in text


async def test_every_post_of_every_screen_needs_the_token_and_the_own_origin(tmp_path):
    """The guard, not each screen, stops a forged change: every POST route the screens
    register (adding an MCP server runs a command line as the owner) refuses a form without
    the session's token or from another origin, before its handler runs."""
    async with panel_on(tmp_path) as b:
        before = b.panel.config_path.read_text()
        await b.login()
        csrf = await b.csrf()
        posts = sorted(
            {r.resource.canonical for r in b.panel.app.router.routes() if r.method == "POST"}
        )
        assert "/tools/mcp/add" in posts and "/tools/allow/add" in posts
        forged = {"name": "evil", "command": "sh", "args": "-c\ntouch /tmp/owned", "pattern": "*"}
        for path in posts:
            if path in ("/login", "/logout"):
                continue
            assert (await b.post(path, forged))[0] == 403, path
            evil = {**forged, "csrf": csrf}
            assert (await b.post(path, evil, origin="http://127.0.0.1:3000"))[0] == 403, path
        assert b.panel.config_path.read_text() == before


async def test_a_change_from_a_foreign_origin_is_refused(tmp_path):
    async with panel_on(tmp_path) as b:
        code = await _with_waiting_code(tmp_path)
        await b.login()
        csrf = await b.csrf()
        form = {"code": code, "csrf": csrf}
        for origin in ("http://evil.example", "null", f"{b.base}.evil.example", None):
            status, _, _ = await b.post("/access/approve", form, origin=origin)
            assert status == 403, origin
        # A Referer of another site is no better; one of the panel's own is.
        evil = {"Referer": "http://evil.example/page"}
        assert (await b.post("/access/approve", form, origin=None, headers=evil))[0] == 403
        own = {"Referer": f"{b.base}/access"}
        assert (await b.post("/access/approve", form, origin=None, headers=own))[0] == 303


async def test_another_sites_page_cannot_embed_or_fetch_a_panel_answer(tmp_path):
    """A page on another port of the same host (or a sibling subdomain) is the "same site":
    the browser sends it the Strict cookie, so a <script src> of an export, an EventSource
    of the log or a fetch would go out logged in. Its Fetch Metadata headers give it away;
    following a link to the panel stays allowed."""
    async with panel_on(tmp_path) as b:
        await b.login()
        for site in ("same-site", "cross-site"):
            for mode, dest, path in (
                ("no-cors", "script", "/chats/export?key=telegram:1&format=jsonl"),
                ("cors", "empty", "/logs/stream"),
                ("no-cors", "image", "/chats?q=password"),
                ("navigate", "iframe", "/"),
            ):
                headers = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest}
                status, text, _ = await b.get(path, headers=headers, allow_redirects=False)
                assert status == 403 and "another site" in text, (site, mode, path)
            link = {
                "Sec-Fetch-Site": site,
                "Sec-Fetch-Mode": "navigate",
                "Sec-Fetch-Dest": "document",
            }
            assert (await b.get("/", headers=link))[0] == 200
        own = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
        assert (await b.get("/", headers=own))[0] == 200


async def test_a_foreign_host_header_is_refused(tmp_path):
    async with panel_on(tmp_path) as b:
        await b.login()
        port = b.base.rsplit(":", 1)[1]
        for host in (f"evil.example:{port}", "127.0.0.1:1", "evil.example"):
            status, text, _ = await b.get("/", headers={"Host": host})
            assert status == 421 and "Overview" not in text, host
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert (await b.get("/", headers={"Host": host}))[0] == 200


async def test_a_login_flood_gets_429(tmp_path):
    async with panel_on(tmp_path, limiter=AttemptLimiter(attempts=5, per_seconds=60)) as b:
        statuses = []
        for i in range(8):
            async with b.http.get(f"{b.base}/login?token=guess{i}") as r:
                statuses.append(r.status)
                retry = r.headers.get("Retry-After")
        assert statuses == [403] * 5 + [429] * 3
        assert retry is not None and 0 < int(retry) <= 60
        assert not b.panel.links.path.exists()  # guesses wrote nothing
        # A real link is let in: the flood (the model's commands reach 127.0.0.1 too) must
        # not lock the owner out, and a link's token cannot be guessed.
        async with b.http.get(b.link()) as r:
            assert r.status == 200
        async with b.http.get(f"{b.base}/login?token=guess9") as r:
            assert r.status == 429  # guesses still wait


async def test_every_answer_carries_the_security_headers(tmp_path):
    async with panel_on(tmp_path) as b:
        await b.login()
        paths = [*PAGES, *PUBLIC_PAGES, "/no-such-page"]
        for path in paths:
            async with b.http.get(b.base + path, allow_redirects=False) as r:
                h = r.headers
                csp = h["Content-Security-Policy"]
                assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
                assert "script-src 'self'" in csp and "unsafe-inline" not in csp
                assert h["X-Content-Type-Options"] == "nosniff"
                assert h["Referrer-Policy"] in ("no-referrer", "same-origin")
                assert h["Cache-Control"] == "no-store"
                text = await r.text()
                # Script only from the panel's own files: never inline.
                for script in re.findall(r"<script[^>]*>(.*?)</script>", text, re.S):
                    assert script == "", path
                assert all('src="/static/' in s for s in re.findall(r"<script[^>]*>", text))
        async with b.http.get(b.base + "/", headers={"Host": "evil.example"}) as r:
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]


async def test_no_secret_of_the_config_reaches_the_browser(tmp_path):
    clock = Clock()
    async with panel_on(tmp_path, clock=clock, passwordHash=hash_password(PASSWORD)) as b:
        await _with_waiting_code(tmp_path)
        stored = b.panel.cfg.web.password_hash
        seen = []
        for path in PUBLIC_PAGES:
            status, text, r = await b.get(path)
            seen.append(text + str(r.headers))
        await b.login()
        for path in PAGES:
            status, text, r = await b.get(path)
            assert status == 200
            seen.append(text + str(r.headers))
        everything = "\n".join(seen)
        for name, secret in SECRETS.items():
            assert secret not in everything, name
        assert stored not in everything and stored.split("$")[-1] not in everything
        assert "2002" in everything  # the crawl did see the pages' data


async def test_the_password_logs_in_and_a_wrong_one_does_not(tmp_path):
    async with panel_on(tmp_path, passwordHash=hash_password(PASSWORD)) as b:
        status, text, _ = await b.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', text).group(1)
        status, text, _ = await b.post("/login", {"csrf": csrf, "password": "guess"})
        assert status == 403 and "Wrong password" in text
        # Without the login form's own token (a login forced from another page): refused.
        status, _, _ = await b.post("/login", {"password": PASSWORD})
        assert status == 403
        status, text, _ = await b.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', text).group(1)
        status, _, r = await b.post("/login", {"csrf": csrf, "password": PASSWORD})
        assert status == 303 and r.headers["Location"] == "/"
        assert (await b.get("/"))[2].url.path == "/"


async def test_no_password_login_without_a_password(tmp_path):
    async with panel_on(tmp_path) as b:
        _, text, _ = await b.get("/login")
        assert 'type="password"' not in text
        assert (await b.post("/login", {"password": "x"}))[0] == 404


def test_listening_beyond_loopback_needs_a_password(tmp_path):
    for listen in ("0.0.0.0:8765", "192.168.1.5:8765", "[::]:8765", "myhost:8765"):
        config = write(tmp_path, listen=listen)
        with pytest.raises(ConfigError) as err:
            load_config(config)
        assert "web.listen" in str(err.value) and "--set-password" in str(err.value)
    config = write(tmp_path, listen="0.0.0.0:8765", passwordHash=hash_password(PASSWORD))
    cfg, _ = load_config(config)
    assert cfg.web.listen == "0.0.0.0:8765"
    for bad in ("8765", "127.0.0.1:99999", "::1:8765"):
        with pytest.raises(ConfigError, match=r"web\.listen"):
            load_config(write(tmp_path, listen=bad))
    with pytest.raises(ConfigError, match=r"web\.passwordHash"):
        load_config(write(tmp_path, passwordHash="hunter2"))
    for bad in ("ftp://bot.example.org", "https://bot.example.org/panel", "https://u:p@host"):
        with pytest.raises(ConfigError, match=r"web\.publicUrl"):
            load_config(write(tmp_path, publicUrl=bad))


def test_a_panel_reads_its_addresses_from_the_config(tmp_path):
    cfg, path = load_config(write(tmp_path, publicUrl="https://bot.example.org/"))
    panel = Panel(cfg, path, in_gateway=False)
    assert panel.base_url == "https://bot.example.org"
    assert panel.served.host_ok("bot.example.org")
    assert panel.served.origin_ok("https://bot.example.org")
    assert not panel.served.origin_ok("http://bot.example.org")


async def test_a_browser_is_not_needed_for_anything(tmp_path):
    """Every action is a plain form: no page ships a script (CSP forbids one anyway)."""
    async with panel_on(tmp_path) as b:
        await _with_waiting_code(tmp_path)
        await b.login()
        _, text, _ = await b.get("/access")
        assert text.count('method="post"') >= 3  # logout, approve, refuse
        assert "<script" not in text


async def test_what_a_stranger_calls_themselves_is_shown_as_text(tmp_path):
    async with panel_on(tmp_path) as b:
        name = '<script>alert(1)</script><img src=x onerror="alert(2)">'
        PairingStore(tmp_path / "state", "telegram").request("2002", name, "2002")
        await b.login()
        _, text, _ = await b.get("/access")
        assert "<script>alert" not in text and "<img" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=&quot;" in text


def test_the_login_limit_lets_an_address_in_again_after_its_window():
    now = [0.0]
    limiter = AttemptLimiter(attempts=2, per_seconds=60, clock=lambda: now[0])
    assert limiter.attempt("a") is None and limiter.attempt("a") is None
    assert limiter.attempt("a") == 60
    assert limiter.attempt("b") is None  # another address is not held
    now[0] = 45.0
    assert limiter.attempt("a") == 15
    now[0] = 60.0
    assert limiter.attempt("a") is None


def test_the_names_a_panel_answers_to():
    from bot.web.addresses import served

    local = served("127.0.0.1:8765", "")
    assert local.hosts == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert local.base_url == "http://127.0.0.1:8765"
    assert not local.host_ok("127.0.0.1.evil.example:8765") and not local.host_ok(None)
    six = served("[::1]:9000", "")
    assert six.host_ok("[::1]:9000") and six.base_url == "http://[::1]:9000"
    # Every address of the machine: its own names only through publicUrl.
    anywhere = served("0.0.0.0:8765", "https://bot.example.org")
    assert anywhere.host_ok("bot.example.org") and not anywhere.host_ok("192.168.1.5:8765")
    assert anywhere.base_url == "https://bot.example.org"
    assert anywhere.origin_ok("https://bot.example.org") and anywhere.origin_ok(
        "http://localhost:8765"
    )


@pytest.mark.skipif(launcher.landlock_abi() < 1, reason="needs Landlock")
async def test_a_command_the_model_runs_cannot_act_as_the_owner(tmp_path):
    """The link file is in the state folder, which the model's commands can neither read nor
    write; what they ask the panel themselves is asked without a session."""
    config = write(tmp_path)
    cfg, _ = load_config(config)
    cfg.agent.workspace_path.mkdir(parents=True)
    gate = build_gate(cfg, config)  # as the gateway builds it: config and state out of reach
    registry = ToolRegistry()
    registry.register(ExecTool(cfg.tools.exec))
    ctx = ToolContext(workspace=cfg.agent.workspace_path, gate=gate)

    async def run(command: str) -> str:
        return await registry.execute("exec", json.dumps({"command": command}), ctx)

    try:
        async with browsing(cfg, config) as b:
            link = b.link()  # a link waits in the state folder
            links = tmp_path / "state" / "web" / "links.json"
            assert "Permission denied" in await run(f"cat {links}")
            assert "Permission denied" in await run(f"echo '{{\"links\": []}}' > {links}")
            assert (await b.get(link.removeprefix(b.base)))[0] == 200  # still there, unread
            seen = await run(f"curl -sL {b.base}/")
            assert "<title>Log in" in seen and "Overview" not in seen
    finally:
        gate.close()
