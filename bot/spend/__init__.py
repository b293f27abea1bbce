"""Spend under control (issue 31): every model call counted once, durably, and read back.

- ``record``: one call's record (tokens as reported or estimated, cost from ``llm.prices``).
- ``ledger``: the append-only monthly files in ``<state>/usage/`` and their reader.
- ``report``: totals and groups over local days, for ``memobot usage``, ``/usage``, status.
- ``commands``: ``memobot usage``.
"""
