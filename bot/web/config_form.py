"""The config as forms: one per section, its fields read from the config models, each
option's help from docs/configuration.md (``bot.config_help``), and what a browser may see.

Pure functions over the file's raw JSON (``bot.config.read_raw``: ``${VAR}`` as written)
and the loaded config (for the values the file leaves to their defaults). Nothing here
writes: the screen saves through ``bot.config.set_options``.

Secrets never reach the browser: a token or key is a write-only field shown as set or not
set (or "from ${VAR}" when the file names a variable); inside a JSON value (headers, an MCP
server's env, a fallback's key) and in the raw view each secret is replaced by :data:`MASK`,
which a save turns back into the value it hid.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel

from bot.config import SECRET_MAPS, Config, is_secret_key
from bot.config_help import help_for
from bot.service.logs import SECRET_PARAM, has_token_shape

MASK = "<secret: kept as it is>"
_ENV_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")
# A reference with at most a scheme word before it ("Bearer ${TOKEN}"): no secret in the text.
_ONLY_REF = re.compile(r"(?:[A-Za-z]+ )?\$\{[A-Za-z_][A-Za-z0-9_]*\}")
# Set by a command, never typed in a form (shown as set or not set only).
READ_ONLY = frozenset({"web.passwordHash"})

Kind = Literal["bool", "choice", "number", "text", "secret", "lines", "json"]


@dataclass(frozen=True, slots=True)
class FormField:
    path: tuple[str, ...]  # camelCase keys, as in the file: ("llm", "retry", "attempts")
    kind: Kind
    optional: bool  # None ("not set") is a value of its own
    choices: tuple[str, ...] = ()
    group: str = ""  # the nested section it belongs to ("retry"), "" for the section's own

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def label(self) -> str:
        return self.path[-1]

    @property
    def help(self) -> str:
        return help_for(self.name)

    @property
    def read_only(self) -> bool:
        return self.name in READ_ONLY


def sections(cfg: Config) -> list[tuple[str, ...]]:
    """Every form: the top-level sections, and one per channel (``channels.telegram``)."""
    out: list[tuple[str, ...]] = []
    for name, field in Config.model_fields.items():
        alias = field.alias or name
        if alias == "channels":
            out.extend(("channels", c) for c in type(cfg.channels).model_fields)
        else:
            out.append((alias,))
    return out


def model_at(section: tuple[str, ...]) -> type[BaseModel]:
    model: type[BaseModel] = Config
    for key in section:
        field = next(f for n, f in model.model_fields.items() if key in (n, f.alias))
        assert isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        model = field.annotation
    return model


def fields(section: tuple[str, ...]) -> list[FormField]:
    """The section's options in the models' order, nested models flattened after its own."""
    return _fields(model_at(section), section, "")


def _fields(model: type[BaseModel], prefix: tuple[str, ...], group: str) -> list[FormField]:
    own: list[FormField] = []
    nested: list[FormField] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        path = (*prefix, key)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            inner = f"{group}.{key}" if group else key
            nested.extend(_fields(annotation, path, inner))
            continue
        own.append(_field(path, annotation, group))
    return own + nested


def _field(path: tuple[str, ...], annotation: Any, group: str) -> FormField:
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in args
    inner = next(a for a in args if a is not type(None)) if optional else annotation
    if typing.get_origin(inner) is typing.Annotated:  # StrictBool inside "| None"
        inner = typing.get_args(inner)[0]
    origin = typing.get_origin(inner)
    if inner is bool:
        return FormField(path, "bool", optional, ("true", "false"), group)
    if origin is Literal:
        return FormField(
            path, "choice", optional, tuple(str(a) for a in typing.get_args(inner)), group
        )
    if inner in (int, float):
        return FormField(path, "number", optional, (), group)
    if inner is str:
        kind: Kind = "secret" if is_secret_key(path[-1]) else "text"
        return FormField(path, kind, optional, (), group)
    if origin is list and typing.get_args(inner) == (str,):
        return FormField(path, "lines", optional, (), group)
    return FormField(path, "json", optional, (), group)


# -- values ----------------------------------------------------------------------------------

_MISSING = object()


def value_at(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return _MISSING
        data = data[key]
    return data


def current(field: FormField, raw: dict[str, Any], loaded: dict[str, Any]) -> Any:
    """The option's value as the file writes it, or (left out) as it loads: its default."""
    value = value_at(raw, field.path)
    if value is _MISSING:
        value = value_at(loaded, field.path)
    return None if value is _MISSING else value


def secret_state(value: Any) -> str:
    """How a secret option is shown: never its value."""
    if isinstance(value, str) and _ENV_REF.fullmatch(value):
        return f"from {value}"
    return "set" if value else "not set"


def shown(field: FormField, value: Any) -> str:
    """The text a form field holds for ``value`` (secrets masked; a secret field holds "")."""
    if field.kind == "secret":
        return ""
    value = mask({field.path[-1]: value})[field.path[-1]]  # as it sits in its section
    if value is None:
        return ""
    if field.kind == "bool":
        # Not a boolean (``"false"`` in quotes, a mistake): shown as written, never as the
        # truth value Python gives it ("false" is true).
        return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
    if field.kind == "lines" and isinstance(value, list):
        return "\n".join(str(v) for v in value)
    if field.kind == "json":
        return json.dumps(value, indent=1, ensure_ascii=False)
    if isinstance(value, str):
        return value
    return json.dumps(value)


class FieldError(ValueError):
    """A submitted text that is not a value of the field's form (bad JSON, a stray mask)."""


