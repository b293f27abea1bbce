"""The process cap of the agent's commands: which pids cgroup holds it, found once per process.

A command may have at most ``tools.exec.maxProcesses`` processes and threads at once. The cap
that holds for root too is a pids cgroup per command (the launcher creates it, the command
joins it before execve, the launcher removes it when the subtree is gone). Where memobot may
create one:

* cgroup v2, when memobot's own cgroup is delegated to it (systemd ``Delegate=pids``, a
  container's own cgroup namespace) and offers the pids controller. The no-internal-process
  rule of v2 means memobot first moves itself into a leaf ``memobot`` below its cgroup, as
  systemd's delegation notes ask; the commands' cgroups are siblings of that leaf.
* cgroup v1, when memobot's cgroup in the pids hierarchy is writable (root on a v1 or hybrid
  machine; v1 has no such rule).

Otherwise RLIMIT_NPROC holds for a memobot that is not root, and nothing holds for root.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bot.gate import launcher

log = logging.getLogger(__name__)

CapKind = Literal["cgroup2", "cgroup1", "rlimit", "none"]
SUPERVISOR_LEAF = "memobot"  # memobot's own leaf below a delegated cgroup v2


@dataclass(frozen=True, slots=True)
class TaskCap:
    """What caps a command's processes here. ``parent``: where its cgroup is created."""

    kind: CapKind
    parent: Path | None = None
    why: str = ""  # rlimit / none: why no cgroup

    @property
    def holds(self) -> bool:
        return self.kind != "none"

    def summary(self, max_tasks: int) -> str:
        if self.kind in ("cgroup2", "cgroup1"):
            version = "v2" if self.kind == "cgroup2" else "v1"
            return (
                f"at most {max_tasks} processes per command (pids cgroup {version} under "
                f"{self.parent})"
            )
        if self.kind == "rlimit":
            return f"about {max_tasks} processes per command (RLIMIT_NPROC; {self.why})"
        return (
            f"NO process cap: memobot runs as root, which RLIMIT_NPROC does not bind, and "
            f"{self.why}"
        )


@dataclass(frozen=True, slots=True)
class CgroupPlaces:
    """This process's own cgroup folders: in the unified (v2) hierarchy and in a v1 pids
    hierarchy, where those are mounted."""

    v2: Path | None
    v2_path: str  # as /proc/self/cgroup names it ("/" at a cgroup namespace's root)
    v1_pids: Path | None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def _below(mount_point: str, mount_root: str, path: str) -> Path | None:
    if mount_root == "/":
        rest = path.lstrip("/")
    elif path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        rest = path[len(mount_root) :].lstrip("/")
    else:
        return None  # the mount shows another part of the hierarchy
    return Path(mount_point) / rest if rest else Path(mount_point)


