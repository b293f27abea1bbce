"""Settings: the config file as one form per section (``bot.web.config_form``), and the
whole file as JSON; both judged by the validator that judges it at start, saved with
``bot.config.set_options`` (the rest of the file kept, mode 0600, nothing written when it
is refused) and applied to the running gateway through its reload path."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic.alias_generators import to_camel

from bot.config import (
    Config,
    ConfigError,
    apply_options,
    check_layout,
    load_config,
    parse_config,
    read_versioned,
    set_options,
)
from bot.web import config_form as forms
from bot.web.config_form import FieldError, FormField
from bot.web.form_fields import as_sent, hidden
from bot.web.render import Html, join, tag, void
from bot.web.server import page_response
from bot.web.views import EMPTY, Frame, csrf_field, page

if TYPE_CHECKING:
    from bot.service.checks import Check
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/settings", "Settings")
RAW = "raw"


def routes(panel: Panel) -> list[web.RouteDef]:
    async def index(request: web.Request) -> web.Response:
        state = await asyncio.to_thread(read_state, panel.config_path)
        frame = panel.frame(request, await panel.gateway_running())
        return page_response(index_page(panel.config_path, _sections(), frame, state.problem))

    async def show(request: web.Request, problem: str = "", status: int = 200) -> web.Response:
        """The section's form over the file as it is now; ``problem``: why a save was not
        made (then shown instead of the file's own)."""
        section = _section_of(request)
        state = await asyncio.to_thread(read_state, panel.config_path)
        raw, loaded = state.raw, state.loaded
        fields = forms.fields(section)
        texts = {f.name: forms.shown(f, forms.current(f, raw, loaded)) for f in fields}
        frame = panel.frame(request, await panel.gateway_running())
        states = _secret_states(fields, raw, loaded)
        body = section_page(
            section, fields, texts, states, {}, [], frame, problem or state.problem, state.version
        )
        return page_response(body, status)

    async def save(request: web.Request) -> web.Response:
        section = _section_of(request)
        form = await request.post()
        state = await asyncio.to_thread(read_state, panel.config_path)
        if (refusal := _stale(state, form.get("version"))) is not None:
            return await show(request, refusal, 409)
        raw, loaded = state.raw, state.loaded
        fields = forms.fields(section)
        texts = {f.name: forms.shown(f, forms.current(f, raw, loaded)) for f in fields}
        changes: dict[tuple[str, ...], Any] = {}
        errors: dict[str, str] = {}
        for f in fields:
            if f.read_only or (f.name not in form and f"clear:{f.name}" not in form):
                continue
            text = str(form.get(f.name, ""))
            if f.kind == "secret":
                if form.get(f"clear:{f.name}") == "on":
                    changes[f.path] = ""
                elif text:
                    changes[f.path] = text
                continue
            before = forms.current(f, raw, loaded)
            if _same(text, texts[f.name]) and _holds(f, text, before):
                continue
            texts[f.name] = text
            try:
                changes[f.path] = forms.parsed(f, text, before)
            except FieldError as exc:
                errors[f.name] = str(exc)
        general: list[str] = []
        notes: list[str] = []
        if not errors and changes:
            errors, general, notes = await _check(panel, section, raw, changes)
        if errors or general:
            frame = panel.frame(request, await panel.gateway_running())
            states = _secret_states(fields, raw, loaded)
            body = section_page(
                section, fields, texts, states, errors, general, frame, version=state.version
            )
            return page_response(body, 422)
        name = ".".join(section)
        if not changes:
            return panel.back(f"/settings/{name}", "Nothing changed.")
        try:
            after = await asyncio.to_thread(
                set_options, panel.config_path, raw, changes, state.version
            )
        except ConfigError as exc:  # the file changed in between: its own report
            return panel.back(f"/settings/{name}", f"Nothing saved: {exc}")
        changed = ", ".join(".".join(p) for p in changes)
        log.info("config: %s changed by web", changed)
        notice = " ".join(
            [
                f"Saved {changed}.",
                *opened(state.loaded, after),
                *notes,
                applied(panel, after),
                *way_in(panel, after),
            ]
        )
        return panel.back(f"/settings/{name}", notice)

    async def raw_view(
        request: web.Request, problem: str = "", status: int = 200, unsaved: str = ""
    ) -> web.Response:
        state = await asyncio.to_thread(read_state, panel.config_path)
        text = json.dumps(forms.mask(state.raw), indent=2, ensure_ascii=False)
        frame = panel.frame(request, await panel.gateway_running())
        body = raw_page(text, [], frame, problem or state.problem, state.version, unsaved)
        return page_response(body, status)

    async def raw_save(request: web.Request) -> web.Response:
        form = await request.post()
        text = str(form.get("json", ""))
        state = await asyncio.to_thread(read_state, panel.config_path)
        if (refusal := _stale(state, form.get("version"))) is not None:
            return await raw_view(request, refusal, 409, text)
        raw = state.raw
        try:
            data = forms.load_json(text)
            if not isinstance(data, dict):
                raise FieldError("the top level must be a JSON object { ... }")
            data = forms.unmask(data, raw, "<root>")
        except FieldError as exc:
            problems = [str(exc)]
        else:
            try:
                before = await asyncio.to_thread(_loaded_or_none, panel.config_path)
                after = await asyncio.to_thread(
                    set_options, panel.config_path, data, {}, state.version
                )
            except ConfigError as exc:
                problems = [f"{p}: {why}" for p, why in exc.fields] or [str(exc)]
            else:
                changed = _changed(before, after)
                log.info("config: replaced in the raw view by web (changed: %s)", changed)
                warnings = [*opened(state.loaded, after), applied(panel, after)]
                notice = " ".join(["Saved.", *warnings, *way_in(panel, after)])
                return panel.back(f"/settings/{RAW}", notice)
        frame = panel.frame(request, await panel.gateway_running())
        return page_response(raw_page(text, problems, frame, version=state.version), 422)

    return [
        web.get("/settings", index),
        web.get(f"/settings/{RAW}", raw_view),
        web.post(f"/settings/{RAW}", raw_save),
        web.get("/settings/{section}", show),
        web.post("/settings/{section}", save),
    ]


# -- reading, checking, applying ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileState:
    raw: dict[str, Any]  # the file's JSON ({} when it cannot be read)
    loaded: dict[str, Any]  # the config as it loads, defaults filled in (JSON, file's keys)
    problem: str  # why it does not load ("" when it does)
    version: str  # bot.config.file_version of what ``raw`` was read from
    readable: bool  # False: not JSON the panel can read (a form would write over it)


def read_state(config_path: Path) -> FileState:
    """The config file as the pages show it, and as a save starts from."""
    try:
        raw, version = read_versioned(config_path)
    except ConfigError as exc:
        problem = (
            f"{exc}. Saving is off until the file is fixed by hand: the panel does not write "
            "over a file it cannot read (the fields below are the defaults, not the file)."
        )
        return FileState({}, _dump(Config()), problem, "", False)
    try:
        cfg, _ = load_config(config_path)
    except (ConfigError, OSError) as exc:
        return FileState(
            raw, _dump(Config()), f"The config file does not load now: {exc}", version, True
        )
    return FileState(raw, _dump(cfg), "", version, True)


def _stale(state: FileState, sent: object) -> str | None:
    """Why a save from a page must not be made: the file cannot be read (it would be
    replaced by the defaults and the change), or it is not the version the page showed (a
    hand edit since would be undone by the fields sent back as they were). None: save."""
    if not state.readable:
        return f"Nothing was saved. {state.problem}"
    if isinstance(sent, str) and sent != state.version:
        return (
            "Nothing was saved: the config file was changed since this page was opened (by "
            "hand, or from another page), and saving would have undone that. Below is the "
            "file as it is now: make your change again."
        )
    return None


def _dump(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(by_alias=True, mode="json")


def _loaded_or_none(config_path: Path) -> Config | None:
    try:
        return load_config(config_path)[0]
    except (ConfigError, OSError):
        return None


def _changed(before: Config | None, after: Config) -> str:
    from bot.service.reload import changed_paths, display

    if before is None:
        return "all (it did not load before)"
    return ", ".join(display(p) for p in changed_paths(before, after)) or "nothing"


def _validate(data: dict[str, Any], config_path: Path) -> Config:
    cfg = parse_config(data, str(config_path))
    check_layout(cfg, config_path)
    return cfg


async def _check(
    panel: Panel, section: tuple[str, ...], raw: dict[str, Any], changes: dict[tuple[str, ...], Any]
) -> tuple[dict[str, str], list[str], list[str]]:
    """(errors by field, errors of the section, notes) of the file with ``changes``: the
    validator's verdict, then for a channel its tokens asked of the platform, live."""
    names = [f.name for f in forms.fields(section)]
    candidate = apply_options(copy.deepcopy(raw), changes)
    try:
        after = await asyncio.to_thread(_validate, candidate, panel.config_path)
    except ConfigError as exc:
        errors: dict[str, str] = {}
        general: list[str] = []
        for path, why in exc.fields or (("", str(exc)),):
            name = forms.error_field(path, names)
            if name is None:
                general.append(f"{path}: {why}" if path else why)
            else:
                errors[name] = f"{errors[name]}; {why}" if name in errors else why
        return errors, general, []
    if section[0] != "channels":
        return {}, [], []
    checks, field = await token_checks(section[1], after, changes)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        text = "; ".join(f"{c.text} ({c.fix})" if c.fix else c.text for c in failed)
        return {field: text}, [], []
    return {}, [], [c.text + "." for c in checks]


async def token_checks(
    channel: str, after: Config, changes: dict[tuple[str, ...], Any]
) -> tuple[list[Check], str]:
    """The channel's tokens asked of its platform (getMe, auth.test, the Discord user), when
    the section is enabled and a token, its address, its proxy or ``enabled`` changed; and
    the field a refusal is shown at."""
    from bot.service.probes import check_token
    from channels import registry

    spec = registry.specs()[channel]
    tokens = [to_camel(k) for k, _ in spec.setup.tokens] if spec.setup else []
    field = f"channels.{channel}.{tokens[0]}" if tokens else f"channels.{channel}.enabled"
    section = spec.section(after)
    if section is None or not section.enabled or not tokens:
        return [], field
    assert spec.setup is not None
    watched = {*tokens, "enabled", "proxy", to_camel(spec.setup.url_field)}
    if not any(p[-1] in watched for p in changes):
        return [], field
    checks = []
    for probe in spec.token_probes(section):
        check = await check_token(probe, section.proxy)
        if check.status == "fail" and " " in probe.channel:  # "slack botToken"
            field = f"channels.{channel}.{probe.channel.split()[1]}"
        checks.append(check)
    return checks, field


def applied(panel: Panel, after: Config) -> str:
    """Apply a saved config to the running gateway (its reload path, as SIGHUP), and say
    what came of it."""
    gateway = panel.gateway
    if gateway is None:
        return (
            "The gateway is not running in this process: the change counts when the gateway "
            "starts (a running one takes it at its next reload, SIGHUP)."
        )
    result = gateway.service.apply(after)
    parts = []
    if result.applied:
        parts.append(f"Applied now: {', '.join(result.applied)}.")
    if result.restart_needed:
        parts.append(f"Takes a restart of the gateway: {', '.join(result.restart_needed)}.")
    return " ".join(parts) or "The running gateway had it already."


def opened(before: dict[str, Any], after: Config) -> list[str]:
    """A warning for each channel a save opened to everyone (``"*"`` newly in allowFrom)."""
    out = []
    for name in type(after.channels).model_fields:
        section = getattr(after.channels, name)
        was = before.get("channels", {}).get(to_camel(name)) or {}
        if (
            section is not None
            and "*" in section.allow_from
            and "*" not in was.get("allowFrom", [])
        ):
            out.append(
                f'channels.{to_camel(name)}.allowFrom has "*": anyone who finds the bot can '
                "talk to it now, and use its tools."
            )
    return out


def way_in(panel: Panel, after: Config) -> list[str]:
    """What a saved ``web`` section does to the owner's way back into this panel once the
    gateway restarts: off, or at another address (the one this page is at stops working)."""
    from bot.web.addresses import served

    if not after.web.enabled:
        return [
            "The panel is off from the next start (of the gateway, or of memobot web): this "
            "page will be gone, and only an edit of the config file by hand (web.enabled: "
            "true) brings it back."
        ]
    base = served(after.web.listen, after.web.public_url).base_url
    if after.web.enabled and base != panel.base_url:
        return [f"From the next start the panel is at {base}, no longer at {panel.base_url}."]
    return []


# -- pages ------------------------------------------------------------------------------------


def _sections() -> list[tuple[str, ...]]:
    from channels import registry

    channels = [n for n, s in registry.specs().items() if s.config is not None]
    return [s for s in forms.sections(Config()) if s[0] != "channels" or s[1] in channels]


def _section_of(request: web.Request) -> tuple[str, ...]:
    section = tuple(request.match_info["section"].split("."))
    if section not in forms.sections(Config()):
        raise web.HTTPNotFound()
    return section


def _same(text: str, shown: str) -> bool:
    """A field sent back as it was shown (browsers send a textarea's lines with CRLF)."""
    return as_sent(text) == as_sent(shown)


def _holds(f: FormField, text: str, before: Any) -> bool:
    """The file holds what ``text`` stands for: sent back as shown is no change. Not so for
    a value of the wrong type shown as the right one (ids written as numbers, ``[1001]``,
    shown as ``1001``): sent back, it is written as it should be, or the owner could never
    fix it from the form. A select shows a wrong value as written (it stays unchanged)."""
    if f.kind in ("bool", "choice"):
        return True
    try:
        return bool(forms.parsed(f, text, before) == before)
    except FieldError:
        return True


def _secret_states(
    fields: list[FormField], raw: dict[str, Any], loaded: dict[str, Any]
) -> dict[str, str]:
    return {
        f.name: forms.secret_state(forms.current(f, raw, loaded))
        for f in fields
        if f.kind == "secret"
    }


_CODE = re.compile(r"`([^`]+)`")


def help_html(text: str) -> Html:
    """The docs' words, their `code` spans as code (everything escaped)."""
    parts = _CODE.split(text)
    return join(tag("code", p) if i % 2 else p for i, p in enumerate(parts))


def index_page(
    config_path: Path, sections: list[tuple[str, ...]], frame: Frame, problem: str = ""
) -> Html:
    intro = tag(
        "p",
        join(
            [
                "The config file ",
                tag("code", str(config_path)),
                ", one form per section, each option with its help. A save is checked as "
                "memobot checks the file at start, and written only when it passes (mode "
                "0600, the rest of the file as it was); a running gateway takes it at once, "
                "and names what needs a restart. Tokens and keys are never shown: type a new "
                "one to replace it.",
            ]
        ),
    )
    links = tag(
        "ul",
        join(tag("li", tag("a", ".".join(s), href=f"/settings/{'.'.join(s)}")) for s in sections),
        class_="sections",
    )
    raw = tag("p", join(["Or the whole file: ", tag("a", "raw JSON", href=f"/settings/{RAW}")]))
    parts = [intro]
    if problem:
        parts.append(tag("p", problem, class_="banner", role="alert"))
    parts.extend([links, raw])
    return page("Settings", join(parts), frame)


def _control(f: FormField, text: str, state: str, error: str, described: str | None) -> Html:
    common: dict[str, Any] = {
        "id": f"f-{f.name}",
        "name": f.name,
        "aria_invalid": "true" if error else None,
        "aria_describedby": described,
    }
    if f.kind == "secret":
        box = EMPTY
        if not f.read_only and state != "not set":
            box = tag(
                "label",
                join([void("input", type="checkbox", name=f"clear:{f.name}"), " remove it"]),
                class_="inline",
            )
        field = void(
            "input",
            type="password",
            autocomplete="new-password",
            placeholder="type a new one to replace it" if state != "not set" else "not set",
            disabled=f.read_only,
            **common,
        )
        return join([field, " ", tag("span", state, class_="state"), " ", box])
    if f.kind in ("bool", "choice"):
        choices = [("", "(not set)")] if f.optional else []
        choices += [(c, c) for c in f.choices]
        if text and text not in {v for v, _ in choices}:
            # What the file holds, though not a choice: shown as it is, so a save of the
            # section's other fields sends it back unchanged (refused at this field) instead
            # of the first choice in its place.
            choices.insert(0, (text, f"{text} (in the file: not one of these)"))
        options = join(tag("option", label, value=v, selected=v == text) for v, label in choices)
        return tag("select", options, **common)
    if f.kind in ("lines", "json"):
        rows = max(2, min(12, text.count("\n") + 2))
        # A newline first: the HTML parser drops one that starts a textarea's content.
        return tag("textarea", "\n" + text, rows=rows, spellcheck="false", **common)
    return void("input", type="text", value=text, spellcheck="false", **common)


def _version_field(version: str) -> Html:
    """The version of the file the page shows: a save from it is refused once the file has
    changed (``_stale``)."""
    return hidden(version=version)


def field_html(f: FormField, text: str, state: str, error: str) -> Html:
    described = " ".join(
        x for x in (f"e-{f.name}" if error else "", f"h-{f.name}" if f.help else "") if x
    )
    parts: list[object] = [
        tag("label", f.label, for_=f"f-{f.name}"),
        " ",
        tag("code", f.name, class_="path"),
        _control(f, text, state, error, described or None),
    ]
    if error:
        parts.append(tag("p", error, id=f"e-{f.name}", class_="error"))
    if f.help:
        parts.append(tag("p", help_html(f.help), id=f"h-{f.name}", class_="help"))
    kind = "invalid" if error else None
    return tag("div", join(parts), class_="field", data_state=kind)


def section_page(
    section: tuple[str, ...],
    fields: list[FormField],
    texts: dict[str, str],
    states: dict[str, str],
    errors: dict[str, str],
    general: list[str],
    frame: Frame,
    problem: str = "",
    version: str = "",
) -> Html:
    name = ".".join(section)
    parts: list[object] = [tag("p", tag("a", "All settings", href="/settings"))]
    if problem:
        parts.append(tag("p", problem, class_="banner", role="alert"))
    if errors or general:
        summary = "Nothing was saved: " + (
            f"{len(errors)} field(s) refused, marked below."
            if errors
            else "the section is refused."
        )
        parts.append(
            tag(
                "div",
                join([tag("p", summary), *(tag("p", g, class_="error") for g in general)]),
                class_="banner",
                role="alert",
            )
        )
    if section[0] == "channels":
        parts.append(
            tag(
                "p",
                "Saving an enabled channel with a new token asks the platform first whether "
                "it accepts it; a refused token is not written.",
                class_="muted",
            )
        )
    groups: dict[str, list[Html]] = {}
    for f in fields:
        html = field_html(f, texts.get(f.name, ""), states.get(f.name, ""), errors.get(f.name, ""))
        groups.setdefault(f.group, []).append(html)
    blocks = [
        join(items) if not group else tag("fieldset", join([tag("legend", group), *items]))
        for group, items in groups.items()
    ]
    button = tag("button", "Save", type="submit", class_="primary")
    form = tag(
        "form",
        join([csrf_field(frame.csrf), _version_field(version), *blocks, tag("p", button)]),
        method="post",
        action=f"/settings/{name}",
        class_="settings",
        novalidate=True,
    )
    parts.append(form)
    return page(f"Settings: {name}", join(parts), frame)


def raw_page(
    text: str,
    problems: list[str],
    frame: Frame,
    problem: str = "",
    version: str = "",
    unsaved: str = "",
) -> Html:
    """``unsaved``: the text a refused save sent (the file changed meanwhile), shown apart
    for copying: the form holds the file as it is now."""
    intro = tag(
        "p",
        join(
            [
                "The whole config file as JSON. Secrets show as ",
                tag("code", json.dumps(forms.MASK)),
                ": leave that in place to keep the secret, or write a new value. Checked as at "
                "start; nothing is written when it is refused. ",
                tag("a", "The forms", href="/settings"),
            ]
        ),
    )
    parts: list[object] = [intro]
    if problem:
        parts.append(tag("p", problem, class_="banner", role="alert"))
    error = EMPTY
    if problems:
        error = tag(
            "div",
            join(
                [tag("p", "Nothing was saved:"), *(tag("p", p, class_="error") for p in problems)]
            ),
            id="e-json",
            class_="banner",
            role="alert",
        )
    area = tag(
        "textarea",
        "\n" + text,
        id="f-json",
        name="json",
        rows=30,
        spellcheck="false",
        aria_invalid="true" if problems else None,
        aria_describedby="e-json" if problems else None,
    )
    button = tag("button", "Save", type="submit", class_="primary")
    form = tag(
        "form",
        join(
            [
                csrf_field(frame.csrf),
                _version_field(version),
                tag("label", "config.json", for_="f-json"),
                area,
                tag("p", button),
            ]
        ),
        method="post",
        action=f"/settings/{RAW}",
        class_="settings",
    )
    parts.extend([error, form])
    if unsaved:
        parts.append(
            tag(
                "details",
                join(
                    [
                        tag("summary", "Your text, not saved (to copy from)"),
                        tag(
                            "textarea",
                            "\n" + unsaved,
                            rows=12,
                            readonly=True,
                            aria_label="not saved",
                        ),
                    ]
                ),
            )
        )
    return page("Settings: raw JSON", join(parts), frame)
