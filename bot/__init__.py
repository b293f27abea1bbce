"""memobot: a self-hosted chat assistant daemon."""

__version__ = "0.1.0"
