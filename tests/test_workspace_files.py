"""The safe-open helper: nothing memobot itself does in the workspace follows a link or leaves it.

Every test runs twice: with openat2 (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) and with the
O_NOFOLLOW walk used on kernels without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from bot import workspace_files as wf
from bot.workspace import init_workspace


@pytest.fixture(params=["openat2", "walk"])
def ws(request, tmp_path, monkeypatch) -> Path:
    if request.param == "walk":
        monkeypatch.setattr(wf, "_have_openat2", lambda: False)
    elif not wf._have_openat2():
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(wf, "_reported", set())
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    return workspace


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "config.json"
    path.write_text('{"llm": {"apiKey": "sk-secret"}}')
    return path


def test_reads_a_regular_file_and_refuses_a_link_as_absent(ws, secret, caplog):
    (ws / "SOUL.md").write_text("be kind")
    (ws / "AGENTS.md").symlink_to(secret)
    assert wf.read_text(ws, "SOUL.md") == "be kind"
    with caplog.at_level(logging.WARNING, logger="bot.workspace_files"):
        with pytest.raises(FileNotFoundError):
            wf.read_text(ws, "AGENTS.md")
        assert wf.read_text_or_empty(ws, ws / "AGENTS.md") == ""
    warnings = [r.getMessage() for r in caplog.records if "AGENTS.md" in r.getMessage()]
    assert len(warnings) == 1 and "symlink" in warnings[0]  # once, not on every read


def test_a_link_inside_the_workspace_is_refused_too(ws):
    (ws / "real.md").write_text("x")
    (ws / "USER.md").symlink_to("real.md")
    assert wf.read_text_or_empty(ws, "USER.md") == ""
    assert not wf.is_file(ws, "USER.md") and not wf.exists(ws, "USER.md")


def test_a_linked_folder_on_the_way_is_refused(ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "MEMORY.md").write_text("other")
    (ws / "memory").rmdir()
    (ws / "memory").symlink_to(outside)
    with pytest.raises(wf.LinkRefused):
        wf.read_text(ws, "memory/MEMORY.md")
    with pytest.raises(wf.LinkRefused):
        wf.append(ws, "memory/history.jsonl", "{}\n")
    with pytest.raises(wf.LinkRefused):
        wf.write_atomic(ws, "memory/.cursor", "7\n")
    assert sorted(os.listdir(outside)) == ["MEMORY.md"]
    assert wf.list_dir(ws, "memory") == []


def test_dotdot_and_outside_paths_never_leave(ws, secret):
    for path in ("../config.json", ws / ".." / "config.json", secret, "memory/../../config.json"):
        with pytest.raises(wf.LinkRefused):
            wf.read_bytes(ws, path)


def test_write_replaces_a_planted_link_and_never_writes_through(ws, tmp_path):
    victim = tmp_path / "authorized_keys"
    victim.write_text("owner-key\n")
    (ws / "USER.md").symlink_to(victim)
    wf.write_atomic(ws, "USER.md", "facts\n")
    assert victim.read_text() == "owner-key\n"
    assert not (ws / "USER.md").is_symlink() and (ws / "USER.md").read_text() == "facts\n"
    assert oct((ws / "USER.md").stat().st_mode & 0o777) == "0o600"


def test_temporary_names_are_random_so_a_planted_temp_link_is_never_used(ws, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for name in (".USER.md.tmp", ".USER.md.dream-tmp", "USER.md.tmp"):
        (ws / name).symlink_to(victim)
    wf.write_atomic(ws, "USER.md", "new")
    assert victim.read_text() == "keep"
    leftovers = [p.name for p in ws.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]
    assert leftovers == []


def test_append_refuses_a_link_and_appends_to_a_file(ws, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    assert wf.append(ws, "memory/history.jsonl", "a\n") == 0
    assert wf.append(ws, "memory/history.jsonl", "b\n") == 2
    assert (ws / "memory" / "history.jsonl").read_text() == "a\nb\n"
    (ws / "memory" / "other.jsonl").symlink_to(victim)
    with pytest.raises(wf.LinkRefused):
        wf.append(ws, "memory/other.jsonl", "x\n")
    assert victim.read_text() == ""


def test_a_fifo_or_folder_is_not_read_and_does_not_block(ws):
    os.mkfifo(ws / "TOOLS.md")
    (ws / "SOUL.md").mkdir()
    with pytest.raises(wf.LinkRefused):
        wf.read_bytes(ws, "TOOLS.md")
    with pytest.raises(IsADirectoryError):
        wf.read_bytes(ws, "SOUL.md")
    assert wf.read_text_or_empty(ws, "SOUL.md") == ""


def test_listing_leaves_links_out_and_matching_skips_linked_skills(ws, tmp_path):
    skills = ws / "skills"
    (skills / "real").mkdir(parents=True)
    (skills / "real" / "SKILL.md").write_text("---\nname: real\n---\n")
    outside = tmp_path / "planted"
    outside.mkdir()
    (outside / "SKILL.md").write_text("evil")
    (skills / "linked").symlink_to(outside)
    (skills / "filelink").mkdir()
    (skills / "filelink" / "SKILL.md").symlink_to(outside / "SKILL.md")
    (skills / ".hidden").mkdir()
    (skills / ".hidden" / "SKILL.md").write_text("x")
    names = [name for name, _ in wf.list_dir(ws, "skills")]
    assert "linked" not in names and "real" in names
    assert [rel for rel, _ in wf.files_matching(ws, "skills", "SKILL.md")] == [
        "skills/real/SKILL.md"
    ]


def test_make_dirs_creates_private_folders_and_refuses_links(ws, tmp_path):
    wf.make_dirs(ws, "media/telegram/1")
    assert wf.is_dir(ws, "media/telegram/1")
    assert oct((ws / "media").stat().st_mode & 0o777) == "0o700"
    (ws / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(wf.LinkRefused):
        wf.make_dirs(ws, "elsewhere/x")
    assert not (tmp_path / "x").exists()


def test_rename_and_unlink_act_on_the_names_not_the_targets(ws, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (ws / "memory" / "a").write_text("1")
    (ws / "memory" / "b").symlink_to(victim)
    wf.rename(ws, "memory/a", "memory/b")
    assert (ws / "memory" / "b").read_text() == "1" and victim.read_text() == "keep"
    (ws / "link").symlink_to(victim)
    wf.unlink(ws, "link")
    assert victim.exists() and not (ws / "link").is_symlink()


def test_the_workspace_itself_may_be_a_link_the_owner_made(tmp_path):
    real = tmp_path / "data"
    real.mkdir()
    (real / "SOUL.md").write_text("hi")
    link = tmp_path / "ws"
    link.symlink_to(real)
    assert wf.read_text(link, link / "SOUL.md") == "hi"


def test_onboard_fills_gaps_but_never_through_a_planted_folder_link(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    outside = tmp_path / "autostart"
    outside.mkdir()
    shutil.rmtree(ws / "skills")
    (ws / "skills").symlink_to(outside)
    (ws / "TOOLS.md").unlink()
    (ws / "TOOLS.md").symlink_to(tmp_path / "new-file-outside")
    created = init_workspace(ws)
    assert list(outside.iterdir()) == [] and not (tmp_path / "new-file-outside").exists()
    assert all(not str(p).startswith(str(ws / "skills")) for p in created)


def test_a_planted_fifo_at_history_never_hangs_memobot(ws):
    from bot.memory.history import HistoryArchive

    os.mkfifo(ws / "memory" / "history.jsonl")
    archive = HistoryArchive(ws)
    assert archive.entries() == []  # at once, as if absent (a hang fails by timeout)
    assert archive.last_cursor() == 0
    with pytest.raises(wf.LinkRefused):
        archive.append_batch_sync([("2026-12-01T00:00:00Z", "cli:x", "text")])


async def test_write_stream_cancelled_while_its_file_opens_closes_it(tmp_path, monkeypatch):
    # The open runs in a worker thread; a cancel landing meanwhile waits for it, then closes
    # the file and removes the temporary one (they stayed open, and the .part stayed).
    opening, go_on = threading.Event(), threading.Event()
    real_writer = wf.atomic_writer

    @contextlib.contextmanager
    def slow_writer(*args, **kwargs):
        with real_writer(*args, **kwargs) as fh:
            opening.set()
            go_on.wait(5)
            yield fh

    monkeypatch.setattr(wf, "atomic_writer", slow_writer)

    async def nothing():
        return
        yield b""

    write = asyncio.create_task(wf.write_stream(tmp_path, "a.bin", nothing()))
    await asyncio.to_thread(opening.wait, 5)
    write.cancel()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert list(tmp_path.iterdir()) == []
