"""Running memobot as a system service: the systemd notify protocol, unit files, ``doctor``.

Nothing here imports systemd libraries: the notify protocol is one datagram per message, and the
units are plain text rendered from this installation's paths.
"""
