"""What every channel is: a name, a lifecycle, and a way to send one message."""

from __future__ import annotations

from abc import ABC, abstractmethod

from bot.bus import MessageBus, OutboundMessage


class Channel(ABC):
    """One chat platform (or the terminal). Receives by publishing to the bus; sends on demand.

    ``send`` raises on failure; the manager decides what a failure means for the delivery.
    """

    name: str

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus

    async def start(self) -> None:  # noqa: B027 - most channels need no start-up work
        """Connect and begin publishing inbound messages; return once running."""

    async def stop(self) -> None:  # noqa: B027
        """Disconnect cleanly."""

    @abstractmethod
    async def send(self, msg: OutboundMessage) -> None:
        """Deliver one message to its chat."""
