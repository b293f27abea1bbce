"""The one JSON config file: camelCase keys, validated at start, errors name the JSON path."""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from bot import durable
from bot.config_base import ConfigModel as _Model
from bot.dialects import ProviderName
from bot.file_errors import SETUP_ERRNOS, about
from bot.gate.approval import DEFAULT_EXEC_ALLOW, allow_pattern_problem
from bot.layout import layout_problem
from bot.proxy import check_proxy_url
from bot.service.logs import SECRET_PARAM, redact, remember_secrets
from bot.spend.limits import BudgetConfig
from bot.urls import checked_url, endpoint_access, redact_url, without_trailing_slash
from channels.registry import specs  # light: the specs and their config models import no SDK

EX_CONFIG = 78  # sysexits.h: configuration error; systemd units refuse to restart-loop on it
DEFAULT_HOME = Path("~/.memobot")
DEFAULT_CONFIG_PATH = DEFAULT_HOME / "config.json"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# apiKey, token, botToken, an MCP server's env GITHUB_TOKEN or its Authorization header, ...
_SECRET_KEY = re.compile(r"(?i)(token|key|secret|password|passwordhash|authorization)$")
# Maps whose every value is a secret, whatever its name: extra HTTP headers (a gateway's
# token) and an MCP server's environment (GH_PAT, DATABASE_URL).
SECRET_MAPS = ("headers", "env")


def is_secret_key(key: str) -> bool:
    """An option whose value is a secret by its name (apiKey, token, botToken, passwordHash)."""
    return bool(_SECRET_KEY.search(key))


