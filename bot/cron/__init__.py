"""Scheduled work: reminders and recurring tasks (cron jobs) and the heartbeat.

Due work enters the bus as an ``InboundMessage`` with a durable id (DESIGN.md section 11), so
intake, dedup, resume and the delivery ledger treat it like a message a person sent.
"""
