"""The process that stands between memobot and every command it runs for the model.

memobot starts ``python -I -S launcher.py OPTIONS -- COMMAND...`` instead of the command
itself. This file uses a few standard modules only, so it runs isolated and without site
packages (fast to start), never importing memobot. The launcher:

* makes itself a *child subreaper*, so every descendant of the command, including ``setsid``
  and double-forked daemons, is re-parented to it rather than to pid 1 and stays in reach;
* forks the command, which confines itself with Landlock (when the spec asks for it) just
  before ``execve``: the launcher itself stays outside the Landlock domain, so the command can
  neither ptrace it nor (Landlock ABI 6+) signal it;
* when the command's main process exits, or when the launcher is told to stop (SIGTERM from
  memobot on a timeout or ``/stop``, or memobot's own death through ``PR_SET_PDEATHSIG``),
  kills every process left in its subtree and reaps it, then exits with the command's status.

OPTIONS (see :func:`parse_args`): ``--ppid N`` (memobot's pid), ``--grace S`` (seconds between
SIGTERM and SIGKILL), ``--confine``, ``--no-network``, ``--no-unix-sockets``, ``--stdio`` (a
server speaking a protocol on stdin/stdout: its stderr stays apart and no status line is
written), repeated ``-r PATH`` (read), ``-w PATH`` (write), ``-d PATH`` (device) for the
confinement, and the limits: ``--max-tasks N`` (processes and threads of the command),
``--cgroup DIR`` (a pids cgroup folder to hold the command's own cgroup, which enforces
``--max-tasks`` also for root; without it RLIMIT_NPROC does, which root ignores) and
``--max-file-bytes N`` (RLIMIT_FSIZE). Exit 125 with a ``memobot-sandbox:`` line on stderr means
the command was never started.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import signal
import sys
import time

# --- Landlock (linux/landlock.h) ------------------------------------------------------------

_SYS_CREATE_RULESET = 444  # the same numbers on every architecture (unified syscall table)
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

_FS_V1 = (1 << 13) - 1
_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
_DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed))
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(*args: object) -> int:
    result = _libc.syscall(*args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled (asked once:
    the file tools and every exec consult it)."""
    try:
        return _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    except OSError:
        return 0


def fs_rights(abi: int) -> int:
    """Every filesystem right this ABI can handle."""
    rights = _FS_V1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def confine(read: list[str], write: list[str], devices: list[str], network: bool) -> int:
    """Confine the calling process and its future children. Returns the ABI used.

    Everything the ABI can express is denied except: ``read`` paths (read and execute beneath),
    ``write`` paths (everything beneath), ``devices`` (read, write, truncate, ioctl on those
    files). With ABI 4+ and ``network`` false, TCP bind and connect are denied. With ABI 6+,
    signals and abstract Unix sockets are scoped to the domain. Paths that do not exist are
    skipped. Raises OSError when the kernel refuses.
    """
    abi = landlock_abi()
    if abi < 1:
        raise OSError(errno.ENOSYS, "Landlock is not available in this kernel")
    handled = fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        if not network:
            attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if abi >= 6:
        size = 24
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    try:
        for paths, access in ((read, _READ), (write, handled), (devices, _DEVICE)):
            for path in paths:
                _add_path_rule(ruleset, path, access & handled)
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _syscall(_SYS_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # e.g. /lib32 on a system without it
    try:
        if not os.path.isdir(path):
            access &= _FILE_ONLY
        rule = _PathBeneathAttr(access, fd)
        _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
    finally:
        os.close(fd)


# --- Capabilities ---------------------------------------------------------------------------

_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# SECBIT_NOROOT and SECBIT_NO_SETUID_FIXUP set, SECBIT_KEEP_CAPS clear, all three locked:
# uid 0 gets no capabilities at execve, and nothing can turn that back on.
_SECUREBITS_NO_ROOT = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5)
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def drop_capabilities() -> None:
    """Give up every capability, for this process and whatever it executes.

    Landlock lets a process with CAP_SYS_PTRACE read other processes' memory and environment
    (/proc/<pid>/environ), and root keeps capabilities across execve; a memobot running as
    root must not pass that on. Raises OSError when the kernel refuses.
    """
    if os.geteuid() == 0:
        if _libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS_NO_ROOT, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot set securebits: {os.strerror(err)}")
        for cap in range(64):  # past the last capability the kernel answers EINVAL
            _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    if not _has_capabilities():
        return  # e.g. a systemd service user: nothing to drop (and capset may be filtered)
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot drop capabilities: {os.strerror(err)}")


