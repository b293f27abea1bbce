"""nanobot's ``config.json`` translated into a memobot config; a pure function over JSON.

nanobot's schema (camelCase aliases; nanobot also accepts snake_case, so both are read)::

    agents.defaults.{workspace, model, provider, maxTokens, temperature, maxToolIterations,
                     contextWindowTokens, timezone, timezoneMode, idleCompactAfterMinutes
                     (sessionTtlMinutes), memoryWindow (older), dream.{enabled, intervalH}, ...}
    providers.<name>.{apiKey, apiBase, extraHeaders, proxy}
    channels.{telegram, discord, slack, whatsapp, ...}.{enabled, token | botToken/appToken,
              allowFrom, groupPolicy, proxy, streaming, streamEditInterval, allowChannels, ...}
    tools.{restrictToWorkspace, exec.{timeout, enable, pathAppend}, web.{enable, proxy, search},
           mcpServers.<name>}
    gateway.{host, port, heartbeat}

memobot speaks one OpenAI-compatible endpoint, three channels, and MCP over stdio,
Streamable HTTP and SSE. Every value that has a memobot home is carried over and checked
against memobot's own config models one field at a time (a value memobot would refuse is
listed, not written); every value that has none is listed by its JSON path. Secret values are
never put into a report line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake

from bot.config import (
    _SECRET_KEY,
    AgentConfig,
    DreamConfig,
    ExecConfig,
    HeartbeatConfig,
    LLMConfig,
    McpServerConfig,
    MemoryConfig,
    WebConfig,
    WebSearchConfig,
)
from bot.config_base import ChannelConfig
from bot.dialects import PROVIDERS, detect_provider
from bot.service.logs import redact
from bot.urls import redact_url
from channels.discord_channel.config import DiscordConfig
from channels.slack_channel.config import SlackConfig
from channels.telegram_channel.config import TelegramConfig

# OpenAI-compatible endpoints of the providers nanobot knows by name; "" is OpenAI itself.
PROVIDER_BASES: dict[str, str] = {
    "openai": "",
    "custom": "",
    "openrouter": "https://openrouter.ai/api/v1",
    "anthropic": "https://api.anthropic.com/v1/",
    "deepseek": "https://api.deepseek.com/v1",
    "groq": "https://api.groq.com/openai/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta/openai/",
    "moonshot": "https://api.moonshot.ai/v1",
    "dashscope": "https://dashscope.aliyuncs.com/compatible-mode/v1",
    "zhipu": "https://open.bigmodel.cn/api/paas/v4",
    "minimax": "https://api.minimax.io/v1",
    "siliconflow": "https://api.siliconflow.cn/v1",
    "aihubmix": "https://aihubmix.com/v1",
    "ollama": "http://localhost:11434/v1",
}
# Gateways whose model ids carry the vendor ("anthropic/claude-..."): the prefix stays.
_ROUTERS = frozenset({"openrouter", "aihubmix", "siliconflow", "custom", "vllm", "ollama"})
# Words in a model name that point at a provider, when the config leaves it to "auto".
_MODEL_HINTS: tuple[tuple[str, str], ...] = (
    ("claude", "anthropic"),
    ("gpt", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("deepseek", "deepseek"),
    ("gemini", "gemini"),
    ("qwen", "dashscope"),
    ("glm", "zhipu"),
    ("kimi", "moonshot"),
    ("moonshot", "moonshot"),
    ("minimax", "minimax"),
)
_CHANNELS: dict[str, type[ChannelConfig]] = {
    "telegram": TelegramConfig,
    "discord": DiscordConfig,
    "slack": SlackConfig,
}
_TOKENS: dict[str, tuple[str, ...]] = {
    "telegram": ("token",),
    "discord": ("token",),
    "slack": ("botToken", "appToken"),
}
# Channel settings with a memobot home of the same meaning: nanobot's key -> memobot's.
_CHANNEL_SAME: dict[str, dict[str, str]] = {
    "telegram": {"streaming": "streaming", "streamEditInterval": "streamEditIntervalSeconds"},
    "discord": {"streaming": "streaming", "allowChannels": "allowChannels"},
    "slack": {"streaming": "streaming"},
}
_SNAKE = re.compile(r"_([a-z0-9])")


@dataclass(slots=True)
class Translation:
    """The memobot config (camelCase JSON, ready for ``parse_config``) and what was left out.

    ``dropped`` holds (JSON path in nanobot's config, why); ``notes`` holds things carried
    over that a person should look at (a guessed endpoint, a weaker setting)."""

    config: dict[str, Any]
    dropped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    provider: str = ""


def camel_keys(value: Any) -> Any:
    """Every object key in camelCase (nanobot reads ``api_key`` and ``apiKey`` alike)."""
    if isinstance(value, dict):
        return {_camel(str(k)): camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def _camel(key: str) -> str:
    return _SNAKE.sub(lambda m: m.group(1).upper(), key) if "_" in key else key


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {} or value is False


def _fits(model: type[BaseModel], key: str, value: Any) -> str | None:
    """None when memobot's ``model`` accepts ``value`` for ``key``, else why not."""
    try:
        model.model_validate({key: value})
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"])
    return None


def _as_typed(model: type[BaseModel], key: str, value: Any) -> Any:
    """``value`` as memobot's strict ``model`` wants it for ``key``: nanobot's config is read
    leniently, so a number it took in quotes ("8192") becomes the number; anything else
    is returned as it was."""
    if _fits(model, key, value) is None:
        return value
    try:
        lax = model.model_validate({key: value}, strict=False)
    except ValidationError:
        return value
    return lax.model_dump(by_alias=True, mode="json", include={to_snake(key)})[key]


def _shown(key: str, value: Any) -> str:
    """A refused value as the report shows it (it is printed, and pasted into bug reports):
    as bot.config's errors do, an extra header's value or a secret not at all (nor a mangled
    one), a URL (a proxy) without its user name and password."""
    if key == "headers" or _SECRET_KEY.search(key):
        return "its value"
    return repr(redact_url(value)) if isinstance(value, str) else repr(value)


class _Translator:
    def __init__(self, data: dict[str, Any]) -> None:
        self.raw = data
        self.data = camel_keys(data)
        self.out: dict[str, Any] = {"llm": {}, "agent": {}, "tools": {"exec": {}}, "channels": {}}
        self.result = Translation(self.out)

    def drop(self, path: str, why: str) -> None:
        self.result.dropped.append((path, why))

    def leftovers(self, prefix: str, section: Any, used: set[str], why: str) -> None:
        """List every non-empty key of ``section`` not in ``used``."""
        if not isinstance(section, dict):
            return
        for key, value in section.items():
            if key not in used and not _empty(value):
                self.drop(f"{prefix}.{key}", why)

    def put(
        self, model: type[BaseModel], dest: dict[str, Any], key: str, value: Any, src: str
    ) -> None:
        value = _as_typed(model, key, value)
        problem = _fits(model, key, value)
        if problem:
            self.drop(src, redact(f"memobot refuses {_shown(key, value)} for it ({problem})"))
        else:
            dest[key] = value

    # -- sections --------------------------------------------------------------------------

    def run(self) -> Translation:
        known = {"agents", "providers", "channels", "tools", "gateway"}
        for key, value in self.data.items():
            if key not in known and not _empty(value):
                self.drop(key, "no memobot equivalent")
        self.agents()
        self.tools()
        self.channels()
        gateway = self.data.get("gateway")
        if isinstance(gateway, dict):
            why = {
                "host": "memobot's gateway opens no HTTP port",
                "port": "memobot's gateway opens no HTTP port",
            }
            for key, value in gateway.items():
                if key == "heartbeat":
                    self.heartbeat(value)
                elif not _empty(value):
                    self.drop(f"gateway.{key}", why.get(key, "no memobot equivalent"))
        self.without_placeholders(self.out, "")
        return self.result

    def without_placeholders(self, section: dict[str, Any], path: str) -> None:
        """Take out every setting whose text holds ``${``: nanobot never fills one in, memobot
        fills it from its own environment, so an imported ``"http://${OPENAI_API_KEY}@host"``
        would carry memobot's secrets to that host. The owner writes such references by hand."""
        for key, value in list(section.items()):
            where = f"{path}.{key}" if path else key
            if isinstance(value, dict):
                self.without_placeholders(value, where)
            elif "${" in json.dumps(value):
                del section[key]
                self.drop(
                    f"(memobot's {where})",
                    "it holds ${...}, which memobot would fill from its own environment; "
                    "write the value, or the reference, into memobot's config yourself",
                )

    def heartbeat(self, section: Any) -> None:
        """nanobot's ``gateway.heartbeat {enabled, intervalS}``: memobot's ``heartbeat``."""
        if not isinstance(section, dict):
            return
        self.leftovers("gateway.heartbeat", section, {"enabled", "intervalS"}, "no equivalent")
        if section.get("enabled") is False:
            self.out["heartbeat"] = {"intervalMinutes": 0}
            return
        seconds = section.get("intervalS")
        if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
            self.out["heartbeat"] = {}
            minutes = round(seconds / 60, 3)
            self.put(
                HeartbeatConfig,
                self.out["heartbeat"],
                "intervalMinutes",
                minutes,
                "gateway.heartbeat.intervalS",
            )

    def agents(self) -> None:
        agents = self.data.get("agents")
        defaults = agents.get("defaults") if isinstance(agents, dict) else None
        defaults = defaults if isinstance(defaults, dict) else {}
        if isinstance(agents, dict):
            self.leftovers("agents", agents, {"defaults"}, "no memobot equivalent")
        llm, agent = self.out["llm"], self.out["agent"]
        self.provider(str(defaults.get("model") or ""), defaults.get("provider"))
        for src, model, dest, key in (
            ("maxTokens", LLMConfig, llm, "maxTokens"),
            ("temperature", LLMConfig, llm, "temperature"),
            ("contextWindowTokens", LLMConfig, llm, "contextWindowTokens"),
            ("maxToolIterations", AgentConfig, agent, "maxToolIterations"),
        ):
            if defaults.get(src) is not None:
                self.put(model, dest, key, defaults[src], f"agents.defaults.{src}")
        used = {"workspace", "model", "provider", "maxTokens", "temperature"}
        used |= {"contextWindowTokens", "maxToolIterations"}
        used |= self.timezone(defaults) | self.memory(defaults)
        self.leftovers("agents.defaults", defaults, used, "no memobot equivalent")

    def timezone(self, defaults: dict[str, Any]) -> set[str]:
        """``timezone`` and ``timezoneMode``: a zone set by hand is memobot's
        ``agent.timezone``; nanobot's "auto" follows the system's zone, as memobot's ""."""
        zone_name = defaults.get("timezone")
        mode = defaults.get("timezoneMode") or ("manual" if zone_name else "auto")
        if mode == "auto":
            if zone_name:
                self.result.notes.append(
                    (
                        "agent.timezone",
                        f'"" (the system\'s zone): nanobot\'s timezoneMode "auto" followed the '
                        f"system, which was {zone_name} when it last wrote its config",
                    )
                )
        elif isinstance(zone_name, str) and zone_name:
            self.put(
                AgentConfig, self.out["agent"], "timezone", zone_name, "agents.defaults.timezone"
            )
        return {"timezone", "timezoneMode"}

    def memory(self, defaults: dict[str, Any]) -> set[str]:
        """Idle compaction, the consolidation window and Dream's schedule: memobot's
        ``memory`` section."""
        memory: dict[str, Any] = {}
        for src in ("idleCompactAfterMinutes", "sessionTtlMinutes"):
            if defaults.get(src) is not None:  # two names of one nanobot setting
                where = f"agents.defaults.{src}"
                self.put(MemoryConfig, memory, "idleCompactMinutes", defaults[src], where)
        if defaults.get("memoryWindow") is not None:
            where = "agents.defaults.memoryWindow"
            self.put(MemoryConfig, memory, "consolidateAtMessages", defaults["memoryWindow"], where)
        dream = defaults.get("dream")
        if isinstance(dream, dict):
            out: dict[str, Any] = {}
            if isinstance(dream.get("enabled"), bool):
                out["enabled"] = dream["enabled"]
            hours = dream.get("intervalH")
            if isinstance(hours, int | float) and not isinstance(hours, bool):
                where = "agents.defaults.dream.intervalH"
                self.put(DreamConfig, out, "intervalMinutes", hours * 60, where)
            if out:
                memory["dream"] = out
            why = "memobot's Dream runs every memory.dream.intervalMinutes with the main model"
            self.leftovers("agents.defaults.dream", dream, {"enabled", "intervalH"}, why)
        if memory:
            self.out["memory"] = memory
        return {"idleCompactAfterMinutes", "sessionTtlMinutes", "memoryWindow", "dream"}

    def provider(self, model: str, wanted: Any) -> None:
        providers = self.data.get("providers")
        providers = providers if isinstance(providers, dict) else {}
        usable = {
            name: p
            for name, p in providers.items()
            if isinstance(p, dict) and (p.get("apiKey") or p.get("apiBase"))
        }
        name = self._choose(model, wanted, usable)
        llm = self.out["llm"]
        if model:
            shown = model
            if name and name not in _ROUTERS and model.startswith(f"{name}/"):
                shown = model.split("/", 1)[1]
                self.result.notes.append(
                    ("llm.model", f"{model!r} became {shown!r} (the endpoint's own model id)")
                )
            llm["model"] = shown
        chosen = usable.get(name, providers.get(name) if name else None)
        if isinstance(chosen, dict):
            self.result.provider = name
            if chosen.get("apiKey"):
                llm["apiKey"] = str(chosen["apiKey"])
            base = str(chosen.get("apiBase") or PROVIDER_BASES.get(name, ""))
            if base:
                llm["baseUrl"] = base
                if name in PROVIDERS and detect_provider(base) == "generic":
                    # nanobot's provider names the dialect a self-hosted URL cannot tell; a
                    # URL that names its provider is trusted over nanobot's name for it.
                    llm["provider"] = name
            if not chosen.get("apiBase") and name in PROVIDER_BASES and base:
                self.result.notes.append(
                    (
                        "llm.baseUrl",
                        f"{base} is {name}'s OpenAI-compatible endpoint (memobot speaks only that "
                        "API); check it if the first answer fails",
                    )
                )
            if not base and name not in ("openai",):
                self.result.notes.append(
                    ("llm.baseUrl", f"no endpoint known for provider {name!r}: set llm.baseUrl")
                )
            if isinstance(chosen.get("extraHeaders"), dict) and chosen["extraHeaders"]:
                where = f"providers.{name}.extraHeaders"
                self.put(LLMConfig, llm, "headers", chosen["extraHeaders"], where)
            if not _empty(chosen.get("proxy")):
                self.put(LLMConfig, llm, "proxy", chosen["proxy"], f"providers.{name}.proxy")
            used = {"apiKey", "apiBase", "extraHeaders", "proxy"}
            self.leftovers(f"providers.{name}", chosen, used, "no memobot equivalent")
        elif usable or wanted:
            self.drop("providers", "none of them could be matched to the model; set llm.* by hand")
        for other in usable:
            if other != name:
                self.drop(f"providers.{other}", "memobot talks to one endpoint")

    @staticmethod
    def _choose(model: str, wanted: Any, usable: dict[str, Any]) -> str:
        if isinstance(wanted, str) and wanted and wanted != "auto":
            return wanted
        prefix = model.split("/", 1)[0] if "/" in model else ""
        if prefix in usable:
            return prefix
        lowered = model.lower()
        for hint, name in _MODEL_HINTS:
            if hint in lowered and name in usable:
                return name
        return next(iter(usable), "")

    def tools(self) -> None:
        tools = self.data.get("tools")
        if not isinstance(tools, dict):
            return
        out = self.out["tools"]
        if isinstance(tools.get("restrictToWorkspace"), bool):
            out["restrictToWorkspace"] = tools["restrictToWorkspace"]
            if not tools["restrictToWorkspace"]:
                self.result.notes.append(
                    (
                        "tools.restrictToWorkspace",
                        "false, as in nanobot: the agent's file tools and commands are not "
                        "confined to the workspace (memobot's default is true)",
                    )
                )
        exec_cfg = tools.get("exec")
        if isinstance(exec_cfg, dict):
            if exec_cfg.get("timeout") is not None:
                self.put(
                    ExecConfig,
                    out["exec"],
                    "timeoutSeconds",
                    exec_cfg["timeout"],
                    "tools.exec.timeout",
                )
            for key in ("enable", "enabled"):
                if isinstance(exec_cfg.get(key), bool):
                    out["exec"]["enabled"] = exec_cfg[key]
            self.leftovers(
                "tools.exec", exec_cfg, {"timeout", "enable", "enabled"}, "no memobot equivalent"
            )
        web = tools.get("web")
        if isinstance(web, dict):
            for key, value in web.items():
                if key == "search" and isinstance(value, dict):
                    self.web_search(value)
                elif key in ("enable", "enabled") and isinstance(value, bool):
                    web_out = out.setdefault("web", {})
                    self.put(WebConfig, web_out, "enabled", value, f"tools.web.{key}")
                elif not _empty(value):
                    self.drop(f"tools.web.{key}", "no memobot equivalent")
        servers = tools.get("mcpServers")
        if isinstance(servers, dict) and servers:
            raw_tools = self.raw.get("tools") if isinstance(self.raw.get("tools"), dict) else {}
            raw = raw_tools.get("mcpServers") or raw_tools.get("mcp_servers") or {}
            raw = raw if isinstance(raw, dict) else {}
            # A server's name is as written: camelCased, "my_srv" would become "mySrv" and
            # every tool the model knows (mcp_my_srv_...) would change its name.
            names = list(raw) if len(raw) == len(servers) else list(servers)
            for name, src in sorted(zip(names, servers.values(), strict=True), key=itemgetter(0)):
                self.mcp_server(name, src, raw.get(name))
        used = {"restrictToWorkspace", "exec", "web", "mcpServers"}
        self.leftovers("tools", tools, used, "no memobot equivalent")

    def web_search(self, src: dict[str, Any]) -> None:
        """``tools.web.search``: nanobot's provider, key, endpoint and count; a key without a
        provider is Brave's (nanobot's first and long only provider)."""
        out: dict[str, Any] = {}
        provider = src.get("provider") or ("brave" if src.get("apiKey") else "")
        if provider:
            self.put(WebSearchConfig, out, "provider", provider, "tools.web.search.provider")
        for key in ("apiKey", "baseUrl", "maxResults"):
            if not _empty(src.get(key)):
                self.put(WebSearchConfig, out, key, src[key], f"tools.web.search.{key}")
        if out.get("provider") == "searxng" and not out.get("baseUrl"):
            self.drop("tools.web.search", "searxng needs baseUrl, which nanobot's config lacks")
            return
        if out:
            self.out["tools"].setdefault("web", {})["search"] = out
        used = {"provider", "apiKey", "baseUrl", "maxResults"}
        self.leftovers("tools.web.search", src, used, "no memobot equivalent")

    def mcp_server(self, name: str, src: Any, raw: Any) -> None:
        """One ``tools.mcpServers`` entry: the same keys in memobot (``env`` and ``headers``
        names as written, not camelCased); what memobot refuses is listed."""
        path = f"tools.mcpServers.{name}"
        if not isinstance(src, dict):
            self.drop(path, "not an object")
            return
        keys = ("type", "command", "args", "env", "cwd", "url", "headers", "toolTimeout")
        out = {k: src[k] for k in keys if not _empty(src.get(k))}
        for key in ("env", "headers"):
            if isinstance(raw, dict) and isinstance(raw.get(key), dict) and raw[key]:
                out[key] = raw[key]
        if "enabledTools" in src:
            out["enabledTools"] = src["enabledTools"]
        try:
            McpServerConfig.model_validate(out)
        except ValidationError as exc:
            self.drop(path, f"memobot refuses it ({exc.errors()[0]['msg']})")
            return
        self.out["tools"].setdefault("mcpServers", {})[name] = out
        self.leftovers(path, src, {*keys, "enabledTools"}, "no memobot equivalent")

    def channels(self) -> None:
        channels = self.data.get("channels")
        if not isinstance(channels, dict):
            return
        for name, section in channels.items():
            if name in _CHANNELS and isinstance(section, dict):
                self.channel(name, section)
            elif isinstance(section, dict):
                state = "enabled" if section.get("enabled") else "disabled"
                self.drop(f"channels.{name} ({state})", f"memobot has no {name} channel")
            elif not _empty(section):
                self.drop(f"channels.{name}", "no memobot equivalent")

    def channel(self, name: str, src: dict[str, Any]) -> None:
        model = _CHANNELS[name]
        out: dict[str, Any] = {}
        path = f"channels.{name}"
        for key in _TOKENS[name]:
            if src.get(key):
                out[key] = str(src[key])
        allow = src.get("allowFrom")
        if isinstance(allow, list):
            kept: list[str] = []
            for raw in allow:
                value = str(raw).split("|", 1)[0].strip() if isinstance(raw, str | int) else ""
                if value and _fits(model, "allowFrom", [value]) is None:
                    kept.append(value)
                else:
                    self.drop(
                        f"{path}.allowFrom {raw!r}",
                        "not a stable user id (memobot allows ids, never usernames)",
                    )
            out["allowFrom"] = kept
        policy = src.get("groupPolicy")
        if policy in ("mention", "open"):
            out["groupPolicy"] = policy
        elif not _empty(policy):
            out["groupPolicy"] = "mention"
            self.drop(f"{path}.groupPolicy {policy!r}", "memobot has mention or open; set mention")
        proxy = src.get("proxy")
        if not _empty(proxy):
            self.put(model, out, "proxy", str(proxy), f"{path}.proxy")
        enabled = bool(src.get("enabled"))
        missing = [k for k in _TOKENS[name] if not out.get(k)]
        if enabled and missing:
            enabled = False
            self.drop(f"{path}.enabled", f"no {', '.join(missing)}: the channel stays disabled")
        out["enabled"] = enabled
        if name == "slack" and src.get("mode") not in (None, "", "socket"):
            self.drop(f"{path}.mode {src['mode']!r}", "memobot connects over Socket Mode only")
        if name == "telegram" and src.get("mode") not in (None, "", "polling"):
            self.drop(f"{path}.mode {src['mode']!r}", "memobot polls Telegram (no webhook)")
        same = _CHANNEL_SAME.get(name, {})
        for key, dest in same.items():
            if src.get(key) is not None:
                self.put(model, out, dest, src[key], f"{path}.{key}")
        used = {"enabled", "allowFrom", "groupPolicy", "proxy", "mode", *_TOKENS[name], *same}
        self.leftovers(path, src, used, "no memobot equivalent")
        self.out["channels"][name] = out


def translate_config(data: dict[str, Any]) -> Translation:
    """memobot config JSON for nanobot's ``data`` (agent.workspace and stateDir are the
    caller's to set). Never raises on unexpected shapes: they are listed in ``dropped``."""
    return _Translator(data).run()


def nanobot_workspace_setting(data: dict[str, Any]) -> str | None:
    """``agents.defaults.workspace`` of a nanobot config, if set."""
    agents = camel_keys(data).get("agents")
    defaults = agents.get("defaults") if isinstance(agents, dict) else None
    value = defaults.get("workspace") if isinstance(defaults, dict) else None
    return value if isinstance(value, str) and value else None


__all__ = [
    "PROVIDER_BASES",
    "Translation",
    "camel_keys",
    "nanobot_workspace_setting",
    "translate_config",
]
