"""Issue 27, findings 4 and 8: Unix sockets lead out, and limits that did not hold as root.

Attacks go through the real exec path: a ``memobot agent`` subprocess whose fake model calls
``exec`` (or, where a protection is switched off on purpose, the in-process agent), the real
launcher, the kernel's seccomp filter and a real pids cgroup. The Unix socket listener is a
real one, outside the workspace, and counts who reached it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, ExecConfig, parse_config
from bot.gate import Gate, GateRefused, ProcessScope, describe_confinement, launcher, limits
from bot.gate.usage import WorkspaceUsage, describe, measure
from bot.tools.base import ToolContext
from bot.tools.shell import ExecTool
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, call, reply, tool_step
from tests.helpers import (
    Harness,
    alive,
    config_dict,
    make_config,
    request_messages,
    run_memobot,
    write_config,
)

needs_landlock = pytest.mark.skipif(launcher.landlock_abi() < 1, reason="needs Landlock")
needs_seccomp = pytest.mark.skipif(
    not launcher.seccomp_available(), reason="no seccomp filter for this kernel or architecture"
)
CAP = limits.probe_here()
needs_pids_cgroup = pytest.mark.skipif(
    CAP.kind not in ("cgroup1", "cgroup2"), reason=f"no writable pids cgroup here: {CAP.why}"
)


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def tool_results(llm: FakeLLMThread, request: int = 1) -> dict[str, str]:
    messages = request_messages(llm.requests[request])
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def agent_turn(
    tmp_path: Path, llm: FakeLLMThread, commands: dict[str, str], **sections: Any
) -> dict[str, str]:
    """One ``memobot agent`` turn in which the model runs each command; returns the results."""
    cfg = write_config(tmp_path, llm.base_url, **sections)
    calls = [call("exec", {"command": cmd}, id=cid) for cid, cmd in commands.items()]
    llm.script(tool_step(*calls), reply("done"))
    done = run_memobot("agent", "-m", "please run these", config=cfg)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    return tool_results(llm)


def exec_section(**extra: Any) -> dict[str, Any]:
    return {"exec": {"timeoutSeconds": 20, **extra}, "approval": "off"}


# -- Unix sockets ----------------------------------------------------------------------------


class Listener:
    """A Unix socket server (think tmux or docker.sock) that records every connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.received: list[bytes] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(8)
        self._sock.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    self.received.append(conn.recv(1024))
                    conn.sendall(b"ran it\n")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    # Outside every folder the command may write; short, for the 108-byte socket path limit.
    folder = Path(tempfile.mkdtemp(prefix="memobot-sock-", dir="/tmp"))
    server = Listener(folder / "server.sock")
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def connect_command(path: Path | str) -> str:
    """A command that sends a tmux-like request to the socket at ``path``."""
    code = (
        "import socket; s = socket.socket(socket.AF_UNIX); "
        f"s.connect({str(path)!r}); s.sendall(b'run-shell id'); print(s.recv(100).decode().strip())"
    )
    return f'python3 -c "{code}" 2>&1 | tail -1'


SOCKETPAIR = (
    'python3 -c "import asyncio, socket; asyncio.run(asyncio.sleep(0)); '
    "a, b = socket.socketpair(); a.send(b'x'); print('pair', b.recv(1))\""
)
DGRAM_PAIR = (
    'python3 -c "import socket; socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)" '
    "2>&1 | tail -1"
)
INSIDE = (
    "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.bind('own.sock')\" "
    "2>&1 | tail -1"
)


@needs_landlock
@needs_seccomp
def test_a_confined_command_cannot_reach_a_unix_socket_outside(
    tmp_path: Path, llm: FakeLLMThread, listener: Listener
) -> None:
    results = agent_turn(
        tmp_path,
        llm,
        {
            "outside": connect_command(listener.path),
            "inside": INSIDE,
            "pair": SOCKETPAIR,
            "dgram": DGRAM_PAIR,
        },
        tools=exec_section(),
    )
    assert "PermissionError" in results["outside"], results["outside"]
    assert listener.received == []
    # Stricter than the finding asks: no Unix socket at all, also in the workspace.
    assert "PermissionError" in results["inside"], results["inside"]
    # A connected pair inside the command reaches nothing and keeps asyncio working.
    assert results["pair"].strip() == "pair b'x'", results["pair"]
    # A datagram pair could still sendto() a socket file: refused too.
    assert "PermissionError" in results["dgram"], results["dgram"]