def _has_capabilities() -> bool:
    try:
        with open("/proc/self/status") as fh:
            return any(
                line.startswith(("CapInh:", "CapPrm:", "CapEff:", "CapAmb:"))
                and int(line.split()[1], 16) != 0
                for line in fh
            )
    except OSError:
        return True


# --- Unix sockets (seccomp) -----------------------------------------------------------------

# Landlock (up to ABI 7) does not govern connect() to a socket file, and the sockaddr connect()
# takes is a pointer a seccomp filter cannot read; socket()'s domain is a plain argument it can.
# So the filter refuses socket(AF_UNIX, ...) outright: no Unix socket file can be reached (a
# tmux server, D-Bus, docker.sock, an ssh-agent), also none inside the workspace. A
# socketpair() is a connected pair inside the command (asyncio and libuv need one); only its
# datagram kind is refused, as sendto() on it could still address a socket file.
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_AF_UNIX = 1
_SOCK_DGRAM = 2
_SOCK_TYPE_MASK = 0xF
_X32_SYSCALL_BIT = 0x40000000
_IO_URING = (425, 426, 427)  # setup, enter, register: the unified numbers on every arch
# machine: (AUDIT_ARCH_*, socket, socketpair, x32 ABI beside it). All little-endian.
_ARCHES = {
    "x86_64": (0xC000003E, 41, 53, True),
    "aarch64": (0xC00000B7, 198, 199, False),
    "riscv64": (0xC00000F3, 198, 199, False),
}
# classic BPF opcodes
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (low words, LE)


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


