"""Change records: how a metadata line says what changed since the line before it.

A change record carries ``{"set": {key: value}, "unset": [key], "lists": {key: {"drop": [id],
"put": [entry], "add": [entry]}}}``: a list of entries with ids (the pending turns, the outbox)
changes entry by entry, so a record written per message received carries that message, not the
whole list again. Pure functions over JSON values; docs/sessions.md describes the format.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_MISSING: Any = object()


class _NoId(Exception):
    pass


def _item_id(item: Any) -> Any:
    if isinstance(item, dict):
        if "id" not in item:
            raise _NoId
        item = item["id"]
    if item is None or isinstance(item, str | int):
        return item
    raise _NoId


def apply_list(items: list[Any], ops: dict[str, Any]) -> list[Any]:
    """``items`` after ``drop`` (first entry with each id), ``put`` (replace the entry with
    that id, in place) and ``add`` (append). Ids that are not there are ignored."""
    out = list(items)
    for gone in ops.get("drop") or ():
        for i, item in enumerate(out):
            try:
                if _item_id(item) == gone:
                    del out[i]
                    break
            except _NoId:
                continue
    puts = ops.get("put")
    if puts:
        by_id = {}
        for p in puts:
            try:
                by_id[_item_id(p)] = p
            except _NoId:
                continue
        for i, item in enumerate(out):
            try:
                new = by_id.get(_item_id(item), _MISSING)
            except _NoId:
                continue
            if new is not _MISSING:
                out[i] = new
    out.extend(ops.get("add") or ())
    return out


def list_ops(old: list[Any], new: list[Any]) -> dict[str, Any] | None:
    """drop/put/add turning ``old`` into ``new``; None when they cannot say it more briefly
    than ``new`` itself (the caller then stores the whole list). Checked by applying them."""
    try:
        old_ids = [_item_id(x) for x in old]
        new_ids = [_item_id(x) for x in new]
    except _NoId:
        return None
    drop: list[Any] = []
    put: list[Any] = []
    i = j = 0
    while j < len(new):
        k = i
        while k < len(old) and old_ids[k] != new_ids[j]:
            k += 1
        if k == len(old):
            break  # not in the old list: this and the rest are added
        drop.extend(old_ids[i:k])
        if old[k] is not new[j] and old[k] != new[j]:
            put.append(new[j])
        i, j = k + 1, j + 1
    drop.extend(old_ids[i:])
    add = new[j:]
    if len(put) + len(add) >= len(new) > 0:
        return None
    ops = {name: v for name, v in (("drop", drop), ("put", put), ("add", add)) if v}
    return ops if apply_list(old, ops) == new else None


def apply_changes(meta: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The metadata a change record (written by ``SessionStore.append``) turns ``meta`` into."""
    out = dict(meta)
    for name in changes.get("unset") or ():
        out.pop(name, None)
    out.update(changes.get("set") or {})
    for name, ops in (changes.get("lists") or {}).items():
        current = out.get(name)
        out[name] = apply_list(current if isinstance(current, list) else [], ops)
    return out


def metadata_changes(
    old: dict[str, Any], new: dict[str, Any], names: Iterable[str]
) -> dict[str, Any]:
    """What changed between ``old`` and ``new`` among ``names``: ``apply_changes(old, result)``
    equals ``new`` on those keys. Lists of entries with ids change entry by entry, so a record
    written per message received does not repeat the whole pending list and seen ids."""
    set_: dict[str, Any] = {}
    unset: list[str] = []
    lists: dict[str, Any] = {}
    for name in names:
        before = old.get(name, _MISSING)
        after = new.get(name, _MISSING)
        if after is _MISSING:
            if before is not _MISSING:
                unset.append(name)
        elif before is after:
            continue
        elif isinstance(before, list) and isinstance(after, list):
            ops = list_ops(before, after)
            if ops is None:
                set_[name] = after
            elif ops:
                lists[name] = ops
        elif before is _MISSING or before != after:
            set_[name] = after
    changes: dict[str, Any] = {}
    if set_:
        changes["set"] = set_
    if unset:
        changes["unset"] = unset
    if lists:
        changes["lists"] = lists
    return changes
