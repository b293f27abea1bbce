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
SIGTERM and SIGKILL), ``--confine``, ``--no-network``, ``--stdio`` (a server speaking a
protocol on stdin/stdout: its stderr stays apart and no status line is written), and repeated
``-r PATH`` (read), ``-w PATH`` (write), ``-d PATH`` (device) for the confinement. Exit 125 with a
``memobot-sandbox:`` line on stderr means the command was never started.
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


MAX_NEW_TASKS = 1024


def _limit_tasks() -> None:
    """Cap the tasks a confined command can add, so a fork bomb the guard did not recognise
    stops at about MAX_NEW_TASKS instead of exhausting the machine's pids.

    RLIMIT_NPROC counts every task of the user, memobot's included; the system-wide count in
    /proc/loadavg is an upper bound of that, so the command always gets its MAX_NEW_TASKS.
    """
    import resource

    try:
        with open("/proc/loadavg") as fh:
            total = int(fh.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = total + MAX_NEW_TASKS
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or limit < soft:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, hard))


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


def _child(spec: dict, report_w: int) -> None:
    """In the forked child: own session, confinement, then exec. Never returns."""
    try:
        os.setsid()  # its own process group: a terminal's ^C or a group kill stays inside
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if not spec.get("stdio"):
            os.dup2(1, 2)  # one stream keeps the interleaving of output and errors readable
        if spec.get("confine"):
            _limit_tasks()
            drop_capabilities()
            confine(spec["read"], spec["write"], spec.get("devices", []), spec["network"])
        argv = spec["argv"]
        os.execvpe(argv[0], argv, os.environ)
    except BaseException as exc:  # reported through the pipe; the parent prints it
        os.write(report_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(125)


def parse_args(args: list[str]) -> dict:
    """The launcher's options (module docstring) as a dict; raises ValueError when malformed."""
    spec: dict = {"confine": False, "network": True, "read": [], "write": [], "devices": []}
    lists = {"-r": "read", "-w": "write", "-d": "devices"}
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
        elif arg in ("--ppid", "--grace") and i + 1 < len(args):
            i += 1
            spec[arg[2:]] = int(args[i]) if arg == "--ppid" else float(args[i])
        elif arg in lists and i + 1 < len(args):
            i += 1
            spec[lists[arg]].append(args[i])
        else:
            raise ValueError(f"unknown launcher option {arg!r}")
        i += 1
    if not spec.get("argv") or "ppid" not in spec:
        raise ValueError("the launcher needs --ppid and a command after --")
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
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