def unix_socket_filter(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The seccomp program (``(code, jt, jf, k)`` rows) that denies Unix sockets on this
    machine, or None where it cannot be built (another architecture, a 32-bit Python).

    Denied with EACCES: socket(AF_UNIX) and socketpair(AF_UNIX, SOCK_DGRAM). Denied with ENOSYS:
    io_uring, whose IORING_OP_SOCKET and IORING_OP_CONNECT would go around the filter (programs
    fall back to plain system calls). A system call of another ABI (i386 or x32 on x86_64,
    arm32 on aarch64) kills the process: their socket entry points (socketcall) cannot be
    checked, and confined commands are native programs anyway.
    """
    arch = _ARCHES.get(machine or os.uname().machine)
    if arch is None or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    audit, socket_nr, pair_nr, x32 = arch
    deny_unix = _RET_ERRNO | errno.EACCES
    deny_nosys = _RET_ERRNO | errno.ENOSYS
    rows: list[tuple[int, int, int, int]] = []
    labels: dict[str, int] = {}
    jumps: list[tuple[int, str, str]] = []  # (row, label if true, label if false)

    def op(code: int, k: int) -> None:
        rows.append((code, 0, 0, k))

    def jump(code: int, k: int, true: str, false: str) -> None:
        jumps.append((len(rows), true, false))
        rows.append((code, 0, 0, k))

    def label(name: str) -> None:
        labels[name] = len(rows)

    op(_LD_ABS, _ARCH)
    jump(_JEQ, audit, "native", "foreign")
    label("native")
    op(_LD_ABS, _NR)
    if x32:
        jump(_JGE, _X32_SYSCALL_BIT, "foreign", "syscall")
    label("syscall")
    jump(_JEQ, socket_nr, "socket", "not_socket")
    label("not_socket")
    jump(_JEQ, pair_nr, "pair", "not_pair")
    label("not_pair")
    for i, nr in enumerate(_IO_URING):
        jump(_JEQ, nr, "nosys", f"uring{i}")
        label(f"uring{i}")
    op(_RET, _RET_ALLOW)
    label("socket")
    op(_LD_ABS, _ARG0)
    jump(_JEQ, _AF_UNIX, "deny", "allow")
    label("pair")
    op(_LD_ABS, _ARG0)
    jump(_JEQ, _AF_UNIX, "pair_unix", "allow")
    label("pair_unix")
    op(_LD_ABS, _ARG1)
    op(_AND, _SOCK_TYPE_MASK)
    jump(_JEQ, _SOCK_DGRAM, "deny", "allow")
    label("allow")
    op(_RET, _RET_ALLOW)
    label("deny")
    op(_RET, deny_unix)
    label("nosys")
    op(_RET, deny_nosys)
    label("foreign")
    op(_RET, _RET_KILL_PROCESS)
    for at, true, false in jumps:  # BPF jumps are forward offsets from the next row
        code, _, _, k = rows[at]
        rows[at] = (code, labels[true] - at - 1, labels[false] - at - 1, k)
    return rows


@functools.cache
def seccomp_available() -> bool:
    """Whether this kernel takes seccomp filters that answer with an errno (asked once)."""
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as fh:
            actions = fh.read().split()
    except OSError:
        return False
    return {"errno", "kill_process", "allow"} <= set(actions) and unix_socket_filter() is not None


def forbid_unix_sockets() -> None:
    """Install :func:`unix_socket_filter` on the calling thread and whatever it executes.

    Sets no_new_privs first (the kernel requires it of a process without CAP_SYS_ADMIN).
    Raises OSError when the filter cannot be built or the kernel refuses it.
    """
    rows = unix_socket_filter()
    if rows is None:
        raise OSError(errno.ENOSYS, f"no Unix socket filter for {os.uname().machine}")
    program = (_SockFilter * len(rows))(*(_SockFilter(*row) for row in rows))
    fprog = _SockFprog(len(rows), program)
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot install the Unix socket filter: {os.strerror(err)}")


# --- Limits ---------------------------------------------------------------------------------

MAX_NEW_TASKS = 1024
CGROUP_PREFIX = "memobot-cmd-"


def _limit_tasks(max_tasks: int) -> None:
    """Cap the tasks a command can add with RLIMIT_NPROC (the fallback where no pids cgroup
    is writable), so a fork bomb stops at about ``max_tasks`` instead of exhausting the
    machine's pids. The kernel ignores RLIMIT_NPROC for root: there only a cgroup holds.

    RLIMIT_NPROC counts every task of the user, memobot's included; the system-wide count in
    /proc/loadavg is an upper bound of that, so the command always gets its ``max_tasks``.
    """
    import resource

    try:
        with open("/proc/loadavg") as fh:
            total = int(fh.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = total + max_tasks
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or limit < soft:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, hard))


def _limit_file_size(max_bytes: int) -> None:
    """RLIMIT_FSIZE, soft and hard (a command cannot raise it again; root without
    CAP_SYS_RESOURCE cannot either). A longer write fails with EFBIG: SIGXFSZ is ignored
    (by Python already; set here so it stays true), so the program reports "File too large"
    instead of dying without a word."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY:
        max_bytes = min(max_bytes, hard)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


OOM_SCORE_ADJ = 500


def _prefer_for_oom() -> None:
    """Make the command the OOM killer's first choice over memobot (raising one's own score
    needs no privilege): at the service's MemoryMax a fork bomb of small processes would
    otherwise get memobot, the largest process, killed."""
    try:
        with open("/proc/self/oom_score_adj", "r+") as fh:
            if int(fh.read() or 0) < OOM_SCORE_ADJ:
                fh.seek(0)
                fh.write(str(OOM_SCORE_ADJ))
    except (OSError, ValueError):
        pass  # no /proc: the limits still hold, only the choice of victim is the kernel's


def make_cgroup(parent: str, max_tasks: int) -> str:
    """Create this launcher's pids cgroup under ``parent`` with ``pids.max`` = ``max_tasks``;
    returns its path. The command joins it before execve (:func:`join_cgroup`): pids.max binds
    root too, and the command cannot leave (the cgroup files are outside its Landlock rules).
    Raises OSError."""
    path = os.path.join(parent, f"{CGROUP_PREFIX}{os.getpid()}")
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:  # left by a killed launcher whose pid we now have
        try:
            os.rmdir(path)
        except OSError:  # its processes still run (killed at memobot's next start)
            path = f"{path}-{time.monotonic_ns()}"
        os.mkdir(path, 0o755)
    try:
        with open(os.path.join(path, "pids.max"), "w") as fh:
            fh.write(str(max_tasks))
    except OSError:
        os.rmdir(path)
        raise
    return path


def join_cgroup(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))


