"""A delivery ledger that keeps nothing, for the channel manager alone: what it sends is no
answer on disk (``channels.delivery.Ledger``)."""

from __future__ import annotations

from bot.bus import OutboundMessage


class NoLedger:
    def progress(self, msg: OutboundMessage) -> tuple[None, int]:
        return None, 0

    async def sending(self, msg: OutboundMessage, pieces: object = None, index: int = 0) -> bool:
        return True

    async def sent(self, msg: OutboundMessage) -> None:
        pass

    async def postponed(self, msg: OutboundMessage, index: int = 0) -> None:
        pass

    async def failed(self, msg: OutboundMessage, reason: str = "", index: int = 0) -> None:
        pass

    def preview_ids(self, key: str, reply_to: str | None) -> list[str]:
        return []

    async def previewing(self, key: str, reply_to: str | None, ids: list[str]) -> None:
        pass
