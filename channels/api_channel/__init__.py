"""The OpenAI-compatible API as a channel: programs talk to memobot (``api:<key>:<session>``)."""
