"""File tools: read_file, write_file, edit_file, list_dir.

All paths go through :func:`bot.tools.paths.resolve_tool_path`, so the workspace policy lives in
one place. The blocking file work of each call runs in one hop to the gate's file threads
(:meth:`bot.gate.Gate.run_file_op`), which the kernel confines to the same policy: a path that
changes between the check and the use (a symlink swapped in by a background job) still cannot
lead out. Files are opened without following a final symlink and without blocking (a FIFO
swapped in cannot hang a thread), and no call reads more than a bounded number of bytes.

In a turn that is not the owner's, the turn's privacy scope (``ctx.scope``) hides paths: they
are refused before anything is opened, and what was opened is checked again by the path of its
descriptor (a directory swapped for a link meanwhile), and a file with more than one name (a
hard link to USER.md) is refused. A hidden entry is left out of a listing.
"""

from __future__ import annotations

import asyncio
import codecs
import difflib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bot import durable
from bot.images import (
    MAX_INLINE_IMAGE_BYTES,
    ShownImage,
    data_url,
    human_size,
    image_label,
    image_mime,
)
from bot.tools.base import Effects, Tool, ToolContext, ToolError
from bot.tools.paths import hidden_here, real_path, refuse_hidden, resolve_tool_path

MAX_READ_CHARS = 50_000
MAX_IMAGES_PER_TURN = 4  # pictures read_file shows in one answer (each up to 10 MB)
MAX_LIST_ENTRIES = 500
MAX_EDIT_BYTES = 8 * 1024 * 1024
# Counting lines past the window stops here: a 50 GB sparse file costs no disk but would cost
# minutes to scan.
MAX_SCAN_BYTES = 64 * 1024 * 1024
_SNIFF_BYTES = 8192
_CHUNK = 65536
T = TypeVar("T")
# Checks an opened descriptor against the turn's privacy scope (raises ToolError); None: the
# owner's turn, nothing to check.
Guard = Callable[[int], None] | None


async def _file_work(ctx: ToolContext, fn: Callable[..., T], *args: Any) -> T:
    if ctx.gate is None:
        return await asyncio.to_thread(fn, *args)
    # A turn that is not the owner's is confined whatever restrictToWorkspace says.
    confined = ctx.restrict_to_workspace or not ctx.scope.is_owner
    return await ctx.gate.run_file_op(fn, *args, confined=confined)


def _guard(raw: str, ctx: ToolContext) -> Guard:
    """The check of an opened descriptor for a turn whose scope hides paths."""
    if ctx.scope.is_owner:
        return None

    def check(fd: int) -> None:
        try:
            opened = real_path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            raise ToolError(f"not readable in this chat: {raw} (cannot tell what it is)") from None
        refuse_hidden(raw, opened, ctx)
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            raise ToolError(
                f"not readable in this chat: {raw} (the file has other names, hard links, "
                "which this chat may not see)"
            )

    return check


