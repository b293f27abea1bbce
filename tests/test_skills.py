from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from bot.skills import (
    NO_DESCRIPTION,
    FrontMatterError,
    Skill,
    SkillsIndex,
    load_skills,
    parse_front_matter,
    skills_summary,
)


def write_skill(workspace: Path, folder: str, text: str) -> Path:
    path = workspace / "skills" / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def bump_mtime(path: Path, seconds: int = 10) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


# --- front matter --------------------------------------------------------------------------


def test_plain_values() -> None:
    text = "---\nname: weather\ndescription: Look up the forecast # trailing comment\n---\nbody\n"
    assert parse_front_matter(text) == {"name": "weather", "description": "Look up the forecast"}


def test_quoted_values() -> None:
    text = (
        "---\n"
        'name: "quoted: with colon"\n'
        "description: 'it''s single # not a comment'  # a comment\n"
        'other: "esc \\"q\\" \\\\ \\n"\n'
        "---\n"
    )
    meta = parse_front_matter(text)
    assert meta["name"] == "quoted: with colon"
    assert meta["description"] == "it's single # not a comment"
    assert meta["other"] == 'esc "q" \\ \n'


def test_folded_and_literal_descriptions() -> None:
    text = (
        "---\n"
        "description: >\n"
        "  First line\n"
        "  continues here.\n"
        "\n"
        "  New paragraph.\n"
        "literal: |-\n"
        "  keep\n"
        "    indented\n"
        "  lines\n"
        "---\n"
    )
    meta = parse_front_matter(text)
    assert meta["description"] == "First line continues here.\nNew paragraph."
    assert meta["literal"] == "keep\n  indented\nlines"


def test_plain_multiline_and_nested_values() -> None:
    text = (
        "---\n"
        "description:\n"
        "  spread over\n"
        "  two lines\n"
        "metadata:\n"
        "  author: someone\n"
        "tags:\n"
        "- a\n"
        "- b\n"
        "name: x\n"
        "---\n"
    )
    assert parse_front_matter(text) == {"description": "spread over two lines", "name": "x"}


def test_no_front_matter() -> None:
    assert parse_front_matter("# Just a heading\n---\nname: nope\n") == {}
    assert parse_front_matter("") == {}


def test_bom_and_crlf() -> None:
    assert parse_front_matter("\ufeff---\r\nname: a\r\n---\r\n") == {"name": "a"}


@pytest.mark.parametrize(
    "text",
    [
        "---\nname: never closed\n",
        "---\nthis is not a key value line\n---\n",
        "---\nname: 'unterminated\n---\n",
        '---\nname: "a" trailing\n---\n',
        "---\n  indented: first\n---\n",
        "---\ndescription: >x\n  text\n---\n",
    ],
)
def test_malformed_front_matter_raises(text: str) -> None:
    with pytest.raises(FrontMatterError):
        parse_front_matter(text)


# --- loading -------------------------------------------------------------------------------


def test_load_skills_variants(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_skill(tmp_path, "zeta", '---\nname: alpha-by-name\ndescription: "Quoted one"\n---\n')
    write_skill(tmp_path, "folded", "---\ndescription: >\n  Folded\n  text\n---\n# body\n")
    write_skill(tmp_path, "nodesc", "---\nname: nodesc\n---\n")
    write_skill(tmp_path, "nofm", "# No front matter at all\n")
    broken = write_skill(tmp_path, "broken", "---\nname: broken\ndescription: oops\n")
    (tmp_path / "skills" / "empty-folder").mkdir()
    (tmp_path / "skills" / ".hidden").mkdir()
    write_skill(tmp_path, ".hidden", "---\nname: hidden\n---\n")
    (tmp_path / "skills" / "README.md").write_text("not a skill\n")

    with caplog.at_level(logging.WARNING, logger="bot.skills"):
        skills = load_skills(tmp_path)

    by_name = {s.name: s for s in skills}
    assert [s.name for s in skills] == sorted(by_name)
    assert set(by_name) == {"alpha-by-name", "folded", "nodesc", "nofm", "broken"}
    assert by_name["alpha-by-name"].description == "Quoted one"
    assert by_name["alpha-by-name"].path == tmp_path / "skills" / "zeta" / "SKILL.md"
    assert by_name["folded"].description == "Folded text"
    assert by_name["nodesc"].description == ""
    assert by_name["nofm"].description == ""
    # Malformed: listed by folder name, and the warning names the file.
    assert by_name["broken"] == Skill("broken", "", broken)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(broken) in warnings[0]


def test_load_skills_survives_bad_encoding(tmp_path: Path) -> None:
    path = tmp_path / "skills" / "latin" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"---\nname: caf\xe9\n---\n")
    assert load_skills(tmp_path) == [Skill("latin", "", path)]


