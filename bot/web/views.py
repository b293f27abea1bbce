"""The panel's pages as HTML: every value escaped (``bot.web.render``), every action a plain
form POST carrying the session's CSRF field; no script."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bot.status import ChannelLine
from bot.web.pages import ChannelAccess, Overview
from bot.web.render import Html, escape, fill, join, tag, void

# The pages that exist, in the nav's order; nothing else is linked.
PAGES = (("/", "Overview"), ("/access", "Access"))
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
    links = join(
        tag("a", label, href=href, aria_current="page" if href == frame.path else None)
        for href, label in PAGES
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


def overview_page(data: Overview, frame: Frame) -> Html:
    rows: list[list[object]] = [[c.name, c.state, _why(c)] for c in data.channels]
    channels = (
        table(("Channel", "State", "Why"), rows)
        if rows
        else tag("p", "No channel is enabled.", class_="muted")
    )
    body = fill(
        "overview.html",
        version=data.version,
        model=data.model,
        gateway=data.gateway,
        sessions=data.sessions,
        schedule=data.schedule,
        approvals=data.open_approvals,
        channels=channels,
    )
    return page("Overview", body, frame)


def _why(c: ChannelLine) -> str:
    if c.state == "not running":
        return "the gateway is not running"
    parts = [c.reason, *c.features_off, f"last event {c.last_event}"]
    return "; ".join(p for p in parts if p)


def _ids(ids: list[str], empty: str) -> Html:
    return join([tag("code", i) for i in ids], ", ") if ids else tag("span", empty, class_="muted")


def _channel_access(c: ChannelAccess, csrf: str, now: float) -> Html:
    state = "enabled" if c.enabled else "not enabled"
    admins_note = "" if c.admins_set else " (the allowFrom ids: admins is not set)"
    policy_note = "" if c.dm_policy_set else " (not set: the default for this allowFrom)"
    facts = tag(
        "dl",
        join(
            [
                tag("dt", "allowFrom"),
                tag("dd", _ids(c.allow_from, "nobody: strangers are refused or get a code")),
                tag("dt", "Admins"),
                tag("dd", join([_ids(c.admins, "none"), admins_note])),
                tag("dt", "dmPolicy"),
                tag("dd", join([tag("code", c.dm_policy), policy_note])),
                tag("dt", "Let in through pairing"),
                tag("dd", _ids([a.who for a in c.pairing.approved], "nobody")),
            ]
        ),
        class_="facts",
    )
    if c.pairing.waiting:
        rows: list[list[object]] = [
            [
                tag("code", w.code),
                w.who,
                f"{w.minutes_left(now):.0f} min",
                join(
                    [
                        post_button("/access/approve", "Approve", csrf, True, code=w.code),
                        " ",
                        post_button("/access/refuse", "Refuse", csrf, code=w.code),
                    ]
                ),
            ]
            for w in c.pairing.waiting
        ]
        waiting = join(
            [tag("h3", "Waiting for you"), table(("Code", "Who", "Time left", ""), rows)]
        )
    else:
        waiting = tag("p", "No pairing code waits.", class_="muted")
    title = tag("h2", join([c.name, " ", tag("span", f"({state})", class_="muted")]))
    return tag("section", join([title, facts, waiting]), aria_label=c.name)


def access_page(channels: list[ChannelAccess], frame: Frame, problem: str = "") -> Html:
    intro = tag(
        "p",
        "Who may talk to memobot on each channel. A stranger's private message gets a pairing "
        "code when dmPolicy is pairing; approve it here to let them in at once (as a guest, "
        "not an admin).",
    )
    parts = [intro]
    if problem:
        parts.append(tag("p", problem, class_="banner", role="alert"))
    now = time.time()
    parts.extend(_channel_access(c, frame.csrf, now) for c in channels)
    return page("Access", join(parts), frame)


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
