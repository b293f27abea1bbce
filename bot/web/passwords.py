"""The panel's optional password, stored as an scrypt hash (``web.passwordHash``):
``scrypt$N$r$p$<salt, base64>$<hash, base64>``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

N, R, P = 2**15, 8, 1  # about 32 MiB and a tenth of a second per check
_MAXMEM = 64 * 1024 * 1024
_LENGTH = 32


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def parse_hash(text: str) -> tuple[int, int, int, bytes, bytes]:
    """(N, r, p, salt, hash); ValueError when ``text`` is not a hash this module wrote."""
    parts = text.split("$")
    try:
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError
        n, r, p = (int(x) for x in parts[1:4])
        salt, digest = (
            base64.b64decode(parts[4], validate=True),
            base64.b64decode(parts[5], validate=True),
        )
    except ValueError:
        raise ValueError(
            "not a password hash memobot wrote (scrypt$N$r$p$salt$hash): set the password "
            "with memobot web --set-password"
        ) from None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or not salt or not digest:
        raise ValueError("the password hash has parameters memobot does not use")
    return n, r, p, salt, digest


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=N, r=R, p=P, maxmem=_MAXMEM, dklen=_LENGTH
    )
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    """True when ``password`` is the one ``stored`` was made from (compared in constant time).
    CPU-heavy: call it in a thread."""
    n, r, p, salt, digest = parse_hash(stored)
    given = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=len(digest)
    )
    return hmac.compare_digest(given, digest)