class ConfigError(Exception):
    """The config cannot be used. ``str()`` is a message for a person, naming file and field;
    ``fields``: (JSON path, what is wrong) for each refused field, secrets left out (the
    panel marks each at its field)."""

    def __init__(self, message: str, fields: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


class RetryConfig(_Model):
    attempts: int = Field(4, ge=1, le=20, description="total tries per LLM request")
    initial_delay_seconds: float = Field(1.0, ge=0)
    max_delay_seconds: float = Field(30.0, ge=0)


class OutageConfig(_Model):
    """When every model fails, turns wait for one to come back instead of failing."""

    probe_max_seconds: float = Field(60.0, gt=0, le=3600, description="longest probe backoff")
    max_wait_minutes: float = Field(
        60.0, gt=0, description="then a waiting turn is answered with the error"
    )


def _header_safe_key(v: str | None) -> str | None:
    """An API key travels in an HTTP header: a space, a line break or a non-ASCII letter in it
    (a paste gone wrong) would fail every request with an error that names no setting."""
    if v and not all("!" <= c <= "~" for c in v):
        raise ValueError(
            "the API key has a space, a line break or a non-ASCII character; copy it again"
        )
    return v


def _header_problem(headers: dict[str, str] | None) -> dict[str, str] | None:
    """Extra HTTP headers go out with every request: a name or value that is not one header
    line would fail each request with an error that names no setting."""
    for name, value in (headers or {}).items():
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise ValueError(f"{name!r} is not a valid HTTP header name")
        if not all(" " <= c <= "~" for c in value):
            raise ValueError(
                f"the value of header {name!r} has a line break or a non-ASCII character"
            )
    return headers


class DialectConfig(_Model):
    """Single fields of a provider's dialect (bot.dialects.Dialect), over its profile."""

    token_parameter: Literal["max_tokens", "max_completion_tokens"] | None = None
    send_temperature: StrictBool | None = None
    stream_usage: StrictBool | None = None
    reasoning_back: Literal["never", "with_calls"] | None = None
    extra_content_back: StrictBool | None = None
    reasoning_details_back: StrictBool | None = None
    tool_call_ids: Literal["any", "alnum9", "word"] | None = None
    null_content: StrictBool | None = None

    def overrides(self) -> dict[str, Any]:
        return {k: v for k in self.model_fields_set if (v := getattr(self, k)) is not None}


ProviderSetting = Literal["auto", ProviderName]


class PriceConfig(_Model):
    """``llm.prices.<model>``: what a million tokens cost (bot.spend). Cached tokens are part of
    the prompt tokens, as OpenAI counts them; ``cachedInput`` unset: they cost ``input``."""

    input: float = Field(ge=0, allow_inf_nan=False, description="per million prompt tokens")
    output: float = Field(ge=0, allow_inf_nan=False, description="per million completion tokens")
    cached_input: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="per million cached tokens"
    )
    currency: str = "USD"

    @field_validator("currency")
    @classmethod
    def _currency_code(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", v):
            raise ValueError(
                f"{v!r} is not a currency code: three capital letters, e.g. USD or EUR"
            )
        return v


class FallbackConfig(_Model):
    """One fallback model: any ``llm`` field; an unset one is inherited from ``llm``."""

    base_url: str | None = None
    # provider, apiVersion, headers and dialect belong to a server: a fallback with a
    # baseUrl of its own does not inherit them.
    provider: ProviderSetting | None = None
    api_version: str | None = None
    headers: dict[str, str] | None = None
    dialect: DialectConfig | None = None
    api_key: str | None = None
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    timeout_seconds: float | None = Field(None, gt=0)
    stream_idle_seconds: float | None = Field(None, gt=0)
    context_window_tokens: int | None = Field(None, ge=1024)
    transcription_model: str | None = None
    retry: RetryConfig | None = None
    proxy: str | None = None

    _api_key = field_validator("api_key")(_header_safe_key)
    _proxy = field_validator("proxy")(lambda v: v if v is None else check_proxy_url(v))
    _headers = field_validator("headers")(_header_problem)
    _base_url = field_validator("base_url")(lambda v: v and without_trailing_slash(v))


class NamedModelConfig(FallbackConfig):
    """``llm.models.<name>``: a model a chat may switch to (``/model NAME``); like a fallback,
    any ``llm`` field, an unset one inherited from ``llm`` (none of its server's own settings,
    key included, when it names a baseUrl of its own)."""

    model: str = Field(min_length=1)  # type: ignore[assignment]


# A name people type after /model: short, no spaces; "/model default" is llm's own model.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
DEFAULT_MODEL = "default"


class LLMConfig(_Model):
    base_url: str = ""
    api_key: str = ""
    model: str = "gpt-4o-mini"
    # Whose dialect the endpoint speaks (bot.dialects); "auto": told by the base URL's host
    # and the model's name, and learnt from what the endpoint refuses.
    provider: ProviderSetting = "auto"
    api_version: str = ""  # Azure's api-version query, for /openai/deployments/<name> URLs
    headers: dict[str, str] = Field(default_factory=dict)  # sent with every request
    dialect: DialectConfig = DialectConfig()
    max_tokens: int = Field(4096, ge=1)
    temperature: float = Field(0.7, ge=0, le=2)
    timeout_seconds: float = Field(120.0, gt=0)
    # A streamed answer silent this long counts as a timeout (retried, then failed over).
    stream_idle_seconds: float = Field(60.0, gt=0)
    context_window_tokens: int = Field(65536, ge=1024)
    transcription_model: str = ""  # e.g. "whisper-1": voice messages become text
    retry: RetryConfig = RetryConfig()
    # "": the environment's HTTPS_PROXY / ALL_PROXY / NO_PROXY decide, as for curl.
    proxy: str = ""
    # Tried in order when this endpoint (and then each one before) stays unavailable.
    fallbacks: list[FallbackConfig] = Field(default_factory=list)
    outage: OutageConfig = OutageConfig()
    # Per model name (any endpoint's): a call of a model without one is counted in tokens only.
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    # Named models a chat may switch to with /model NAME (kept in the chat's session).
    models: dict[str, NamedModelConfig] = Field(default_factory=dict)
    # Who may switch a chat's model: "admins" of the channel, or "everyone" let in.
    model_switch: Literal["admins", "everyone"] = "admins"
    # False for a fallback on a server of its own: OPENAI_API_KEY is llm's, not its.
    _key_from_environment: bool = PrivateAttr(True)

    _api_key = field_validator("api_key")(_header_safe_key)
    _proxy = field_validator("proxy")(check_proxy_url)
    _headers = field_validator("headers")(_header_problem)
    # Stored without a trailing slash, so every URL built from it, and every one shown, has
    # one form ("/v1/" and "/v1" are the same endpoint).
    _base_url = field_validator("base_url")(without_trailing_slash)

    @field_validator("models")
    @classmethod
    def _model_names(cls, v: dict[str, NamedModelConfig]) -> dict[str, NamedModelConfig]:
        for name in v:
            if name == DEFAULT_MODEL:
                raise ValueError(f"{name!r} is llm's own model in /model: choose another name")
            if not MODEL_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a model name to type after /model: letters, digits, "
                    "'.', '_' and '-', at most 40"
                )
        return v

    @model_validator(mode="after")
    def _credentials_fit(self) -> LLMConfig:
        # A base URL's user:password@ and an API key cannot both be sent (bot.urls).
        named = [(f"llm.models.{n}.baseUrl", self.named(n)) for n in self.models]
        chain = [(f"llm.fallbacks[{i - 1}].baseUrl", e) for i, e in enumerate(self.endpoints())]
        chain[0] = ("llm.baseUrl", chain[0][1])
        for where, endpoint in chain + named:
            access = endpoint_access(endpoint.base_url, where, bearer=bool(endpoint.api_key))
            classic_azure = "/openai/deployments/" in urlsplit(access.url).path
            if classic_azure and not endpoint.api_version and "api-version" not in access.query:
                raise ValueError(
                    f"{where} is an Azure OpenAI deployment URL, which needs an api-version: "
                    'set "apiVersion" next to it (for example "2024-10-21"), or use the v1 '
                    "URL https://<resource>.openai.azure.com/openai/v1"
                )
        return self

    def endpoints(self) -> list[LLMConfig]:
        """This config and then each fallback, with its unset fields taken from this one
        (a fallback on another server keeps none of llm's provider, apiVersion, headers,
        dialect and key: llm's key, or OPENAI_API_KEY, is never sent to another server)."""
        own = self._own()
        return [own, *(self._derived(own, fb) for fb in self.fallbacks)]

    def named(self, name: str) -> LLMConfig:
        """The endpoint of ``llm.models.<name>`` (KeyError for a name not there), its unset
        fields taken from this config as a fallback's are."""
        return self._derived(self._own(), self.models[name])

    def _own(self) -> LLMConfig:
        return self.model_copy(update={"fallbacks": [], "models": {}})

    def _derived(self, own: LLMConfig, fb: FallbackConfig) -> LLMConfig:
        # "" is the SDK's own endpoint (OPENAI_BASE_URL, else OpenAI's): not llm's server
        # when llm names one.
        elsewhere = bool(fb.base_url) or (fb.base_url == "" and bool(self.base_url))
        update: dict[str, Any] = dict(_ENDPOINT_OWN) if elsewhere else {}
        update |= {k: v for k in fb.model_fields_set if (v := getattr(fb, k)) is not None}
        endpoint = own.model_copy(update=update)
        if elsewhere:
            endpoint._key_from_environment = False
        return endpoint

    def resolved_api_key(self) -> str:
        if self.api_key or not self._key_from_environment:
            return self.api_key
        return os.environ.get("OPENAI_API_KEY", "")

    def resolved_base_url(self) -> str:
        return self.base_url or os.environ.get("OPENAI_BASE_URL", "")


