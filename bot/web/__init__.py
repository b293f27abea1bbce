"""The control panel in the browser (docs/panel.md): served by the gateway on aiohttp's web
server, or by ``memobot web`` alone while no gateway runs.

One job per module: ``addresses`` (listen, publicUrl, the hosts and origins the panel
answers to), ``passwords`` (scrypt), ``links`` (one-time login links handed over through the
state folder), ``sessions`` (logged-in browsers), ``limits`` (login attempts), ``pages``
(what each page shows, read with the CLI's own functions), ``views`` (those pages as HTML),
``render`` (escaped templates), ``server`` (routes, the checks and headers every request
passes, the listening socket), ``command`` (``memobot web``).
"""