def test_load_skills_without_skills_folder(tmp_path: Path) -> None:
    assert load_skills(tmp_path) == []
    assert skills_summary([]) == ""


def test_summary_format(tmp_path: Path) -> None:
    write_skill(tmp_path, "b-skill", "---\nname: b\ndescription: |\n  two\n  lines\n---\n")
    write_skill(tmp_path, "a", "---\ndescription: Does A.\n---\n")
    write_skill(tmp_path, "c", "no front matter\n")
    write_skill(tmp_path, "long", "---\ndescription: " + "word " * 200 + "\n---\n")
    summary = skills_summary(load_skills(tmp_path))
    lines = summary.splitlines()
    assert lines[0] == "- a: Does A. (skills/a/SKILL.md)"
    assert lines[1] == "- b: two lines (skills/b-skill/SKILL.md)"
    assert lines[2] == f"- c: {NO_DESCRIPTION} (skills/c/SKILL.md)"
    assert lines[3].startswith("- long: word word")
    assert lines[3].endswith("… (skills/long/SKILL.md)")
    assert len(lines[3]) < 350
    assert not summary.endswith("\n")


# --- cache ---------------------------------------------------------------------------------


def test_index_returns_same_object_while_unchanged(tmp_path: Path) -> None:
    write_skill(tmp_path, "one", "---\ndescription: First\n---\n")
    index = SkillsIndex(tmp_path)
    first = index.summary()
    assert first == "- one: First (skills/one/SKILL.md)"
    assert index.summary() is first
    assert index.summary() is first


def test_index_rereads_after_mtime_change(tmp_path: Path) -> None:
    path = write_skill(tmp_path, "one", "---\ndescription: Aaaa\n---\n")
    index = SkillsIndex(tmp_path)
    first = index.summary()
    # Same size, so only the mtime tells the index that the file changed.
    path.write_text("---\ndescription: Bbbb\n---\n", encoding="utf-8")
    bump_mtime(path)
    second = index.summary()
    assert second == "- one: Bbbb (skills/one/SKILL.md)"
    assert second is not first
    assert index.summary() is second


def test_index_does_not_parse_when_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_skill(tmp_path, "one", "---\ndescription: First\n---\n")
    index = SkillsIndex(tmp_path)
    index.summary()
    import bot.skills

    def fail(*_: object) -> None:
        raise AssertionError("skills were re-read although nothing changed")

    monkeypatch.setattr(bot.skills, "load_skills", fail)
    index.summary()


def test_index_notices_added_and_removed_skills(tmp_path: Path) -> None:
    write_skill(tmp_path, "one", "---\ndescription: First\n---\n")
    index = SkillsIndex(tmp_path)
    index.summary()
    # An empty folder is not a skill yet; its SKILL.md appearing later must still be noticed.
    (tmp_path / "skills" / "two").mkdir()
    assert index.summary() == "- one: First (skills/one/SKILL.md)"
    write_skill(tmp_path, "two", "---\ndescription: Second\n---\n")
    assert [s.name for s in index.skills()] == ["one", "two"]
    assert "- two: Second (skills/two/SKILL.md)" in index.summary()
    (tmp_path / "skills" / "one" / "SKILL.md").unlink()
    assert index.summary() == "- two: Second (skills/two/SKILL.md)"


def test_index_without_skills_folder(tmp_path: Path) -> None:
    index = SkillsIndex(tmp_path)
    assert index.summary() == ""
    write_skill(tmp_path, "late", "---\ndescription: Late\n---\n")
    assert index.summary() == "- late: Late (skills/late/SKILL.md)"