def cgroup_pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as fh:
            return [int(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return []


def remove_cgroup(path: str) -> None:
    """Kill whatever is still in the cgroup (nothing, once the subtree is reaped) and remove
    it; the kernel refuses rmdir for a moment after the last task was reaped."""
    for _ in range(200):
        pids = cgroup_pids(path)
        _signal_all(pids, signal.SIGKILL)
        if pids:
            _reap()
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


# --- The subtree ----------------------------------------------------------------------------


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state first); [] when gone.

    The command name may contain spaces and parentheses; the fields follow the last ')'.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return []  # exited while we looked
    return stat[stat.rfind(b")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """Every living process below ``root``, parents before children (from /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(name)
        if fields and (fields[0] != b"Z" or _has_live_threads(name)):
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _has_live_threads(pid: str) -> bool:
    """A zombie thread-group leader whose other threads still run (its main thread called
    the raw exit system call): a process to kill, not a corpse to skip."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap() -> tuple[bool, list[tuple[int, int]]]:
    """Collect exited children without blocking. Returns (no children left, [(pid, status)])."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True, done
        if pid == 0:
            return False, done
        done.append((pid, status))


def kill_subtree(grace: float) -> None:
    """SIGTERM every descendant, wait up to ``grace`` s, then SIGKILL until none is left.

    A process forking while we kill it leaves children that are re-parented to us (we are the
    subreaper), so the walk repeats until the subtree is empty.
    """
    me = os.getpid()
    _signal_all(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        empty, _ = _reap()
        if empty or not descendants(me):
            break
        time.sleep(0.02)
    for _ in range(10_000):
        pids = descendants(me)
        if not pids:
            break
        # Stop first so nothing forks between the walk and the kill.
        _signal_all(pids, signal.SIGSTOP)
        _signal_all(descendants(me), signal.SIGKILL)
        _reap()
        time.sleep(0.005)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break


# --- Main -----------------------------------------------------------------------------------


class _Stop(Exception):
    pass


_stop_signal = 0
_waiting = False


def _on_stop(signum: int, _frame: object) -> None:
    global _stop_signal
    _stop_signal = signum
    if _waiting:
        raise _Stop  # a blocking waitpid would be retried after the handler (PEP 475)


def _wait(pid: int | None) -> int | None:
    """Reap children until ``pid`` exits (its wait status) or, with None, until none are left.

    Returns None when a stop signal arrives first, or when the last child is gone.
    """
    global _waiting
    _waiting = True
    try:
        while not _stop_signal:
            try:
                got, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return None
            if got == pid:
                return status
        return None
    except _Stop:
        return None
    finally:
        _waiting = False


def _fail(message: str) -> None:
    sys.stderr.write(f"memobot-sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(125)


def _find_program(name: str, path: str) -> str:
    """The file ``execvp`` would run for ``name``: itself when it holds a slash, else the
    first executable regular file of that name in ``path``; raises FileNotFoundError."""
    if "/" in name:
        return name
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, f"{name}: command not found in PATH")


def _child(spec: dict, report_w: int) -> None:
    """In the forked child: own session, limits, confinement, then exec. Never returns."""
    try:
        os.setsid()  # its own process group: a terminal's ^C or a group kill stays inside
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if not spec.get("stdio"):
            os.dup2(1, 2)  # one stream keeps the interleaving of output and errors readable
        # Before the capabilities go: joining a cgroup needs write access to its files.
        if spec.get("cgroup_path"):
            join_cgroup(spec["cgroup_path"])
        elif spec.get("max_tasks"):
            _limit_tasks(spec["max_tasks"])
        if spec.get("max_file_bytes"):
            _limit_file_size(spec["max_file_bytes"])
        _prefer_for_oom()
        # Looked up before the confinement: os.execvpe's own search imports a module, which
        # Landlock may no longer let this interpreter read.
        program = _find_program(spec["argv"][0], os.environ.get("PATH", os.defpath))
        if spec.get("confine"):
            drop_capabilities()
            confine(spec["read"], spec["write"], spec.get("devices", []), spec["network"])
            if not spec.get("unix_sockets", True):
                forbid_unix_sockets()  # last: nothing of ours runs after it but execve
        os.execve(program, spec["argv"], os.environ)
    except BaseException as exc:  # reported through the pipe; the parent prints it
        os.write(report_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(125)


def parse_args(args: list[str]) -> dict:
    """The launcher's options (module docstring) as a dict; raises ValueError when malformed."""
    spec: dict = {
        "confine": False, "network": True, "unix_sockets": True, "read": [], "write": [],
        "devices": [],
    }  # fmt: skip
    lists = {"-r": "read", "-w": "write", "-d": "devices"}
    numbers = {"--ppid": int, "--grace": float, "--max-tasks": int, "--max-file-bytes": int}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            spec["argv"] = args[i + 1 :]
            break
        if arg == "--confine":
            spec["confine"] = True
        elif arg == "--stdio":
            spec["stdio"] = True
        elif arg == "--no-network":
            spec["network"] = False
        elif arg == "--no-unix-sockets":
            spec["unix_sockets"] = False
        elif arg in numbers and i + 1 < len(args):
            i += 1
            spec[arg[2:].replace("-", "_")] = numbers[arg](args[i])
        elif arg == "--cgroup" and i + 1 < len(args):
            i += 1
            spec["cgroup"] = args[i]
        elif arg in lists and i + 1 < len(args):
            i += 1
            spec[lists[arg]].append(args[i])
        else:
            raise ValueError(f"unknown launcher option {arg!r}")
        i += 1
    if not spec.get("argv") or "ppid" not in spec:
        raise ValueError("the launcher needs --ppid and a command after --")
    if spec.get("cgroup") and not spec.get("max_tasks"):
        raise ValueError("--cgroup needs --max-tasks")
    return spec


def build_args(spec: dict) -> list[str]:
    """The inverse of :func:`parse_args` (used by memobot to start the launcher)."""
    args = ["--ppid", str(spec["ppid"]), "--grace", str(spec.get("grace", 2.0))]
    if spec.get("confine"):
        args.append("--confine")
    if spec.get("stdio"):
        args.append("--stdio")
    if not spec.get("network", True):
        args.append("--no-network")
    if not spec.get("unix_sockets", True):
        args.append("--no-unix-sockets")
    for flag, key in (("--max-tasks", "max_tasks"), ("--max-file-bytes", "max_file_bytes")):
        if spec.get(key):
            args += [flag, str(spec[key])]
    if spec.get("cgroup"):
        args += ["--cgroup", spec["cgroup"]]
    for flag, key in (("-r", "read"), ("-w", "write"), ("-d", "devices")):
        for path in spec.get(key, ()):
            args += [flag, path]
    return [*args, "--", *spec["argv"]]


def main(args: list[str]) -> None:
    """Run the command of ``args`` (the options above) to the end of its subtree.

    On stderr, memobot reads exactly one line: ``status N`` (N the command's wait status, as
    soon as its main process exits) or ``memobot-sandbox: why``. Processes the command left
    running stay until the subtree is empty or a stop signal arrives; then they are killed.
    """
    try:
        spec = parse_args(args)
    except ValueError as exc:
        _fail(str(exc))
    # Die with memobot: the SIGTERM of its death lets us clean up the subtree first.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != spec["ppid"]:
        _fail("memobot exited before the command started")
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_stop)
    if spec.get("cgroup"):
        try:
            spec["cgroup_path"] = make_cgroup(spec["cgroup"], spec["max_tasks"])
        except OSError as exc:
            _fail(f"cannot create the command's pids cgroup under {spec['cgroup']}: {exc}")
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        _child(spec, report_w)
    os.close(report_w)
    problem = b""
    while chunk := os.read(report_r, 4096):  # EOF at a successful exec (close-on-exec)
        problem += chunk
    os.close(report_r)
    if problem:
        os.waitpid(pid, 0)
        if spec.get("cgroup_path"):
            remove_cgroup(spec["cgroup_path"])
        _fail(f"the command could not start: {problem.decode(errors='replace')}")
    # Our copy of stdout would keep memobot's pipe open after the command's own end.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    status = _wait(pid)
    if status is not None and not spec.get("stdio"):
        os.write(2, f"status {status}\n".encode())
    os.dup2(devnull, 2)
    if status is not None:
        _wait(None)  # background jobs: they may run until memobot ends the turn
    kill_subtree(float(spec.get("grace", 2.0)) if _stop_signal else 0.0)
    if spec.get("cgroup_path"):
        remove_cgroup(spec["cgroup_path"])
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
