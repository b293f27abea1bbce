"""Issue 9, attacked the way a hostile model (steered by a message or a web page) would.

Each attack runs through the real ``memobot`` command (a subprocess) with the fake LLM scripted
to call the real tools; what the tools returned is read back from the next LLM request, and
what the attack tried to touch is checked on disk and in /proc. Where it helps to prove that a
test can fail, the same attack is also run with the protection switched off by config.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.gate import launcher
from tests.fakes.llm_server import FakeLLM, FakeLLMThread, call, reply, tool_step
from tests.helpers import REPO, request_messages, run_memobot, write_config

pytestmark = pytest.mark.skipif(launcher.landlock_abi() < 1, reason="needs Landlock")

API_KEY = "sk-attack-target-0123456789abcdef"
ENV_TOKEN = "7700000001:AAH-environment-token-never-shown"


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def attack_config(tmp_path: Path, llm: FakeLLMThread, **tools: Any) -> Path:
    path = write_config(tmp_path, llm.base_url, tools=tools)
    data = json.loads(path.read_text())
    data["llm"]["apiKey"] = API_KEY
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def tool_results(llm: FakeLLMThread, request: int = 1) -> dict[str, str]:
    """The tool results the model saw in its ``request``-th request, by call id."""
    messages = request_messages(llm.requests[request])
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def run_attack(
    tmp_path: Path, llm: FakeLLMThread, commands: dict[str, str], **tools: Any
) -> dict[str, str]:
    """One turn in which the model runs each command through ``exec``; returns the results."""
    cfg = attack_config(tmp_path, llm, **tools)
    calls = [call("exec", {"command": cmd}, id=cid) for cid, cmd in commands.items()]
    llm.script(tool_step(*calls), reply("done"))
    done = run_memobot(
        "agent", "-m", "please run these", "-s", "cli:attack", config=cfg,
        env={"MEMOBOT_TEST_BOT_TOKEN": ENV_TOKEN},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    return tool_results(llm)


MEMOBOT_PID = "$(cut -d' ' -f4 /proc/$PPID/stat)"  # the launcher's parent


def secret_reads(config: Path) -> dict[str, str]:
    return {
        "abs": f"cat {config}",
        "home": "cat $HOME/../config.json",
        "environ": f"tr '\\0' '\\n' < /proc/{MEMOBOT_PID}/environ",
        "all_environs": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; echo scanned",
        "env": "env",
        "sessions": f"cat {config.parent}/state/sessions/* 2>&1; ls {config.parent}/state",
    }


def test_the_shell_cannot_read_the_config_the_state_or_memobots_environment(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    config = tmp_path / "config.json"
    # A first turn so a session file exists to be stolen.
    results = run_attack(tmp_path, llm, secret_reads(config))
    for cid, out in results.items():
        assert API_KEY not in out, cid
        assert ENV_TOKEN not in out, cid
        assert "please run these" not in out, cid  # another chat's transcript
    assert "Permission denied" in results["abs"]
    assert "Permission denied" in results["home"]
    assert "Permission denied" in results["environ"]
    assert results["all_environs"].strip().endswith("scanned")
    assert "Permission denied" in results["sessions"]
    assert f"HOME={tmp_path / 'ws'}" in results["env"]


def test_with_the_sandbox_off_the_same_attack_succeeds(tmp_path: Path, llm: FakeLLMThread) -> None:
    """The control: proves the attack above would find the secrets without the confinement."""
    config = tmp_path / "config.json"
    results = run_attack(tmp_path, llm, secret_reads(config), exec={"sandbox": "off"})
    assert API_KEY in results["abs"]
    assert API_KEY in results["home"]
    assert ENV_TOKEN in results["environ"]


def test_the_shell_cannot_rewrite_the_config_through_a_link(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    config = tmp_path / "config.json"
    before = None
    commands = {
        "symlink": f"ln -s {config} cfg; echo '{{\"x\": 1}}' > cfg; cat cfg",
        "hardlink": f"ln {config} hard && echo linked",
        "direct": f"echo '{{}}' > {config}",
        "state": f'echo \'{{"role": "system"}}\' >> {tmp_path}/state/sessions/cli_attack.jsonl',
        "move": f"mv {config} moved.json",
    }
    cfg = attack_config(tmp_path, llm)
    before = cfg.read_bytes()
    llm.script(tool_step(*[call("exec", {"command": c}, id=k) for k, c in commands.items()]))
    llm.script(reply("done"))
    done = run_memobot("agent", "-m", "go", "-s", "cli:attack", config=cfg)
    assert done.returncode == 0, done.stderr
    results = tool_results(llm)
    assert config.read_bytes() == before
    assert "linked" not in results["hardlink"]
    for cid in ("symlink", "direct", "state", "move"):
        assert "ermission denied" in results[cid] or "not permitted" in results[cid], cid
    sessions = (tmp_path / "state" / "sessions").glob("*.jsonl")
    assert not any('"role": "system"' in p.read_text() for p in sessions)


def test_file_tools_refuse_the_config_and_the_state_folder(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    cfg = attack_config(tmp_path, llm)
    (tmp_path / "ws").mkdir()
    os.symlink(tmp_path / "state", tmp_path / "ws" / "state_link")
    llm.script(
        tool_step(
            call("read_file", {"path": str(cfg)}, id="read_cfg"),
            call("read_file", {"path": "../config.json"}, id="read_rel"),
            call("write_file", {"path": "state_link/sessions/x.jsonl", "content": "{}"}, id="w"),
            call("read_file", {"path": "/proc/self/environ"}, id="environ"),
            call("read_file", {"path": "/etc/hostname"}, id="system"),
            call("write_file", {"path": "/etc/memobot-test", "content": "x"}, id="w_system"),
        ),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", "-s", "cli:files", config=cfg)
    assert done.returncode == 0, done.stderr
    results = tool_results(llm)
    for cid in ("read_cfg", "read_rel", "w", "environ", "w_system"):
        assert results[cid].startswith("Error: path"), (cid, results[cid])
        assert API_KEY not in results[cid]
    assert not results["system"].startswith("Error"), results["system"]  # the system: read-only
    assert not (tmp_path / "state" / "sessions" / "x.jsonl").exists()
    assert not Path("/etc/memobot-test").exists()


# -- processes -----------------------------------------------------------------------------------


def sleepers(tag: str) -> list[int]:
    """Living processes whose command line carries ``tag`` (a unique sleep duration)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tag in cmdline and "sleep" in cmdline and state not in ("Z", "X"):
            found.append(int(name))
    return found


