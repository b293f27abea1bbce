"""The panel's chat: the owner talks to memobot from the browser (``web:<name>`` sessions)."""
