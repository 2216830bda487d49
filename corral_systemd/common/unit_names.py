"""The names corral gives its runs' units and groups: declared once here,
spelled and parsed by every layer through these functions.

- a run's id: hex digits, 12 for a new run (6 random bytes); 1 to 64 are
  accepted where an id is read back (the registry, corralctl, the service);
- its unit: ``corral-<id>.scope`` or ``corral-<id>.service``;
- its group under ``--cgroup-parent``: ``corral-<id>``;
- the tether its unit is bound to: ``corral-<id>-tether.scope`` (one run),
  or a library Runner's ``corral-runner-<pid>-<8 hex>-tether.scope``;
- a session's, in systemd mode: its slice ``corral-session_<session id>.slice``
  (a child of ``corral.slice``: its runs' units go there, under its aggregate
  limits) and its holder ``corral-session_<session id>.service``;
- the corral service started with no install step (``service/transient.py``):
  the transient pair ``corral-transient.socket`` + ``corral-transient.service``
  (the installed one is ``corral.socket`` + ``corral.service``).

A name is never proof that a unit or a group is corral's (anyone may
create ``corral-x.scope``); callers that act on one check its marks too
(``ctl/reclaim.py``: BindsTo= a tether, corral's description).
"""

import os

PREFIX = "corral-"
UNIT_TYPES = ("scope", "service")
_ID = "[0-9a-f]{1,64}"
# Patterns for ``re`` (imported where one is read: ``re`` costs every run's
# start more than the reading), compiled and cached by ``re`` on first use.
_RUN_UNIT = rf"corral-({_ID})\.(scope|service)"
_RUNNER_TETHER = r"corral-runner-[0-9]+-[0-9a-f]{8}-tether\.scope"
#: A path component of a run's cgroup: its unit, or its --cgroup-parent group.
_RUN_COMPONENT = rf"corral-({_ID})(\.scope|\.service)?"


def new_run_id() -> str:
    return os.urandom(6).hex()


_HEX = frozenset("0123456789abcdef")


def is_run_id(text) -> bool:
    """``text`` is a run's id (``_ID``)."""
    return isinstance(text, str) and 0 < len(text) <= 64 and _HEX.issuperset(text)


def looks_like_run(text: str) -> bool:
    """Would ``text`` be read as naming a run or a session by its id (a name must
    not be): the forms ``new_run_id`` and ``common.verdict`` make, or anything
    with corral's unit prefix."""
    return text.startswith(PREFIX) or len(text) in (12, 24) and _HEX.issuperset(text)


def unit_name(run_id: str, unit_type: str) -> str:
    return f"{PREFIX}{run_id}.{unit_type}"


def run_units(run_id: str) -> tuple[str, ...]:
    """Every unit name the run may have (its unit type unknown)."""
    return tuple(unit_name(run_id, t) for t in UNIT_TYPES)


def group_name(run_id: str) -> str:
    """The run's group under --cgroup-parent."""
    return f"{PREFIX}{run_id}"


def tether_unit(run_id: str) -> str:
    return f"{PREFIX}{run_id}-tether.scope"


#: The transient corral service's units, without their type (``.socket``, ``.service``):
#: one per manager, the name is the lock two clients starting it at once meet.
TRANSIENT_SERVICE = f"{PREFIX}transient"

#: The slice a run goes in when it names none (``--slice``'s default).
DEFAULT_SLICE = "corral.slice"


def session_slice(session_id: str) -> str:
    """A session's slice: its runs' units go there, under its aggregate limits.
    The "-" makes it a child of corral.slice; "_" keeps the id one level."""
    return f"{PREFIX}session_{session_id}.slice"


def session_holder_unit(session_id: str) -> str:
    """A session's holder, as a unit of the manager (systemd mode)."""
    return f"{PREFIX}session_{session_id}.service"


def runner_tether_unit() -> str:
    """A new name for a library Runner's tether (one per Runner)."""
    return f"{PREFIX}runner-{os.getpid()}-{os.urandom(4).hex()}-tether.scope"


def is_tether(name: str, run_id: str | None = None) -> bool:
    """``name`` is a tether's: ``run_id``'s own, or any Runner's (a Runner's
    tether holds many runs); with ``run_id`` None, any run's too."""
    import re

    if re.fullmatch(_RUNNER_TETHER, name):
        return True
    if run_id is not None:
        return name == tether_unit(run_id)
    return name.startswith(PREFIX) and name.endswith("-tether.scope")


def run_of_unit(name) -> str | None:
    """The run id a run unit's name carries (``corral-<id>.scope``/``.service``), else None."""
    import re

    m = re.fullmatch(_RUN_UNIT, name) if isinstance(name, str) else None
    return m.group(1) if m else None


def run_of_cgroup(path: str) -> str | None:
    """The run whose unit or group ``path`` (a cgroup path) is in, else None."""
    import re

    for part in path.split("/"):
        if m := re.fullmatch(_RUN_COMPONENT, part):
            return m.group(1)
    return None


def run_id_of(text: str) -> str:
    """What a user typed for a run (``<id>``, ``corral-<id>``, a unit name) as its id."""
    text = text.strip()
    if text.startswith(PREFIX):
        text = text[len(PREFIX) :]
    for unit_type in UNIT_TYPES:
        if text.endswith("." + unit_type):
            text = text[: -len(unit_type) - 1]
    return text
