"""Form fields for the panel's screens: a label, the input, and the error at that field.

Plain HTML forms that work without script; a refused form is shown again with what was
typed and the reason beside the field it is about.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.web.render import Html, join, tag, void
from bot.web.views import EMPTY, csrf_field


def field(
    name: str,
    label: str,
    value: str = "",
    errors: Mapping[str, str] | None = None,
    *,
    kind: str = "text",
    hint: str = "",
    **attrs: object,
) -> Html:
    """A labelled input (``kind`` "textarea" for a text area, "checkbox" for a box)."""
    error = (errors or {}).get(name, "")
    ident = f"f-{name}"
    described = f"{ident}-error" if error else None
    if kind == "textarea":
        control = tag(
            "textarea",
            "\n" + value,  # the HTML parser eats a textarea's first line break: keep the text's
            id=ident,
            name=name,
            aria_invalid="true" if error else None,
            aria_describedby=described,
            **attrs,
        )
    elif kind == "checkbox":
        control = void(
            "input",
            type="checkbox",
            id=ident,
            name=name,
            value="1",
            checked=bool(value),
            **attrs,
        )
    else:
        control = void(
            "input",
            type=kind,
            id=ident,
            name=name,
            value=value,
            aria_invalid="true" if error else None,
            aria_describedby=described,
            **attrs,
        )
    parts = [tag("label", label, for_=ident), control]
    if hint:
        parts.append(tag("small", hint, class_="muted"))
    if error:
        parts.append(tag("span", error, id=described, class_="field-error", role="alert"))
    return tag("div", join(parts), class_="field" + (" checkbox" if kind == "checkbox" else ""))


def form(action: str, csrf: str, body: Html, submit: str, **attrs: object) -> Html:
    button = tag("button", submit, type="submit", class_="primary")
    content = join([csrf_field(csrf), body, tag("div", button, class_="actions")])
    return tag("form", content, method="post", action=action, class_="panel-form", **attrs)


def hidden(**fields: str) -> Html:
    if not fields:
        return EMPTY
    return join(void("input", type="hidden", name=k, value=v) for k, v in fields.items())


def as_sent(text: str) -> str:
    """``text`` as a form field that showed it comes back: a browser sends every line end of
    a textarea as CRLF and a NUL as U+FFFD; LF line ends here, and no surrounding space.
    Compare ``as_sent(sent) == as_sent(shown)`` to tell a field sent back unchanged."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd").strip()
