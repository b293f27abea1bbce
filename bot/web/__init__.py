"""The control panel in the browser (docs/panel.md): served by the gateway on aiohttp's web
server, or by ``memobot web`` alone while no gateway runs.

One job per module: ``addresses`` (listen, publicUrl, the hosts and origins the panel
answers to), ``passwords`` (scrypt), ``links`` (one-time login links handed over through the
state folder), ``sessions`` (logged-in browsers), ``limits`` (login attempts), ``guard``
(the checks and headers every request passes), ``render`` (escaped templates), ``pages``
(what each page shows), ``server`` (routes and the listening socket), ``command``
(``memobot web``).
"""