_ENDPOINT_OWN: dict[str, Any] = {
    "provider": "auto",
    "api_version": "",
    "headers": {},
    "dialect": DialectConfig(),
    "api_key": "",
}


class AgentConfig(_Model):
    workspace: str = str(DEFAULT_HOME / "workspace")
    state_dir: str = str(DEFAULT_HOME / "state")
    max_tool_iterations: int = Field(20, ge=1, le=500)
    max_concurrent_turns: int = Field(64, ge=1, le=1000)  # model calls are I/O: ~1 core at 300 ms
    # Calls beyond this many in one turn are answered with an error result and not run.
    max_tool_calls_per_turn: int = Field(50, ge=1, le=10000)
    # The tokens (prompt + completion) of one turn's model calls, summed; 0: no limit.
    max_tokens_per_turn: int = Field(1_000_000, ge=0)
    # A warning (log, doctor, status) once the workspace takes more disk than this; 0: never.
    workspace_warn_bytes: int = Field(2_000_000_000, ge=0)
    # IANA zone for scheduled jobs and the time the model sees; "" is the system's zone.
    timezone: str = ""
    # Background tasks (the spawn tool, docs/tasks.md): how many run at once in all, in one
    # chat, and how long one may run before it is stopped.
    max_tasks: int = Field(3, ge=0, le=100)
    max_tasks_per_chat: int = Field(2, ge=1, le=100)
    task_timeout_minutes: float = Field(30.0, gt=0, le=24 * 60)

    @field_validator("timezone")
    @classmethod
    def _iana_zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        if v:
            try:
                ZoneInfo(v)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"unknown time zone {v!r}: use an IANA name such as Europe/Berlin, or "
                    '"" for the system zone'
                ) from None
        return v

    @property
    def workspace_path(self) -> Path:
        return Path(self.workspace).expanduser()

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()


class ExecConfig(_Model):
    enabled: StrictBool = True
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    max_output_chars: int = Field(10000, ge=100)
    # "landlock": with tools.restrictToWorkspace, every command runs under the kernel's
    # confinement (refused where the kernel cannot confine). "off": no kernel confinement.
    sandbox: Literal["landlock", "off"] = "landlock"
    network: StrictBool = True  # false: confined commands may not open or accept TCP connections
    # Processes and threads one command may have at once (a pids cgroup where one is
    # writable, which binds root too; else RLIMIT_NPROC), and the largest file it may write.
    max_processes: int = Field(1024, ge=8, le=4_194_304)
    max_file_bytes: int = Field(100_000_000, ge=1_000_000)
    # Commands that run without asking under tools.approval "risky" (bot.gate.approval).
    allow: list[str] = Field(default_factory=lambda: list(DEFAULT_EXEC_ALLOW))

    @field_validator("allow")
    @classmethod
    def _patterns_parse(cls, v: list[str]) -> list[str]:
        for pattern in v:
            problem = allow_pattern_problem(pattern)
            if problem:
                raise ValueError(f"{pattern!r}: {problem}")
        return v


SearchProvider = Literal["duckduckgo", "brave", "tavily", "searxng"]
MAX_SEARCH_RESULTS = 10


class WebSearchConfig(_Model):
    provider: SearchProvider = "duckduckgo"
    api_key: str = ""  # brave and tavily
    base_url: str = ""  # "": the provider's public endpoint; searxng: required
    max_results: int = Field(5, ge=1, le=MAX_SEARCH_RESULTS, description="when count is not given")

    _base_url = field_validator("base_url")(without_trailing_slash)

    @model_validator(mode="after")
    def _searxng_needs_url(self) -> WebSearchConfig:
        if self.provider == "searxng" and not self.base_url:
            raise ValueError(
                "tools.web.search.baseUrl is required for searxng (your instance, e.g. "
                "http://localhost:8888)"
            )
        return self


