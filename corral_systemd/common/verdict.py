"""A session's verdict that only its holder can give: a one-bit commitment.

A fallback session's holder is a process of its runs' uid: they can rewrite
the entry it writes, and once it is dead (killed by what it held) bind its
address and answer in its name. What the holder says at the end — every
process proven gone, or not — must still be its own, or be read as nothing.

At ``session start`` two secrets are drawn and only their digests are
published, folded into the session's id: the id *is* the commitment, so
nothing written later can change it. At the end the holder reveals the one
secret that matches its verdict. The secrets live only in the memory of the
holder (and, for a moment, of ``session start``), neither dumpable, so no run
can read them: a forger can reveal nothing, and so can say "not proven"
(which it could anyway), never "proven". ``ID_HEX`` digits of the digest are
in the id: finding another pair of secrets whose digest begins with them
(2^96 work) is out of reach.

A revealed verdict stays valid for that session only after its holder ended
it, which is when it was true: replaying it says nothing false.
"""

import hashlib
import secrets

_DOMAIN = b"corral-session-verdict\0"
#: Hex digits of the commitment that make a committed session's id.
ID_HEX = 24


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(_DOMAIN + data).digest()


def _session_id(proven_digest: bytes, unproven_digest: bytes) -> str:
    return hashlib.sha256(_DOMAIN + proven_digest + unproven_digest).hexdigest()[:ID_HEX]


def is_committed(session_id: str) -> bool:
    """Was the session's id made by ``Verdicts.session_id`` (a fallback session:
    its end is proven only by a verdict that ``check`` accepts)? Told by the
    id's form alone, which nothing can rewrite."""
    return len(session_id) == ID_HEX


class Verdicts:
    """The two secrets of one session, kept by its holder until it reveals one."""

    def __init__(self) -> None:
        self._proven = secrets.token_bytes(32)
        self._unproven = secrets.token_bytes(32)

    @property
    def session_id(self) -> str:
        return _session_id(_digest(self._proven), _digest(self._unproven))

    def reveal(self, proven: bool) -> dict:
        """The verdict, as the entry and the ``End`` answer carry it."""
        secret, other = (self._proven, self._unproven) if proven else (self._unproven, self._proven)
        return {"proven": proven, "secret": secret.hex(), "other": _digest(other).hex()}


def check(session_id: str, verdict) -> bool | None:
    """What session ``session_id``'s holder revealed in ``verdict``: True (every
    process proven gone), False (not proven), or None: no verdict of its holder's
    (absent, malformed, or not matching the id: forged)."""
    if not isinstance(verdict, dict) or not isinstance(verdict.get("proven"), bool):
        return None
    try:
        secret = bytes.fromhex(verdict["secret"])
        other = bytes.fromhex(verdict["other"])
    except (KeyError, TypeError, ValueError):
        return None
    mine = _digest(secret)
    pair = (mine, other) if verdict["proven"] else (other, mine)
    return verdict["proven"] if secrets.compare_digest(_session_id(*pair), session_id) else None
