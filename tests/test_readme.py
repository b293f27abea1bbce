"""The README is a first-hour page and docs/ the reference: short, readable lines, links that
lead somewhere, commands that run as written (parsed by memobot's own parser, in-process), and
option defaults that are the code's."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest
from pydantic import BaseModel

from bot.cli import build_parser
from bot.config import ApiKeyConfig, Config, McpServerConfig
from bot.config_base import ChannelConfig

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
FIRST_PART_MAX_LINES = 200
MAX_LINE = 120

FENCE = re.compile(r"^\s*```")
# [text](target): the target up to the first space or closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def _code(text: str) -> list[str]:
    """The text of every fenced block line and every inline code span."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            out.append(line)
        else:
            out += [m.group(2) for m in CODE_SPAN.finditer(line)]
    return out


def _anchors(text: str) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces to hyphens,
    a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = CODE_SPAN.sub(lambda c: c.group(2), m.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _readme_first_part() -> list[str]:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert "## Reference" in lines, "the README has no '## Reference' section"
    return lines[: lines.index("## Reference")]


def test_first_part_of_readme_is_short() -> None:
    first = _readme_first_part()
    assert len(first) < FIRST_PART_MAX_LINES, f"{len(first)} lines before '## Reference'"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_lines_are_of_normal_length(page: Path) -> None:
    """Prose wraps; code blocks and table rows may run long."""
    text = page.read_text(encoding="utf-8")
    long = [
        f"{_name(page)}:{n}: {len(line)} characters"
        for n, line in _prose_lines(text)
        if len(line) > MAX_LINE and not line.lstrip().startswith("|")
    ]
    assert not long, "\n".join(long)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_lead_to_a_file_and_heading(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for n, line in _prose_lines(text):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{_name(page)}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md":
                if anchor not in _anchors(dest.read_text(encoding="utf-8")):
                    broken.append(f"{_name(page)}:{n}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


# memobot as a command (`memobot status`, `.venv/bin/memobot status`), never the Slack slash
# command `/memobot stop` or a file name such as `memobot.service`.
INVOCATION = re.compile(
    r"(?:^|(?<=[\s`(])|(?<=\.venv/bin/))memobot[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?"
)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_memobot_subcommand_named_is_real(page: Path) -> None:
    commands = _subparsers(build_parser())
    wrong = []
    for code in _code(page.read_text(encoding="utf-8")):
        for m in INVOCATION.finditer(code):
            name, sub = m.group(1), m.group(2)
            if name not in commands:
                wrong.append(f"{_name(page)}: memobot {name}")
                continue
            nested = _subparsers(commands[name])
            if nested and sub is not None and sub not in nested:
                wrong.append(f"{_name(page)}: memobot {name} {sub}")
    assert not wrong, "\n".join(wrong)


def _readme_commands() -> list[list[str]]:
    """Each `.venv/bin/memobot ...` command the README's first part writes, as argv (one
    command of a `&&` chain or a pipe each)."""
    out = []
    for code in _code("\n".join(_readme_first_part())):
        for piece in re.split(r"&&|\|\||[|;]", code):
            words = shlex.split(piece)
            if words and words[0] == ".venv/bin/memobot":
                out.append(words[1:])
    return out


def test_every_command_in_the_readme_parses() -> None:
    """Options and arguments too, not just the command's name: argparse reads each as it
    would on the command line (a wrong option exits 2)."""
    commands = _readme_commands()
    assert len(commands) >= 10
    for argv in commands:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                build_parser().parse_args(argv)
            except SystemExit as stop:
                assert stop.code == 0, f"memobot {shlex.join(argv)}: {out.getvalue()}"


def test_readme_commands_name_the_executable_the_quick_start_installs() -> None:
    """The Quick start installs into .venv and puts nothing on PATH: a bare `memobot status`
    in the first part would not run as written."""
    bare = [
        code
        for code in _code("\n".join(_readme_first_part()))
        for m in INVOCATION.finditer(code)
        if not code[: m.start()].endswith(".venv/bin/")
    ]
    assert not bare, bare


def test_quick_start_has_two_commands_and_ci_runs_the_second() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)\n\s*```", section, re.DOTALL)
    assert len(blocks) == 2, blocks
    install, tests = (b.strip() for b in blocks)
    assert ".venv/bin/memobot onboard" in install and ".venv/bin/memobot agent" in install
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines(), "the README's second Quick start command is not .ci/run's"


def _option_rows() -> list[tuple[list[str], str]]:
    """(keys, default cell) of each row of docs/configuration.md's option tables."""
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`") and "." in cells[0]:
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
    return rows


def _bounds(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """``{key: "1 to 500"}`` for each option whose value the config bounds, as the docs write it
    after "allowed:" (sections nested in ``model`` included, not lists or maps of them)."""
    out: dict[str, str] = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= _bounds(field.annotation, key + ".")
        rules = {
            k: f"{getattr(r, k):,}"
            for r in field.metadata
            for k in ("ge", "gt", "le")
            if hasattr(r, k)
        }
        if "le" in rules:
            low = rules.get("ge") or (f"above {rules['gt']}," if "gt" in rules else "")
            sep = " up to " if "gt" in rules else " to "
            out[key] = f"{low}{sep}{rules['le']}" if low else f"at most {rules['le']}"
        elif "ge" in rules or "gt" in rules:
            out[key] = f"at least {rules['ge']}" if "ge" in rules else f"above {rules['gt']}"
    return out


def _all_bounds() -> dict[str, str]:
    """Every bounded option, under the names the docs use (``channels.<name>.x`` for what all
    channels share, ``tools.mcpServers.<name>.x``)."""
    out = {k: text for k, text in _bounds(Config).items() if not k.startswith("channels.")}
    shared = _bounds(ChannelConfig)
    out |= {f"channels.<name>.{key}": text for key, text in shared.items()}
    for channel in ("telegram", "discord", "slack"):
        own = _bounds(type(getattr(Config().channels, channel)))
        out |= {f"channels.{channel}.{k}": text for k, text in own.items() if k not in shared}
    out |= {f"tools.mcpServers.<name>.{k}": text for k, text in _bounds(McpServerConfig).items()}
    return out


def test_docs_give_each_option_its_real_default() -> None:
    """A default changed in code (say a channel's dmPolicy) fails here until the docs follow."""
    defaults = json.loads(Config().model_dump_json(by_alias=True))
    server = json.loads(McpServerConfig(command="x").model_dump_json(by_alias=True))
    api_key = json.loads(ApiKeyConfig(name="x", key="x" * 16).model_dump_json(by_alias=True))
    rows = _option_rows()
    assert len(rows) > 100
    wrong = []
    for keys, cell in rows:
        if not cell:
            continue  # no default: a value the person gives (an MCP server's command or url)
        try:
            written = json.loads(cell.strip("`").replace("\\|", "|"))
        except ValueError:
            written = cell.strip("`")  # an unquoted string: `gpt-4o-mini`
        for key in keys:
            parts = key.split(".")
            if parts[:2] == ["tools", "mcpServers"] and len(parts) == 4:
                value: object = server[parts[3]]
            elif parts[:2] == ["api", "keys[]"]:
                value = api_key[parts[2]]
            else:
                value = defaults
                for part in ("telegram" if p == "<name>" else p for p in parts):
                    value = value[part]  # type: ignore[index]
            if value != written:
                wrong.append(f"{key}: docs say {cell}, the code {json.dumps(value)}")
    assert not wrong, "\n".join(wrong)


def test_docs_give_each_option_its_real_bounds() -> None:
    """Each bounded option's row says "(allowed: ...)" with the code's bounds; an unbounded one
    says nothing of the kind."""
    bounds = _all_bounds()
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    wrong = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 3 or not cells[0].startswith("`") or "." not in cells[0]:
            continue
        keys = re.findall(r"`([^`]+)`", cells[0])
        said = re.findall(r"\(allowed: ([^)]*)\)", cells[2])
        real = sorted({bounds[k] for k in keys if k in bounds})
        if said != real:
            wrong.append(f"{', '.join(keys)}: docs say {said or 'nothing'}, the code {real}")
    assert not wrong, "\n".join(wrong)