def parsed(field: FormField, text: str, before: Any) -> Any:
    """The value a submitted ``text`` stands for. Numbers and the rest are passed on as
    typed so the config's own validator judges them (and says so at the field)."""
    text = text.replace("\r\n", "\n")
    if field.optional and not text.strip() and field.kind != "json":
        return None
    if field.kind == "bool":
        return {"true": True, "false": False}.get(text, text)
    if field.kind == "number":
        try:
            number = json.loads(text, parse_constant=_not_a_number)
        except ValueError:
            return text
        return number if isinstance(number, int | float) and not isinstance(number, bool) else text
    if field.kind == "lines":
        return [line.strip() for line in text.split("\n") if line.strip()]
    if field.kind == "json":
        if not text.strip():
            return None if field.optional else {} if isinstance(before, dict) else []
        return unmask(load_json(text), before, field.name)
    if text == MASK:  # a URL with a password in it, shown masked and sent back as it was
        return before
    return text


# A config is a few levels deep (tools.mcpServers.<name>.env.<NAME>); text nested deeper is
# refused before anything walks it (the parser, the masks, the validator all recurse).
MAX_DEPTH = 32


def load_json(text: str) -> Any:
    """The JSON value ``text`` holds; FieldError saying why not (its place in the text)."""
    try:
        value = json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as exc:
        raise FieldError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError as exc:  # NaN, Infinity
        raise FieldError(str(exc)) from None
    except RecursionError:
        value = None
    else:
        if _depth(value) > MAX_DEPTH:
            raise FieldError(f"nested more than {MAX_DEPTH} levels deep: no option goes that deep")
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise FieldError(
                "a \\uD800-\\uDFFF escape alone is half a character: no file can hold it"
            ) from None
        return value
    raise FieldError(f"nested more than {MAX_DEPTH} levels deep: no option goes that deep")


def _not_a_number(word: str) -> Any:
    """Python's JSON reads NaN and Infinity, which JSON has not: a file written with them
    is one no other tool reads (and an endless timeout is not one a form should set)."""
    raise ValueError(f"{word} is not a number JSON has: write a number")


def _depth(value: Any) -> int:
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


# -- secrets inside values -------------------------------------------------------------------


def is_secret(key: str, value: str, in_map: bool = False) -> bool:
    """Whether ``value`` (under ``key``) holds a secret written in the file itself (a
    ``${VAR}`` reference holds none: the secret is in the environment)."""
    if not value or _ONLY_REF.fullmatch(value):
        return False
    if in_map or is_secret_key(key) or has_token_shape(value):
        return True  # has_token_shape: a key in a URL's path (an MCP server's), in args
    if "://" not in value:
        return False
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        return True  # not a URL one can read: shown as nothing rather than guessed at
    if password and not _ONLY_REF.fullmatch(unquote(password)):
        return True
    return any(
        SECRET_PARAM.search(name) and not _ONLY_REF.fullmatch(v)
        for name, v in parse_qsl(parts.query)
    )


def mask(value: Any, key: str = "", in_map: bool = False) -> Any:
    """``value`` with every secret string in it replaced by :data:`MASK`."""
    if isinstance(value, dict):
        return {
            k: mask(v, str(k), in_map or (str(k) in SECRET_MAPS and isinstance(v, dict)))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask(v, key, in_map) for v in value]
    if isinstance(value, str) and is_secret(key, value, in_map):
        return MASK
    return value


def unmask(value: Any, before: Any, where: str) -> Any:
    """``value`` (as sent back) with each :data:`MASK` replaced by what it hid in ``before``
    (the same place of the value it was shown from). FieldError for a MASK at a place that
    held no secret (typed, or moved). An entry of a list (a fallback) takes the secrets of
    the entry it was shown as, found by its server: moved in the list, its key moves with it,
    never to the server now at its old place; on another server, it keeps none."""
    if isinstance(value, dict):
        old = before if isinstance(before, dict) else {}
        return {k: unmask(v, old.get(k, _MISSING), f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        old_list = before if isinstance(before, list) else []
        return [unmask(v, _shown_as(v, i, old_list), f"{where}[{i}]") for i, v in enumerate(value)]
    if value == MASK:
        if not isinstance(before, str):
            raise FieldError(
                f"{where}: write the value itself here, not {MASK!r} (nothing was hidden "
                "here, or this entry is on another server than the one it was shown with)"
            )
        return before
    return value


# What tells the entries of a list apart: the server each one talks to.
_SERVER_KEYS = ("baseUrl", "url", "command")


def _shown_as(value: Any, index: int, before: list[Any]) -> Any:
    """The entry of ``before`` that ``value`` (at ``index``) was shown as."""
    if not isinstance(value, dict):
        return before[index] if index < len(before) else _MISSING
    if index < len(before) and _same_server(value, before[index]):
        return before[index]
    same = [b for b in before if _same_server(value, b)]
    return same[0] if len(same) == 1 else _MISSING


def _same_server(value: dict[str, Any], before: Any) -> bool:
    if not isinstance(before, dict):
        return False
    for key in _SERVER_KEYS:
        new = value.get(key)
        if new != MASK and _server(new) != _server(before.get(key)):
            return False
    return True


def _server(value: Any) -> Any:
    """A URL's scheme, host and port (its path may change, its server not); else the value."""
    if isinstance(value, str) and "://" in value:
        try:
            parts = urlsplit(value)
            return (parts.scheme.lower(), parts.hostname, parts.port)
        except ValueError:
            return value
    return value


def error_field(path: str, names: list[str]) -> str | None:
    """The form field a validator's error path (``channels.telegram.allowFrom[0]``) belongs
    to, or None (an error of the whole section)."""
    best = None
    for name in names:
        if (path == name or path.startswith((name + ".", name + "["))) and (
            best is None or len(name) > len(best)
        ):
            best = name
    return best
