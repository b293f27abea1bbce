"""The first hour with the command line (issue 10): what a new user hits, run as they run it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLM, FakeLLMThread, error, hang, reply
from tests.helpers import REPO, closed_port, config_dict, write_config, zygote
from tests.helpers.console import Pty

VENV_MEMOBOT = Path(sys.executable).parent / "memobot"


@pytest.fixture
def llm() -> Iterator[FakeLLMThread]:
    with FakeLLM.start_in_thread() as server:
        yield server


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MEMOBOT_"))}
    return {**env, **(extra or {})}


def cli(
    *args: str,
    config: Path | None = None,
    stdin: int | str | None = None,
    env: dict[str, str] | None = None,
    umask: int | None = None,
    cwd: Path = REPO,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """``python -m bot ARGS`` with stdin from a file descriptor (``subprocess.DEVNULL``) or text
    (forked from the suite's zygote: tests.helpers.zygote)."""
    return zygote.run(
        [*(["--config", str(config)] if config else []), *args],
        stdin=stdin if isinstance(stdin, int) else None,
        input=stdin if isinstance(stdin, str) else "",
        timeout=timeout,
        env=_env({"PYTHONPATH": str(REPO), **(env or {})}),
        cwd=cwd,
        umask=umask,
    )


def pty_memobot(
    *args: str, config: Path | None = None, cwd: Path = REPO, env: dict[str, str] | None = None
) -> Pty:
    argv = [sys.executable, "-m", "bot", *(["--config", str(config)] if config else []), *args]
    return Pty(argv, _env({"PYTHONPATH": str(REPO), "TERM": "dumb", **(env or {})}), cwd)


# -- stdin of any kind -----------------------------------------------------------------------


def test_stdin_the_loop_cannot_watch_ends_cleanly(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    done = cli("agent", "-s", "x", config=cfg, stdin=subprocess.DEVNULL, timeout=20)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and done.stderr == ""
    assert llm.requests == []


def test_resumed_turn_then_devnull_exits(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    crashed = cli(
        "agent", "-m", "hello", "-s", "x", config=cfg, env={"MEMOBOT_FAILPOINTS": "final_response"}
    )
    assert crashed.returncode == -signal.SIGKILL
    done = cli("agent", "-s", "x", config=cfg, stdin=subprocess.DEVNULL, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "echo: hello\n"


def test_stdin_through_a_reader_thread_one_message_per_line(
    tmp_path: Path, llm: FakeLLMThread
) -> None:
    # A character device the event loop refuses: lines come through the reader thread.
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    cfg = write_config(tmp_path, llm.base_url)
    script = tmp_path / "lines.txt"
    script.write_text("one\ntwo\n")
    with open(script) as fh:  # a regular file: the plain path
        done = cli("agent", "-s", "f", config=cfg, stdin=fh.fileno())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["echo: one", "echo: two"]


# -- exit codes ------------------------------------------------------------------------------


def test_unreachable_llm_exits_1_naming_the_endpoint(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    done = cli("agent", "-m", "hi", config=cfg)
    assert done.returncode == 1, done.stderr
    assert "http://127.0.0.1:9/v1" in done.stderr and "llm.baseUrl" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("status", "setting"), [(401, "llm.apiKey"), (404, "llm.model")])
def test_rejected_turn_exits_1(
    tmp_path: Path, llm: FakeLLMThread, status: int, setting: str
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(error(status))
    done = cli("agent", "-m", "hi", config=cfg)
    assert done.returncode == 1, done.stderr
    assert setting in done.stdout + done.stderr


def test_piped_turn_failure_exits_1(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply("fine"), error(401))
    done = cli("agent", "-s", "p", config=cfg, stdin="one\ntwo\nthree\n")
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[0] == "fine"
    assert done.stdout.splitlines()[-1] == "echo: three"  # later lines still answered


def test_ctrl_c_during_one_shot_exits_130(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(hang())
    proc = zygote.popen(
        ["--config", str(cfg), "agent", "-m", "hi"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env({"PYTHONPATH": str(REPO)}),
        cwd=REPO,
    )
    try:
        llm.wait_for_requests(1, timeout=20)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err


def test_usage_errors_exit_2_without_an_llm_call(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    for args in (("-m", ""), ("-m", "  "), ("-s", "x:"), ("-s", "telegram:1", "-m", "hi")):
        done = cli("agent", *args, config=cfg)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert llm.requests == []


def test_docs_have_one_exit_code_table() -> None:
    readme = (REPO / "docs" / "commands.md").read_text()
    assert readme.count("| exit code |") == 1
    table = readme.split("| exit code |", 1)[1].split("\n\n", 1)[0]
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 78 |", "| 130 |", "| 141 |"):
        assert code in table


# -- config path and config errors -----------------------------------------------------------


@pytest.mark.parametrize(
    "args", [("status",), ("agent", "-m", "hi"), ("memory", "history"), ("dream",), ("doctor",)]
)
def test_missing_explicit_config_is_an_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    missing = tmp_path / "typo.json"
    done = cli(*args, config=missing)
    assert done.returncode == 78 if args != ("doctor",) else done.returncode != 0
    assert str(missing) in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_missing_config_from_environment_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "typo.json"
    done = cli("status", env={"MEMOBOT_CONFIG": str(missing)})
    assert done.returncode == 78 and str(missing) in done.stderr


def test_unknown_key_did_you_mean_and_strict_booleans(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    data = config_dict(tmp_path, "http://127.0.0.1:9/v1")
    data["llm"]["modle"] = "x"
    data["channels"] = {"telegram": {"enabled": "yes", "token": "1:x"}}
    data["tools"]["exec"]["network"] = 1
    cfg.write_text(json.dumps(data))
    done = cli("status", config=cfg)
    assert done.returncode == 78
    assert "llm.modle" in done.stderr and "did you mean 'model'" in done.stderr
    assert "channels.telegram.enabled" in done.stderr
    assert "tools.exec.network" in done.stderr
    assert "config.example.json" not in done.stderr
    assert "docs/configuration.md" in done.stderr


# -- onboard ---------------------------------------------------------------------------------


def test_onboard_hint_names_the_executable_as_invoked(tmp_path: Path) -> None:
    cfg = tmp_path / "home" / "config.json"
    done = subprocess.run(
        [str(VENV_MEMOBOT), "--config", str(cfg), "onboard", "--workspace", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert f"{VENV_MEMOBOT} --config {cfg} onboard --base-url" in done.stdout
    assert f"Then chat: {VENV_MEMOBOT} --config {cfg} agent" in done.stdout
    for flag in ("--base-url", "--api-key", "--model", "OPENAI_API_KEY"):
        assert flag in done.stdout  # not a terminal: the flags are explained


def test_onboard_stores_absolute_paths_and_says_where_state_goes(tmp_path: Path) -> None:
    cfg = tmp_path / "home" / "config.json"
    done = cli("onboard", "--workspace", "myws", "--model", "m", config=cfg, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    stored = json.loads(cfg.read_text())["agent"]
    assert stored["workspace"] == str(tmp_path / "myws")
    assert Path(stored["stateDir"]).is_absolute()
    assert (tmp_path / "myws" / "AGENTS.md").is_file()
    assert f"State: {stored['stateDir']}" in done.stdout
    # memobot's own records live with its config, not in the real home folder.
    assert stored["stateDir"] == str(tmp_path / "home" / "state")


def test_onboard_asks_for_the_llm_in_a_terminal(tmp_path: Path) -> None:
    cfg = tmp_path / "home" / "config.json"
    term = pty_memobot("onboard", "--workspace", str(tmp_path / "ws"), config=cfg)
    term.read_until("Choose")
    for preset in ("OpenAI", "Ollama", "vLLM", "OpenRouter"):
        assert preset in term.text
    term.send("2\r")  # Ollama
    term.read_until("Base URL")
    term.send("\r")  # keep the preset's URL
    term.read_until("Model")
    term.send("qwen2.5\r")
    # Nothing listens there: said before anything is written, and saved only when asked to.
    term.read_until("Save this config anyway? [y/N]")
    assert "✗ LLM http://localhost:11434/v1 unreachable" in term.text
    term.send("y\r")
    term.read_until("Which ones?")
    term.send("\r")  # no chat channel
    assert term.wait() == 0, term.text
    llm = json.loads(cfg.read_text())["llm"]
    assert llm["baseUrl"] == "http://localhost:11434/v1" and llm["model"] == "qwen2.5"
    assert "agent" in term.text


def test_onboard_openai_preset_asks_for_the_key_unechoed(tmp_path: Path) -> None:
    cfg = tmp_path / "home" / "config.json"
    # The model check goes through a proxy that is not there: it never leaves this machine.
    no_proxy = {"HTTPS_PROXY": f"http://127.0.0.1:{closed_port()}"}
    term = pty_memobot("onboard", "--workspace", str(tmp_path / "ws"), config=cfg, env=no_proxy)
    term.read_until("Choose")
    term.send("1\r")
    term.read_until("API key")
    term.send("sk-test-abcdefghijklmnopqrstu\r")
    term.read_until("Model")
    term.send("\r")
    term.read_until("Save this config anyway? [y/N]")
    term.send("y\r")
    term.read_until("Which ones?")
    term.send("none\r")
    assert term.wait() == 0, term.text
    assert "sk-test-abcdefghijklmnopqrstu" not in term.text  # not echoed
    llm = json.loads(cfg.read_text())["llm"]
    assert llm["apiKey"] == "sk-test-abcdefghijklmnopqrstu" and llm["model"] == "gpt-4o-mini"
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600


# -- pipes, dream, history -------------------------------------------------------------------


def test_closed_stdout_is_a_quiet_exit(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    _archive(tmp_path / "ws", [(datetime.now(UTC), "a line for the pipe")])
    commands = (("status",), ("--help",), ("memory", "history"), ("agent", "-m", "hi"))
    for args in (*commands, ("agent", "-s", "piped")):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader (head -3) is already gone
        try:
            proc = zygote.popen(
                ["--config", str(cfg), *args],
                stdin=subprocess.PIPE,
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                env=_env({"PYTHONPATH": str(REPO)}),
                cwd=REPO,
            )
        finally:
            os.close(write_end)
        _, err = proc.communicate("one\ntwo\n" if "piped" in args else "", timeout=30)
        assert err == "", (args, err)
        # argparse's help ignores a closed stdout itself and exits 0.
        assert proc.returncode == (0 if args == ("--help",) else 141), args


def test_dream_prints_its_result_once(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    assert cli("onboard", config=cfg).returncode == 0
    done = cli("dream", config=cfg)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    assert done.stdout.strip() not in done.stderr


def _archive(ws: Path, entries: list[tuple[datetime, str]]) -> None:
    (ws / "memory").mkdir(parents=True, exist_ok=True)
    with open(ws / "memory" / "history.jsonl", "w") as fh:
        for i, (when, text) in enumerate(entries, 1):
            stamp = when.astimezone(UTC).isoformat()
            line = {"cursor": i, "timestamp": stamp, "session": "cli:d", "content": text}
            fh.write(json.dumps(line) + "\n")
    (ws / "memory" / ".cursor").write_text(f"{len(entries)}\n")


def test_since_and_until_take_words_and_spans(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    now = datetime.now().astimezone().replace(hour=12, minute=0, second=0, microsecond=0)
    _archive(
        tmp_path / "ws",
        [
            (now - timedelta(days=10), "talked about kayaks long ago"),
            (now - timedelta(days=1), "talked about kayaks yesterday"),
            (now, "talked about kayaks today"),
        ],
    )
    yesterday = cli("memory", "history", "--since", "yesterday", "--until", "yesterday", config=cfg)
    assert yesterday.returncode == 0, yesterday.stderr
    assert "yesterday" in yesterday.stdout and "today" not in yesterday.stdout
    assert "long ago" not in yesterday.stdout
    week = cli("memory", "search", "kayaks", "--since", "7d", config=cfg)
    assert week.returncode == 0, week.stderr
    assert "today" in week.stdout and "yesterday" in week.stdout
    assert "long ago" not in week.stdout
    today = cli("memory", "history", "--since", "today", config=cfg)
    assert "talked about kayaks today" in today.stdout and "yesterday" not in today.stdout
    dated = cli(
        "memory", "history", "--until", (date.today() - timedelta(days=5)).isoformat(), config=cfg
    )
    assert "long ago" in dated.stdout and "today" not in dated.stdout
    bad = cli("memory", "history", "--since", "last tuesday", config=cfg)
    assert bad.returncode == 2 and "yesterday" in bad.stderr


# -- interactive -----------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["exit", "quit", "/exit"])
def test_exit_words_end_the_interactive_session(
    tmp_path: Path, llm: FakeLLMThread, word: str
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    term = pty_memobot("agent", "-s", "i", config=cfg)
    term.read_until("you> ")
    term.send(f"{word}\r")
    assert term.wait() == 0, term.text
    assert llm.requests == []


def test_thinking_line_until_the_answer(tmp_path: Path, llm: FakeLLMThread) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    llm.script(reply("the long answer", delay=1.5))
    term = pty_memobot("agent", "-s", "t", config=cfg)
    term.read_until("you> ")
    term.send("hello\r")
    term.read_until("thinking")
    term.read_until("the long answer")
    term.read_until("you> ")
    term.send("exit\r")
    assert term.wait() == 0, term.text
    after = term.text.rsplit("thinking", 1)[1]
    assert "\x1b[K" in after.split("the long answer", 1)[0] or "\r" in after  # erased


# -- file modes ------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_private_modes_whatever_the_umask(tmp_path: Path, llm: FakeLLMThread, umask: int) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    state = tmp_path / "state"
    assert cli("agent", "-m", "hi", "-s", "u", config=cfg, umask=umask).returncode == 0
    session = next((state / "sessions").glob("*.jsonl"))
    text = session.read_text().splitlines()
    session.write_text("\n".join([text[0], "{not json", *text[1:]]) + "\n")
    assert cli("agent", "-m", "again", "-s", "u", config=cfg, umask=umask).returncode == 0
    assert cli("memory", "search", "hi", config=cfg, umask=umask).returncode == 0
    corrupt = next((state / "sessions").glob("*.corrupt-*"))
    for folder in (state, state / "sessions", state / "index"):
        assert _mode(folder) == 0o700, folder
    for file in (session, corrupt, state / "index" / "memory.sqlite"):
        assert _mode(file) == 0o600, file
    for extra in (state / "index").iterdir():
        assert _mode(extra) & 0o077 == 0, extra


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_gateway_status_and_cli_history_are_private(
    tmp_path: Path, llm: FakeLLMThread, umask: int
) -> None:
    cfg = write_config(tmp_path, llm.base_url)
    state = tmp_path / "state"
    proc = zygote.popen(
        ["--config", str(cfg), "gateway"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env({"PYTHONPATH": str(REPO)}),
        cwd=REPO,
        umask=umask,
    )
    try:
        end = time.monotonic() + 20
        while not (state / "gateway.json").exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert _mode(state / "gateway.json") == 0o600  # removed when the gateway stops
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    # The interactive chat's line history.
    os.umask(old := os.umask(umask))
    try:
        term = pty_memobot("agent", "-s", "h", config=cfg)
    finally:
        os.umask(old)
    term.read_until("you> ")
    term.send("hello\r")
    term.read_until("echo: hello")
    term.read_until("you> ")
    term.send("exit\r")
    assert term.wait() == 0
    assert _mode(state / "cli_history") == 0o600
