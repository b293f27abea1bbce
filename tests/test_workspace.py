from __future__ import annotations

import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import bot
from bot.skills import load_skills, parse_front_matter
from bot.workspace import WORKSPACE_PROMPT_FILES, init_workspace, template_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
# The prompt files go into the system prompt verbatim every turn.
PROMPT_BUDGET_CHARS = 6000


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def template_files() -> list[Path]:
    root = template_dir()
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def test_template_dir_is_found() -> None:
    root = template_dir()
    assert root.is_dir()
    assert root in (
        Path(bot.__file__).resolve().parent / "workspace_template",
        Path(bot.__file__).resolve().parent.parent / "workspace_template",
    )


def test_wheel_ships_template_where_template_dir_looks() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    force = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force["workspace_template"] == "bot/workspace_template"


def test_prompt_files_exist_and_fit_the_budget() -> None:
    root = template_dir()
    total = 0
    for name in WORKSPACE_PROMPT_FILES:
        path = root / name
        assert path.is_file(), name
        text = path.read_text(encoding="utf-8")
        total += len(text)
        # Each file opens with one line saying what it is for and who edits it.
        first = text.splitlines()[0]
        assert first.startswith("<!--") and first.endswith("-->"), name
        assert "edit" in first.lower(), name
    assert total < PROMPT_BUDGET_CHARS, total


def test_user_template_has_no_made_up_facts() -> None:
    text = (template_dir() / "USER.md").read_text(encoding="utf-8")
    for field in ("Name", "Timezone", "Language"):
        assert f"- {field}: (unknown)" in text


def test_starter_skill_parses(tmp_path: Path) -> None:
    skill_files = list((template_dir() / "skills").glob("*/SKILL.md"))
    assert skill_files
    for path in skill_files:
        meta = parse_front_matter(path.read_text(encoding="utf-8"))
        assert meta["name"] == path.parent.name
        assert meta["description"].strip()
    init_workspace(tmp_path / "ws")
    skills = load_skills(tmp_path / "ws")
    assert skills and all(s.description for s in skills)


def test_init_workspace_copies_everything(tmp_path: Path) -> None:
    ws = tmp_path / "home" / "workspace"
    created = init_workspace(ws)
    assert ws.is_dir()
    assert mode(ws) == 0o700
    for rel in template_files():
        copy = ws / rel
        assert copy.read_bytes() == (template_dir() / rel).read_bytes()
        assert copy in created
        assert mode(copy) == 0o600
    for name in ("memory", "skills"):
        assert (ws / name).is_dir()
        assert mode(ws / name) == 0o700
    assert ws in created
    assert ws / "memory" in created


def test_init_workspace_keeps_existing_files(tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    init_workspace(ws)
    user_md = ws / "USER.md"
    user_md.write_text("- Name: Ada\n", encoding="utf-8")
    (ws / "SOUL.md").unlink()

    created = init_workspace(ws)

    assert user_md.read_text(encoding="utf-8") == "- Name: Ada\n"
    assert created == [ws / "SOUL.md"]
    assert init_workspace(ws) == []


def test_init_workspace_does_not_follow_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n", encoding="utf-8")
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "AGENTS.md").symlink_to(outside)
    created = init_workspace(ws)
    assert ws / "AGENTS.md" not in created
    assert outside.read_text(encoding="utf-8") == "keep me\n"


def test_init_workspace_with_custom_template(tmp_path: Path) -> None:
    template = tmp_path / "tpl"
    (template / "deep" / "er").mkdir(parents=True)
    (template / "deep" / "er" / "f.md").write_text("x", encoding="utf-8")
    (template / "__pycache__").mkdir()
    (template / "__pycache__" / "junk.pyc").write_bytes(b"")
    ws = tmp_path / "ws"
    created = init_workspace(ws, template)
    assert (ws / "deep" / "er" / "f.md").read_text(encoding="utf-8") == "x"
    assert ws / "deep" in created and ws / "deep" / "er" in created
    assert not (ws / "__pycache__").exists()


def test_init_workspace_twice_at_the_same_moment(tmp_path: Path) -> None:
    # Two memobot processes starting together on a fresh workspace: neither may crash.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from bot.workspace import init_workspace\n"
        "while time.time() < float(sys.argv[2]):\n"
        "    pass\n"
        "for i in range(30):\n"
        "    init_workspace(Path(sys.argv[1]) / str(i))\n"
    )
    start = str(time.time() + 0.5)
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), start], cwd=REPO_ROOT)
        for _ in range(3)
    ]
    assert [p.wait(30) for p in procs] == [0, 0, 0]
    assert all((tmp_path / str(i) / "skills").is_dir() for i in range(30))
