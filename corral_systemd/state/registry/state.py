"""The reader side: a run's state as an authorisation check must see it."""

import time

from .identity import boot_id, owner_alive, owner_token

STATES = ("active", "expired", "finished")


# -- the reader side: state -------------------------------------------------------
def _finished_why(entry: dict) -> str:
    """How a finished run ended, in words: its exit, or how it was reclaimed."""
    if entry.get("outcome") == "reclaimed":
        # Its corral died; corralctl stopped what was left. No exit status is known.
        proof = (
            "verified"
            if entry.get("verified")
            else f"NOT verified, still present: {' '.join(map(str, entry.get('remaining_pids') or [])) or '?'}"
        )
        return f"reclaimed after its corral was gone, exit status unknown; {proof}"
    exit_code = entry.get("exit_code")
    return f"exit {'unknown' if exit_code is None else exit_code}, {entry.get('outcome') or 'unknown outcome'}"


def effective_state(entry: dict | None, *, now_monotonic: float | None = None) -> tuple[str, str]:
    """(state, why) as an authorisation check must see it.

    The entry is a file the run's own uid can rewrite, so while its owner
    lives the owner's sealed token (``owner_token``) decides: an entry that
    claims ``finished``, or a later deadline, while its corral still runs
    the run is overruled, and the why says so. Without a token: ``finished``
    and ``expired`` as written; ``active`` only while the deadline has not
    passed and the owner still runs and holds the token (so an entry naming
    some other live process as its owner is ``expired``).
    """
    if not isinstance(entry, dict):
        return "unknown", "no such run"
    now = time.monotonic() if now_monotonic is None else now_monotonic
    written = entry.get("state")
    token = owner_token(entry) if written in STATES else None
    if token is not None:
        pid = (entry.get("owner") or {}).get("pid")
        said = token.get("state")
        if said == "finished":
            return "finished", _finished_why(entry) if written == "finished" else "finished (its owner says so)"
        deadline = token.get("deadline_monotonic")
        if said == "expired" or (isinstance(deadline, (int, float)) and now >= deadline):
            state, why = "expired", "deadline passed"
        else:
            state, why = "active", "running"
        if written == "finished":
            why += f"; entry claims finished but its owner (pid {pid}) is alive and running the run"
        elif written != said:
            why += f"; entry claims {written} but its owner (pid {pid}) says {said}"
        elif entry.get("deadline_monotonic") != deadline:
            why += f"; entry's deadline differs from its owner's (pid {pid})"
        return state, why
    if written == "finished":
        return "finished", _finished_why(entry)
    if written == "expired":
        return "expired", "deadline passed"
    if written != "active":
        return "unknown", f"unreadable state {written!r}"
    deadline = entry.get("deadline_monotonic")
    same_boot = (entry.get("owner") or {}).get("boot_id") in (None, "", boot_id())
    if isinstance(deadline, (int, float)) and (now >= deadline or not same_boot):
        return "expired", "deadline passed"
    if not owner_alive(entry):
        return "expired", "its corral process is gone"
    return "expired", (
        f"its owner (pid {(entry.get('owner') or {}).get('pid')}) holds no token for this run: "
        "the entry alone does not make it active"
    )
