"""Skills: reusable procedures in ``skills/<name>/SKILL.md`` inside the workspace.

Only each skill's name and description go into the system prompt; the agent reads the full
SKILL.md with its file tools when a request matches. The front matter is the small subset of
YAML that skill files use (``key: value``, quoted values, ``>``/``|`` block scalars), parsed here
so memobot needs no YAML dependency. A broken skill file is logged and never stops a turn.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bot import workspace_files

log = logging.getLogger(__name__)

SKILLS_DIR = "skills"
SKILL_FILE = "SKILL.md"
# Front matter sits at the top; a file larger than this is still listed, only its head is read.
MAX_READ_BYTES = 64 * 1024
# A description is a one-line "when to use this", not the procedure; longer ones are cut in the
# prompt so one careless skill cannot crowd out the rest of the context.
MAX_SUMMARY_DESCRIPTION = 300
NO_DESCRIPTION = "(no description; read the file to see what it does)"

_KEY_RE = re.compile(r"^([A-Za-z_][\w.-]*)\s*:(?:\s+(.*))?$")
_FENCE = "---"


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str  # "" when the file has none
    path: Path  # the SKILL.md file


class FrontMatterError(ValueError):
    """The ``---`` block at the top of a SKILL.md cannot be read."""


def parse_front_matter(text: str) -> dict[str, str]:
    """Parse the ``---`` block at the top of ``text`` into a flat mapping of strings.

    Returns ``{}`` when the text has no front matter. Nested values (a key with an empty value
    followed by indented lines or ``- item`` lines) are skipped, not interpreted. Block scalars
    are returned without trailing newlines. Raises :class:`FrontMatterError` when the block is
    not closed or a line is neither ``key: value`` nor a continuation.
    """
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].rstrip() != _FENCE:
        return {}
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].rstrip() in (_FENCE, "..."))
    except StopIteration:
        raise FrontMatterError("front matter starts with '---' but is never closed") from None
    body = lines[1:end]
    result: dict[str, str] = {}
    i = 0
    while i < len(body):
        line = body[i]
        lineno = i + 2  # 1-based line number in the file, after the opening fence
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t":
            raise FrontMatterError(f"line {lineno}: unexpected indentation")
        match = _KEY_RE.match(line.rstrip())
        if match is None:
            raise FrontMatterError(f"line {lineno}: expected 'key: value', got {line.strip()!r}")
        key, raw = match.group(1), (match.group(2) or "").strip()
        # Lines that belong to this key: indented ones, blank ones, and (for an empty value)
        # an unindented "- item" list, which YAML allows directly under a key.
        block: list[str] = []
        while i < len(body):
            nxt = body[i]
            if nxt.strip() and nxt[0] not in " \t" and not (not raw and nxt.startswith("- ")):
                break
            block.append(nxt)
            i += 1
        if raw and raw[0] in ">|":
            result[key] = _block_scalar(raw, block, lineno)
        elif raw and raw[0] in "\"'":
            if any(b.strip() for b in block):
                raise FrontMatterError(f"line {lineno}: quoted value must fit on one line")
            result[key] = _quoted(raw, lineno)
        elif raw or _is_plain_continuation(block):
            # A plain value may continue on indented lines; YAML folds them with spaces.
            parts = [_strip_comment(raw), *(b.strip() for b in block if b.strip())]
            result[key] = " ".join(p for p in parts if p)
        # else: a nested mapping or list; skills only need flat string fields.
    return result


def _is_plain_continuation(block: list[str]) -> bool:
    """True when the lines under an empty ``key:`` are text rather than a nested mapping/list."""
    first = next((b.strip() for b in block if b.strip()), "")
    return bool(first) and not first.startswith(("-", "#")) and _KEY_RE.match(first) is None


def _strip_comment(value: str) -> str:
    cut = value.find(" #")
    return (value[:cut] if cut >= 0 else value).strip()


def _quoted(raw: str, lineno: int) -> str:
    quote = raw[0]
    out: list[str] = []
    i = 1
    while i < len(raw):
        ch = raw[i]
        if quote == "'" and ch == "'":
            if raw[i + 1 : i + 2] == "'":  # '' is an escaped single quote
                out.append("'")
                i += 2
                continue
            return _after_quote("".join(out), raw[i + 1 :], lineno)
        if quote == '"' and ch == "\\" and i + 1 < len(raw):
            esc = raw[i + 1]
            out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\", "/": "/"}.get(esc, "\\" + esc))
            i += 2
            continue
        if quote == '"' and ch == '"':
            return _after_quote("".join(out), raw[i + 1 :], lineno)
        out.append(ch)
        i += 1
    raise FrontMatterError(f"line {lineno}: unterminated {quote} quote")


def _after_quote(value: str, rest: str, lineno: int) -> str:
    rest = rest.strip()
    if rest and not rest.startswith("#"):
        raise FrontMatterError(f"line {lineno}: unexpected text after closing quote: {rest!r}")
    return value


def _block_scalar(indicator: str, block: list[str], lineno: int) -> str:
    header = _strip_comment(indicator)
    if header not in (">", "|", ">-", "|-", ">+", "|+"):
        raise FrontMatterError(f"line {lineno}: unsupported block scalar header {header!r}")
    content = [b for b in block if b.strip()]
    if not content:
        return ""
    indent = min(len(b) - len(b.lstrip(" \t")) for b in content)
    lines = [b[indent:].rstrip() if b.strip() else "" for b in block]
    while lines and not lines[-1]:
        lines.pop()
    if header[0] == "|":
        return "\n".join(lines)
    # Folded: lines of one paragraph join with a space, a blank line becomes a line break.
    paragraphs: list[str] = []
    current: list[str] = []
    for line in lines:
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(paragraphs)


def _read_skill(workspace: Path, skill_md: Path) -> Skill:
    """Read one SKILL.md; on any problem, log it and fall back to the folder name."""
    folder = skill_md.parent.name
    try:
        head = workspace_files.read_bytes(workspace, skill_md, limit=MAX_READ_BYTES)
        meta = parse_front_matter(head.decode("utf-8", errors="strict"))
    except (OSError, UnicodeDecodeError, FrontMatterError) as exc:
        log.warning(
            "skill file %r: %s; listing it as %r without a description", str(skill_md), exc, folder
        )
        return Skill(name=folder, description="", path=skill_md)
    name = " ".join(meta.get("name", "").split()) or folder
    return Skill(name=name, description=meta.get("description", "").strip(), path=skill_md)


def _skill_files(workspace: Path) -> list[tuple[Path, os.stat_result]]:
    """Every ``skills/<folder>/SKILL.md`` that exists, with its status; hidden folders and
    links excluded."""
    try:
        found = workspace_files.files_matching(workspace, SKILLS_DIR, SKILL_FILE)
    except OSError as exc:
        log.warning("cannot list skills folder %s: %s", workspace / SKILLS_DIR, exc)
        return []
    return [(workspace / rel, st) for rel, st in found]


def load_skills(workspace: Path) -> list[Skill]:
    """All skills of ``workspace``, sorted by name. Never raises; problems are logged."""
    skills = [_read_skill(workspace, p) for p, _ in _skill_files(workspace)]
    return sorted(skills, key=lambda s: (s.name, s.path.parent.name))


def skills_summary(skills: list[Skill]) -> str:
    """A compact Markdown list for the system prompt, or ``""`` when there are no skills.

    One line per skill: ``- name: description (skills/<folder>/SKILL.md)``. Whitespace in the
    description collapses to single spaces and long descriptions are cut.
    """
    lines = []
    for skill in skills:
        desc = " ".join(skill.description.split())
        if len(desc) > MAX_SUMMARY_DESCRIPTION:
            desc = desc[: MAX_SUMMARY_DESCRIPTION - 1].rstrip() + "…"
        rel = f"{SKILLS_DIR}/{skill.path.parent.name}/{skill.path.name}"
        lines.append(f"- {skill.name}: {desc or NO_DESCRIPTION} ({rel})")
    return "\n".join(lines)


class UntrustedFiles(Protocol):
    """Who wrote which skill (bot.provenance.Provenance)."""

    def untrusted_now(self) -> dict[str, str]: ...

    def stamp(self) -> tuple[int, int, int]: ...


# (folder name, mtime_ns, size, inode) per SKILL.md: enough to notice edits, replacements by
# editors that write a new file, additions and removals, without opening any file.
_Signature = tuple[tuple[str, int, int, int], ...]


class SkillsIndex:
    """Skills of one workspace, re-read only when a SKILL.md or the set of skills changed.

    Each call costs a listing of ``skills/`` and one stat per skill; files are parsed only when
    their signature moved. While nothing changes, :meth:`summary` returns the very same string,
    so the system prompt stays byte-identical and provider prompt caches keep hitting.
    """

    def __init__(self, workspace: Path, untrusted: UntrustedFiles | None = None) -> None:
        """``untrusted``: the skill files (workspace-relative) a non-admin's turn wrote, with
        the session (bot.provenance); those are left out of the list, and so of every prompt,
        until an admin or the owner rewrites them. Asked only when a skill changed."""
        self.workspace = workspace
        self._untrusted = untrusted
        self._signature: _Signature | None = None
        self._skills: list[Skill] = []
        self._summary = ""

    def _current_signature(self) -> _Signature:
        sig = []
        for skill_md, st in _skill_files(self.workspace):
            sig.append((skill_md.parent.name, st.st_mtime_ns, st.st_size, st.st_ino))
        if sig and self._untrusted is not None:
            # Provenance is recorded when the writing turn ends, after its own prompts were
            # built: its record moving must refresh the list too.
            sig.append(("\0provenance", *self._untrusted.stamp()))
        return tuple(sorted(sig))

    def _refresh(self) -> None:
        sig = self._current_signature()
        if sig == self._signature:
            return
        skills = load_skills(self.workspace)
        if self._untrusted is not None:
            shaped = self._untrusted.untrusted_now()
            for skill in skills:
                by = shaped.get(f"{SKILLS_DIR}/{skill.path.parent.name}/{SKILL_FILE}")
                if by:
                    log.warning(
                        "skill %r was written in %s, not by an admin: left out of the prompt "
                        "(edit or touch its SKILL.md to keep it)",
                        skill.path.parent.name,
                        by,
                    )
            skills = [
                s for s in skills if f"{SKILLS_DIR}/{s.path.parent.name}/{SKILL_FILE}" not in shaped
            ]
        self._skills = skills
        self._summary = skills_summary(self._skills)
        self._signature = sig

    def skills(self) -> list[Skill]:
        self._refresh()
        return list(self._skills)

    def summary(self) -> str:
        self._refresh()
        return self._summary