def _hard_linked(path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink > 1


def _checked(fd: int, guard: Guard) -> int:
    if guard is not None:
        try:
            guard(fd)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _open_regular(path: Path, raw: str, guard: Guard = None) -> int:
    """An fd of the regular file at ``path``; no final symlink, no FIFO, no device; checked by
    ``guard`` before a byte is read.

    The policy checked the real path, so a symlink found here was swapped in since: refused.
    O_NONBLOCK keeps the open itself from waiting on a FIFO.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ToolError(f"file not found: {raw}") from None
    except PermissionError:
        raise ToolError(f"permission denied: {raw}") from None
    except IsADirectoryError:
        raise ToolError(f"'{raw}' is a directory; use list_dir to see its contents") from None
    except OSError as exc:  # ELOOP: the final component became a symlink
        raise ToolError(f"cannot open '{raw}': {exc.strerror}") from None
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise ToolError(f"'{raw}' is a directory; use list_dir to see its contents")
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        # A FIFO or device would block the reading thread or never end.
        raise ToolError(f"'{raw}' is not a regular file")
    return _checked(fd, guard)


def _looks_binary(head: bytes) -> bool:
    # A NUL byte in the first block is what git and grep use too; UTF-16 text counts as binary.
    return b"\0" in head


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix.

    Parent directories are created. An existing file keeps its permission bits.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    # A random temporary name: two calls may write one file at once (background jobs too).
    durable.replace_file(path, data, mode=0o666, chmod=mode, unique=True)


# ---------------------------------------------------------------------------------------------
# read_file


@dataclass(slots=True)
class _Window:
    text: str
    first: int
    last: int  # last line shown; first - 1 when nothing was shown
    total: int
    cut_line: bool  # the last line shown was longer than the cap and was cut
    total_known: bool = True  # False: the file was too long to count to its end


@dataclass(frozen=True, slots=True)
class _Image:
    size: int
    url: str  # a data: URL


def _read_image(fh: Any, raw: str, mime: str) -> _Image:
    size = os.fstat(fh.fileno()).st_size
    if size > MAX_INLINE_IMAGE_BYTES:
        raise ToolError(
            f"'{raw}' is an image of {human_size(size)}, over the "
            f"{human_size(MAX_INLINE_IMAGE_BYTES)} the model can be shown"
        )
    fh.seek(0)
    return _Image(size, data_url(fh.read(MAX_INLINE_IMAGE_BYTES), mime))


def _read_window(
    path: Path, raw: str, offset: int, limit: int | None, guard: Guard = None
) -> _Window | _Image:
    with os.fdopen(_open_regular(path, raw, guard), "rb") as fh:
        head = fh.read(_SNIFF_BYTES)
        mime = image_mime(head)
        if mime is not None:
            return _read_image(fh, raw, mime)
        if _looks_binary(head):
            size = os.fstat(fh.fileno()).st_size
            raise ToolError(f"'{raw}' looks like a binary file ({size} bytes); cannot show it")
        fh.seek(0)
        # Bytes in bounded pieces: a line without an end cannot fill memory. Decoding keeps
        # \r\n as written, so what the model sees is what edit_file matches.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        shown: list[str] = []
        line: list[str] = []  # the pieces of the line being read, while it fits
        chars = line_chars = 0
        last = offset - 1
        lineno = scanned = 0
        cut_line = full = False
        at_line_start = counted = True
        while piece := fh.readline(_CHUNK):
            scanned += len(piece)
            if at_line_start:
                lineno += 1
                line, line_chars = [], 0
            at_line_start = piece.endswith(b"\n")
            if full or lineno < offset:
                if full and scanned > MAX_SCAN_BYTES:
                    counted = False
                    break
                continue  # keep counting so the note can say how long the file is
            if limit is not None and lineno >= offset + limit:
                full = True
                continue
            text = decoder.decode(piece, final=at_line_start)
            line.append(text)
            line_chars += len(text)
            if chars + line_chars > MAX_READ_CHARS:
                if not shown:  # the first line alone is too long: show its head
                    shown.append("".join(line)[:MAX_READ_CHARS])
                    last, cut_line = lineno, True
                full = True
            elif at_line_start:
                shown.append("".join(line))
                chars += line_chars
                last = lineno
        if line and not full and last < lineno:  # a last line without a newline
            shown.append("".join(line) + decoder.decode(b"", final=True))
            last = lineno
    text = "".join(shown)
    if "\0" in text:  # past the sniffed head: still not text to show
        raise ToolError(f"'{raw}' looks like a binary file (NUL bytes after the start)")
    return _Window(text, offset, last, lineno, cut_line, counted)


def _format_window(w: _Window, raw: str) -> str:
    if w.total == 0:
        return f"(empty file: {raw})"
    if w.first > w.total:
        raise ToolError(f"offset {w.first} is past the end of '{raw}' ({w.total} lines)")
    notes: list[str] = []
    if w.cut_line:
        notes.append(f"Line {w.last} is longer than {MAX_READ_CHARS} characters and was cut.")
    if w.last < w.total:
        of = f"{w.total}" if w.total_known else f"at least {w.total}"
        notes.append(
            f"Showing lines {w.first}-{w.last} of {of}. "
            f"Use offset={w.last + 1} (and limit) to read more."
        )
    if not notes:
        return w.text
    body = w.text if w.text.endswith("\n") else w.text + "\n"
    return body + "\n[" + " ".join(notes) + "]"


class ReadFileTool(Tool):
    name: ClassVar[str] = "read_file"
    effects: ClassVar[Effects] = Effects(reads=("path",), scoped=True)
    description: ClassVar[str] = (
        "Read a UTF-8 text file, or look at an image (PNG, JPEG, GIF, WebP). Relative paths "
        f"are inside the workspace. Large files are cut at {MAX_READ_CHARS} characters; use "
        "offset (first line, 1-based) and limit (number of lines) to read further."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to read"},
            "offset": {"type": "integer", "description": "First line to read, 1-based"},
            "limit": {"type": "integer", "description": "Maximum number of lines to read"},
        },
        "required": ["path"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raw: str = args["path"]
        offset: int = args.get("offset", 1)
        limit: int | None = args.get("limit")
        if offset < 1:
            raise ToolError("offset must be 1 or more (lines are numbered from 1)")
        if limit is not None and limit < 1:
            raise ToolError("limit must be 1 or more")
        path = resolve_tool_path(raw, ctx)
        window = await _file_work(ctx, _read_window, path, raw, offset, limit, _guard(raw, ctx))
        if isinstance(window, _Image):
            return _show(window, raw, ctx)
        return _format_window(window, raw)


def _show(image: _Image, raw: str, ctx: ToolContext) -> str:
    """Hand ``image`` to the runner, which shows it to the model after this batch's results."""
    if len(ctx.images) >= MAX_IMAGES_PER_TURN:
        raise ToolError(
            f"'{raw}' is an image, and this answer already showed {MAX_IMAGES_PER_TURN}: "
            "answer with what you saw first"
        )
    ctx.images.append(ShownImage(image_label(raw, image.size, shown=True), image.url))
    return (
        f"'{raw}' is an image ({human_size(image.size)}); it is shown to you right after "
        "these tool results."
    )


# ---------------------------------------------------------------------------------------------
# write_file


def _write(path: Path, raw: str, data: bytes) -> None:
    if path.is_dir():
        raise ToolError(f"'{raw}' is a directory; give a file path")
    try:
        atomic_write(path, data)
    except NotADirectoryError:
        raise ToolError(f"cannot create '{raw}': a parent path is a file") from None
    except FileExistsError:
        raise ToolError(f"cannot create '{raw}': a parent path is a file") from None
    except PermissionError:
        raise ToolError(f"permission denied: {raw}") from None


class WriteFileTool(Tool):
    name: ClassVar[str] = "write_file"
    effects: ClassVar[Effects] = Effects(writes=("path",), scoped=True)
    description: ClassVar[str] = (
        "Create or overwrite a text file with the given content (UTF-8). Parent directories "
        "are created. Relative paths are inside the workspace."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to write"},
            "content": {"type": "string", "description": "The complete new file content"},
        },
        "required": ["path", "content"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raw: str = args["path"]
        data = args["content"].encode("utf-8")
        path = resolve_tool_path(raw, ctx, write=True)
        await _file_work(ctx, _write, path, raw, data)
        return f"Wrote {len(data)} bytes to {raw}"


# ---------------------------------------------------------------------------------------------
# edit_file


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _not_found_hint(text: str, old: str) -> str:
    if " ".join(old.split()) in " ".join(text.split()):
        return (
            "It matches only when whitespace is ignored: check indentation, tabs versus "
            "spaces and line breaks."
        )
    needle = next((ln.strip() for ln in old.splitlines() if ln.strip()), "")
    lines = [ln.strip() for ln in text.splitlines()]
    close = difflib.get_close_matches(needle, lines, n=1, cutoff=0.5) if needle else []
    if close:
        lineno = lines.index(close[0]) + 1
        return f"The closest line is {lineno}: {close[0]!r}."
    return "No similar line was found."


def _edit(path: Path, raw: str, old: str, new: str, replace_all: bool, guard: Guard = None) -> int:
    with os.fdopen(_open_regular(path, raw, guard), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_EDIT_BYTES:
            raise ToolError(
                f"'{raw}' is {human_size(size)}; edit_file edits files up to "
                f"{human_size(MAX_EDIT_BYTES)} (use exec with sed for bigger ones)"
            )
        data = fh.read(MAX_EDIT_BYTES + 1)
    if _looks_binary(data[:_SNIFF_BYTES]):
        raise ToolError(f"'{raw}' looks like a binary file; edit_file only edits text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"'{raw}' is not valid UTF-8 text; edit_file cannot edit it") from None
    count = text.count(old)
    if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
        # Models write "\n"; a file saved on Windows has "\r\n". Same edit, same line endings.
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        count = text.count(old)
    if count == 0:
        raise ToolError(
            f"old_text was not found in {raw}. {_not_found_hint(text, old)} "
            "Use read_file to see the current content; old_text must match exactly."
        )
    if count > 1 and not replace_all:
        starts: list[int] = []
        pos = text.find(old)
        while pos != -1 and len(starts) < 10:
            starts.append(_line_of(text, pos))
            pos = text.find(old, pos + len(old))
        where = ", ".join(str(n) for n in starts) + (", ..." if count > len(starts) else "")
        raise ToolError(
            f"old_text occurs {count} times in {raw} (at lines {where}). Include more "
            "surrounding lines to make it unique, or set replace_all to true."
        )
    atomic_write(path, text.replace(old, new).encode("utf-8"))
    return count


class EditFileTool(Tool):
    name: ClassVar[str] = "edit_file"
    effects: ClassVar[Effects] = Effects(reads=("path",), writes=("path",), scoped=True)
    description: ClassVar[str] = (
        "Replace exact text in a file. old_text must match the file exactly (including "
        "whitespace) and be unique unless replace_all is true."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to edit"},
            "old_text": {"type": "string", "description": "Exact text to replace"},
            "new_text": {"type": "string", "description": "Replacement text"},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence instead of requiring one (default false)",
            },
        },
        "required": ["path", "old_text", "new_text"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raw: str = args["path"]
        old: str = args["old_text"]
        new: str = args["new_text"]
        if not old:
            raise ToolError("old_text must not be empty; use write_file to create a file")
        if old == new:
            raise ToolError("old_text and new_text are the same; nothing to change")
        path = resolve_tool_path(raw, ctx, write=True)
        count = await _file_work(
            ctx, _edit, path, raw, old, new, bool(args.get("replace_all", False)), _guard(raw, ctx)
        )
        noun = "occurrence" if count == 1 else "occurrences"
        return f"Edited {raw}: replaced {count} {noun}"


# ---------------------------------------------------------------------------------------------
# list_dir


def _describe_entry(entry: os.DirEntry[str], dir_fd: int) -> str:
    name = entry.name
    try:
        is_dir = entry.is_dir()  # follows symlinks: a link to a directory lists as one
        link = os.readlink(name, dir_fd=dir_fd) if entry.is_symlink() else None
        size = None if is_dir else entry.stat().st_size
    except OSError:
        return f"{name} (unreadable)"
    label = f"{name}/" if is_dir else name
    if link is not None:
        label += f" -> {link}"
    return label if size is None else f"{label} ({human_size(size)})"


def _list(path: Path, raw: str, hide: Callable[[Path], bool] | None = None) -> str:
    """The listing of the directory at ``path``; with ``hide`` (a turn whose scope hides
    paths), the directory opened is checked again and entries whose real path ``hide``
    names are left out."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ToolError(f"directory not found: {raw}") from None
    except NotADirectoryError:
        raise ToolError(f"'{raw}' is a file, not a directory; use read_file") from None
    except PermissionError:
        raise ToolError(f"permission denied: {raw}") from None
    except OSError as exc:  # ELOOP: the final component became a symlink
        raise ToolError(f"cannot open '{raw}': {exc.strerror}") from None
    try:
        return _list_open(fd, path, raw, hide)
    finally:
        os.close(fd)


def _list_open(fd: int, path: Path, raw: str, hide: Callable[[Path], bool] | None) -> str:
    where = path
    if hide is not None:
        try:
            where = real_path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            raise ToolError(f"not readable in this chat: {raw} (cannot tell what it is)") from None
        if hide(where):
            raise ToolError(f"not readable in this chat: {raw}")
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: (e.name.casefold(), e.name))
    except PermissionError:
        raise ToolError(f"permission denied: {raw}") from None
    if hide is not None:
        entries = [e for e in entries if not hide(real_path(where / e.name))]
    if not entries:
        return f"(empty directory: {raw})"
    lines = [_describe_entry(e, fd) for e in entries[:MAX_LIST_ENTRIES]]
    if len(entries) > MAX_LIST_ENTRIES:
        lines.append(f"... and {len(entries) - MAX_LIST_ENTRIES} more entries not shown")
    return "\n".join(lines)


class ListDirTool(Tool):
    name: ClassVar[str] = "list_dir"
    effects: ClassVar[Effects] = Effects(reads=("path",), scoped=True)
    description: ClassVar[str] = (
        "List a directory: one entry per line, sorted by name, directories end with '/', "
        f"files show their size. At most {MAX_LIST_ENTRIES} entries. Default: the workspace."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Directory to list (default '.')"},
        },
        "required": [],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raw: str = args.get("path") or "."
        path = resolve_tool_path(raw, ctx)
        hide = None
        if not ctx.scope.is_owner:

            def hide(real: Path) -> bool:
                # A second name of a file is left out as read_file refuses it: it may be one
                # of the hidden files.
                return hidden_here(real, ctx) is not None or _hard_linked(real)

        return await _file_work(ctx, _list, path, raw, hide)
