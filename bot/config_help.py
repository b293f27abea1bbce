"""Each config option's help: the "meaning" column of docs/configuration.md, word for word.

Installed wheels carry no docs, so the column is kept beside this module as package data
(``config_help.json``, JSON path -> text with the docs' `code` spans, links reduced to their
words). ``python -m bot.config_help`` writes it again from the docs; a test fails when the two
differ, so the panel's help and the docs never disagree.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path

FILE = "config_help.json"
_ROW = re.compile(r"^\| (`[^|]+`(?:, `[^|]+`)*) \|(?:[^|\\]|\\.)*\| (.+) \|$")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")
_KEY = re.compile(r"`([^`]+)`")


def parse_docs(markdown: str) -> dict[str, str]:
    """JSON path (``channels.<name>.allowFrom`` as the docs write it) -> its meaning."""
    out: dict[str, str] = {}
    for line in markdown.splitlines():
        row = _ROW.match(line)
        if row is None:
            continue
        meaning = _LINK.sub(r"\1", row.group(2)).replace("\\|", "|")
        for key in _KEY.findall(row.group(1)):
            out[key] = meaning
    return out


@functools.cache
def _table() -> dict[str, str]:
    text = resources.files("bot").joinpath(FILE).read_text(encoding="utf-8")
    table: dict[str, str] = json.loads(text)
    return table


def help_for(path: str) -> str:
    """The help of the option at ``path`` (``channels.telegram.allowFrom``), or ""."""
    table = _table()
    if path in table:
        return table[path]
    parts = path.split(".")
    if len(parts) >= 3 and parts[0] == "channels":
        return table.get(".".join(["channels", "<name>", *parts[2:]]), "")
    return ""


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    table = parse_docs((root / "docs" / "configuration.md").read_text(encoding="utf-8"))
    text = json.dumps(table, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    (Path(__file__).resolve().parent / FILE).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
