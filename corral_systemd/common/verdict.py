"""A session's verdict that only its holder can give: a one-bit commitment.

A fallback session's holder is a process of its runs' uid: they can rewrite
the entry it writes, and once it is dead (killed by what it held) bind its
address and answer in its name. What the holder says at the end — every
process proven gone, or not — must still be its own, or be read as nothing.

At ``session start`` two secrets are drawn and only their digests are
published, folded into the session's id: the id *is* the commitment, so
nothing written later can change it. At the end the holder reveals the one
secret that matches its verdict. The secrets live only in the memory of the
holder (and, for a moment, of ``session start``), neither dumpable, in a page
the holder's own forks see wiped (``Verdicts``), so no run can read them: a
forger can reveal nothing, and so can say "not proven" (which it could
anyway), never "proven". ``ID_HEX`` digits of the digest are
in the id: finding another pair of secrets whose digest begins with them
(2^96 work) is out of reach.

A revealed verdict stays valid for that session only after its holder ended
it, which is when it was true: replaying it says nothing false.
"""

import hashlib
import mmap
import os
import secrets

_DOMAIN = b"corral-session-verdict\0"
#: Hex digits of the commitment that make a committed session's id.
ID_HEX = 24
#: madvise(2)'s MADV_WIPEONFORK (Linux 4.14; Python's mmap module does not always name it).
_MADV_WIPEONFORK = 18


def _digest(data) -> bytes:
    digest = hashlib.sha256(_DOMAIN)
    digest.update(data)  # a view of the secret: no copy of it is made in Python's heap
    return digest.digest()


def _session_id(proven_digest: bytes, unproven_digest: bytes) -> str:
    return hashlib.sha256(_DOMAIN + proven_digest + unproven_digest).hexdigest()[:ID_HEX]


def is_committed(session_id: str) -> bool:
    """Was the session's id made by ``Verdicts.session_id`` (a fallback session:
    its end is proven only by a verdict that ``check`` accepts)? Told by the
    id's form alone, which nothing can rewrite."""
    return len(session_id) == ID_HEX


class Verdicts:
    """The two secrets of one session, kept by its holder until it reveals one.

    They are read from the kernel straight into a private page of their own,
    never into a Python object, so no copy of them is left in the heap, and
    ``keep_from_forks`` has every later fork of this process see zeros there
    (``MADV_WIPEONFORK``): the holder's children -- its background runs'
    corrals are forks of it, which fork the runs' commands -- never hold them,
    dumpable or not."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = memoryview(self._page)
        fd = os.open("/dev/urandom", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.readv(fd, [view[:64]]) != 64:
                raise OSError("/dev/urandom: a short read")
        finally:
            os.close(fd)
        self._proven, self._unproven = view[:32], view[32:64]

    def keep_from_forks(self) -> None:
        """From now on a fork of this process sees zeros where the secrets are
        (the holder says so once it is the holder; OSError before Linux 4.14)."""
        self._page.madvise(_MADV_WIPEONFORK)

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
