"""The local terminal (``memobot agent``), through prompt-toolkit; ``spec`` is light,
``channel`` imports prompt-toolkit."""
