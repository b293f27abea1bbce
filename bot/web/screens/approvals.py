"""Approvals: the tool calls waiting for a yes (Allow once / Always / Deny), and each chat's
remembered "always allow" rules, removable.

An answer here is the chat's button press: the running gateway's approval desk records it
(``ApprovalDesk.answer_as_owner``: the same first-writer-wins decision in the turn's
checkpoint) and the waiting turn goes on; once answered in the chat, an answer here is told
it was answered already, and the other way round. The question's text is the model's: shown
escaped, every invisible character by its code point, as in the chats
(``bot.gate.question.visible``). A rule removed here is gone from the session state the gate
reads, for the next call.

Dream's proposal (``memory.dreamReview``, :mod:`bot.memory.review`) waits here too: the diff,
each change with the history entries it comes from, Allow and Deny; answered through the same
desk, as a press of its buttons in the admins' chats.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from bot.approvals import open_approvals
from bot.gate.approval import CHOICES, answer_hint, asked_call, describe_call
from bot.gate.effects import Effects
from bot.gate.question import visible
from bot.memory.review import CHOICES as DREAM_CHOICES
from bot.memory.review import DREAM_KEY, Proposal, ProposalStore
from bot.session import SessionStore, transitions
from bot.web.render import Html, join, tag
from bot.web.server import page_response
from bot.web.views import Frame, page, post_button

if TYPE_CHECKING:
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/approvals", "Approvals")
TOKEN = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
NEEDS_GATEWAY = (
    "Answering needs the gateway the turn that asked waits in, and this panel is not served by "
    "a gateway: start it with “memobot gateway” (with web.enabled; the questions wait again "
    "after a restart), or answer in the chat."
)
RUNS_ELSEWHERE = (
    "A gateway runs without this panel (web.enabled is false there): it keeps each chat's "
    "state itself. Remove the rule while it is stopped, or turn its panel on."
)
LABELS = {"once": "Allow once", "deny": "Deny"}


@dataclass(frozen=True, slots=True)
class Waiting:
    key: str
    id: str
    tool: str
    intro: str
    subject: str  # the model's text: whole, shown escaped and made visible
    always_label: str
    asked_at: float
    deadline: float


@dataclass(frozen=True, slots=True)
class Rules:
    key: str
    rules: list[str]


def approvals_data(
    state_dir: Path, effects: Mapping[str, Effects] | None
) -> tuple[list[Waiting], list[Rules]]:
    """The waiting questions (oldest first) and every chat's remembered rules, from disk."""
    store = SessionStore(state_dir)
    waiting = []
    for key, record in open_approvals(store):
        state = store.peek_state(key)
        found = asked_call(state.checkpoint if state else None, record)
        name, arguments = found if found else (str(record.get("tool", "")), "")
        tool_effects = (effects or {}).get(name)
        question = describe_call(name, arguments, tool_effects)
        subject = question.subject if found else str(record.get("summary", ""))
        waiting.append(
            Waiting(
                key,
                str(record["id"]),
                name,
                question.intro,
                subject,
                question.always_label,
                float(record.get("asked_at", 0)),
                float(record.get("deadline", 0)),
            )
        )
    rules = []
    for key in store.keys():
        state = store.peek_state(key)
        if state is not None and state.approved_calls:
            rules.append(Rules(key, list(state.approved_calls)))
    return waiting, rules


def routes(panel: Panel) -> list[web.RouteDef]:
    def store() -> SessionStore:
        """The gateway's own store when it runs (the one the gate reads), else one here."""
        gateway = panel.gateway
        return gateway.stack.store if gateway is not None else SessionStore(panel.state_dir)

    async def show(request: web.Request) -> web.Response:
        gateway = panel.gateway
        effects = None
        if gateway is not None:
            effects = dict(gateway.stack.loop.approvals.tools.effects())
        waiting, rules = await asyncio.to_thread(approvals_data, panel.state_dir, effects)
        proposal = await asyncio.to_thread(ProposalStore(panel.state_dir).open)
        frame = panel.frame(request, await panel.gateway_running())
        live = gateway is not None
        return page_response(approvals_page(waiting, rules, frame, live, proposal))

    async def answer(request: web.Request) -> web.Response:
        data = await request.post()
        key, approval_id = str(data.get("key", "")), str(data.get("id", ""))
        choice, token = str(data.get("choice", "")), str(data.get("token", ""))
        gateway = panel.gateway
        if gateway is None:
            return panel.back("/approvals", NEEDS_GATEWAY)
        if choice not in CHOICES or not TOKEN.match(token):
            return panel.back("/approvals", "That is not an answer to an approval.")
        # Dream's proposal belongs to no chat: the desk knows it by its id.
        if key != DREAM_KEY and key not in await asyncio.to_thread(gateway.stack.store.keys):
            return panel.back("/approvals", f"There is no chat {key}.")
        desk = gateway.stack.loop.approvals
        reply = await desk.answer_as_owner(key, approval_id, choice, "web", f"web-{token}")
        log.info("approval %s session=%s answered %s by web: %s", approval_id, key, choice, reply)
        return panel.back("/approvals", reply or "Your answer was recorded already.")

    async def forget(request: web.Request) -> web.Response:
        data = await request.post()
        key, rule = str(data.get("key", "")), str(data.get("rule", ""))
        if panel.gateway is None and await panel.gateway_running():
            # A gateway elsewhere holds this chat's state in memory: a write beside it would
            # be lost to it (and it to the file).
            return panel.back("/approvals", RUNS_ELSEWHERE)
        sessions = store()
        if key not in await asyncio.to_thread(sessions.keys):
            return panel.back("/approvals", f"There is no chat {key}.")
        session = await asyncio.to_thread(sessions.get, key)
        if rule not in session.state.approved_calls:
            return panel.back("/approvals", "That rule is not remembered (any more).")
        await sessions.apply_async(session, transitions.forget_approved_calls(lambda k: k == rule))
        log.info("approvals: a remembered rule of session=%s removed by web", key)
        return panel.back("/approvals", f"Removed: that call is asked about again in {key}.")

    return [
        web.get("/approvals", show),
        web.post("/approvals/answer", answer),
        web.post("/approvals/forget", forget),
    ]


