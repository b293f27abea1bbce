"""The real-browser harness (tests/helpers/browser.py) against a small aiohttp app: what Chromium
does with the protections the panel relies on (a strict Content-Security-Policy, a form POST
with its Origin, an HttpOnly SameSite=Strict cookie). Each would pass without a browser that
really runs script, sends forms and keeps cookies, so each also checks the opposite case."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from tests.helpers import browser
from tests.helpers.browser import BROWSER_TEST, csp_violations, serve

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = BROWSER_TEST

STRICT_CSP = "default-src 'self'; script-src 'self'; frame-ancestors 'none'"
# watch.js (allowed: 'self') records the violations the page reports to its own script; it
# runs before the inline script, since a script without async or defer blocks the parser.
CSP_PAGE = """<!doctype html><html><head><title>start</title>
<script src="/watch.js"></script>
<script>document.title = "inline ran";</script>
</head><body><p>page</p></body></html>"""
WATCH_JS = """window.violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.violations.push(e.effectiveDirective));
"""


def _static(body: str, content_type: str = "text/html", **headers: str) -> Handler:
    """A handler that answers every request with ``body``."""

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type=content_type, headers=headers)

    return handler


async def test_a_strict_csp_blocks_inline_script_and_the_console_reports_it(
    browser_page: Page,
) -> None:
    app = web.Application()
    app.router.add_get("/open", _static(CSP_PAGE))
    app.router.add_get("/strict", _static(CSP_PAGE, **{"Content-Security-Policy": STRICT_CSP}))
    app.router.add_get("/watch.js", _static(WATCH_JS, "text/javascript"))
    async with serve(app) as url:
        # Without the header the same inline script runs: the browser executes script.
        await browser_page.goto(url + "/open")
        assert await browser_page.title() == "inline ran"
        assert await csp_violations(browser_page) == []

        await browser_page.goto(url + "/strict")
        assert await browser_page.title() == "start"
        # The page's own report is queued as a task: it may come just after the load event.
        await browser_page.wait_for_function("() => window.violations.length > 0")
        assert await browser_page.evaluate("window.violations") == ["script-src-elem"]
        reports = await csp_violations(browser_page)
        assert len(reports) == 1, reports
        assert "inline script" in reports[0] and "script-src 'self'" in reports[0], reports


FORM = """<!doctype html><title>note</title>
<form method="post" action="/save">
<input name="note" aria-label="note"><input type="hidden" name="csrf" value="t0ken">
<button>Save</button></form>"""


async def test_a_form_post_round_trip_carries_the_fields_and_the_pages_origin(
    browser_page: Page,
) -> None:
    posted: list[tuple[dict[str, str], str | None, str | None]] = []

    async def save(request: web.Request) -> web.Response:
        form = await request.post()
        fields = {k: str(v) for k, v in form.items()}
        headers = request.headers
        posted.append((fields, headers.get("Origin"), headers.get("Sec-Fetch-Site")))
        # POST, redirect, GET: as the panel answers a form.
        raise web.HTTPSeeOther(f"/saved?{urlencode({'note': fields['note']})}")

    async def saved(request: web.Request) -> web.Response:
        note = html.escape(request.query["note"])
        return web.Response(text=f"<p id=saved>{note}</p>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", _static(FORM))
    app.router.add_post("/save", save)
    app.router.add_get("/saved", saved)
    note = "café & <b>bold</b>"
    async with serve(app) as url:
        await browser_page.goto(url + "/")
        await browser_page.get_by_label("note").fill(note)
        await browser_page.get_by_role("button", name="Save").click()
        await browser_page.wait_for_url(url + "/saved?**")
        assert await browser_page.locator("#saved").text_content() == note
    assert posted == [({"note": note, "csrf": "t0ken"}, url, "same-origin")]


async def test_an_httponly_samesite_strict_cookie_is_hidden_from_script_and_other_sites(
    browser_page: Page,
) -> None:
    seen: list[str | None] = []

    async def login(_: web.Request) -> web.Response:
        response = web.Response(text="<p>in</p>", content_type="text/html")
        response.set_cookie("session", "s3cret", httponly=True, samesite="Strict", path="/")
        # The same cookie without HttpOnly: script does read cookies here.
        response.set_cookie("visible", "yes", samesite="Strict", path="/")
        return response

    async def whoami(request: web.Request) -> web.Response:
        seen.append(request.cookies.get("session"))
        return web.Response(text="<p>who</p>", content_type="text/html")

    panel = web.Application()
    panel.router.add_get("/login", login)
    panel.router.add_get("/whoami", whoami)
    async with serve(panel) as url:
        other = web.Application()
        # Another site: localhost and 127.0.0.1 are different sites to the browser.
        page = f'<a href="{url}/whoami">panel</a>'
        other.router.add_get("/", _static(page))
        async with serve(other) as other_url:
            await browser_page.goto(url + "/login")
            assert await browser_page.evaluate("document.cookie") == "visible=yes"
            await browser_page.goto(url + "/whoami")
            # A link followed from another site is a top-level GET: Lax would send the cookie.
            await browser_page.goto(other_url.replace("127.0.0.1", "localhost") + "/")
            await browser_page.get_by_role("link", name="panel").click()
            await browser_page.wait_for_url(url + "/whoami")
    assert seen == ["s3cret", None]


async def test_without_chromium_a_developer_is_told_how_to_get_it_and_ci_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(browser, "find_chromium", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        await anext(browser.launch())
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install chromium.*under CI"):
        await anext(browser.launch())
