"""Discord, through discord.py. Named ``discord_channel`` so it can never shadow the SDK's
``discord`` package; ``spec`` is light, ``channel`` imports the SDK."""