class WebConfig(_Model):
    enabled: StrictBool = True
    timeout_seconds: float = Field(20.0, gt=0, le=300)
    max_bytes: int = Field(2_000_000, ge=1000)
    max_chars: int = Field(20000, ge=100)
    search: WebSearchConfig = WebSearchConfig()


class McpServerConfig(_Model):
    """One MCP server: a command speaking MCP on stdio, or a ``url`` speaking Streamable HTTP
    or the older SSE transport.

    The keys are nanobot's, so its ``tools.mcpServers`` block pastes in; as in nanobot, a url
    ending in ``/sse`` is an SSE server unless ``type`` says otherwise.
    """

    # Inferred from command / url when unset.
    type: Literal["stdio", "streamableHttp", "sse"] | None = None
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""  # default: a private folder of its own, <stateDir>/mcp/<name>/
    url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    tool_timeout: float = Field(30.0, gt=0, le=3600, description="seconds per tool call")
    enabled_tools: list[str] = Field(default_factory=lambda: ["*"])

    @field_validator("cwd")
    @classmethod
    def _cwd_absolute(cls, v: str) -> str:
        if v and not Path(v).expanduser().is_absolute():
            raise ValueError(
                f"{v!r}: give an absolute folder (or one starting with ~); a relative one "
                "would depend on where memobot was started"
            )
        return v

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("set either command (a stdio server) or url (Streamable HTTP, or SSE)")
        if self.type == "stdio" and not self.command:
            raise ValueError('type "stdio" needs a command')
        if self.type in ("streamableHttp", "sse") and not self.url:
            raise ValueError(f'type "{self.type}" needs a url')
        if self.url:
            checked_url(self.url)
        return self

    @property
    def transport(self) -> Literal["stdio", "http", "sse"]:
        if self.command:
            return "stdio"
        if self.type == "sse" or (self.type is None and ends_in_sse(self.url)):
            return "sse"
        return "http"


def ends_in_sse(url: str) -> bool:
    """nanobot's rule for an SSE server's url (the whole url, as it checks it)."""
    return url.rstrip("/").endswith("/sse")