def wait_for(predicate: Any, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def unique_seconds() -> str:
    return f"{4000 + uuid.uuid4().int % 50000}.{uuid.uuid4().int % 1000}"


@pytest.fixture
def kill_leftovers() -> Iterator[list[str]]:
    tags: list[str] = []
    yield tags
    for tag in tags:
        for pid in sleepers(tag):
            os.kill(pid, signal.SIGKILL)


def test_no_process_outlives_its_turn(
    tmp_path: Path, llm: FakeLLMThread, kill_leftovers: list[str]
) -> None:
    bg, sid, dbl, keep = (unique_seconds() for _ in range(4))
    kill_leftovers.extend([bg, sid, dbl, keep])
    commands = {
        "bg": f"sleep {bg} >/dev/null 2>&1 &",
        "setsid": f"setsid sleep {sid} &",
        "double_fork": f"(setsid sh -c 'sleep {dbl} >/dev/null 2>&1 &' &); echo forked",
        "keep": f"sleep {keep} >/dev/null 2>&1 & echo $! > keep.pid",
    }
    cfg = attack_config(tmp_path, llm)
    llm.script(
        tool_step(*[call("exec", {"command": c}, id=k) for k, c in commands.items()]),
        # Within the turn, background jobs keep running (a server started for the next step).
        tool_step(
            call("exec", {"command": "test -d /proc/$(cat keep.pid) && echo alive"}, id="check")
        ),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", "-s", "cli:procs", config=cfg)
    assert done.returncode == 0, done.stderr
    assert tool_results(llm, 2)["check"] == "alive\n"
    for tag in (bg, sid, dbl, keep):
        assert not sleepers(tag), f"sleep {tag} outlived the turn"


def test_a_timeout_kills_setsid_children_too(
    tmp_path: Path, llm: FakeLLMThread, kill_leftovers: list[str]
) -> None:
    tag = unique_seconds()
    kill_leftovers.append(tag)
    cfg = attack_config(tmp_path, llm)
    llm.script(
        tool_step(call("exec", {"command": f"setsid sleep {tag} & sleep 60", "timeout": 1})),
        # Still inside the turn: the escaped child must already be gone.
        tool_step(call("exec", {"command": ALIVE_SLEEPERS.format(tag=tag)})),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", "-s", "cli:timeout", config=cfg)
    assert done.returncode == 0, done.stderr
    assert "timed out" in next(iter(tool_results(llm, 1).values()))
    seen = list(tool_results(llm, 2).values())[-1]
    assert seen == "end\n", seen


ALIVE_SLEEPERS = (
    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null"
    " | grep '^sleep {tag}'; echo end"
)


def start_agent(cfg: Path, message: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.Popen(
        [sys.executable, "-m", "bot", "--config", str(cfg), "agent", "-m", message],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, cwd=REPO,
    )  # fmt: skip


def children_of(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except (OSError, NotADirectoryError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(name))
    return out


def test_a_sigkilled_memobot_leaves_no_tool_process(
    tmp_path: Path, llm: FakeLLMThread, kill_leftovers: list[str]
) -> None:
    fg, bg = unique_seconds(), unique_seconds()
    kill_leftovers.extend([fg, bg])
    cfg = attack_config(tmp_path, llm)
    llm.script(tool_step(call("exec", {"command": f"setsid sleep {bg} & sleep {fg}"})))
    agent = start_agent(cfg, "go")
    try:
        assert wait_for(lambda: sleepers(fg) and sleepers(bg)), "the command never started"
        agent.kill()
        agent.wait(10)
    finally:
        agent.kill()
    assert wait_for(lambda: not sleepers(fg) and not sleepers(bg), 10), "a tool process survived"


def test_the_next_start_kills_what_a_dead_run_left(
    tmp_path: Path, llm: FakeLLMThread, kill_leftovers: list[str]
) -> None:
    """The launcher itself died too (SIGKILL): its orphans are found by their marker."""
    tag = unique_seconds()
    kill_leftovers.append(tag)
    cfg = attack_config(tmp_path, llm)
    llm.script(tool_step(call("exec", {"command": f"setsid sleep {tag} & sleep 300"})))
    agent = start_agent(cfg, "go")
    try:
        assert wait_for(lambda: sleepers(tag)), "the command never started"
        for pid in children_of(agent.pid):
            os.kill(pid, signal.SIGKILL)  # the launcher: no subtree cleanup
        agent.kill()
        agent.wait(10)
    finally:
        agent.kill()
    time.sleep(0.3)
    assert sleepers(tag), "expected an orphan for the next start to find"
    llm.script(reply("back"))
    done = run_memobot("agent", "-m", "hello again", "-s", "cli:other", config=cfg)
    assert done.returncode == 0, done.stderr
    assert wait_for(lambda: not sleepers(tag), 5), "the orphan of the dead run survived"


def test_the_shell_cannot_signal_or_trace_memobot(tmp_path: Path, llm: FakeLLMThread) -> None:
    if launcher.landlock_abi() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    results = run_attack(
        tmp_path,
        llm,
        {
            "kill": f"kill -9 {MEMOBOT_PID}; echo sent $?",
            "kill_launcher": "kill -9 $PPID; echo sent $?",
            "kill_all": "kill -9 -1; echo still here",
        },
    )
    # memobot answered ("done" checked in run_attack), so it survived every kill.
    assert "sent 1" in results["kill"]
    assert "sent 1" in results["kill_launcher"]


def test_confined_commands_can_be_denied_the_network(tmp_path: Path, llm: FakeLLMThread) -> None:
    port = llm.base_url.split(":")[-1].split("/")[0]
    probe = (
        'python3 -c "import socket; s=socket.socket(); '
        f"s.connect(('127.0.0.1', {port})); print('connected')\" 2>&1 | tail -1"
    )
    results = run_attack(tmp_path, llm, {"tcp": probe}, exec={"network": False})
    assert "PermissionError" in results["tcp"], results["tcp"]
    llm.reset()
    results = run_attack(tmp_path, llm, {"tcp": probe})
    assert results["tcp"].strip() == "connected"


def test_exec_is_refused_where_the_kernel_cannot_confine(
    tmp_path: Path, llm: FakeLLMThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the in-process agent: the kernel's answer is replaced by "no Landlock"."""
    import asyncio

    from tests.helpers import Harness, make_config

    monkeypatch.setattr(launcher, "landlock_abi", lambda: 0)
    marker = tmp_path / "ws" / "ran"
    llm.script(tool_step(call("exec", {"command": f"touch {marker}"})), reply("done"))

    async def turn() -> str:
        cfg = make_config(tmp_path, llm.base_url)
        async with Harness(cfg, tmp_path / "config.json") as h:
            return await h.ask("go")

    assert asyncio.run(turn()) == "done"
    result = next(iter(tool_results(llm).values()))
    assert result.startswith("Error: exec refused"), result
    assert 'tools.exec.sandbox to "off"' in result
    assert not marker.exists()


def test_status_and_doctor_name_the_confinement(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = attack_config(tmp_path, llm)
    status = run_memobot("status", config=cfg)
    assert f"Landlock ABI {launcher.landlock_abi()}" in status.stdout
    off = attack_config(tmp_path, llm, exec={"sandbox": "off"})
    status = run_memobot("status", config=off)
    assert 'none (tools.exec.sandbox is "off")' in status.stdout
    doctor = run_memobot("doctor", config=off)
    assert 'exec confinement: none (tools.exec.sandbox is "off")' in doctor.stdout
    llm.script(reply("hi"))
    started = run_memobot("agent", "-m", "hi", config=off)
    assert "WARNING" in started.stderr and "exec confinement: none" in started.stderr


def test_a_process_whose_main_thread_exited_is_still_killed(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    """A zombie thread-group leader with live threads looks dead in /proc/<pid>/stat."""
    script = (
        "import ctypes, os, threading, time\n"
        "def beat():\n"
        "    while True:\n"
        "        open('beat.log', 'a').write('x')\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=beat).start()\n"
        "time.sleep(0.1)\n"
        "ctypes.CDLL(None).syscall(60, 0)  # SYS_exit of the main thread only\n"
    )
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "ghost.py").write_text(script)
    cfg = attack_config(tmp_path, llm)
    llm.script(
        tool_step(call("exec", {"command": "python3 ghost.py >/dev/null 2>&1 & sleep 0.5"})),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", "-s", "cli:ghost", config=cfg)
    assert done.returncode == 0, done.stderr
    beats = tmp_path / "ws" / "beat.log"
    assert beats.exists(), "the thread never ran"
    size = beats.stat().st_size
    time.sleep(0.5)
    assert beats.stat().st_size == size, "a thread of the turn's process is still running"


# -- the file tools against a path that changes under them ---------------------------------------

SWAPPER = """\
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
while True:
    libc.renameat2(-100, a, -100, b, 2)  # RENAME_EXCHANGE: a and b trade places atomically
"""


async def race(tmp_path: Path, setup: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Start ``setup`` (which starts a swapper) with exec, then make the file-tool ``calls``
    while it runs, all in one turn's process scope, as a hostile model would."""
    import asyncio

    from bot.config import ToolsConfig
    from bot.gate import Gate, ProcessScope
    from bot.tools import build_default_tools
    from bot.tools.base import ToolContext

    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "swap.py").write_text(SWAPPER)
    gate = Gate(ws, protected=[tmp_path / "config.json", tmp_path / "state"])
    ctx = ToolContext(workspace=ws, gate=gate, processes=ProcessScope(0.5))
    tools = build_default_tools(ToolsConfig())
    try:
        started = await tools.execute("exec", json.dumps({"command": setup}), ctx)
        assert started.strip().endswith("started"), started
        out = []
        for name, args in calls:
            out.append(await asyncio.wait_for(tools.execute(name, json.dumps(args), ctx), 10))
        return out
    finally:
        assert ctx.processes is not None
        await ctx.processes.close()
        gate.close()


async def test_a_symlink_swapped_in_after_the_check_leads_nowhere(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"llm": {"apiKey": API_KEY}}))
    state = tmp_path / "state" / "sessions"
    state.mkdir(parents=True)
    setup = (
        f"echo decoy > f; ln -s {config} f2; mkdir d; ln -s {state} d2; "
        "python3 swap.py f f2 >/dev/null 2>&1 & python3 swap.py d d2 >/dev/null 2>&1 & "
        "sleep 0.3; echo started"
    )
    calls: list[tuple[str, dict[str, Any]]] = []
    for i in range(30):
        calls.append(("read_file", {"path": "f"}))
        calls.append(("write_file", {"path": f"d/planted{i}.jsonl", "content": "{}"}))
    results = await race(tmp_path, setup, calls)
    assert not any(API_KEY in r for r in results)
    assert sorted(p.name for p in state.iterdir()) == []
    assert any(r == "decoy\n" for r in results), "the race never ran"


async def test_a_fifo_swapped_in_cannot_hang_the_file_tools(tmp_path: Path) -> None:
    setup = (
        "echo plain > f; mkfifo p; python3 swap.py f p >/dev/null 2>&1 & sleep 0.3; echo started"
    )
    results = await race(tmp_path, setup, [("read_file", {"path": "f"})] * 40)
    assert all(r == "plain\n" or r.startswith("Error:") for r in results), results


async def test_huge_sparse_files_are_read_in_bounded_memory(tmp_path: Path) -> None:
    import resource

    setup = "printf 'a%.0s' $(seq 9000) > big; truncate -s 3G big; echo started"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    read, edit = await race(
        tmp_path,
        setup,
        [
            ("read_file", {"path": "big"}),
            ("edit_file", {"path": "big", "old_text": "aaa", "new_text": "b"}),
        ],
    )
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert "at least" in read or "binary" in read, read[-300:]
    assert edit.startswith("Error:") and "up to" in edit, edit
    assert grown_mib < 100, f"reading a sparse 3 GB file grew memory by {grown_mib:.0f} MiB"


def test_the_systems_own_secrets_stay_closed(tmp_path: Path, llm: FakeLLMThread) -> None:
    """memobot may run as root, and root owns /etc/shadow: the policy carves it out."""
    if not Path("/etc/shadow").exists():
        pytest.skip("no /etc/shadow here")
    cfg = attack_config(tmp_path, llm)
    llm.script(
        tool_step(
            call("exec", {"command": "head -c 40 /etc/shadow; echo; head -c 20 /etc/passwd"}),
            call("read_file", {"path": "/etc/shadow"}),
        ),
        reply("done"),
    )
    done = run_memobot("agent", "-m", "go", "-s", "cli:shadow", config=cfg)
    assert done.returncode == 0, done.stderr
    shell, file_tool = tool_results(llm).values()
    assert "Permission denied" in shell and "root:" in shell  # passwd readable, shadow not
    assert file_tool.startswith("Error: path")
