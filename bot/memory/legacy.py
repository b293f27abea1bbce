"""Copy the memory history out of a workspace's old ``.git``, once, reading it as hostile data.

Earlier versions of memobot kept the memory repository in ``<workspace>/.git``, and nanobot
keeps its memory store there. That folder is the model's to write: a config with ``include``
lines, a symbolic ref that sends a write elsewhere, a link to any file or folder, an
``alternates`` file naming another repository, a pack crafted to expand without end. So:

* only ``HEAD``, the one branch it names (a loose ref or a ``packed-refs`` line) and the objects
  are read; never ``config``, ``commondir``, ``alternates``, ``shallow``, hooks or reflogs;
* every file is read through :mod:`bot.workspace_files` (no link followed at any component,
  nothing outside that workspace, nothing but regular files, every read capped);
* ``HEAD`` must name a branch (or be a commit id) and the branch must hold a commit id: a
  symbolic ref chain is refused;
* every object read is checked against its id, and sizes and counts are capped;
* the copy runs in a child process with CPU, memory and time limits, so a pack whose deltas
  expand or loop stops that process only.

Copied are the commits reachable from the branch tip, their trees and blobs, and only when the
tip's tree holds nothing but memory files and nanobot's bookkeeping (:func:`judge_paths`);
the destination is a fresh bare repository of memobot's own. The old ``.git`` is not written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import resource
import stat
import subprocess
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from dulwich.objects import Blob, Commit, ShaFile, Tree
from dulwich.pack import Pack, PackData, load_pack_index_file

from bot import workspace_files
from bot.memory.versioning import (
    BRANCH,
    DEFAULT_AUTHOR,
    NANOBOT_BOOKKEEPING,
    Migration,
    is_tracked,
)

CHILD_TIMEOUT_SECONDS = 120.0  # wall time of the whole copy; the child's CPU limit is the same
CHILD_MEMORY_BYTES = 1 << 30  # address space of the child
MAX_OBJECT_BYTES = 16 * 1024 * 1024  # one object (memory files are text, at most 1 MB each)
MAX_TOTAL_BYTES = 256 * 1024 * 1024  # everything copied
MAX_OBJECTS = 200_000
MAX_PACK_BYTES = workspace_files.MAX_READ_BYTES  # one .pack or .idx file
_SMALL = 4096  # HEAD and a loose ref
_MAX_PACKED_REFS = 1024 * 1024
_GITLINK = 0o160000  # a submodule entry: no object of this repository
_HEX = re.compile(rb"[0-9a-f]{40}")
_BRANCH = re.compile(rb"refs/heads/[A-Za-z0-9][A-Za-z0-9._/-]*")
_TYPES = {b"commit": Commit.type_num, b"tree": Tree.type_num, b"blob": Blob.type_num}
_TYPE_NAMES = {num: name for name, num in _TYPES.items()}


class Refused(Exception):
    """The old repository looks wrong; ``str()`` says what, for a log line."""


# -- the parent: run the copy in a child with limits ----------------------------------------------


def copy_history(workspace: Path, dest: Path) -> Migration:
    """Copy the memory history of ``<workspace>/.git`` into the empty bare repository ``dest``
    (its branch ``main`` then points at the old tip). Returns what was found; after anything
    but ``copied``, ``dest`` may hold a part of a copy (start it again). Raises OSError when
    the child cannot be started."""
    if not workspace_files.lexists(workspace, ".git"):
        return Migration("none")
    if not workspace_files.is_dir(workspace, ".git"):
        return Migration("refused", detail="it is not a folder (a link or a gitdir file)")
    package_root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(package_root), "LC_ALL": "C.UTF-8"}  # no secret of memobot's
    command = [sys.executable, "-P", "-m", "bot.memory.legacy", str(workspace), str(dest)]
    try:
        done = subprocess.run(
            command, cwd=dest, env=env, capture_output=True, timeout=CHILD_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Migration("refused", detail=f"reading it took over {CHILD_TIMEOUT_SECONDS:.0f} s")
    if done.returncode != 0:
        # A limit hit (MemoryError, SIGXCPU) or a crash: the data is not a history we keep.
        why = "it exceeded the copy's memory or CPU limit, or the copy failed"
        return Migration("refused", detail=f"{why} (exit status {done.returncode})")
    try:
        answer = json.loads(done.stdout)
        return Migration(
            answer["state"],
            commits=int(answer.get("commits", 0)),
            drop=tuple(answer.get("drop", ())),
            detail=str(answer.get("detail", "")),
        )
    except (ValueError, KeyError, TypeError):
        return Migration("refused", detail="the copy gave no readable answer")


def _limit_self() -> None:
    cpu = int(CHILD_TIMEOUT_SECONDS)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


def main(argv: list[str]) -> int:
    """The child: ``python -m bot.memory.legacy WORKSPACE DEST``; prints one JSON answer."""
    _limit_self()
    workspace, dest = Path(argv[0]), Path(argv[1])
    try:
        result = copy_in_process(workspace, dest)
    except Refused as exc:
        # One line: the detail names the model's files (a pack name may hold a newline).
        result = Migration("refused", detail=_printable(str(exc).encode(), 300))
    print(
        json.dumps(
            {
                "state": result.state,
                "commits": result.commits,
                "drop": list(result.drop),
                "detail": result.detail,
            }
        )
    )
    return 0


# -- the child: read, check, copy -----------------------------------------------------------------


def copy_in_process(workspace: Path, dest: Path) -> Migration:
    """The copy itself (no limits of its own: run it through :func:`copy_history`). Raises
    Refused, naming what looks wrong; MemoryError and the like escape."""
    old = OldRepo(workspace)
    try:
        tip = old.tip()
        if tip is None:
            return Migration("none")
        head = old.get(tip)
        if not isinstance(head, Commit):
            raise Refused("its branch does not name a commit")
        paths = list(old.tree_paths(head.tree))
        verdict = judge_paths(paths)
        if verdict is not None:
            return Migration("foreign", detail=verdict)
        objects, commits = old.reachable(tip)
    finally:
        old.close()
    _write(dest, objects, tip)
    drop = sorted(os.fsdecode(p) for p in paths if p in NANOBOT_BOOKKEEPING)
    return Migration("copied", commits=commits, drop=tuple(drop))


def judge_paths(paths: Iterable[bytes]) -> str | None:
    """None when a tree of these paths is a memory history (memobot's :data:`TRACKED`, plus
    nanobot's bookkeeping files); else why not, naming one path."""
    for path in paths:
        if not (is_tracked(path) or path in NANOBOT_BOOKKEEPING):
            return f"it tracks {_printable(path)}, which is not a memory file"
    return None


def _printable(raw: bytes, limit: int = 120) -> str:
    """A path from the model's repository, safe for one log line."""
    text = raw.decode("utf-8", "replace")[:limit]
    return "".join(c if c.isprintable() else "?" for c in text)


def _write(dest: Path, objects: list[ShaFile], tip: bytes) -> None:
    from dulwich.repo import Repo

    repo = Repo(str(dest), bare=True)
    try:
        for obj in objects:  # loose, as memobot's commits are: no pack left open at exit
            repo.object_store.add_object(obj)
        branch = b"refs/heads/" + BRANCH
        # The committer is given: dulwich would otherwise look for one in git config files.
        who, why = DEFAULT_AUTHOR.encode(), b"memobot: history copied from the workspace's .git"
        if not repo.refs.add_if_new(branch, tip, committer=who, message=why):
            raise Refused("the new repository already has a branch")
    finally:
        repo.close()


class OldRepo:
    """Read-only access to ``<workspace>/.git`` by object id; nothing but HEAD, one branch ref
    and the objects is read, all through :mod:`bot.workspace_files`."""

    def __init__(self, workspace: Path) -> None:
        self.root = workspace
        self._packs: list[Pack] | None = None
        self._read_bytes = 0

    def close(self) -> None:
        for pack in self._packs or ():
            pack.close()

    # -- refs ----------------------------------------------------------------------------------

    def tip(self) -> bytes | None:
        """The commit id HEAD names (through one branch), None for a branch without commits."""
        head = self._small(".git/HEAD", required=True).strip()
        if _HEX.fullmatch(head):
            return head
        if not head.startswith(b"ref: "):
            raise Refused("its HEAD is neither a branch nor a commit id")
        name = head[5:].strip()
        parts = name.split(b"/")
        if not _BRANCH.fullmatch(name) or any(p in (b"", b".", b"..") for p in parts):
            raise Refused(f"its HEAD names {_printable(name)}, which is not a branch")
        loose = self._small(f".git/{os.fsdecode(name)}", required=False).strip()
        if loose:
            if not _HEX.fullmatch(loose):
                raise Refused(f"{_printable(name)} is not a commit id (a symbolic ref?)")
            return loose
        return self._packed_ref(name)

    def _packed_ref(self, name: bytes) -> bytes | None:
        for line in self._small(".git/packed-refs", False, _MAX_PACKED_REFS).splitlines():
            sha, _, ref = line.partition(b" ")
            if ref.strip() == name and _HEX.fullmatch(sha):
                return sha
        return None

    def _small(self, rel: str, required: bool, limit: int = _SMALL) -> bytes:
        try:
            data = workspace_files.read_bytes(self.root, rel, limit + 1)
        except workspace_files.LinkRefused:
            raise Refused(f"{rel} is a link, or leads through one") from None
        except (FileNotFoundError, NotADirectoryError):
            if required:
                raise Refused(f"{rel} is missing") from None
            return b""
        except IsADirectoryError:
            raise Refused(f"{rel} is a folder") from None
        if len(data) > limit:
            raise Refused(f"{rel} is larger than {limit} bytes")
        return data

    # -- objects -------------------------------------------------------------------------------

    def get(self, sha: bytes) -> ShaFile:
        """The object ``sha`` (40 hex digits), loose or packed, checked against its id."""
        found = self._loose(sha)
        if found is None:
            found = self._packed(sha)
        if found is None:
            raise Refused(f"object {sha.decode()} is missing (objects elsewhere are not read)")
        type_num, body = found
        name = _TYPE_NAMES.get(type_num)
        if name is None:
            raise Refused(f"object {sha.decode()} is not a commit, tree or blob")
        header = name + b" " + str(len(body)).encode() + b"\0"
        if hashlib.sha1(header + body).hexdigest().encode() != sha:
            raise Refused(f"object {sha.decode()} does not match its id")
        self._read_bytes += len(body)
        if self._read_bytes > MAX_TOTAL_BYTES:
            raise Refused(f"its history is larger than {MAX_TOTAL_BYTES} bytes")
        try:
            return ShaFile.from_raw_string(type_num, body, sha=sha)
        except Exception as exc:  # dulwich's parsers raise several kinds on malformed objects
            raise Refused(
                f"object {sha.decode()} cannot be parsed ({type(exc).__name__})"
            ) from None

    def _loose(self, sha: bytes) -> tuple[int, bytes] | None:
        rel = f".git/objects/{sha[:2].decode()}/{sha[2:].decode()}"
        st = self._stat(rel)
        if st is None:
            return None
        if st.st_size > MAX_OBJECT_BYTES:
            raise Refused(f"{rel} is larger than {MAX_OBJECT_BYTES} bytes")
        data = workspace_files.read_bytes(self.root, rel, MAX_OBJECT_BYTES)
        inflate = zlib.decompressobj()
        try:
            raw = inflate.decompress(data, MAX_OBJECT_BYTES + 64)
        except zlib.error:
            raise Refused(f"{rel} is not a zlib stream") from None
        if inflate.unconsumed_tail:
            raise Refused(f"{rel} inflates to more than {MAX_OBJECT_BYTES} bytes")
        if not inflate.eof:
            raise Refused(f"{rel} is cut short")
        name, _, rest = raw.partition(b" ")
        size, nul, body = rest.partition(b"\0")
        if name not in _TYPES or not nul or not size.isdigit() or int(size) != len(body):
            raise Refused(f"{rel} has no valid object header")
        return _TYPES[name], body

    def _stat(self, rel: str) -> os.stat_result | None:
        try:
            st = workspace_files.lstat(self.root, rel)
        except workspace_files.LinkRefused:
            raise Refused(f"{rel} leads through a link") from None
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{rel} is not a regular file")
        return st

    def _packed(self, sha: bytes) -> tuple[int, bytes] | None:
        for pack in self._load_packs():
            if sha in pack:
                type_num, body = pack.get_raw(sha)
                if len(body) > MAX_OBJECT_BYTES:
                    raise Refused(f"object {sha.decode()} is larger than {MAX_OBJECT_BYTES} bytes")
                return type_num, body
        return None

    def _load_packs(self) -> list[Pack]:
        if self._packs is not None:
            return self._packs
        from dulwich.object_format import SHA1

        self._packs = []
        folder = ".git/objects/pack"
        for name, _ in workspace_files.list_dir(self.root, folder):
            if not (name.startswith("pack-") and name.endswith(".idx")):
                continue
            base = f"{folder}/{name[:-4]}"
            idx_bytes, pack_bytes = self._whole(base + ".idx"), self._whole(base + ".pack")
            try:
                index = load_pack_index_file(base + ".idx", io.BytesIO(idx_bytes), SHA1)
                data = PackData(
                    base + ".pack", SHA1, file=io.BytesIO(pack_bytes), size=len(pack_bytes)
                )
                self._packs.append(Pack.from_objects(data, index))
            except Exception as exc:  # dulwich's pack readers raise several kinds
                raise Refused(f"{base}.pack cannot be read ({type(exc).__name__})") from None
        return self._packs

    def _whole(self, rel: str) -> bytes:
        st = self._stat(rel)
        if st is None:
            raise Refused(f"{rel} is missing")
        if st.st_size > MAX_PACK_BYTES:
            raise Refused(f"{rel} is larger than {MAX_PACK_BYTES} bytes")
        self._read_bytes += st.st_size
        return workspace_files.read_bytes(self.root, rel, MAX_PACK_BYTES)

    # -- walking -------------------------------------------------------------------------------

    def tree_paths(self, tree_id: bytes) -> Iterator[bytes]:
        """Every path of a tree, folders walked (iteratively: a deep tree cannot recurse)."""
        stack = [(b"", tree_id)]
        seen = 0
        while stack:
            prefix, sha = stack.pop()
            tree = self.get(sha)
            if not isinstance(tree, Tree):
                raise Refused(f"object {sha.decode()} should be a tree")
            for name, mode, child in tree.iteritems():
                seen += 1
                if seen > MAX_OBJECTS:
                    raise Refused(f"its tree has more than {MAX_OBJECTS} entries")
                path = prefix + name
                if stat.S_ISDIR(mode):
                    stack.append((path + b"/", child))
                else:
                    yield path

    def reachable(self, tip: bytes) -> tuple[list[ShaFile], int]:
        """Every commit reachable from ``tip`` with its trees and blobs (checked), and the
        number of commits. Submodule entries have no object here and are skipped."""
        out: list[ShaFile] = []
        seen: set[bytes] = set()
        commits = 0
        pending: list[tuple[bytes, type[ShaFile]]] = [(tip, Commit)]
        while pending:
            sha, kind = pending.pop()
            if sha in seen:
                continue
            if not isinstance(sha, bytes) or not _HEX.fullmatch(sha):
                raise Refused(f"a {kind.__name__.lower()} id is malformed")
            seen.add(sha)
            if len(seen) > MAX_OBJECTS:
                raise Refused(f"its history has more than {MAX_OBJECTS} objects")
            obj = self.get(sha)
            if not isinstance(obj, kind):
                raise Refused(f"object {sha.decode()} should be a {kind.__name__.lower()}")
            out.append(obj)
            if isinstance(obj, Commit):
                commits += 1
                pending.append((obj.tree, Tree))
                pending.extend((parent, Commit) for parent in obj.parents)
            elif isinstance(obj, Tree):
                for _, mode, child in obj.iteritems():
                    if mode == _GITLINK:
                        continue
                    pending.append((child, Tree if stat.S_ISDIR(mode) else Blob))
        return out, commits


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