def _question(w: Waiting, csrf: str, live: bool, now: float) -> Html:
    left = w.deadline - now
    when = f"{left / 60:.0f} min left" if left > 0 else "expired, not yet closed"
    head = tag("h3", join([w.key, " · ", tag("code", w.tool), " ", tag("small", when)]))
    # The model's text: every character visible, escaped by tag(); inside <pre> it cannot
    # pass for the panel's own words.
    subject = tag("pre", visible(w.subject).shown, class_="subject")
    parts = [head, tag("p", w.intro), subject]
    if live:
        token = secrets.token_urlsafe(12)  # one per question shown: a resubmit is the same
        labels = {**LABELS, "always": w.always_label}
        buttons = [
            post_button(
                "/approvals/answer",
                labels[choice],
                csrf,
                choice == "once",
                key=w.key,
                id=w.id,
                choice=choice,
                token=token,
            )
            for choice in CHOICES
        ]
        parts.append(tag("div", join(buttons, " "), class_="actions"))
        hint = answer_hint(w.id, (w.deadline - w.asked_at) / 60)
        parts.append(tag("p", hint.splitlines()[-1], class_="muted"))
    return tag("section", join(parts), class_="question", aria_label=f"approval {w.id}")


def _rules(r: Rules, csrf: str) -> Html:
    items = [
        tag(
            "li",
            join(
                [
                    tag("code", visible(rule).shown),
                    " ",
                    post_button("/approvals/forget", "Remove", csrf, key=r.key, rule=rule),
                ]
            ),
        )
        for rule in r.rules
    ]
    return tag("section", join([tag("h3", r.key), tag("ul", join(items), class_="rules")]))


def _proposal(p: Proposal, csrf: str, live: bool) -> Html:
    """Dream's proposal: memobot's words, then the changes and the diff (the model's words:
    escaped, every invisible character shown) and, in a gateway, Allow and Deny."""
    view = p.view()
    head = tag("h3", join(["Dream · ", tag("code", ", ".join(p.files))]))
    parts = [head, tag("p", view.intro), tag("pre", visible(view.subject).shown, class_="subject")]
    if p.state != "waiting":
        later = "Answered; carried out at the gateway's next start or Dream run."
        parts.append(tag("p", later, class_="muted"))
    elif live:
        token = secrets.token_urlsafe(12)
        buttons = [
            post_button(
                "/approvals/answer",
                label,
                csrf,
                choice == "once",
                key=DREAM_KEY,
                id=p.id,
                choice=choice,
                token=token,
            )
            for choice, label in DREAM_CHOICES.items()
        ]
        parts.append(tag("div", join(buttons, " "), class_="actions"))
        parts.append(tag("p", view.outro.splitlines()[-1], class_="muted"))
    return tag("section", join(parts), class_="question", aria_label=f"approval {p.id}")


def approvals_page(
    waiting: list[Waiting],
    rules: list[Rules],
    frame: Frame,
    live: bool,
    proposal: Proposal | None = None,
) -> Html:
    now = time.time()
    parts: list[object] = [tag("h2", "Waiting for an answer")]
    if (waiting or proposal) and not live:
        parts.append(tag("p", NEEDS_GATEWAY, class_="muted"))
    if proposal is not None:
        parts.append(_proposal(proposal, frame.csrf, live))
    if waiting:
        parts.extend(_question(w, frame.csrf, live, now) for w in waiting)
    elif proposal is None:
        parts.append(tag("p", "No tool call waits for an answer.", class_="muted"))
    parts.append(tag("h2", "Remembered rules (“always allow”)"))
    parts.append(
        tag(
            "p",
            "Each chat's calls that run without asking. Remove one and that call is asked "
            "about again, from the next call on.",
        )
    )
    if rules:
        parts.extend(_rules(r, frame.csrf) for r in rules)
    else:
        parts.append(tag("p", "No chat has a remembered rule.", class_="muted"))
    return page("Approvals", join(parts), frame)
