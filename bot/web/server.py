"""The panel's web server: routes, the checks every request passes, and the listening
socket. The gateway starts one beside its channels; ``memobot web`` starts one alone while
no gateway runs. It sets no timer and polls nothing: a panel nobody opens costs nothing.

Every request: the Host must be one the panel serves (``bot.web.addresses``; DNS
rebinding). Every request that changes something: an Origin (or a Referer) of the panel's
own, a live session and its CSRF field. Every response: a strict Content-Security-Policy
(script only from the panel's own static files, never inline), nosniff, no framing, not
cached. Every page works without script; script only enhances (live parts).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

from aiohttp import web

from bot.config import Config, ConfigError, load_config
from bot.invocation import command_for
from bot.web import limits, screens, views
from bot.web.addresses import parse_listen, served
from bot.web.api import ApiFace, api_error, in_openai_shape, is_api_path
from bot.web.limits import AttemptLimiter
from bot.web.links import LinkBook
from bot.web.passwords import verify_password
from bot.web.render import Html, static, tag
from bot.web.sessions import COOKIE, Session, Sessions

if TYPE_CHECKING:
    from bot.gateway import Gateway

log = logging.getLogger(__name__)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with the
# panel's own form posts (the Fetch standard), and the Origin check could not tell them from
# a foreign page's. Nothing goes to other sites either way.
REFERRER_POLICY = "same-origin"
LOGIN_COOKIE = "memobot_login"  # the login form's CSRF value (there is no session yet)
PUBLIC = frozenset({"/login", "/logged-out", "/expired", "/static/panel.css"})
# A form's body; the largest is a memory file saved on the Memory screen (64 KiB of text, sent
# as multipart, its line breaks doubled to CRLF by the browser). Read only with a session.
MAX_BODY = 256 * 1024
MAX_PASSWORD = 1024
_SESSION: ContextVar[Session | None] = ContextVar("panel_session", default=None)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def login_url(base_url: str, token: str) -> str:
    """The one-time link: its token in the query (a fragment never reaches the server)."""
    return f"{base_url}/login?{urlencode({'token': token})}"


class Panel:
    """One panel server over ``cfg`` (its listen address, password and publicUrl as they
    were at start) and the config file (each page reads it again)."""

    def __init__(
        self,
        cfg: Config,
        config_path: Path,
        *,
        in_gateway: bool,
        gateway: Gateway | None = None,
        clock: Callable[[], float] = time.time,
        limiter: AttemptLimiter | None = None,
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.in_gateway = in_gateway
        # The running gateway this panel is part of (its bus, loop and channels), for the
        # screens that act on it live; None when ``memobot web`` serves the panel alone.
        self.gateway = gateway
        self.state_dir = cfg.agent.state_path
        self.served = served(cfg.web.listen, cfg.web.public_url)
        self.links = LinkBook(self.state_dir, clock)
        self.sessions = Sessions(clock)
        self.limiter = limiter or AttemptLimiter()
        self._notices: dict[str, str] = {}  # session id -> the result of its last action
        self._runner: web.AppRunner | None = None
        # Set when the panel stops: a live part (an SSE stream) ends then, rather than holding
        # the stop for aiohttp's shutdown timeout.
        self.closing = asyncio.Event()
        # The OpenAI-compatible API on this server (docs/api.md), when a gateway runs it.
        self.api: ApiFace | None = None
        if cfg.api.enabled and gateway is not None:
            self.api = ApiFace(gateway)
        self.app = self._build()

    @property
    def base_url(self) -> str:
        return self.served.base_url

    # -- lifecycle --

    async def start(self, sock: socket.socket | None = None) -> str | None:
        """Listen (on ``sock`` when one is given: bound already); None when listening, else
        why not (also logged, as one line)."""
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=limits.IDLE_SECONDS,
        )
        await runner.setup()
        host, port = parse_listen(self.cfg.web.listen)
        try:
            site = web.SockSite(runner, sock) if sock else web.TCPSite(runner, host, port)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            why = (
                f"the web panel cannot listen on {self.cfg.web.listen}: "
                f"{exc.strerror or exc} (set web.listen to a free address, or web.enabled "
                "to false)"
            )
            log.error("%s%s", why, "; memobot runs on without it" if self.in_gateway else "")
            return why
        self._runner = runner
        log.info("web panel on %s (memobot web prints a login link)", self.base_url)
        return None

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _close_streams(self, app: web.Application) -> None:
        self.closing.set()
        if self.api is not None:
            self.api.close()

    # -- the application --

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        app.on_response_prepare.append(_security_headers)
        app.on_shutdown.append(self._close_streams)
        for screen in screens.load():
            app.router.add_routes(screen.routes(self))
        if self.api is not None:
            app.router.add_routes(self.api.routes())
        app.router.add_get("/login", self._login_page)
        app.router.add_post("/login", self._password_login)
        app.router.add_post("/logout", self._logout)
        app.router.add_get("/logged-out", self._logged_out)
        app.router.add_get("/expired", self._expired)
        app.router.add_get("/static/{name}", _static)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not self.served.host_ok(host):
            log.info("web: refused a request for host %r: not one the panel serves", host)
            if self.api is not None and is_api_path(request.path):
                return api_error(421, "This server does not answer to that host name.")
            return _refused(
                "This panel does not answer to that host name (web.publicUrl names the "
                "address it is opened at).",
                421,
            )
        if self.api is None and self.cfg.api.enabled and is_api_path(request.path):
            # ``memobot web`` alone: a program is told so, not sent to the login page.
            return api_error(503, "memobot's gateway is not running.", "server_error")
        if self.api is not None and is_api_path(request.path):
            # A program's request with a bearer key (checked by the API itself), never a
            # cookie: the session and CSRF checks below are the browser's, and so is the
            # form body limit (the API reads its body with api.maxRequestBytes).
            return await in_openai_shape(request, handler)
        if _embedded_by_another_site(request):
            log.warning("web: refused a %s %s from another site", request.method, request.path)
            return _refused("Refused: another site's page asked for this.")
        changes = request.method not in ("GET", "HEAD")
        if changes and not self.served.origin_ok(_origin(request)):
            log.warning("web: refused a %s %s from another origin", request.method, request.path)
            return _refused("Refused: this request did not come from the panel's own pages.")
        session, expired = self.sessions.touch(request.cookies.get(COOKIE))
        _SESSION.set(session)  # each request is a task of its own: seen by its handler only
        if session is None and request.path not in PUBLIC:
            if changes:
                return _refused("Log in first.")
            raise web.HTTPSeeOther("/expired" if expired else "/login")
        if changes and session is not None and request.path != "/login":
            form = await request.post()
            if not same_secret(form.get("csrf"), session.csrf):
                log.warning("web: refused a POST %s without its form's token", request.path)
                return _refused("Refused: the form's token is missing or out of date.")
        return await handler(request)

    def frame(self, request: web.Request, running: bool) -> views.Frame:
        """What the page answering ``request`` carries: its CSRF field, the nav, whether a
        gateway runs and the result of the session's last action."""
        session = _session()
        notice = self._notices.pop(session.id, "")
        return views.Frame(request.path, session.csrf, running, notice)

    def csrf(self) -> str:
        """The CSRF field of the session of the request being handled (for a part of a page
        fetched by its script: ``frame`` would take the page's notice)."""
        return _session().csrf

    async def gateway_running(self) -> bool:
        from bot.gateway import read_status

        return self.in_gateway or await asyncio.to_thread(read_status, self.state_dir) is not None

    async def config(self) -> tuple[Config, str]:
        """The config as the file says now, or (when it cannot be loaded) the one this panel
        started with, and why."""
        try:
            cfg, _ = await asyncio.to_thread(load_config, self.config_path)
        except (ConfigError, OSError) as exc:
            return self.cfg, f"The config file cannot be loaded now; shown as it was. {exc}"
        # The state folder is this process's for its lifetime (a new agent.stateDir takes a
        # restart): pages show the records the panel's actions change, never another folder's.
        cfg.agent.state_dir = str(self.state_dir)
        return cfg, ""

    def back(self, path: str, notice: str) -> web.Response:
        """After an action: to the page again (a reload does not repeat it), with its result."""
        # Kept for live sessions only: one whose browser never came back leaves nothing.
        self._notices = {k: v for k, v in self._notices.items() if k in self.sessions}
        self._notices[_session().id] = notice
        return see_other(path)

    # -- logging in and out --

    def _too_many(self, request: web.Request) -> web.Response | None:
        wait = self.limiter.attempt(request.remote or "?")
        if wait is None:
            return None
        log.warning("web: too many login attempts from %s; refused for %d s", request.remote, wait)
        page = views.page("Too many attempts", tag("p", f"Try again in {wait} seconds."))
        return page_response(page, 429, {"Retry-After": str(wait)})

    def _login_form(self, reason: str, status: int = 200) -> web.Response:
        command = command_for(self.config_path, "web")
        csrf = secrets.token_urlsafe(32) if self.cfg.web.password_hash else None
        response = page_response(views.login_page(reason, command, csrf), status)
        if csrf:
            self._cookie(response, LOGIN_COOKIE, csrf, "/login")
        return response

    def _cookie(self, response: web.Response, name: str, value: str, path: str) -> None:
        """A cookie no script can read, sent to this site only (and only over https when
        publicUrl is https)."""
        secure = self.cfg.web.secure_cookies
        response.set_cookie(name, value, path=path, httponly=True, samesite="Strict", secure=secure)

    def _logged_in(self, response: web.Response, how: str, request: web.Request) -> web.Response:
        session = self.sessions.create()
        self._cookie(response, COOKIE, session.id, "/")
        response.del_cookie(LOGIN_COOKIE, path="/login")
        log.info("web: logged in with %s from %s", how, request.remote)
        return response

    async def _login_page(self, request: web.Request) -> web.Response:
        token = request.query.get("token")
        if token is None:
            if _SESSION.get() is not None:
                raise web.HTTPSeeOther("/")
            return self._login_form("Log in to memobot's control panel.")
        # A real link is let in whatever the flood from its address (the model's commands
        # reach 127.0.0.1 too, and must not lock the owner out); only guesses are counted,
        # and a guess costs a read, not a write.
        known = await asyncio.to_thread(self.links.holds, token)
        if not known and (limited := self._too_many(request)) is not None:
            return limited
        if not known or not await asyncio.to_thread(self.links.consume, token):
            log.warning("web: a login link was refused (used already, expired or unknown)")
            return self._login_form(
                "That login link was used already or has expired: a link works once, for 10 "
                "minutes.",
                403,
            )
        return self._logged_in(page_response(views.logged_in_page()), "a login link", request)

    async def _password_login(self, request: web.Request) -> web.Response:
        stored = self.cfg.web.password_hash
        if not stored:
            raise web.HTTPNotFound()
        if (limited := self._too_many(request)) is not None:
            return limited
        form = await request.post()
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not same_secret(form.get("csrf"), expected):
            return self._login_form("The login form was out of date: try again.", 403)
        password = str(form.get("password", ""))[:MAX_PASSWORD]
        if not await asyncio.to_thread(verify_password, password, stored):
            log.warning("web: a wrong password was given from %s", request.remote)
            return self._login_form("Wrong password.", 403)
        return self._logged_in(see_other("/"), "the password", request)

    async def _logout(self, request: web.Request) -> web.Response:
        session = _session()
        self.sessions.drop(session.id)
        self._notices.pop(session.id, None)
        log.info("web: logged out")
        response = see_other("/logged-out")
        response.del_cookie(COOKIE, path="/")
        return response

    async def _logged_out(self, request: web.Request) -> web.Response:
        return page_response(views.message_page("Logged out", "You are logged out of the panel."))

    async def _expired(self, request: web.Request) -> web.Response:
        text = "Your session has expired (after 12 hours without use, or a restart of memobot)."
        return page_response(views.message_page("Session expired", text))


