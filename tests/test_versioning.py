"""Versioned memory: real files in a tmp workspace, a real dulwich repository, the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dulwich import porcelain
from dulwich.object_store import iter_tree_contents
from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

from bot.memory import versioning
from bot.memory.versioning import MemoryRepo, MemoryRepoError, commit_async, merge3

REPO_ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")
MEMORY = "\n".join(f"fact {i}" for i in range(1, 11)) + "\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "skills" / "daily-notes").mkdir(parents=True)
    (root / "USER.md").write_text("# User\nName: Ada\n")
    (root / "SOUL.md").write_text("# Soul\nBe brief.\n")
    (root / "memory" / "MEMORY.md").write_text(MEMORY)
    (root / "skills" / "daily-notes" / "SKILL.md").write_text("---\nname: daily-notes\n---\n")
    return root


def tree_files(workspace: Path, rev: str = "HEAD") -> dict[str, bytes]:
    """Path -> content of every blob in the commit's tree, read with dulwich directly."""
    repo = Repo(str(workspace))
    commit = repo[MemoryRepo(workspace).resolve(rev)]
    assert isinstance(commit, Commit)
    out = {}
    for entry in iter_tree_contents(repo.object_store, commit.tree):
        blob = repo[entry.sha]
        assert isinstance(blob, Blob)
        out[entry.path.decode()] = blob.as_raw_string()
    return out


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def git(workspace: Path, *args: str) -> str:
    assert GIT
    done = subprocess.run(
        [GIT, *args], cwd=workspace, capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout


def check_repo_integrity(workspace: Path) -> list[Commit]:
    """Walk the whole history with dulwich: every commit, tree and blob is readable and valid."""
    repo = Repo(str(workspace))
    commits = []
    head = repo.refs.follow(b"HEAD")[1]
    while head is not None:
        commit = repo[head]
        assert isinstance(commit, Commit)
        commit.check()
        tree = repo[commit.tree]
        assert isinstance(tree, Tree)
        for entry in iter_tree_contents(repo.object_store, commit.tree):
            repo[entry.sha].check()
        commits.append(commit)
        head = commit.parents[0] if commit.parents else None
    if GIT:
        git(workspace, "fsck", "--strict", "--no-dangling")
    return commits


# -- commit -----------------------------------------------------------------------------------


def test_commit_only_when_something_changed(ws: Path) -> None:
    repo = MemoryRepo(ws)
    first = repo.commit("Initial memory")
    assert first and re.fullmatch(r"[0-9a-f]{40}", first)
    assert repo.commit("Same content") is None
    (ws / "USER.md").write_text("# User\nName: Ada\nLikes: tea\n")
    second = repo.commit("User likes tea")
    assert second and second != first
    assert repo.commit("Again") is None
    assert [c.id for c in repo.log()] == [second, first]


def test_empty_workspace_has_nothing_to_commit(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert MemoryRepo(tmp_path / "empty").commit("nothing") is None


def test_missing_workspace_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MemoryRepoError, match="does not exist"):
        MemoryRepo(tmp_path / "nope").commit("x")


def test_only_tracked_paths_are_committed(ws: Path) -> None:
    (ws / "notes.md").write_text("private notes")
    (ws / "AGENTS.md").write_text("operator instructions")
    (ws / "memory" / "history.jsonl").write_text('{"cursor": 1}\n')
    (ws / "memory" / ".cursor").write_text("1")
    (ws / "memory" / ".dream_cursor").write_text("1")
    (ws / "scripts").mkdir()
    (ws / "scripts" / "run.sh").write_text("echo hi")
    (ws / "media").mkdir()
    (ws / "media" / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    # A FIFO blocks whoever opens it: if commit() ever read an untracked path, it would hang.
    os.mkfifo(ws / "pipe")
    os.mkfifo(ws / "skills" / "daily-notes" / "pipe")
    (ws / "skills" / "daily-notes" / "huge.bin").write_bytes(
        b"\0" * (versioning.MAX_FILE_BYTES + 1)
    )
    (ws / "skills" / "daily-notes" / "link").symlink_to("/etc/hostname")
    (ws / "skills" / "nested" / ".git").mkdir(parents=True)
    (ws / "skills" / "nested" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "skills" / "nested" / "SKILL.md").write_text("nested")

    assert MemoryRepo(ws).commit("Initial memory")

    files = tree_files(ws)
    assert set(files) == {
        "USER.md",
        "SOUL.md",
        "memory/MEMORY.md",
        "skills/daily-notes/SKILL.md",
        "skills/daily-notes/link",
        "skills/nested/SKILL.md",
    }
    assert files["skills/daily-notes/link"] == b"/etc/hostname"  # the link, never its target


def test_deletions_and_new_skill_folders_are_committed(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    (ws / "skills" / "weather").mkdir()
    (ws / "skills" / "weather" / "SKILL.md").write_text("---\nname: weather\n---\n")
    assert repo.commit("Add weather skill")
    assert "skills/weather/SKILL.md" in tree_files(ws)

    shutil.rmtree(ws / "skills" / "daily-notes")
    (ws / "SOUL.md").unlink()
    assert repo.commit("Drop daily notes and soul")
    assert set(tree_files(ws)) == {"USER.md", "memory/MEMORY.md", "skills/weather/SKILL.md"}
    assert "deleted file mode" in repo.diff()


def test_refuses_a_repository_it_did_not_create(ws: Path) -> None:
    Repo.init(str(ws))
    (ws / "other.txt").write_text("someone's project")
    porcelain.add(str(ws), paths=[str(ws / "other.txt")])
    porcelain.commit(str(ws), message=b"theirs", author=b"A <a@b>", committer=b"A <a@b>")
    with pytest.raises(MemoryRepoError, match="did not create"):
        MemoryRepo(ws).commit("mine")


def test_author_must_be_name_and_email(ws: Path) -> None:
    with pytest.raises(ValueError, match="Name <email>"):
        MemoryRepo(ws).commit("x", author="just a name")
    sha = MemoryRepo(ws).commit("x", author="Dream <dream@memobot>")
    assert sha and MemoryRepo(ws).log()[0].author == "Dream <dream@memobot>"


# -- log and diff -----------------------------------------------------------------------------


def test_log_is_newest_first_with_fields(ws: Path) -> None:
    repo = MemoryRepo(ws)
    assert repo.log() == []
    ids = [repo.commit("Initial memory")]
    for i in (1, 2):
        edit(ws / "memory" / "MEMORY.md", f"fact {i}\n", f"fact {i} (checked)\n")
        ids.append(repo.commit(f"Check fact {i}\n\nDream noticed it twice."))
    log = repo.log()
    assert [c.id for c in log] == ids[::-1]
    newest = log[0]
    assert newest.short_id == newest.id[:7]
    assert newest.message == "Check fact 2\n\nDream noticed it twice."
    assert newest.subject == "Check fact 2"
    assert newest.author == versioning.DEFAULT_AUTHOR
    assert newest.time.tzinfo == UTC
    assert abs(datetime.now(UTC) - newest.time) < timedelta(minutes=1)
    assert [c.id for c in repo.log(limit=2)] == ids[:0:-1]


def test_diff_of_first_and_later_commits(ws: Path) -> None:
    repo = MemoryRepo(ws)
    first = repo.commit("Initial memory")
    assert first
    diff = repo.diff(first)
    assert "diff --git a/USER.md b/USER.md" in diff
    assert "--- /dev/null" in diff and "+Name: Ada" in diff
    assert "+fact 10" in diff

    edit(ws / "USER.md", "Name: Ada", "Name: Ada Lovelace")
    second = repo.commit("Full name")
    later = repo.diff()
    assert later == repo.diff(second) == repo.diff("HEAD")
    assert "--- a/USER.md\n+++ b/USER.md" in later
    assert "-Name: Ada\n+Name: Ada Lovelace" in later
    assert "MEMORY.md" not in later


# -- resolve ----------------------------------------------------------------------------------


def test_resolve_accepts_prefixes_and_head_steps(ws: Path) -> None:
    repo = MemoryRepo(ws)
    ids = [repo.commit("Initial memory")]
    for i in (1, 2):
        edit(ws / "USER.md", "Ada", f"Ada{i}")
        ids.append(repo.commit(f"edit {i}"))
    first, middle, last = (i.encode() for i in ids if i)
    assert repo.resolve("HEAD") == repo.resolve("@") == last
    assert repo.resolve("HEAD~1") == repo.resolve("HEAD^") == repo.resolve("HEAD~") == middle
    assert repo.resolve("HEAD~2") == repo.resolve("HEAD^^") == first
    assert repo.resolve(last[:7].decode().upper()) == last
    assert repo.resolve(f"{last[:8].decode()}~1") == middle
    assert repo.resolve(first.decode()) == first


def test_resolve_errors_are_clear(ws: Path) -> None:
    repo = MemoryRepo(ws)
    with pytest.raises(MemoryRepoError, match="no memory commits yet"):
        repo.resolve("HEAD")
    repo.commit("Initial memory")
    with pytest.raises(MemoryRepoError, match="unknown revision 'nope'"):
        repo.resolve("nope")
    with pytest.raises(MemoryRepoError, match="at least 4 hex digits"):
        repo.resolve("abc")
    blob_id = Blob.from_string((ws / "USER.md").read_bytes()).id.decode()
    with pytest.raises(MemoryRepoError, match="no memory commit starts with it"):
        repo.resolve(blob_id[:10])  # a blob's id is not a commit
    with pytest.raises(MemoryRepoError, match="past the first memory commit"):
        repo.resolve("HEAD~3")


def test_ambiguous_prefix_is_refused(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = MemoryRepo(ws)
    ids = []
    for i in range(17):  # 17 commits: two must share their first hex digit
        (ws / "USER.md").write_text(f"version {i}\n")
        ids.append(repo.commit(f"v{i}"))
    digit = next(d for d in "0123456789abcdef" if sum(c.startswith(d) for c in ids) > 1)
    monkeypatch.setattr(versioning, "MIN_PREFIX_LEN", 1)
    with pytest.raises(MemoryRepoError, match=f"ambiguous revision '{digit}'.*give more digits"):
        repo.resolve(digit)


# -- revert -----------------------------------------------------------------------------------


def test_revert_restores_the_commit_and_leaves_the_rest_alone(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    edit(ws / "USER.md", "Name: Ada", "Name: Bob")
    (ws / "skills" / "weather" / "deep").mkdir(parents=True)
    (ws / "skills" / "weather" / "deep" / "SKILL.md").write_text("weather\n")
    bad = repo.commit("Wrong user, bogus skill")
    assert bad
    edit(ws / "SOUL.md", "Be brief.", "Be brief and kind.")
    later = repo.commit("Kinder soul")
    (ws / "notes.md").write_text("untouched")

    new = repo.revert(bad[:8])

    assert (ws / "USER.md").read_text() == "# User\nName: Ada\n"
    assert not (ws / "skills" / "weather").exists()  # emptied skill folders go too
    assert (ws / "skills").is_dir()
    assert (ws / "SOUL.md").read_text() == "# Soul\nBe brief and kind.\n"
    assert (ws / "notes.md").read_text() == "untouched"
    log = repo.log()
    assert [c.id for c in log[:3]] == [new, later, bad]
    assert log[0].subject == f"Revert {bad[:7]}: Wrong user, bogus skill"
    assert f"This reverts commit {bad}." in log[0].message
    assert "skills/weather/deep/SKILL.md" not in tree_files(ws)
    assert repo.commit("Nothing left over") is None  # disk and HEAD agree after the revert


def test_revert_merges_around_later_edits_of_the_same_file(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    memory = ws / "memory" / "MEMORY.md"
    edit(memory, "fact 2\n", "fact 2 is wrong\n")
    bad = repo.commit("Dream: fact 2")
    edit(memory, "fact 8\n", "fact 8, confirmed\n")
    repo.commit("Dream: fact 8")
    assert bad

    repo.revert(bad)

    assert memory.read_text() == MEMORY.replace("fact 8\n", "fact 8, confirmed\n")


def test_revert_conflict_names_the_file_and_changes_nothing(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    memory = ws / "memory" / "MEMORY.md"
    edit(memory, "fact 2\n", "fact 2 is wrong\n")
    bad = repo.commit("Dream: fact 2")
    edit(memory, "fact 2 is wrong\n", "fact 2 is very wrong\n")
    edit(ws / "USER.md", "Ada", "Ada L.")
    repo.commit("Dream: fact 2 again")
    assert bad
    before = {p: p.read_bytes() for p in (memory, ws / "USER.md")}
    head = repo.log()[0].id

    with pytest.raises(MemoryRepoError, match=r"cannot revert .*memory/MEMORY\.md"):
        repo.revert(bad)

    assert {p: p.read_bytes() for p in before} == before
    assert repo.log()[0].id == head


def test_revert_of_an_already_undone_commit_is_refused(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    edit(ws / "USER.md", "Ada", "Bob")
    bad = repo.commit("Bob")
    assert bad
    repo.revert(bad)
    with pytest.raises(MemoryRepoError, match="already undone"):
        repo.revert(bad)


def test_revert_restores_a_deleted_file_atomically(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    (ws / "SOUL.md").unlink()
    gone = repo.commit("Lost the soul")
    assert gone
    repo.revert(gone)
    assert (ws / "SOUL.md").read_text() == "# Soul\nBe brief.\n"
    assert (ws / "SOUL.md").stat().st_mode & 0o777 == 0o600
    assert not [p for p in ws.iterdir() if p.name.endswith(".tmp")]


def test_revert_of_unknown_rev_is_a_clear_error(ws: Path) -> None:
    repo = MemoryRepo(ws)
    with pytest.raises(MemoryRepoError, match="no memory commits yet"):
        repo.revert("HEAD")
    repo.commit("Initial memory")
    with pytest.raises(MemoryRepoError, match="unknown revision 'deadbeef'"):
        repo.revert("deadbeef")


def test_merge3_pure_cases() -> None:
    base = b"a\nb\nc\nd\ne\n"
    assert merge3(base, base, b"a\nB\nc\nd\ne\n") == b"a\nB\nc\nd\ne\n"
    assert merge3(base, b"a\nB\nc\nd\ne\n", base) == b"a\nB\nc\nd\ne\n"
    assert merge3(base, b"A\nb\nc\nd\ne\n", b"a\nb\nc\nd\nE\n") == b"A\nb\nc\nd\nE\n"
    assert merge3(base, b"a\nX\nc\nd\ne\n", b"a\nY\nc\nd\ne\n") is None
    assert merge3(base, b"a\nX\nc\nd\ne\n", b"a\nX\nc\nd\ne\n") == b"a\nX\nc\nd\ne\n"
    assert merge3(b"", b"x\n", b"") == b"x\n"


# -- concurrency ------------------------------------------------------------------------------


async def test_concurrent_commit_async_calls_all_land(ws: Path) -> None:
    await commit_async(ws, "Initial memory")

    async def add_skill(i: int) -> str | None:
        folder = ws / "skills" / f"skill-{i}"
        folder.mkdir()
        (folder / "SKILL.md").write_text(f"skill {i}\n")
        return await commit_async(ws, f"Add skill {i}")

    results = await asyncio.gather(*(add_skill(i) for i in range(10)))

    landed = [r for r in results if r]
    assert landed and len(set(landed)) == len(landed)
    commits = check_repo_integrity(ws)
    assert len(commits) == len(landed) + 1  # linear: nothing lost, nothing forked
    files = tree_files(ws)
    assert {f"skills/skill-{i}/SKILL.md" for i in range(10)} <= set(files)
    assert await commit_async(ws, "no-op") is None


def test_commits_from_many_threads_and_repo_objects_never_interleave(ws: Path) -> None:
    MemoryRepo(ws).commit("Initial memory")
    results: list[str | None] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        (ws / "skills" / f"t{i}").mkdir()
        barrier.wait()
        for round_ in range(3):
            (ws / "skills" / f"t{i}" / "SKILL.md").write_text(f"thread {i} round {round_}\n")
            # A fresh object per call: only the flock on .git/memobot.lock keeps them apart.
            results.append(MemoryRepo(ws).commit(f"thread {i} round {round_}"))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    landed = [r for r in results if r]
    assert len(check_repo_integrity(ws)) == len(landed) + 1
    files = tree_files(ws)
    assert all(files[f"skills/t{i}/SKILL.md"] == f"thread {i} round 2\n".encode() for i in range(8))


# -- the real git binary agrees (only when it exists) ------------------------------------------


@pytest.mark.skipif(GIT is None, reason="git binary not installed")
def test_git_binary_reads_the_repository(ws: Path) -> None:
    repo = MemoryRepo(ws)
    repo.commit("Initial memory")
    (ws / "notes.md").write_text("not memory")
    (ws / "memory" / "history.jsonl").write_text("{}\n")
    edit(ws / "USER.md", "Ada", "Ada L.")
    bad = repo.commit("Rename user")
    assert bad
    repo.revert(bad)
    assert git(ws, "status", "--porcelain") == ""  # clean, and the untracked rest is hidden
    assert git(ws, "log", "--format=%s").splitlines() == [
        f"Revert {bad[:7]}: Rename user",
        "Rename user",
        "Initial memory",
    ]
    assert git(ws, "ls-files").split() == sorted(tree_files(ws))
    git(ws, "fsck", "--strict")


# -- the real CLI, without git on PATH ---------------------------------------------------------


def test_cli_log_diff_revert_without_git_on_path(tmp_path: Path, ws: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"agent": {"workspace": str(ws), "stateDir": str(tmp_path / "state")}})
    )
    env = {
        "PATH": str(Path(sys.executable).parent),  # the venv's bin: python, no git
        "HOME": str(tmp_path),
        "TZ": "UTC",
        "PYTHONPATH": str(REPO_ROOT),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    def memobot(*args: str) -> subprocess.CompletedProcess[str]:
        return run("-m", "bot", "--config", str(config), "memory", *args)

    empty = memobot("log")
    assert (empty.returncode, empty.stdout) == (0, "No memory commits yet.\n"), empty.stderr

    script = (
        "import shutil, sys; from pathlib import Path\n"
        "from bot.memory.versioning import MemoryRepo\n"
        "assert shutil.which('git') is None\n"
        "ws = Path(sys.argv[1]); r = MemoryRepo(ws); r.commit('Initial memory')\n"
        "p = ws / 'USER.md'; p.write_text(p.read_text().replace('Ada', 'Bob'))\n"
        "print(r.commit('User is Bob'))\n"
    )
    made = run("-c", script, str(ws))
    assert made.returncode == 0, made.stderr
    bad = made.stdout.strip()

    log = memobot("log")
    assert log.returncode == 0, log.stderr
    line = r"[0-9a-f]{7}  \d{4}-\d\d-\d\d \d\d:\d\d  "
    assert re.fullmatch(f"{line}User is Bob\n{line}Initial memory\n", log.stdout)
    assert log.stdout.startswith(bad[:7])

    diff = memobot("diff")
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.startswith(f"commit {bad}\nAuthor: memobot <memobot@localhost>\nDate:")
    assert "    User is Bob\n" in diff.stdout and "-Name: Ada\n+Name: Bob\n" in diff.stdout

    reverted = memobot("revert", bad[:7])
    assert reverted.returncode == 0, reverted.stderr
    assert re.fullmatch(rf"Reverted {bad[:7]}: User is Bob as [0-9a-f]{{7}}\n", reverted.stdout)
    assert (ws / "USER.md").read_text() == "# User\nName: Ada\n"

    unknown = memobot("revert", "ffff0000")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "memobot: unknown revision 'ffff0000'" in unknown.stderr


@pytest.mark.parametrize("planted", ["logs/refs/heads/main", "refs/heads", "objects"])
def test_a_link_inside_dot_git_stops_the_commit_and_nothing_is_written_through(
    ws: Path, tmp_path: Path, planted: str
) -> None:
    """dulwich follows links itself: a model that links .git/logs/... to a file elsewhere
    would have memobot append to (and chmod) that file on the next memory commit."""
    repo = MemoryRepo(ws)
    repo.commit("first")
    victim = tmp_path / "victim"
    victim.mkdir() if planted != "logs/refs/heads/main" else victim.write_text("keep\n")
    target = ws / ".git" / planted
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(victim)
    (ws / "USER.md").write_text("changed\n")
    with pytest.raises(MemoryRepoError, match="link"):
        repo.commit("second")
    if victim.is_dir():
        assert list(victim.iterdir()) == []
    else:
        assert victim.read_text() == "keep\n"