_MCP_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class ToolsConfig(_Model):
    restrict_to_workspace: StrictBool = True
    # "risky": exec outside exec.allow, file writes outside the workspace and MCP tools not
    # in safeMcpTools wait for a person's yes; "always": every tool call; "off": none.
    approval: Literal["off", "risky", "always"] = "risky"
    approval_timeout_minutes: float = Field(30.0, gt=0, le=7 * 24 * 60)
    safe_mcp_tools: list[str] = Field(default_factory=list)  # mcp_<server>_<tool>, globs
    exec: ExecConfig = ExecConfig()
    web: WebConfig = WebConfig()
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("mcp_servers")
    @classmethod
    def _server_names(cls, v: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in v:
            if not _MCP_NAME.match(name):
                raise ValueError(
                    f"server name {name!r}: use letters, digits, _ and - only (it becomes part "
                    "of the tool names mcp_<server>_<tool>)"
                )
        return v


class _ChannelsBase(_Model):
    """``channels.<name>``: one section per channel that ``channels.registry`` lists with a
    config model (each platform's package declares it)."""


def _channels_model() -> type[_ChannelsBase]:
    sections: dict[str, Any] = {
        s.name: (s.config, s.config()) for s in specs().values() if s.config is not None
    }
    return create_model("ChannelsConfig", __base__=_ChannelsBase, **sections)


ChannelsConfig = _channels_model()


class DreamConfig(_Model):
    enabled: StrictBool = True
    interval_minutes: float = Field(240.0, ge=1)
    max_iterations: int = Field(12, ge=1, le=100)
    max_tokens: int = Field(60000, ge=1000, description="prompt+completion tokens per run")
    max_entries: int = Field(200, ge=1, description="history entries digested per run")


class EmbeddingsConfig(_Model):
    """``memory.embeddings``: an OpenAI-compatible ``/v1/embeddings`` endpoint for meaning-based
    (hybrid) memory search. Off by default: every archive entry and memory paragraph goes to
    that server."""

    enabled: StrictBool = False
    # "": llm's own endpoint (llm.baseUrl or OPENAI_BASE_URL, with llm's key).
    base_url: str = ""
    api_key: str = ""  # "": none sent (a local server), or llm's key when baseUrl is ""
    model: str = "text-embedding-3-small"
    batch_size: int = Field(64, ge=1, le=256, description="texts per request")
    timeout_seconds: float = Field(30.0, gt=0, le=600)
    # A search waits this long at most for its own query's vector, then is by words only.
    query_timeout_seconds: float = Field(5.0, gt=0, le=60)
    # Cosine similarity below which a nearest neighbour is no match by meaning.
    min_similarity: float = Field(0.3, ge=-1, le=1)

    _api_key = field_validator("api_key")(_header_safe_key)
    _base_url = field_validator("base_url")(lambda v: v and without_trailing_slash(checked_url(v)))


class MemoryConfig(_Model):
    consolidate_at_tokens: int = Field(24000, ge=500)
    consolidate_at_messages: int = Field(120, ge=4)
    keep_recent_messages: int = Field(12, ge=0, description="left unconsolidated after a run")
    # Background runs at once: each holds a chunk and a summarisation call, so when many chats
    # pass the threshold together (a busy gateway) the rest wait instead of piling up.
    max_concurrent_consolidations: int = Field(4, ge=1, le=64)
    idle_compact_minutes: float = Field(60.0, ge=0, description="0 disables idle compaction")
    max_chars: int = Field(4000, ge=200, description="budget for MEMORY.md and USER.md each")
    history_keep_days: int = Field(90, ge=1)
    share_in_groups: StrictBool = False
    # Non-admins' private chats (allowFrom or pairing) see USER.md, MEMORY.md and the owner's
    # chats' history (memory_search; never another person's or group's).
    share_with_non_admins: StrictBool = False
    # Group members' own memory files (memory/people/) in their group turns: off, because a
    # file holds what its person said in private too, and the whole group reads the answer.
    people_in_groups: StrictBool = False
    dream: DreamConfig = DreamConfig()
    # Dream's edits wait for an admin's Allow (a question with buttons, the panel) before
    # anything is written (bot.memory.review).
    dream_review: StrictBool = False
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    # A name in llm.models for consolidation and Dream (a cheaper model); "": llm's own.
    model: str = ""


class GatewayConfig(_Model):
    drain_seconds: float = Field(20.0, ge=0, le=600)


class CronConfig(_Model):
    max_jobs_per_chat: int = Field(50, ge=1, le=10000)
    # A missed occurrence older than this is skipped (logged) instead of fired late.
    max_late_minutes: float = Field(1440.0, ge=0)


class HeartbeatConfig(_Model):
    interval_minutes: float = Field(30.0, ge=0, description="0 disables the heartbeat")
    # A session key such as "telegram:12345"; "": the first Telegram admin's private chat.
    deliver_to: str = ""

    @field_validator("deliver_to")
    @classmethod
    def _session_key(cls, v: str) -> str:
        channel, sep, chat = v.partition(":")
        if v and not (sep and channel and chat):
            raise ValueError(f"{v!r} is not a session key such as telegram:12345")
        return v


DEFAULT_PANEL_LISTEN = "127.0.0.1:8765"


class PanelConfig(_Model):
    """``web``: the control panel in the browser, served by the gateway (docs/panel.md)."""

    enabled: StrictBool = True
    # Before listen, which is checked against it.
    # scrypt$N$r$p$salt$hash, written by `memobot web --set-password`; "": links only.
    password_hash: str = ""
    listen: str = DEFAULT_PANEL_LISTEN  # host:port; a non-loopback host needs passwordHash
    # The address people open when a reverse proxy stands in front ("https://bot.example.org").
    public_url: str = ""

    @field_validator("password_hash")
    @classmethod
    def _hash_format(cls, v: str) -> str:
        from bot.web.passwords import parse_hash

        if v:
            parse_hash(v)  # ValueError says what is wrong
        return v

    @field_validator("listen")
    @classmethod
    def _listen_address(cls, v: str, info: ValidationInfo) -> str:
        from bot.web.addresses import is_loopback, parse_listen

        host, _ = parse_listen(v)
        if not is_loopback(host) and not info.data.get("password_hash"):
            raise ValueError(
                f"{v!r} can be reached from other machines: set a password first (memobot "
                "web --set-password), or listen on 127.0.0.1"
            )
        return v

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str) -> str:
        from bot.web.addresses import check_public_url

        return check_public_url(v)

    @property
    def secure_cookies(self) -> bool:
        return self.public_url.startswith("https://")


_API_KEY_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")  # fullmatch ("$" would take a last "\n")
MIN_API_KEY_CHARS = 16


class ApiKeyConfig(_Model):
    """``api.keys[]``: one bearer key of the OpenAI-compatible API, named like a person."""

    # In the session keys (api:<name>:<session>) and the logs; never the key itself.
    name: str
    key: str = Field(repr=False)  # "${VAR}" or a systemd credential; never logged
    # Whom the key speaks for: "owner", or a person "<channel>:<user id>" of a channel's
    # allowFrom (that person's tools and memory scope; an admin there is the owner).
    as_: str = Field("owner", alias="as")
    revoked: StrictBool = False  # refused (401) like a wrong key, kept for the record
    # A call that needs an approval: "refuse" it (the model is told; an API client has no
    # buttons), or "allow" it without asking.
    approvals: Literal["refuse", "allow"] = "refuse"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _API_KEY_NAME.fullmatch(v):
            raise ValueError(f"{v!r}: use 1 to 40 letters, digits, _ and - (no spaces or :)")
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if len(v) < MIN_API_KEY_CHARS or not all("!" <= c <= "~" for c in v):
            raise ValueError(
                f"an API key needs at least {MIN_API_KEY_CHARS} characters, ASCII without "
                "spaces (make one with: openssl rand -hex 24)"
            )
        return v

    @field_validator("as_")
    @classmethod
    def _as(cls, v: str) -> str:
        channel, sep, user = v.partition(":")
        if v != "owner" and not (sep and channel and user):
            raise ValueError(f'{v!r}: "owner", or a person as <channel>:<user id>')
        return v


