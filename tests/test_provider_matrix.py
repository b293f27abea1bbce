"""The provider matrix: memobot's real agent loop against each dialect of the fake LLM, for the
core turn shapes (issue 36, "What to build" item 5).

Every cell runs the real code in-process (``bot.llm.LLMProvider`` from a ``bot.config`` config
pointing at a dialect fake, driven by ``bot.runner.Runner`` through the agent loop and a
recording channel, as tests/test_agent_loop.py does) and asserts the turn's answer and that the
fake refused nothing it should not have. Shapes:

* plain: a text answer, not streamed;
* streamed: a text answer streamed to a chat that shows answers as they are written;
* tool: one tool call (streamed), then the answer;
* parallel: two tool calls in one response (streamed), then the answer;
* failed: a turn that makes a tool call and then fails for good (HTTP 400 in the provider's
  shape); the next message must work, so the history the server sees must still satisfy its
  rules (strict templates, Mistral's role order);
* switch: two tool turns with one profile, then the config points at another provider (a model
  switch, a fallback, an outage failover) and the conversation goes on there.

Rows are providers (with a model that exercises their rules), plus variants for older builds and
other models. A cell's id names the failure of issue 36's list it reproduces ("-item2"); those
fail on the code from before the issue's fix, by design.

``llm.provider`` (and ``llm.apiVersion``) are set for every row, as a person pointing memobot at
a self-hosted or local server would; ``test_gpt5_needs_nothing_but_its_name`` shows OpenAI's
reasoning models need no setting at all.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.bus import StreamEvent
from channels.manager import ChannelManager
from tests.fakes.llm_server import FakeLLM, error, reply, tool_step
from tests.helpers import Harness, RecordingChannel, make_config

SHAPES = ("plain", "streamed", "tool", "parallel", "failed", "switch")
API_KEY = "test-key"


@dataclass(frozen=True)
class Profile:
    """One row: a dialect fake, the model asked for, and how memobot is configured for it."""

    id: str
    dialect: str
    model: str
    options: dict[str, Any] = field(default_factory=dict)  # FakeLLM's dialect options
    path: str = "/v1"  # the base URL's path on the fake
    llm: dict[str, Any] = field(default_factory=dict)  # more of the llm config (camelCase)
    shapes: tuple[str, ...] = SHAPES
    switch_to: str = "mistral"  # the profile the "switch" shape continues with
    items: dict[str, str] = field(default_factory=dict)  # shape ("*": all) -> issue items

    def fake(self) -> FakeLLM:
        # Azure's classic endpoints check the api-key header against the key.
        return FakeLLM(
            dialect=self.dialect,
            api_key=API_KEY if self.dialect == "azure" else None,
            **self.options,
        )


PROFILES = [
    Profile("openai", "openai", "gpt-5-mini", items={"*": "1"}),
    Profile(
        "azure",
        "azure",
        "gpt-4o",
        path="/openai/deployments/gpt-4o",
        llm={"apiVersion": "2024-10-21"},
        items={"*": "10"},
    ),
    Profile(
        "deepseek",
        "deepseek",
        "deepseek-reasoner",
        items={"tool": "2", "parallel": "2", "failed": "2", "switch": "2+4"},
    ),
    Profile(
        "gemini",
        "gemini",
        "gemini-3-flash-preview",
        items={"tool": "2", "parallel": "2+6", "failed": "2", "switch": "2+4"},
    ),
    Profile(
        "mistral",
        "mistral",
        "mistral-large-latest",
        switch_to="deepseek",
        items={"streamed": "5", "tool": "5", "parallel": "5", "failed": "3+5", "switch": "2+5"},
    ),
    Profile("groq", "groq", "openai/gpt-oss-20b", items={"switch": "4"}),
    Profile("openrouter", "openrouter", "deepseek/deepseek-r1", items={"switch": "4"}),
    Profile("anthropic", "anthropic", "claude-sonnet-4-5", items={"switch": "4"}),
    Profile("ollama", "ollama", "qwen3:8b", items={"parallel": "6", "switch": "4"}),
    Profile(
        "vllm",
        "vllm",
        "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
        items={"failed": "3"},
    ),
    Profile("llamacpp", "llamacpp", "devstral-small-2", items={"failed": "3", "switch": "4"}),
    Profile(
        "lmstudio",
        "lmstudio",
        "qwen/qwen3-8b",
        switch_to="anthropic",
        items={"*": "7", "switch": "4"},
    ),
    Profile("generic", "generic", "fake-model", items={"switch": "4"}),
    # -- variants: other models, older builds --
    Profile("openai-o3", "openai", "o3-mini", shapes=("plain", "streamed"), items={"*": "1"}),
    Profile("azure-v1", "azure", "gpt-4o", path="/openai/v1", shapes=("plain", "streamed", "tool")),
    Profile("deepseek-r1", "deepseek", "deepseek-r1", shapes=("plain", "streamed")),
    Profile(
        "deepseek-to-r1",
        "deepseek",
        "deepseek-reasoner",
        shapes=("switch",),
        switch_to="deepseek-r1",
        items={"switch": "2"},
    ),
    Profile(
        "gemini-2.5",
        "gemini",
        "gemini-2.5-flash",
        shapes=("tool", "parallel"),
        items={"parallel": "6"},
    ),
    Profile(
        "groq-2024",
        "groq",
        "llama3-70b-8192",
        options={"old_build": True},
        shapes=("streamed", "tool"),
        items={"*": "5"},
    ),
    Profile(
        "llamacpp-2025",
        "llamacpp",
        "qwen3-8b",
        options={"old_build": True},
        shapes=("tool",),
        items={"tool": "9"},
    ),
    Profile(
        "llamacpp-2026-03",
        "llamacpp",
        "qwen3-8b",
        options={"object_arguments": True},
        shapes=("tool", "parallel"),
        items={"*": "6"},
    ),
    Profile("llamacpp-gemma", "llamacpp", "gemma-3-27b-it", shapes=("failed",), items={"*": "3"}),
    Profile(
        "lmstudio-2024",
        "lmstudio",
        "qwen2.5-7b-instruct",
        options={"old_build": True},
        shapes=("tool",),
        items={"tool": "9"},
    ),
    Profile("ollama-0.4", "ollama", "llama3.1", options={"old_build": True}, shapes=("parallel",)),
    Profile("vllm-qwen3", "vllm", "Qwen/Qwen3-8B", shapes=("streamed", "tool")),
]
BY_ID = {p.id: p for p in PROFILES}


def llm_section(profile: Profile, fake: FakeLLM) -> dict[str, Any]:
    """The ``llm`` config for ``profile`` at ``fake``."""
    return {
        "baseUrl": f"{fake.url}{profile.path}",
        "apiKey": API_KEY,
        "model": profile.model,
        "provider": profile.dialect,
        **profile.llm,
    }


class StreamingChannel(RecordingChannel):
    """A chat that shows answers while they are written (as the terminal does: "direct")."""

    streaming = True

    def preview_mode(self, chat_id: str) -> str:  # type: ignore[override]
        return "direct"

    def show_stream(self, event: StreamEvent) -> None:
        assert isinstance(self.harness, ChatHarness)
        self.harness.shown.append(event)


class ChatHarness(Harness):
    """``Harness`` with one cli channel, streaming or not; ``shown`` keeps the previews."""

    def __init__(self, tmp_path: Path, profile: Profile, fake: FakeLLM, *, stream: bool) -> None:
        cfg = make_config(tmp_path, fake.base_url, llm=llm_section(profile, fake))
        super().__init__(cfg, tmp_path / "config.json", channels=())
        self.shown: list[StreamEvent] = []
        channel = (StreamingChannel if stream else RecordingChannel)(self, "cli")
        self.manager = ChannelManager(self.stack.bus, self.stack.loop.ledger, [channel])


def refused(fake: FakeLLM) -> list[str]:
    """What the fake refused by its rules (not its scripted errors), in its words."""
    return [
        f"{r['status']} {r['error']}"
        for r in fake.requests
        if r["outcome"] in ("invalid", "unauthorized")
    ]


def assert_accepted(fake: FakeLLM) -> None:
    problems = refused(fake)
    assert not problems, f"the {fake.dialect_name or 'generic'} fake refused: {problems}"


def written(tmp_path: Path, name: str) -> str | None:
    path = tmp_path / "ws" / "notes" / name
    return path.read_text() if path.exists() else None


def no_think(answer: str, harness: ChatHarness) -> None:
    """Reasoning is never shown: not in the answer, not in a preview (issue 36 item 7)."""
    shown = [e.text for e in harness.shown if e.kind == "text"]
    assert "<think>" not in answer, answer
    assert not any("<think>" in text for text in shown), shown[-1:]


def write(name: str, content: str) -> tuple[str, dict[str, str]]:
    return ("write_file", {"path": f"notes/{name}", "content": content})


# -- the shapes ---------------------------------------------------------------------------------

Shape = Callable[[Profile, Path], Awaitable[None]]


async def plain(profile: Profile, tmp_path: Path) -> None:
    async with profile.fake() as fake:
        fake.script(reply("The plain answer."))
        async with ChatHarness(tmp_path, profile, fake, stream=False) as h:
            answer = await h.ask("hello")
        assert_accepted(fake)
        assert answer == "The plain answer."
        assert not fake.requests[0]["stream"]


async def streamed(profile: Profile, tmp_path: Path) -> None:
    async with profile.fake() as fake:
        fake.script(reply("A streamed answer, in pieces.", pieces=4))
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            answer = await h.ask("hello")
        assert_accepted(fake)
        assert answer == "A streamed answer, in pieces."
        assert fake.requests[0]["stream"]
        no_think(answer, h)
        assert [e.text for e in h.shown if e.kind == "text"][-1] == answer


async def tool(profile: Profile, tmp_path: Path) -> None:
    async with profile.fake() as fake:
        fake.script(tool_step(write("a.txt", "alpha")), reply("I wrote it."))
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            answer = await h.ask("write a note")
        assert_accepted(fake)
        assert written(tmp_path, "a.txt") == "alpha"
        assert answer == "I wrote it."
        no_think(answer, h)


async def parallel(profile: Profile, tmp_path: Path) -> None:
    async with profile.fake() as fake:
        fake.script(
            tool_step(write("a.txt", "alpha"), write("b.txt", "beta")), reply("Both written.")
        )
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            answer = await h.ask("write two notes")
        assert_accepted(fake)
        assert (written(tmp_path, "a.txt"), written(tmp_path, "b.txt")) == ("alpha", "beta")
        assert answer == "Both written."
        results = [m for m in fake.requests[-1]["body"]["messages"] if m["role"] == "tool"]
        assert len(results) == 2


async def failed(profile: Profile, tmp_path: Path) -> None:
    async with profile.fake() as fake:
        fake.script(
            tool_step(write("a.txt", "alpha"), when_user_contains="first"),
            error(400, message="refused on purpose", when_user_contains="first"),
        )
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            first = await h.ask("first message")
            second = await h.ask("second message")
        assert "refused" in first or "unavailable" in first
        assert_accepted(fake)
        assert fake.requests[-1]["last_user"].startswith("second message")
        assert second.endswith("echo: second message")
        no_think(second, h)


async def switch(profile: Profile, tmp_path: Path) -> None:
    target = BY_ID[profile.switch_to]
    async with profile.fake() as source:
        source.script(
            tool_step(write("a.txt", "alpha")),
            reply("Wrote a."),
            tool_step(write("b.txt", "beta")),
            reply("Wrote b."),
        )
        async with ChatHarness(tmp_path, profile, source, stream=True) as h:
            await h.ask("write a")
            await h.ask("write b")
    async with target.fake() as fake:
        # Not streamed: stream_options has its own cells (issue 36 item 5); this one is about
        # the history another provider wrote.
        async with ChatHarness(tmp_path, target, fake, stream=False) as h:
            answer = await h.ask("and now?")
        assert_accepted(source)
        assert_accepted(fake)
        assert answer.endswith("echo: and now?")
        sent = fake.requests[-1]["body"]["messages"]
        assert sum(1 for m in sent if m["role"] == "tool") == 2  # the history went along


RUNS: dict[str, Shape] = {
    "plain": plain,
    "streamed": streamed,
    "tool": tool,
    "parallel": parallel,
    "failed": failed,
    "switch": switch,
}


def cell_id(profile: Profile, shape: str) -> str:
    items = profile.items.get(shape) or profile.items.get("*")
    return f"{profile.id}-{shape}" + (f"-item{items}" if items else "")


CELLS = [pytest.param(p, shape, id=cell_id(p, shape)) for p in PROFILES for shape in p.shapes]


@pytest.mark.parametrize(("profile", "shape"), CELLS)
async def test_matrix(profile: Profile, shape: str, tmp_path: Path) -> None:
    """One turn shape against one provider's imitation, through memobot's real agent loop.

    Issue 36 items the ids name: 1 OpenAI reasoning models (max_tokens, temperature);
    2 reasoning that must travel back (DeepSeek reasoning_content, Gemini thought signatures;
    R1 refusing it); 3 a failed turn poisoning strict templates and Mistral's role order;
    4 tool-call ids from another provider or invented; 5 stream_options refused; 6 streamed
    calls mis-assembled (index 0 for all, arguments as an object); 7 <think> shown;
    9 content: null refused; 10 Azure's classic endpoints.
    """
    await RUNS[shape](profile, tmp_path)


# -- what is not a turn shape: errors and liveness (issue 36 items 3, 8, 11) --------------------


def profile_with(base: str, **llm: Any) -> Profile:
    p = BY_ID[base]
    return Profile(p.id, p.dialect, p.model, p.options, p.path, {**p.llm, **llm})


async def test_item8_openrouter_error_in_a_200_is_retried(tmp_path: Path) -> None:
    """Issue 36 item 8: OpenRouter's HTTP 200 with an ``error`` body is the failure it names
    (502: transient), retried like a 502, not a failed turn."""
    profile = BY_ID["openrouter"]
    async with profile.fake() as fake:
        fake.script(error(502, in_body=True, message="upstream provider is down"), reply("Back."))
        async with ChatHarness(tmp_path, profile, fake, stream=False) as h:
            answer = await h.ask("hello")
    assert answer == "Back."
    assert [r["status"] for r in fake.requests] == [200, 200]


async def test_openrouter_error_mid_stream_is_retried(tmp_path: Path) -> None:
    """The streamed form of issue 36 item 8, which works already (the SDK raises the error
    event, a retried connection error): an error event after some text, then a retry."""
    profile = BY_ID["openrouter"]
    async with profile.fake() as fake:
        fake.script(
            error(502, in_body=True, text="Half of an answ", error_after_chunks=2),
            reply("The whole answer."),
        )
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            answer = await h.ask("hello")
    assert answer == "The whole answer."
    assert len(fake.requests) == 2


async def test_item8_groq_tool_use_failed_is_retried(tmp_path: Path) -> None:
    """Issue 36 item 8: Groq's 400 ``tool_use_failed`` (the model wrote a call Groq could not
    parse) is worth another try, not the end of the turn."""
    profile = BY_ID["groq"]
    generation = '<function=write_file>{"path": "notes/a.txt"}</function>'
    async with profile.fake() as fake:
        fake.script(
            error(400, code="tool_use_failed", failed_generation=generation), reply("Done.")
        )
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            answer = await h.ask("write a note")
    assert answer == "Done."
    assert [r["status"] for r in fake.requests] == [400, 200]


async def test_item8_deepseek_keep_alive_counts_as_activity(tmp_path: Path) -> None:
    """Issue 36 item 8: DeepSeek under load sends ": keep-alive" comments before the first
    chunk; a stream that is slow but alive must not time out (``streamIdleSeconds`` 0.1 here,
    0.4 s of comments every 0.02 s)."""
    profile = profile_with("deepseek", streamIdleSeconds=0.1)
    busy = {"keepalive_before": 0.4, "keepalive_every": 0.02, "when_user_contains": "busy"}
    async with profile.fake() as fake:
        fake.script(*[reply("Sorry for the wait.", **busy) for _ in range(3)])
        async with ChatHarness(tmp_path, profile, fake, stream=True) as h:
            answer = await h.ask("are you busy?")
    assert answer == "Sorry for the wait."
    assert len(fake.requests) == 1


async def test_item3_template_refusal_is_logged_with_the_servers_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36 item 3: llama.cpp refuses a history its template cannot render with HTTP 500;
    retrying cannot help, and the log must carry the template's own words."""
    profile = BY_ID["llamacpp"]
    history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    async with profile.fake() as fake:
        async with ChatHarness(tmp_path, profile, fake, stream=False) as h:
            caplog.set_level(logging.INFO)
            with pytest.raises(Exception):  # noqa: B017 - whatever the provider raises
                await h.stack.provider.chat(history, session_key="cli:t")
    assert "conversation roles must alternate" in caplog.text


async def test_item11_answer_emptied_by_the_token_limit_says_why(tmp_path: Path) -> None:
    """Issue 36 item 11: a thinking model that spent ``maxTokens`` on reasoning answers empty
    with ``finish_reason: "length"``; the chat is told why, not "(the model returned an empty
    answer)"."""
    profile = BY_ID["deepseek"]
    async with profile.fake() as fake:
        fake.script(reply("", reasoning="so much thinking", finish_reason="length"))
        async with ChatHarness(tmp_path, profile, fake, stream=False) as h:
            answer = await h.ask("hello")
    assert answer != "(the model returned an empty answer)"
    assert "maxTokens" in answer


async def test_gpt5_needs_nothing_but_its_name(tmp_path: Path) -> None:
    """Issue 36, done when: a gpt-5-style model works with OpenAI's rules and no setting but
    the model's name (no provider: the fake's URL is 127.0.0.1, so it is detected "generic";
    the model's name is what tells)."""
    openai = BY_ID["openai"]
    bare = Profile("openai-bare", "openai", "gpt-5", llm={"provider": "auto"})
    for shape in (plain, tool):
        await shape(bare, tmp_path / shape.__name__)
    assert openai.dialect == bare.dialect
