"""File tools, the workspace path policy and the registry path, on real files in tmp dirs."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import ToolsConfig
from bot.gate import Gate
from bot.tools import build_default_tools
from bot.tools.base import ToolContext, ToolError, ToolRegistry
from bot.tools.filesystem import MAX_LIST_ENTRIES, MAX_READ_CHARS
from bot.tools.paths import resolve_tool_path

SECRET = "top secret outside the workspace"


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text(SECRET)
    return path


@pytest.fixture(params=["gate", "no gate"])
def ctx(ws: Path, request: pytest.FixtureRequest) -> Iterator[ToolContext]:
    """Through the gate's (confined) file threads, as in the daemon, and without a gate."""
    if request.param == "no gate":
        yield ToolContext(workspace=ws)
        return
    gate = Gate(ws)
    yield ToolContext(workspace=ws, gate=gate)
    gate.close()


@pytest.fixture
def registry() -> ToolRegistry:
    return build_default_tools(ToolsConfig())


@pytest.fixture
def call(registry: ToolRegistry, ctx: ToolContext) -> Any:
    """Run a tool the way the runner does: JSON arguments through the registry."""

    async def _call(name: str, _ctx: ToolContext | None = None, **args: Any) -> str:
        return await registry.execute(name, json.dumps(args), _ctx or ctx)

    return _call


# ---------------------------------------------------------------------------------------------
# read_file


async def test_read_file_returns_content(call: Any, ws: Path) -> None:
    (ws / "notes.md").write_text("line one\nline two\n")
    assert await call("read_file", path="notes.md") == "line one\nline two\n"
    assert await call("read_file", path=str(ws / "notes.md")) == "line one\nline two\n"


async def test_read_file_offset_and_limit_select_lines(call: Any, ws: Path) -> None:
    (ws / "f.txt").write_text("".join(f"L{i}\n" for i in range(1, 11)))
    out = await call("read_file", path="f.txt", offset=3, limit=2)
    assert out.startswith("L3\nL4\n")
    assert "L5" not in out and "L2" not in out
    assert "Showing lines 3-4 of 10" in out and "offset=5" in out
    # The last window has no "read more" note.
    assert await call("read_file", path="f.txt", offset=9) == "L9\nL10\n"


async def test_read_file_caps_big_files_and_says_how_to_continue(call: Any, ws: Path) -> None:
    lines = [f"{i:07d} " + "x" * 91 + "\n" for i in range(1, 2001)]  # 100 chars per line
    (ws / "big.txt").write_text("".join(lines))
    out = await call("read_file", path="big.txt")
    shown = MAX_READ_CHARS // 100
    assert out.startswith(lines[0])
    assert lines[shown - 1] in out and lines[shown] not in out
    assert f"Showing lines 1-{shown} of 2000" in out
    assert f"offset={shown + 1}" in out
    nxt = await call("read_file", path="big.txt", offset=shown + 1, limit=1)
    assert nxt.startswith(lines[shown])


async def test_read_file_cuts_a_single_huge_line(call: Any, ws: Path) -> None:
    (ws / "min.js").write_text("a" * (MAX_READ_CHARS + 500) + "\nsecond\n")
    out = await call("read_file", path="min.js")
    assert out.split("\n")[0] == "a" * MAX_READ_CHARS
    assert "longer than" in out and "offset=2" in out


async def test_read_file_errors(call: Any, ws: Path) -> None:
    (ws / "bin.dat").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")  # a PNG is an image now
    (ws / "sub").mkdir()
    (ws / "f.txt").write_text("a\nb\n")
    (ws / "empty.txt").write_text("")
    assert await call("read_file", path="nope.txt") == "Error: file not found: nope.txt"
    assert "binary" in await call("read_file", path="bin.dat")
    assert "list_dir" in await call("read_file", path="sub")
    assert "past the end" in await call("read_file", path="f.txt", offset=5)
    assert (await call("read_file", path="f.txt", offset=0)).startswith("Error: offset")
    assert "empty file" in await call("read_file", path="empty.txt")


