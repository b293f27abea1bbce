"""The panel's pages as HTML: every value escaped (``bot.web.render``), every action a plain
form POST carrying the session's CSRF field; no script."""

from __future__ import annotations

from dataclasses import dataclass

from bot.web.render import Html, escape, fill, join, tag, void

NOT_RUNNING = (
    "The gateway is not running: memobot answers on no channel now. This panel is served by "
    "“memobot web” alone; what you change here counts when the gateway starts."
)


EMPTY = Html("")


def table(headers: tuple[str, ...], rows: list[list[object]]) -> Html:
    head = tag("thead", tag("tr", join(tag("th", h) for h in headers)))
    body = tag("tbody", join(tag("tr", join(tag("td", c) for c in row)) for row in rows))
    return tag("table", join([head, body]))


@dataclass(frozen=True, slots=True)
class Frame:
    """What every page of a logged-in browser carries."""

    path: str
    csrf: str
    gateway_running: bool
    notice: str = ""


def csrf_field(csrf: str) -> Html:
    return void("input", type="hidden", name="csrf", value=csrf)


def post_button(action: str, label: str, csrf: str, primary: bool = False, **fields: str) -> Html:
    hidden = join(void("input", type="hidden", name=k, value=v) for k, v in fields.items())
    button = tag("button", label, type="submit", class_="primary" if primary else None)
    return tag("form", join([csrf_field(csrf), hidden, button]), method="post", action=action)


def _nav(frame: Frame | None) -> Html:
    if frame is None:
        return EMPTY
    from bot.web import screens

    links = join(
        tag("a", label, href=href, aria_current="page" if href == frame.path else None)
        for href, label in screens.nav()
    )
    return join([tag("nav", links), post_button("/logout", "Log out", frame.csrf)])


def page(title: str, body: Html, frame: Frame | None = None, head: Html = EMPTY) -> Html:
    running = frame is None or frame.gateway_running
    banner = EMPTY if running else tag("div", NOT_RUNNING, class_="banner", role="status")
    notice = EMPTY
    if frame and frame.notice:
        notice = tag("p", frame.notice, class_="notice", role="status")
    return fill(
        "base.html",
        title=title,
        head=head,
        nav=_nav(frame),
        banner=banner,
        notice=notice,
        body=body,
    )


def login_page(reason: str, command: str, login_csrf: str | None) -> Html:
    form = fill("password.html", csrf=login_csrf) if login_csrf else EMPTY
    body = fill("login.html", reason=reason, command=command, password_form=form)
    return page("Log in", body)


def message_page(title: str, text: str) -> Html:
    body = join([tag("p", text), tag("p", tag("a", "Log in again", href="/login"))])
    return page(title, body)


def logged_in_page() -> Html:
    """After a login link: a page of the panel's own that moves on to the overview, so the
    SameSite=Strict cookie goes with the next request even when the link was opened from
    another site (a redirect from there would be a cross-site request without it)."""
    head = void("meta", http_equiv="refresh", content="0; url=/")
    body = tag("p", join(["You are logged in. ", tag("a", "Continue", href="/")]))
    return page("Logged in", body, head=head)


def refused(text: str) -> Html:
    return page("Refused", tag("p", escape(text)))