@needs_landlock
def test_without_the_filter_landlock_alone_lets_the_command_out(
    tmp_path: Path, llm: FakeLLMThread, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding itself: the kernel's answer is replaced by "no seccomp" (in-process)."""
    monkeypatch.setattr(launcher, "seccomp_available", lambda: False)
    llm.script(tool_step(call("exec", {"command": connect_command(listener.path)})), reply("ok"))

    async def turn() -> str:
        async with Harness(make_config(tmp_path, llm.base_url), tmp_path / "config.json") as h:
            return await h.ask("go")

    assert asyncio.run(turn()) == "ok"
    assert next(iter(tool_results(llm).values())).strip() == "ran it"
    assert listener.received == [b"run-shell id"]
    c = describe_confinement(True, "landlock", True)
    assert c.gaps and "Unix sockets NOT blocked" in c.summary


# Machine code called through ctypes: the i386 getpid (int 0x80) and io_uring_setup.
OTHER_ABI = (
    "import ctypes, mmap, os\n"
    "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\n"
    "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
    "print('i386 getpid', f() == os.getpid())\n"
)
IO_URING = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "print('io_uring', libc.syscall(425, 1, ctypes.create_string_buffer(120)), "
    "ctypes.get_errno())\n"
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path.resolve()


@pytest.fixture
def gate(ws: Path) -> Iterator[Gate]:
    g = Gate(ws)
    yield g
    g.close()


async def run_exec(gate: Gate, ws: Path, command: str, **cfg: Any) -> str:
    scope = ProcessScope(0.3)
    ctx = ToolContext(workspace=ws, gate=gate, processes=scope)
    try:
        return await ExecTool(ExecConfig(**cfg), kill_grace_seconds=0.3).run(
            {"command": command}, ctx
        )
    finally:
        await scope.close()


@needs_landlock
@needs_seccomp
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 machine code")
async def test_other_abis_are_killed_and_io_uring_is_refused(gate: Gate, ws: Path) -> None:
    """i386's socketcall could not be checked, io_uring can open sockets on its own."""
    (ws / "abi.py").write_text(OTHER_ABI)
    (ws / "uring.py").write_text(IO_URING)
    off = await run_exec(gate, ws, "python3 abi.py", sandbox="off")
    assert "i386 getpid True" in off  # so the kill below is the filter's doing
    confined = await run_exec(gate, ws, "python3 abi.py")
    assert "exit code 159" in confined  # 128 + SIGSYS
    uring = await run_exec(gate, ws, "python3 uring.py")
    assert "io_uring -1 38" in uring  # ENOSYS: programs fall back to plain system calls


# -- processes -------------------------------------------------------------------------------


def fork_loop(tag: str, bound: int) -> str:
    """Forks sleeping children until the kernel refuses (or ``bound``, so a broken cap cannot
    take the machine down), then says how many it made and which pids cgroup it was in."""
    code = (
        f"import os, time  # {tag}\n"
        "made = 0\n"
        "try:\n"
        f"    while made < {bound}:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        made += 1\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
        "group = [l for l in open('/proc/self/cgroup') if ':pids:' in l or l.startswith('0::')]\n"
        "print('made', made, 'in', group[0].strip().split(':', 2)[2])\n"
    )
    return f"cat > loop.py <<'EOF'\n{code}EOF\npython3 loop.py"


def tagged(tag: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"loop.py" in cmdline and alive(int(name)):
            with contextlib.suppress(OSError):
                if tag.encode() in Path(f"/proc/{name}/cwd/loop.py").read_bytes():
                    found.append(int(name))
    return found


@needs_pids_cgroup
def test_a_fork_loop_stops_at_the_cap_as_root_and_is_reaped(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    assert CAP.parent is not None
    stale = CAP.parent / f"{launcher.CGROUP_PREFIX}{2**22 + 7}"  # above pid_max: never alive
    stale.mkdir()
    tag = uuid.uuid4().hex
    try:
        results = agent_turn(
            tmp_path,
            llm,
            {"bomb": fork_loop(tag, 200), "after": "echo still fine"},
            tools=exec_section(maxProcesses=40),
        )
        started_again = not stale.exists()
    finally:
        with contextlib.suppress(FileNotFoundError):
            stale.rmdir()
    out = results["bomb"]
    found = re.search(r"made (\d+) in (\S+)", out)
    assert found, out
    made, group = int(found.group(1)), found.group(2)
    # 40 tasks: the shell, python and its children; a fork the kernel refused (EAGAIN).
    assert 30 <= made <= 38, out
    assert "refused 11" in out
    assert results["after"].strip() == "still fine"
    assert os.path.basename(group).startswith(launcher.CGROUP_PREFIX)
    assert not tagged(tag), "a child of the fork loop outlived the turn"
    assert not (CAP.parent / os.path.basename(group)).exists(), "the command's cgroup stayed"
    assert started_again, "the next start did not remove a dead launcher's cgroup"


@needs_pids_cgroup
def test_stale_command_cgroups_go_and_live_ones_stay() -> None:
    assert CAP.parent is not None
    dead = CAP.parent / f"{launcher.CGROUP_PREFIX}{2**22 + 8}"
    live = CAP.parent / f"{launcher.CGROUP_PREFIX}{os.getpid()}"
    dead.mkdir()
    live.mkdir()
    try:
        limits.remove_stale(CAP.parent)
        assert not dead.exists()
        assert live.exists()
        assert (live / "pids.max").read_text().strip() == "max"  # a real cgroup folder
    finally:
        for path in (dead, live):
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()


@needs_pids_cgroup
def test_a_launcher_with_a_reused_pid_gets_a_cgroup_of_its_own() -> None:
    """A killed launcher's cgroup, with its processes still in it, under the pid we now have."""
    assert CAP.parent is not None
    taken = CAP.parent / f"{launcher.CGROUP_PREFIX}{os.getpid()}"
    taken.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    made = ""
    try:
        (taken / "cgroup.procs").write_text(str(sleeper.pid))
        made = launcher.make_cgroup(str(CAP.parent), 12)
        assert made != str(taken) and os.path.basename(made).startswith(taken.name + "-")
        assert (Path(made) / "pids.max").read_text().strip() == "12"
        assert str(sleeper.pid) in (taken / "cgroup.procs").read_text()  # left alone
        limits.remove_stale(CAP.parent)  # its pid is alive (ours): both stay
        assert taken.exists() and Path(made).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (made, str(taken)):
            if path:
                launcher.remove_cgroup(path)


HYBRID_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/x\n0::/\n"
HYBRID_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup/pids rw,relatime shared:5 - cgroup cgroup rw,pids\n"
    "31 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:6 - cgroup cgroup rw,memory\n"
    "32 25 0:28 / /sys/fs/cgroup/unified rw,relatime shared:7 - cgroup2 cgroup2 rw\n"
)
UNIFIED_CGROUP = "0::/system.slice/memobot.service\n"
UNIFIED_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_own_cgroups_are_read_from_proc() -> None:
    hybrid = limits.own_cgroups(HYBRID_CGROUP, HYBRID_MOUNTS)
    assert hybrid.v1_pids == Path("/sys/fs/cgroup/pids")
    assert hybrid.v2 == Path("/sys/fs/cgroup/unified")
    unified = limits.own_cgroups(UNIFIED_CGROUP, UNIFIED_MOUNTS)
    assert unified.v2 == Path("/sys/fs/cgroup/system.slice/memobot.service")
    assert unified.v2_path == "/system.slice/memobot.service"
    assert unified.v1_pids is None
    # A mount of another part of the hierarchy (a container's bind mount) does not count.
    other = UNIFIED_MOUNTS.replace(" / /sys/fs/cgroup ", " /machine.slice /sys/fs/cgroup ")
    assert limits.own_cgroups(UNIFIED_CGROUP, other).v2 is None


def fake_v2(tmp_path: Path, controllers: str) -> Path:
    own = tmp_path / "memobot.service"
    own.mkdir()
    (own / "cgroup.controllers").write_text(controllers)
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (own / "cgroup.subtree_control").write_text("")
    return own


def test_a_cgroup_v2_is_used_only_where_it_was_delegated(tmp_path: Path) -> None:
    """Decisions only: this machine's v2 hierarchy has no pids controller to try for real."""
    own = fake_v2(tmp_path, "cpu memory pids\n")
    places = limits.CgroupPlaces(own, "/system.slice/memobot.service", None)
    assert limits.probe(places, 0).kind == "none"  # root in a cgroup nobody delegated
    assert "not delegated" in limits.probe(places, 0).why
    assert limits.probe(places, 1000).kind == "rlimit"  # not its folder
    os.chown(own, 1000, 1000)  # systemd's delegation to the unit's user
    assert limits.probe(places, 1000) == limits.TaskCap("cgroup2", own)
    os.chown(tmp_path, 1000, 1000)  # a user manager's subtree: every folder is the user's
    assert limits.probe(places, 1000).kind == "rlimit"
    at_root = limits.CgroupPlaces(own, "/", None)  # a container's own cgroup namespace
    assert limits.probe(at_root, 0) == limits.TaskCap("cgroup2", own)
    try:
        os.setxattr(own, "user.delegate", b"1")
    except OSError as exc:
        pytest.skip(f"no user xattrs on {tmp_path}: {exc}")
    assert limits.probe(places, 0) == limits.TaskCap("cgroup2", own)
    assert limits.probe(places, 1000) == limits.TaskCap("cgroup2", own)
    (own / "cgroup.controllers").write_text("cpu memory\n")
    assert limits.probe(places, 1000).kind == "rlimit"
    assert "no pids controller" in limits.probe(places, 0).why


def test_describe_names_the_cap_that_holds() -> None:
    v1 = limits.TaskCap("cgroup1", Path("/sys/fs/cgroup/pids"))
    assert "at most 64 processes per command (pids cgroup v1" in v1.summary(64)
    assert limits.TaskCap("rlimit", why="x").summary(64).startswith("about 64 processes")
    none = limits.TaskCap("none", why="no pids cgroup is mounted")
    assert not none.holds and none.summary(64).startswith("NO process cap")
    assert "files up to 100 MB (RLIMIT_FSIZE)" in limits.describe_limits(64, 100_000_000, v1)


# -- file size -------------------------------------------------------------------------------

BIG_WRITES = {
    # Sparse: the kernel checks the end offset, so nothing near 300 MB reaches the disk.
    "seek": "python3 -c \"f = open('big', 'wb', 0); f.seek(300_000_000); f.write(b'x')\" "
    "2>&1 | tail -1; ls -l big | cut -d' ' -f5",
    "truncate": "truncate -s 300M sparse; echo rc=$?",
}


def test_a_300_mb_file_fails_with_efbig(tmp_path: Path, llm: FakeLLMThread) -> None:
    results = agent_turn(tmp_path, llm, BIG_WRITES, tools=exec_section())
    assert "[Errno 27] File too large" in results["seek"], results["seek"]
    assert results["seek"].strip().endswith("\n0") or results["seek"].strip() == "0"
    assert "File too large" in results["truncate"] and "rc=1" in results["truncate"]
    assert (tmp_path / "ws" / "big").stat().st_size == 0


async def test_a_write_stops_at_max_file_bytes(gate: Gate, ws: Path) -> None:
    out = await run_exec(gate, ws, "head -c 3000000 /dev/zero > cut", max_file_bytes=1_000_000)
    assert "File too large" in out, out
    assert (ws / "cut").stat().st_size == 1_000_000


# -- workspace size --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_workspace_size_warning_comes_once_per_crossing(
    gate: Gate, ws: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    gate.usage = WorkspaceUsage(ws, 1_000_000, clock=clock)
    caplog.set_level(logging.INFO, logger="bot.gate.usage")

    def warnings() -> list[str]:
        # Only the usage warnings: asyncio's child watcher may log its own meanwhile.
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "bot.gate.usage"
        ]

    async def command(text: str) -> None:
        await run_exec(gate, ws, text)
        await gate.usage.settle()

    await command("head -c 2000000 /dev/urandom > blob")
    assert len(warnings()) == 1 and "past agent.workspaceWarnBytes (1 MB)" in warnings()[0]
    assert gate.usage.over
    await command("true")  # within the minute: not measured again
    clock.now += 61
    await command("true")  # measured, still over: no second warning
    assert len(warnings()) == 1
    await command("rm blob")  # within the minute
    assert gate.usage.over
    clock.now += 61
    await command("true")
    assert not gate.usage.over
    assert any("back under" in r.getMessage() for r in caplog.records)
    clock.now += 61
    await command("head -c 2000000 /dev/urandom > blob")
    assert len(warnings()) == 2


async def test_a_plain_turn_never_measures_the_workspace(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = parse_config(config_dict(tmp_path, llm.base_url, agent={"workspaceWarnBytes": 1000}))
    llm.script(reply("hi"))
    async with Harness(cfg, tmp_path / "config.json") as h:
        assert await h.ask("hello") == "hi"
        assert h.stack.gate.usage.size is None


def test_measuring_never_follows_a_link(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "data").write_bytes(os.urandom(200_000))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big").write_bytes(os.urandom(3_000_000))
    (ws / "out").symlink_to(tmp_path / "outside")  # 3 MB more, if followed
    (ws / "big").symlink_to(tmp_path / "outside" / "big")
    os.link(ws / "sub" / "data", ws / "again")  # one file, counted once
    size, complete = measure(ws)
    assert complete and 200_000 <= size < 400_000
    assert measure(ws, stop_above=100_000)[1] is False
    (tmp_path / "link").symlink_to(ws)
    assert measure(tmp_path / "link") == (0, True)  # the root itself may not be a link


def test_status_and_doctor_say_which_limits_hold(tmp_path: Path, llm: FakeLLMThread) -> None:
    path = tmp_path / "config.json"
    data = config_dict(
        tmp_path,
        llm.base_url,
        agent={"workspaceWarnBytes": 1_000_000},
        tools=exec_section(maxProcesses=300),
    )
    path.write_text(json.dumps(data))
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "blob").write_bytes(os.urandom(1_500_000))
    status = run_memobot("status", config=path).stdout
    doctor = run_memobot("doctor", config=path).stdout
    for out in (status, doctor):
        assert CAP.summary(300) in out, out
        assert "files up to 100 MB (RLIMIT_FSIZE)" in out
        assert "past agent.workspaceWarnBytes (1 MB)" in out
        if launcher.landlock_abi() >= 1 and launcher.seccomp_available():
            assert "Unix sockets blocked (seccomp)" in out
    assert "(for a gateway started from here)" in status
    assert "! workspace size: 1.5 MB, past agent.workspaceWarnBytes" in doctor, doctor


def test_doctor_shows_the_running_gateways_limits_and_warns_when_none_hold(
    tmp_path: Path,
) -> None:
    """Under systemd the gateway's cgroup is delegated while the shell's is not."""
    from bot.service.doctor import check_limits

    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg.agent.state_path.mkdir(parents=True)
    line = limits.TaskCap("none", why="no pids cgroup is mounted").summary(1024)
    status = {"pid": os.getpid(), "channels": {}, "exec_limits": line}
    (cfg.agent.state_path / "gateway.json").write_text(json.dumps(status))
    check = check_limits(cfg)
    assert check.status == "warn", check
    assert check.text == f"exec limits: {line} (in the running gateway)"
    assert "Delegate=pids" in check.fix


def test_the_size_line_says_where_the_warning_starts() -> None:
    assert describe(12_300_000, True, 2_000_000_000) == "12.3 MB (warns above 2 GB)"
    assert describe(3_000_000_000, False, 2_000_000_000).startswith("over 2 GB, past")
    assert "no size warning" in describe(5, True, 0)


async def test_a_reload_changes_the_limits_of_the_next_command(tmp_path: Path) -> None:
    from bot.app import build_agent
    from bot.service.reload import apply_config

    live = make_config(tmp_path, "http://127.0.0.1:9/v1")
    stack = build_agent(live, tmp_path / "config.json")
    try:
        new = make_config(
            tmp_path,
            "http://127.0.0.1:9/v1",
            agent={"workspaceWarnBytes": 5_000_000},
            tools=exec_section(maxProcesses=64, maxFileBytes=2_000_000),
        )
        result = apply_config(live, new, stack, channels=[])
        assert sorted(result.applied) == [
            "agent.workspaceWarnBytes",
            "tools.exec.maxFileBytes",
            "tools.exec.maxProcesses",
        ]
        exec_tool = stack.loop.runner.tools.get("exec")
        assert isinstance(exec_tool, ExecTool)
        assert (exec_tool.cfg.max_processes, exec_tool.cfg.max_file_bytes) == (64, 2_000_000)
        assert stack.gate.usage.warn_bytes == 5_000_000
    finally:
        await stack.close()


def test_config_limits_have_defaults_and_bounds(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9/v1")
    assert cfg.tools.exec.max_processes == 1024
    assert cfg.tools.exec.max_file_bytes == 100_000_000
    assert cfg.agent.workspace_warn_bytes == 2_000_000_000
    with pytest.raises(ConfigError, match="maxProcesses"):
        parse_config(config_dict(tmp_path, "http://x", tools={"exec": {"maxProcesses": 2}}))


@needs_landlock
async def test_a_confined_program_named_without_a_path_starts(gate: Gate, ws: Path) -> None:
    """MCP servers are often "npx" or "uvx": the launcher finds the program before Landlock,
    whose rules may keep the launcher's own interpreter from importing what execvp needs."""
    scope = ProcessScope(0.3)
    try:
        proc = await gate.spawn(["echo", "found"], cwd=ws, scope=scope, confine=True)
        out = bytearray()
        assert await proc.communicate(out.extend) == 0
        assert out.decode().strip() == "found"
        missing = await gate.spawn(["no-such-program-x"], cwd=ws, scope=scope, confine=True)
        with pytest.raises(GateRefused, match="not found"):
            await missing.communicate(out.extend)
    finally:
        await scope.close()
