"""Platform channels: each speaks one chat platform and meets the core only at the bus.

One package per platform (``telegram_channel``, ``discord_channel``, ``slack_channel``,
``terminal_channel``), named so it can never shadow the SDK it imports (``telegram``,
``discord``, ``slack_bolt``). Each declares itself in a light ``spec`` module listed in
``channels.registry``; its SDK is imported only when that channel is enabled.
"""
