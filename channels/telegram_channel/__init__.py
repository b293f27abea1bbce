"""Telegram, through python-telegram-bot. Named ``telegram_channel`` so it can never shadow
the SDK's ``telegram`` package; ``spec`` is light, ``channel`` imports the SDK."""
