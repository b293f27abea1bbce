"""Slack, through slack-bolt (Socket Mode). Named ``slack_channel`` so it can never shadow
``slack_bolt`` or ``slack_sdk``; ``spec`` is light, ``channel`` imports the SDK."""
