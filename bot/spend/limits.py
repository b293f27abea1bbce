"""``budget`` in the config: spending limits, by scope and period, in tokens or money.

Apart from :mod:`bot.config` (which only gathers it) so the budget's own module owns its
shape: ``budget.daily``, ``budget.monthly`` (the whole installation), ``budget.perChat.*``
(each chat's own turns) and ``budget.background.*`` (consolidation, Dream, heartbeat,
scheduled agent jobs), each ``{"tokens": N, "cost": X}``; an unset limit does not hold.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bot.config_base import ConfigModel

Scope = Literal["total", "chat", "background"]
Period = Literal["daily", "monthly"]
Unit = Literal["tokens", "cost"]
SCOPES: tuple[Scope, ...] = ("total", "chat", "background")
PERIODS: tuple[Period, ...] = ("daily", "monthly")
UNITS: tuple[Unit, ...] = ("tokens", "cost")
# How each scope is written in the config (and in /budget): "daily.tokens",
# "perChat.daily.tokens", "background.monthly.cost".
PREFIX: dict[Scope, str] = {"total": "", "chat": "perChat.", "background": "background."}


class Limit(ConfigModel):
    """One period's limits; None: no limit. ``tokens`` counts prompt plus completion tokens;
    ``cost`` the priced calls' cost (llm.prices), in their currency."""

    tokens: int | None = Field(None, ge=1)
    cost: float | None = Field(None, gt=0, allow_inf_nan=False)  # 1e309 is no limit


class Periods(ConfigModel):
    daily: Limit = Limit()
    monthly: Limit = Limit()


class BudgetConfig(ConfigModel):
    daily: Limit = Limit()
    monthly: Limit = Limit()
    per_chat: Periods = Periods()
    background: Periods = Periods()

    def limit(self, scope: Scope, period: Period) -> Limit:
        if scope == "total":
            return self.daily if period == "daily" else self.monthly
        section = self.per_chat if scope == "chat" else self.background
        return section.daily if period == "daily" else section.monthly


def limit_name(scope: Scope, period: Period, unit: Unit) -> str:
    """The limit's name as the config and /budget write it: "perChat.daily.tokens"."""
    return f"{PREFIX[scope]}{period}.{unit}"


NAMES: dict[str, tuple[Scope, Period, Unit]] = {
    limit_name(s, p, u): (s, p, u) for s in SCOPES for p in PERIODS for u in UNITS
}
