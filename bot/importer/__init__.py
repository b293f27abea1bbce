"""``memobot import ...``: bring another assistant's files into memobot (nanobot for now)."""
