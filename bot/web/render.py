"""HTML from templates (``string.Template``, package data in ``templates/``) in which every
value is escaped, unless it is ``Html``: a fragment built here from escaped parts."""

from __future__ import annotations

import functools
import html
from collections.abc import Iterable
from importlib import resources
from string import Template


class Html(str):
    """Markup already safe to put in a page (built by :func:`tag` or :func:`page`)."""


def escape(value: object) -> Html:
    if isinstance(value, Html):
        return value
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[object], sep: str = "") -> Html:
    return Html(sep.join(escape(p) for p in parts))


def tag(name: str, content: object = "", /, **attrs: object) -> Html:
    """``<name attr="...">content</name>`` with the attributes and content escaped;
    ``class_`` for class. A value of True is a bare attribute, None or False leaves it out."""
    shown = []
    for key, value in attrs.items():
        key = key.rstrip("_").replace("_", "-")
        if value is True:
            shown.append(f" {key}")
        elif value not in (None, False):
            shown.append(f' {key}="{escape(value)}"')
    return Html(f"<{name}{''.join(shown)}>{escape(content)}</{name}>")


def void(name: str, /, **attrs: object) -> Html:
    """An element without content (``<input ...>``)."""
    return Html(tag(name, **attrs).removesuffix(f"</{name}>"))


@functools.cache
def _template(name: str) -> Template:
    text = resources.files("bot.web").joinpath("templates", name).read_text(encoding="utf-8")
    return Template(text)


def fill(name: str, **values: object) -> Html:
    """The template ``name`` with each ``$value`` escaped (an unknown one is a KeyError)."""
    return Html(_template(name).substitute({k: escape(v) for k, v in values.items()}))


@functools.cache  # read once, as the templates are: not from the disk on the loop per request
def static(name: str) -> bytes:
    return resources.files("bot.web").joinpath("static", name).read_bytes()