def own_cgroups(proc_cgroup: str, mountinfo: str) -> CgroupPlaces:
    """Parse /proc/self/cgroup and /proc/self/mountinfo (pure)."""
    v2_path = ""
    v1_pids_path = ""
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2_path = path
        elif "pids" in controllers.split(","):
            v1_pids_path = path
    v2 = v1 = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2" and v2 is None and v2_path:
            v2 = _below(point, root, v2_path)
        elif tail[0] == "cgroup" and v1 is None and v1_pids_path:
            if "pids" in tail[2].split(","):
                v1 = _below(point, root, v1_pids_path)
    return CgroupPlaces(v2, v2_path, v1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _delegated(own: Path, path: str, euid: int) -> bool:
    """Whether memobot may manage the cgroup v2 subtree at ``own``: it can write it, and the
    cgroup was handed to it, not merely writable.

    The signs: systemd's delegate xattr; the root of a cgroup namespace (a container's own tree,
    ProtectControlGroups=private, or a machine where nothing manages cgroups); for a user other
    than root, a folder of its own below one that is not (systemd chowns a delegated cgroup to
    the unit's user). Not a sign: a user's whole user-manager subtree is writable to that user,
    but its terminal's scope is the user manager's, not memobot's.
    """
    writable = all(
        os.access(p, os.W_OK) for p in (own, own / "cgroup.procs", own / "cgroup.subtree_control")
    )
    if not writable:
        return False
    if path == "/":
        return True
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(own, name) == b"1":
                return True
    if euid == 0:
        return False
    try:
        return own.stat().st_uid == euid and own.parent.stat().st_uid != euid
    except OSError:
        return False


def probe(places: CgroupPlaces, euid: int) -> TaskCap:
    """Which cap a command would get, without changing anything."""
    v2 = places.v2
    v2_pids = v2 is not None and "pids" in _read(v2 / "cgroup.controllers").split()
    if v2 is not None and v2_pids and _delegated(v2, places.v2_path, euid):
        return TaskCap("cgroup2", v2)
    v1 = places.v1_pids
    if v1 is not None and os.access(v1, os.W_OK):
        return TaskCap("cgroup1", v1)
    if v2 is not None and v2_pids:
        why = f"memobot's cgroup {v2} is not delegated to it"
    elif v2 is not None:
        why = f"memobot's cgroup {v2} has no pids controller"
    elif v1 is not None:
        why = f"the pids cgroup {v1} is not writable"
    else:
        why = "no pids cgroup is mounted"
    return TaskCap("rlimit" if euid != 0 else "none", why=why)


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _enable_pids(own: Path) -> None:
    """Let the children of ``own`` use the pids controller. A cgroup with processes of its
    own cannot hand controllers down (EBUSY): its processes (memobot) move to a leaf first.
    Raises OSError."""
    if "pids" in _read(own / "cgroup.subtree_control").split():
        return
    try:
        _write(own / "cgroup.subtree_control", "+pids")
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    leaf = own / SUPERVISOR_LEAF
    leaf.mkdir(exist_ok=True)
    for pid in launcher.cgroup_pids(str(own)):
        with contextlib.suppress(ProcessLookupError):
            _write(leaf / "cgroup.procs", str(pid))
    _write(own / "cgroup.subtree_control", "+pids")


def remove_stale(parent: Path) -> None:
    """Remove empty command cgroups whose launcher is gone (killed before cleaning up)."""
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(launcher.CGROUP_PREFIX)]
    except OSError:
        return
    for entry in entries:
        pid = entry.name.removeprefix(launcher.CGROUP_PREFIX).split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)  # refused while processes remain: the next start


def places_here() -> CgroupPlaces:
    return own_cgroups(_read(Path("/proc/self/cgroup")), _read(Path("/proc/self/mountinfo")))


def probe_here() -> TaskCap:
    """The cap this process would get (for ``doctor`` and ``status``; changes nothing)."""
    return probe(places_here(), os.geteuid())


@functools.cache
def task_cap() -> TaskCap:
    """The cap of this process's commands, set up once: on cgroup v2 this moves memobot into
    its leaf; stale command cgroups of a dead memobot are removed."""
    places = places_here()
    cap = probe(places, os.geteuid())
    if cap.kind == "cgroup2" and cap.parent is not None:
        try:
            _enable_pids(cap.parent)
        except OSError as exc:
            log.warning("cannot use the delegated cgroup %s for commands: %s", cap.parent, exc)
            cap = probe(CgroupPlaces(None, "", places.v1_pids), os.geteuid())
    if cap.parent is not None:
        remove_stale(cap.parent)
    return cap


def describe_limits(max_tasks: int, max_file_bytes: int, cap: TaskCap | None = None) -> str:
    """One line for logs, ``doctor`` and ``status``: the process cap and the file size cap."""
    cap = probe_here() if cap is None else cap
    return f"{cap.summary(max_tasks)}; files up to {human_bytes(max_file_bytes)} (RLIMIT_FSIZE)"


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"