class ApiConfig(_Model):
    """``api``: the OpenAI-compatible API for programs (docs/api.md), on the panel's server
    (web.listen), or on a listener of its own there when the panel is off."""

    enabled: StrictBool = False
    keys: list[ApiKeyConfig] = Field(default_factory=list)
    # A request's body; the panel's own forms keep their smaller limit.
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # The new user message; longer is refused with 400 naming the field.
    max_message_chars: int = Field(100_000, ge=100, le=10_000_000)

    @field_validator("keys")
    @classmethod
    def _unique(cls, v: list[ApiKeyConfig]) -> list[ApiKeyConfig]:
        names = [k.name for k in v]
        if len(set(names)) != len(names):
            raise ValueError("two keys have the same name")
        secrets_ = [k.key for k in v]
        if len(set(secrets_)) != len(secrets_):
            raise ValueError("two keys have the same key: give each program its own")
        return v


class Config(_Model):
    llm: LLMConfig = LLMConfig()
    agent: AgentConfig = AgentConfig()
    tools: ToolsConfig = ToolsConfig()
    channels: ChannelsConfig = ChannelsConfig()
    memory: MemoryConfig = MemoryConfig()
    gateway: GatewayConfig = GatewayConfig()
    cron: CronConfig = CronConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    web: PanelConfig = PanelConfig()
    api: ApiConfig = ApiConfig()
    budget: BudgetConfig = BudgetConfig()

    @model_validator(mode="after")
    def _memory_model_named(self) -> Config:
        if self.memory.model and self.memory.model not in self.llm.models:
            known = ", ".join(sorted(self.llm.models)) or "none"
            raise ValueError(
                f"memory.model: {self.memory.model!r} is not a name in llm.models (named: {known})"
            )
        return self

    @model_validator(mode="after")
    def _api_keys(self) -> Config:
        if not self.api.enabled:
            return self
        if not any(not k.revoked for k in self.api.keys):
            # Without a key the API would act for the owner for any program that reaches it
            # (the model's own commands reach 127.0.0.1 too).
            raise ValueError(
                "api.keys: the API is enabled without a key: add one (docs/api.md), or set "
                "api.enabled to false"
            )
        for i, key in enumerate(self.api.keys):
            channel, _, user = key.as_.partition(":")
            section = getattr(self.channels, channel, None) if key.as_ != "owner" else None
            if key.as_ != "owner" and (section is None or user not in section.allow_from):
                raise ValueError(
                    f"api.keys[{i}].as: {key.as_!r} is not a person of a channel's allowFrom "
                    '(write "owner", or <channel>:<user id> as listed there)'
                )
        return self


def default_config_path() -> Path:
    env = os.environ.get("MEMOBOT_CONFIG")
    return Path(env).expanduser() if env else DEFAULT_CONFIG_PATH.expanduser()


def expand_env(
    value: Any, path: str = "", found: set[str] | None = None, whole: set[str] | None = None
) -> Any:
    """Replace ``${NAME}`` in every string with the environment variable NAME, or else with
    the systemd credential NAME (``LoadCredential=NAME:...``, read from
    ``$CREDENTIALS_DIRECTORY``); neither is an error naming the field. Every value put in is
    added to ``found``; the path of every string that was one placeholder alone to
    ``whole``."""
    if isinstance(value, str):
        if whole is not None and _ENV_REF.fullmatch(value):
            whole.add(path)

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            secret = os.environ[name] if name in os.environ else _credential(name)
            if secret is None:
                why = (
                    f"environment variable {name} is not set (and there is no systemd "
                    "credential of that name)"
                )
                raise ConfigError(f"{path or '<root>'}: {why}", ((path or "<root>", why),))
            if found is not None:
                found.add(secret)
            return secret

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {
            k: expand_env(v, f"{path}.{k}" if path else k, found, whole) for k, v in value.items()
        }
    if isinstance(value, list):
        return [expand_env(v, f"{path}[{i}]", found, whole) for i, v in enumerate(value)]
    return value


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {
    "int_type": (int,),
    "float_type": (int, float),
    "bool_type": (bool,),
}


def _typed_placeholders(data: Any, exc: ValidationError, whole: set[str]) -> bool:
    """Give a number or a boolean that came from a placeholder (``"${PORT}"``, where an
    environment variable can only be text) its JSON type, in ``data``, where the field
    wants one; True when anything changed. Written text is never retyped: that stays an
    error."""
    changed = False
    for err in exc.errors():
        wanted = _SCALAR_TYPES.get(err["type"])
        if not wanted or _json_path(err["loc"]) not in whole or not isinstance(err["input"], str):
            continue
        try:
            value = json.loads(err["input"])
        except json.JSONDecodeError:
            continue
        if isinstance(value, wanted) and (bool in wanted) == isinstance(value, bool):
            *parents, last = err["loc"]
            holder = data
            for part in parents:
                holder = holder[part]
            holder[last] = value
            changed = True
    return changed