def same_secret(given: object, expected: str) -> bool:
    """``given`` (a form field: text, a file, absent) is ``expected``, compared in constant
    time (as bytes: compare_digest refuses text that is not ASCII)."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def _session() -> Session:
    """The session of the request being handled (the guard let it through with one)."""
    session = _SESSION.get()
    assert session is not None
    return session


def _embedded_by_another_site(request: web.Request) -> bool:
    """A request another site's page made the browser send (a script, image or event
    stream of the panel's, a fetch), as its Fetch Metadata headers say; following a link
    (a navigation) stays allowed. SameSite=Strict does not cover it: another port of the
    same host (127.0.0.1:3000, a page the model serves) or a sibling subdomain is the
    "same site" and gets the session cookie. Without these headers (an older browser, curl)
    the other checks decide."""
    site = request.headers.get("Sec-Fetch-Site")
    if site not in ("same-site", "cross-site"):
        return False
    return not (
        request.method == "GET"
        and request.headers.get("Sec-Fetch-Mode") == "navigate"
        and request.headers.get("Sec-Fetch-Dest", "document") == "document"
    )


def _origin(request: web.Request) -> str | None:
    """Where a request says it comes from: its Origin, else its Referer's origin."""
    origin = request.headers.get("Origin")
    if origin and origin != "null":
        return origin
    referer = request.headers.get("Referer")
    if not referer:
        return None
    parts = urlsplit(referer)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def page_response(
    body: Html, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        text=body, status=status, content_type="text/html", charset="utf-8", headers=headers
    )


def see_other(path: str) -> web.Response:
    return web.Response(status=303, headers={"Location": path})


def _refused(text: str, status: int = 403) -> web.Response:
    return page_response(views.refused(text), status)


STATIC_TYPES = {".css": "text/css", ".js": "text/javascript"}


async def _static(request: web.Request) -> web.Response:
    """A file of ``bot/web/static`` (the stylesheet before login, scripts after)."""
    name = request.match_info["name"]
    kind = STATIC_TYPES.get(Path(name).suffix)
    if kind is None or "/" in name or name.startswith("."):
        raise web.HTTPNotFound()
    try:
        body = static(name)
    except (FileNotFoundError, IsADirectoryError):
        raise web.HTTPNotFound() from None
    return web.Response(body=body, content_type=kind, charset="utf-8")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    headers["Content-Security-Policy"] = CSP
    headers["X-Content-Type-Options"] = "nosniff"
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = REFERRER_POLICY
    headers["Cross-Origin-Opener-Policy"] = "same-origin"
    headers["Cache-Control"] = "no-store"
