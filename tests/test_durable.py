"""bot.durable: the one module that replaces files (temporary file, fsync, rename, fsync of
the folder), and a walk of the sources that finds any other rename."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from bot import durable
from tests.helpers import REPO
from tests.helpers.source import parse

RENAMES = frozenset({"replace", "rename", "renames"})


def renames_outside_durable(root: Path = REPO) -> list[str]:
    """``file:line`` of every ``os.replace``/``os.rename`` in bot/ and channels/ (called,
    passed around or imported by name) outside bot/durable.py."""
    found = []
    for folder in ("bot", "channels"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "bot" / "durable.py":
                continue
            if not any(name in path.read_text(encoding="utf-8") for name in RENAMES):
                continue  # neither named nor called in the file
            for node in ast.walk(parse(path)):
                hit = (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "os"
                    and node.attr in RENAMES
                ) or (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "os"
                    and any(alias.name in RENAMES for alias in node.names)
                )
                if hit:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_rename_goes_through_the_durable_module() -> None:
    assert renames_outside_durable() == []


def test_the_walk_finds_a_rename(tmp_path: Path) -> None:
    fake = tmp_path / "repo"
    (fake / "bot").mkdir(parents=True)
    (fake / "channels").mkdir()
    (fake / "bot" / "durable.py").write_text("import os\nos.replace('a', 'b')\n")
    (fake / "channels" / "x.py").write_text("import os\n\nos.replace(tmp, path)\n")
    (fake / "bot" / "y.py").write_text("from os import rename\n")
    assert renames_outside_durable(fake) == ["bot/y.py:1", "channels/x.py:3"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), durable.writer(target) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("crash while writing")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    durable.replace_file(target, "new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_crashs_leftover_is_replaced_and_modes_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    (tmp_path / ".a.json.tmp").write_text("left by a SIGKILL between write and rename")
    durable.replace_file(target, b"{}")
    assert target.read_bytes() == b"{}" and not (tmp_path / ".a.json.tmp").exists()
    assert os.stat(target).st_mode & 0o777 == 0o600
    durable.replace_file(target, "x", mode=0o666, chmod=0o640, unique=True)
    assert os.stat(target).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_link_planted_at_the_target_is_replaced_not_written_through(tmp_path: Path) -> None:
    secret = tmp_path / "authorized_keys"
    secret.write_text("the owner's key")
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "USER.md").symlink_to(secret)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with durable.writer_in(fd, "USER.md") as fh:
            fh.write(b"facts")
        (folder / "a").write_text("a")
        durable.rename_in(fd, "a", fd, "b")
    finally:
        os.close(fd)
    assert secret.read_text() == "the owner's key"
    assert not (folder / "USER.md").is_symlink() and (folder / "USER.md").read_text() == "facts"
    assert (folder / "b").read_text() == "a" and not (folder / "a").exists()


def test_move_renames_a_folder(tmp_path: Path) -> None:
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "HEAD").write_text("ref")
    durable.move(tmp_path / "new", tmp_path / "repo")
    assert (tmp_path / "repo" / "HEAD").read_text() == "ref" and not (tmp_path / "new").exists()