def secret_strings(value: Any, key: str = "") -> Iterator[str]:
    """Strings of a config that must never be logged: those under key-, token-, secret- or
    password-like names, the values of extra HTTP headers, and the passwords and key-like
    query values of URLs (proxies, endpoints)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "headers" and isinstance(v, dict):  # extra HTTP headers: tokens, mostly
                yield from (h for h in v.values() if isinstance(h, str) and h)
            else:
                yield from secret_strings(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from secret_strings(v, key)
    elif isinstance(value, str):
        if _SECRET_KEY.search(key):
            yield value
        elif "://" in value:
            try:
                parts = urlsplit(value)
                password = parts.password
            except ValueError:
                return
            if password:
                yield unquote(password)
            for name, secret in parse_qsl(parts.query):
                if SECRET_PARAM.search(name):
                    yield secret


def _credential(name: str) -> str | None:
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return None
    try:
        return (Path(folder) / name).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _json_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


# Installed wheels ship no config.example.json; the docs page is in the repository the README
# (also the package description) links to, and ``memobot onboard`` writes every option.
OPTIONS_HELP = "docs/configuration.md lists every option"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config model that holds the field at ``loc`` (None inside lists and mappings)."""
    model: type[BaseModel] = Config
    for part in loc:
        if not isinstance(part, str):
            return None
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        inner = field.annotation if field else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return None
        model = inner
    return model


def did_you_mean(loc: tuple[int | str, ...]) -> str | None:
    """The known option closest to the unknown key at the end of ``loc``, if one is close."""
    model = _model_at(loc[:-1])
    if model is None or not isinstance(loc[-1], str):
        return None
    known = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    if not close:
        lowered = {k.lower(): k for k in known}
        close = [lowered[loc[-1].lower()]] if loc[-1].lower() in lowered else []
    return close[0] if close else None


# What a strict type error wants, by pydantic's error type (the config models are strict).
_WANTED = {
    "bool_type": "true or false, without quotes",
    "int_type": "a whole number, without quotes",
    "float_type": "a number, without quotes",
    "string_type": "a string, in quotes",
    "model_type": "an object { ... }",
    "dict_type": "an object { ... }",
    "list_type": "a list [ ... ]",
}


def _type_hint(kind: str, got: Any) -> str:
    """How to write what was meant: ``4242`` for an id is ``"4242"``, ``"0.5"`` is ``0.5``."""
    number = isinstance(got, int | float) and not isinstance(got, bool)
    if kind == "string_type" and number:
        return f': write "{got}"'
    if kind in ("int_type", "float_type") and isinstance(got, str):
        try:
            value = int(got) if kind == "int_type" else float(got)
        except ValueError:
            return ""
        return f": write {json.dumps(value)}"
    return ""


def _describe(err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        guess = did_you_mean(tuple(err["loc"]))
        if guess:
            return f"unknown option; did you mean {guess!r}? ({OPTIONS_HELP})"
        return f"unknown option ({OPTIONS_HELP})"
    if kind == "missing":
        return "required option is missing"
    # A secret is not echoed back, not even a mangled one; an extra header's value is often
    # one (a gateway's token), under any name.
    secret = bool(err["loc"]) and (
        bool(_SECRET_KEY.search(str(err["loc"][-1]))) or any(m in err["loc"] for m in SECRET_MAPS)
    )
    got = _without_secrets(err.get("input"))
    # Redacted before it is cut: a secret across the cut is no longer the one the filter knows.
    shown = f" (got {redact(json.dumps(got, default=str))[:80]})"
    if kind in _WANTED:
        hint = "" if secret else _type_hint(kind, got)
        return f"expected {_WANTED[kind]}{hint}{'' if secret else shown}"
    # Our validators' own words ("Value error, " is pydantic's prefix, not news to anyone).
    msg = str(err["msg"]).removeprefix("Value error, ")
    return msg if secret else f"{msg}{shown}"


def _without_secrets(value: Any, key: str = "", in_map: bool = False) -> Any:
    """``value`` (what a refused field got: a whole section, an MCP server) as it may be
    shown: secrets by their key's name or their map (an MCP server's env, whose names are
    anything) as ``***``, URLs redacted. The log filter knows only the secrets it was told."""
    if isinstance(value, dict):
        return {
            k: _without_secrets(v, str(k), in_map or (k in SECRET_MAPS and isinstance(v, dict)))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_without_secrets(v, key, in_map) for v in value]
    if isinstance(value, str) and value and (in_map or _SECRET_KEY.search(key)):
        return "***"
    if isinstance(value, str) and "://" in value:
        return redact_url(value)  # a password, a key in the query, a bot token in the path
    return value


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a JSON object")
    expanded: set[str] = set()
    whole: set[str] = set()
    data = expand_env(data, found=expanded, whole=whole)
    # Known to the log filter before anything can log them, a refused config's included.
    remember_secrets([*expanded, *secret_strings(data)])
    try:
        try:
            return Config.model_validate(data)
        except ValidationError as exc:
            if not _typed_placeholders(data, exc, whole):
                raise
        return Config.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, source) from None


