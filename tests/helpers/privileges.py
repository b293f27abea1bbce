"""Make the calling process someone files do not belong to, as ``setpriv`` does before an exec.

Two ways, for tests of what memobot says about files it may not read or write
(tests/test_file_errors.py):

* ``{"uid": N, "gid": N}``: ``setpriv --reuid N --regid N --clear-groups``;
* ``{"caps": "none"}``: root held to the permission bits like anyone, as
  ``setpriv --bounding-set=-all --inh-caps=-all`` leaves a program it execs: no capability in
  the bounding, inheritable, ambient, permitted or effective set, so neither this process nor
  one it execs gets any back.

Run in a forked child before it becomes memobot (tests.helpers.zygote_server), or as a fresh
interpreter's ``preexec_fn``.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop(spec: dict[str, Any]) -> None:
    """Drop to ``spec`` (see the module's docstring); raises OSError when the kernel refuses."""
    if "uid" in spec:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
        # A uid change without an exec leaves the process undumpable: its /proc files root's,
        # as they would not be for a program setpriv execs.
        _check(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0))
        return
    if spec.get("caps") != "none":
        raise ValueError(f"unknown privileges: {spec!r}")
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0))
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0))
    header = _Header(_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()  # all zero: nothing effective, permitted or inheritable
    _check(libc.capset(ctypes.byref(header), data))


def _check(result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
