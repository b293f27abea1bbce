"""The delivery ledger (bot.delivery) on its own: where an answer's outbox entry lives."""

from __future__ import annotations

from pathlib import Path

from bot.bus import OutboundMessage
from bot.delivery import DELIVERY_KEY, LEDGER_SESSION_KEY, DeliveryLedger, outbox_entry
from bot.session import SessionStore, transitions


async def test_an_answer_kept_in_another_sessions_outbox_leaves_it_once_sent(
    tmp_path: Path,
) -> None:
    # A heartbeat's answer goes to the owner's chat but is kept in the heartbeat session's
    # outbox: sent, it must leave that outbox (else the session reads unfinished for good).
    store = SessionStore(tmp_path)
    ledger = DeliveryLedger(store)
    out = OutboundMessage(
        "telegram",
        "42",
        "all quiet",
        reply_to="hb-1",
        final=True,
        metadata={DELIVERY_KEY: "d-1", LEDGER_SESSION_KEY: "heartbeat:main"},
    )
    kept_in = store.get("heartbeat:main")
    assert store.apply(kept_in, transitions.announce(outbox_entry("d-1", out), "hb-1"))
    assert await ledger.sending(out, ["all quiet"], 0)
    await ledger.sent(out)
    assert kept_in.state.outbox == ()
    assert not kept_in.state.has_work