async def test_read_file_refuses_a_fifo_instead_of_blocking(call: Any, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    assert "not a regular file" in await call("read_file", path="pipe")


async def test_read_file_keeps_crlf(call: Any, ws: Path) -> None:
    (ws / "win.txt").write_bytes(b"a\r\nb\r\n")
    assert await call("read_file", path="win.txt") == "a\r\nb\r\n"


# ---------------------------------------------------------------------------------------------
# write_file


async def test_write_file_creates_parents_and_counts_bytes(call: Any, ws: Path) -> None:
    out = await call("write_file", path="a/b/c.txt", content="héllo")
    assert out == "Wrote 6 bytes to a/b/c.txt"
    assert (ws / "a/b/c.txt").read_text(encoding="utf-8") == "héllo"


async def test_write_file_overwrites_keeping_mode_and_leaves_no_temp(call: Any, ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    await call("write_file", path="run.sh", content="#!/bin/sh\necho new\n")
    assert script.read_text() == "#!/bin/sh\necho new\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert names(ws) == ["run.sh"]


async def test_write_file_is_atomic_when_the_rename_fails(
    call: Any, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "keep.txt").write_text("original")

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    out = await call("write_file", path="keep.txt", content="new content")
    assert out.startswith("Error:")
    assert (ws / "keep.txt").read_text() == "original"
    assert names(ws) == ["keep.txt"]  # temp file cleaned up


async def test_write_file_errors(call: Any, ws: Path) -> None:
    (ws / "dir").mkdir()
    (ws / "file").write_text("x")
    assert "is a directory" in await call("write_file", path="dir", content="x")
    assert "parent path is a file" in await call("write_file", path="file/child", content="x")
    assert (await call("write_file", path="", content="x")).startswith("Error: path")


# ---------------------------------------------------------------------------------------------
# edit_file


async def test_edit_file_replaces_one_exact_match(call: Any, ws: Path) -> None:
    (ws / "app.py").write_text("def f():\n    return 1\n\ndef g():\n    return 2\n")
    out = await call("edit_file", path="app.py", old_text="return 1", new_text="return 10")
    assert out == "Edited app.py: replaced 1 occurrence"
    assert (ws / "app.py").read_text() == "def f():\n    return 10\n\ndef g():\n    return 2\n"


async def test_edit_file_not_found_hints_the_closest_line(call: Any, ws: Path) -> None:
    (ws / "app.py").write_text("import os\n\ndef compute_total(items):\n    return sum(items)\n")
    out = await call(
        "edit_file", path="app.py", old_text="def compute_totals(items):", new_text="x"
    )
    assert out.startswith("Error: old_text was not found in app.py")
    assert "closest line is 3" in out and "compute_total(items)" in out
    assert (ws / "app.py").read_text().startswith("import os")


async def test_edit_file_not_found_spots_whitespace_differences(call: Any, ws: Path) -> None:
    (ws / "a.py").write_text("if x:\n\treturn 1\n")
    out = await call("edit_file", path="a.py", old_text="if x:\n    return 1", new_text="y")
    assert "whitespace" in out


async def test_edit_file_refuses_ambiguous_match_unless_replace_all(call: Any, ws: Path) -> None:
    text = "x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n"
    (ws / "v.py").write_text(text)
    out = await call("edit_file", path="v.py", old_text="x = 1", new_text="x = 9")
    assert "occurs 3 times" in out and "lines 1, 3, 5" in out and "replace_all" in out
    assert (ws / "v.py").read_text() == text
    out = await call("edit_file", path="v.py", old_text="x = 1", new_text="x = 9", replace_all=True)
    assert out == "Edited v.py: replaced 3 occurrences"
    assert (ws / "v.py").read_text() == text.replace("x = 1", "x = 9")


async def test_edit_file_matches_lf_text_in_a_crlf_file(call: Any, ws: Path) -> None:
    (ws / "w.txt").write_bytes(b"alpha\r\nbeta\r\ngamma\r\n")
    out = await call("edit_file", path="w.txt", old_text="alpha\nbeta", new_text="one\ntwo")
    assert out.startswith("Edited")
    assert (ws / "w.txt").read_bytes() == b"one\r\ntwo\r\ngamma\r\n"


async def test_edit_file_errors(call: Any, ws: Path) -> None:
    (ws / "a.txt").write_text("abc")
    assert "must not be empty" in await call("edit_file", path="a.txt", old_text="", new_text="x")
    assert "the same" in await call("edit_file", path="a.txt", old_text="a", new_text="a")
    assert "file not found" in await call("edit_file", path="b.txt", old_text="a", new_text="b")


# ---------------------------------------------------------------------------------------------
# list_dir


async def test_list_dir_sorted_with_dirs_and_sizes(call: Any, ws: Path) -> None:
    (ws / "b.txt").write_text("hello")
    (ws / "A.md").write_bytes(b"x" * 2048)
    (ws / "src").mkdir()
    (ws / ".hidden").write_text("")
    os.symlink("b.txt", ws / "link")
    out = await call("list_dir")
    assert out.splitlines() == [
        ".hidden (0 B)",
        "A.md (2.0 KB)",
        "b.txt (5 B)",
        "link -> b.txt (5 B)",
        "src/",
    ]
    assert out == await call("list_dir", path=".")


async def test_list_dir_caps_the_entry_count(call: Any, ws: Path) -> None:
    for i in range(MAX_LIST_ENTRIES + 7):
        (ws / f"f{i:04d}").touch()
    lines = (await call("list_dir")).splitlines()
    assert len(lines) == MAX_LIST_ENTRIES + 1
    assert lines[0].startswith("f0000")
    assert lines[-1] == "... and 7 more entries not shown"


async def test_list_dir_errors(call: Any, ws: Path) -> None:
    (ws / "empty").mkdir()
    (ws / "f.txt").write_text("x")
    assert "empty directory" in await call("list_dir", path="empty")
    assert "not a directory" in await call("list_dir", path="f.txt")
    assert "directory not found" in await call("list_dir", path="missing")


# ---------------------------------------------------------------------------------------------
# Workspace path policy


def _escape_cases(ws: Path, outside: Path) -> list[tuple[str, dict[str, Any]]]:
    secret = str(outside / "secret.txt")
    return [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": "sub/../../outside/secret.txt"}),
        ("read_file", {"path": secret}),
        ("read_file", {"path": "file_link"}),
        ("read_file", {"path": "dir_link/secret.txt"}),
        ("read_file", {"path": "~/anything.txt"}),
        ("list_dir", {"path": "dir_link"}),
        ("list_dir", {"path": ".."}),
        ("list_dir", {"path": "/"}),
        ("write_file", {"path": "file_link", "content": "pwned"}),
        ("write_file", {"path": "dir_link/new.txt", "content": "pwned"}),
        ("write_file", {"path": "dangling_link", "content": "pwned"}),
        ("write_file", {"path": "../outside/new.txt", "content": "pwned"}),
        ("write_file", {"path": str(outside / "new.txt"), "content": "pwned"}),
        ("edit_file", {"path": "file_link", "old_text": "top", "new_text": "pwned"}),
        ("edit_file", {"path": secret, "old_text": "top", "new_text": "pwned"}),
    ]


@pytest.fixture
def links(ws: Path, outside: Path) -> None:
    (ws / "sub").mkdir()
    os.symlink(outside / "secret.txt", ws / "file_link")
    os.symlink(outside, ws / "dir_link")
    os.symlink(outside / "not_yet.txt", ws / "dangling_link")


@pytest.mark.usefixtures("links")
async def test_every_escape_is_refused_and_nothing_outside_changes(
    call: Any, ws: Path, outside: Path
) -> None:
    for name, args in _escape_cases(ws, outside):
        out = await call(name, **args)
        assert out.startswith("Error: path") and "outside the workspace" in out, (name, args, out)
        assert SECRET not in out
    assert (outside / "secret.txt").read_text() == SECRET
    assert names(outside) == ["secret.txt"]


@pytest.mark.usefixtures("links")
async def test_unrestricted_context_may_leave_the_workspace(
    call: Any, ws: Path, outside: Path
) -> None:
    free = ToolContext(workspace=ws, restrict_to_workspace=False)
    assert await call("read_file", free, path="../outside/secret.txt") == SECRET
    assert await call("read_file", free, path="file_link") == SECRET


async def test_symlinks_that_stay_inside_are_allowed(call: Any, ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "real/a.txt").write_text("inside")
    os.symlink(ws / "real", ws / "alias")
    os.symlink("real/a.txt", ws / "a_link")
    assert await call("read_file", path="alias/a.txt") == "inside"
    assert await call("read_file", path="a_link") == "inside"
    assert await call("read_file", path="real/../a_link") == "inside"
    await call("write_file", path="alias/b.txt", content="via alias")
    assert (ws / "real/b.txt").read_text() == "via alias"
    # Writing through a link replaces the target's content, not the link itself.
    await call("write_file", path="a_link", content="new")
    assert (ws / "a_link").is_symlink() and (ws / "real/a.txt").read_text() == "new"


def test_resolve_tool_path_returns_the_real_path(ws: Path, outside: Path) -> None:
    ctx = ToolContext(workspace=ws)
    os.symlink(outside, ws / "out")
    (ws / "d").mkdir()
    assert resolve_tool_path("d/../x.txt", ctx) == ws.resolve() / "x.txt"
    assert resolve_tool_path("new/dir/f.txt", ctx) == ws.resolve() / "new/dir/f.txt"
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve_tool_path("out/../outside/secret.txt", ctx)  # `..` after a link leaves
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve_tool_path(str(ws) + "/../outside", ctx)
    with pytest.raises(ToolError, match="empty"):
        resolve_tool_path("  ", ctx)


# ---------------------------------------------------------------------------------------------
# Registry path


async def test_registry_turns_bad_calls_into_error_results(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    out = await registry.execute("nope", "{}", ctx)
    assert out.startswith("Error: unknown tool 'nope'") and "read_file" in out
    out = await registry.execute("read_file", '{"path": ', ctx)
    assert out.startswith("Error: tool arguments are not valid JSON")
    assert await registry.execute("read_file", "[1]", ctx) == (
        "Error: tool arguments must be a JSON object"
    )
    assert await registry.execute("read_file", "{}", ctx) == (
        "Error: missing required argument 'path'"
    )
    out = await registry.execute("read_file", '{"path": "a", "offset": "3"}', ctx)
    assert out == "Error: argument 'offset' must be of type integer, got str"
    out = await registry.execute("write_file", '{"path": "a", "content": "x", "mode": 1}', ctx)
    assert out.startswith("Error: unknown argument 'mode'")


def test_build_default_tools_follows_the_config() -> None:
    assert build_default_tools(ToolsConfig()).names == [
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "exec",
        "web_fetch",
        "web_search",
        "message",
    ]
    off = ToolsConfig.model_validate({"exec": {"enabled": False}, "web": {"enabled": False}})
    assert build_default_tools(off).names == [
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "message",
    ]
    for schema in build_default_tools(ToolsConfig()).schemas():
        params = schema["function"]["parameters"]
        assert set(params["required"]) <= set(params["properties"])