def _invalid(exc: ValidationError, source: str, within: tuple[str, ...] = ()) -> ConfigError:
    """One line per refused field, secrets left out; ``within``: the path of the section that
    was validated alone (``("channels", "telegram")``), so each field is named in full."""
    fields = tuple(
        (_json_path((*within, *err["loc"])), redact(_describe(err))) for err in exc.errors()
    )
    lines = [f"{source}: invalid config", *(f"  {path}: {why}" for path, why in fields)]
    return ConfigError(redact("\n".join(lines)), fields)


def invalid_section(exc: ValidationError, *within: str) -> str:
    """The report of a config section validated on its own (``channels add``)."""
    return str(_invalid(exc, ".".join(within), within))


def check_layout(cfg: Config, config_path: Path) -> None:
    """ConfigError when the agent's workspace overlaps memobot's own files (bot.layout)."""
    problem = layout_problem(cfg.agent.workspace_path, cfg.agent.state_path, config_path)
    if problem:
        raise ConfigError(f"{config_path}: unsafe layout: {problem}")


def load_config(path: Path | None = None) -> tuple[Config, Path]:
    """Read and validate the config, and its layout. A missing file means all defaults.
    Raises ConfigError; an OSError of ``bot.file_errors.SETUP_ERRNOS`` (another user's file,
    a folder in its place) passes through marked with the path, for the one-line report."""
    path = (path or default_config_path()).expanduser()
    with about(path, "read"):
        exists = path.exists()
        if exists:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                if exc.errno in SETUP_ERRNOS:
                    raise
                raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    if not exists:
        check_layout(cfg := Config(), path)
        return cfg, path
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    cfg = parse_config(data, str(path))
    check_layout(cfg, path)
    return cfg, path


def read_raw(config_path: Path) -> dict[str, Any]:
    """The JSON of a config file ``load_config`` has just read (``${VAR}`` not expanded); {}
    when there is no file (the defaults)."""
    return read_versioned(config_path)[0]


def read_versioned(config_path: Path) -> tuple[dict[str, Any], str]:
    """:func:`read_raw`, and the version of the file it read (:func:`file_version`), for a
    save that must not overwrite an edit made since (``set_options(expect=...)``)."""
    try:
        data = config_path.read_bytes()
    except FileNotFoundError:
        return {}, ""
    except OSError as exc:
        raise ConfigError(f"{config_path}: cannot read config again: {exc}") from None
    try:
        raw = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # changed since it was loaded
        raise ConfigError(f"{config_path}: cannot read config again: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{config_path}: the top level must be a JSON object")
    return raw, _version(data)


def file_version(config_path: Path) -> str:
    """A fingerprint of the file as it is now: "" when there is none."""
    try:
        return _version(config_path.read_bytes())
    except FileNotFoundError:
        return ""


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


class ConfigChanged(ConfigError):
    """The file is not the one a save was made from (edited by hand, or saved elsewhere)."""


# set_options' check of the version and its write, one save at a time in this process.
_WRITING = threading.Lock()


def apply_options(data: dict[str, Any], changes: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """``data`` (a config's raw JSON) with each option of ``changes`` set in place."""
    for path, value in changes.items():
        holder = data
        for key in path[:-1]:
            holder = holder.setdefault(key, {})
        holder[path[-1]] = value
    return data


def set_options(
    config_path: Path,
    data: dict[str, Any],
    changes: dict[tuple[str, ...], Any],
    expect: str | None = None,
) -> Config:
    """Set each option (its path of keys, camelCase as in the file: ``("web",
    "passwordHash")``) in ``data``, the file's own JSON from ``read_raw``, and replace the
    file with it: everything else stays as written, and a ``${VAR}`` reference is never
    written out expanded. Durable, mode 0600 as ``save_config`` writes it. Returns the config
    as it now loads; ConfigError (nothing written) if it would not. ``expect``: the version
    ``data`` was read at (:func:`read_versioned`); ConfigChanged (nothing written) when the
    file has another now, so an edit made meanwhile is never overwritten unseen."""
    apply_options(data, changes)
    after = parse_config(copy.deepcopy(data), str(config_path))
    check_layout(after, config_path)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    with _WRITING:
        if expect is not None and file_version(config_path) != expect:
            raise ConfigChanged(
                f"{config_path} was changed since it was read (edited by hand, or saved from "
                "another page): nothing was written"
            )
        config_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        durable.replace_file(config_path, text, mode=0o600, chmod=0o600)
    return after


def config_to_json(cfg: Config) -> str:
    return json.dumps(cfg.model_dump(by_alias=True, mode="json"), indent=2) + "\n"


def save_config(cfg: Config, path: Path) -> None:
    """Write the config with mode 0600 from the first byte (it may hold API keys), as it
    will be read back (URLs in their one form). Raises ConfigError naming the field, and
    writes nothing, for a value set in code that would not load (``onboard --base-url
    localhost:11434``)."""
    try:
        cfg = Config.model_validate(json.loads(config_to_json(cfg)))
    except ValidationError as exc:
        raise _invalid(exc, str(path)) from None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    durable.replace_file(path, config_to_json(cfg), mode=0o600, chmod=0o600)
