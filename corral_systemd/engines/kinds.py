"""The engines by the name a record and a registry entry give them (``mode``),
what a run of each leaves for corralctl once its corral is gone, and the
guarantee tiers an engine gives (``GUARANTEES``: the record's ``guarantee``).

Declared once, importing nothing, so that corralctl and the record read it
without loading an engine (the systemd one loads dbus-fast). Each engine
class names its kind (``Engine.mode``); a test checks they agree.
"""

from ..common.plainclass import plainclass

#: The guarantee tiers, strongest first: what holds the run's processes, and
#: so what corral can promise. ``--guarantee auto`` takes the first one that
#: can be had here (``engines.open_engine``: the ladder); each engine class
#: names its own (``Engine.guarantee``; ``tests/test_engine_kinds.py`` checks).
GUARANTEES = ("unit", "cgroup", "pidns", "subreaper")
#: What each tier guarantees, in one line (for --help, the docs and messages).
GUARANTEE_MEANINGS = {
    "unit": "a systemd unit's cgroup: kernel limits; the manager stops the run if corral dies",
    "cgroup": "a child group of a delegated cgroup v2 subtree: kernel limits where delegated, cgroup.kill; "
    "a PID namespace too where one can be had",
    "pidns": "a PID namespace whose init dies with corral: no process can leave it or outlive it",
    "subreaper": "corral as child subreaper: processes found in /proc and stopped through pidfds; limits watched",
}
#: What each tier's proof that the run is gone covers, in one sentence: the
#: record's ``proof`` (every record has it, verified or not: ``verified``
#: says whether the proof held). The hand-offs it does not cover are the
#: record's ``handoff``.
GUARANTEE_PROOFS = {
    "unit": "the unit's control group empty as the kernel reports it and the unit inactive or gone; "
    "processes corral saw leave the group stopped too",
    "cgroup": "the run's control group reported unpopulated by the kernel and removed; "
    "processes corral saw leave the group stopped too (in a PID namespace: its init reaped by corral, "
    "every process of the namespace gone first)",
    "pidns": "the namespace's init reaped by corral: the kernel reports it only after every process "
    "of the namespace is gone, those corral never saw included",
    "subreaper": "no process of the run left below corral in /proc (corral is the child subreaper: "
    "every orphan of the run re-parents to it), each stopped through a pidfd",
}


@plainclass(frozen=True)
class EngineKind:
    """An engine's mode, and how its runs' processes are found once their corral is gone."""

    mode: str
    #: Where a registered run's processes are found, and how they are stopped,
    #: once its corral is gone (corralctl ps, stop, reclaim):
    #: "unit": its systemd unit, through the manager (checked to be corral's);
    #: "cgroup": the control group its entry names (checked to be corral's);
    #: "sessions": the sessions its log names, marked processes only (while its
    #: corral lives: the owner's descendants);
    #: "namespace": its PID namespace, whose init dies with corral, and the
    #: kernel kills every process in it: nothing once corral is gone (while
    #: its corral lives: the owner's descendants, the namespace's processes).
    leftovers: str
    #: What corralctl says about a reclaim of such a run ("" for nothing).
    reclaim_note: str = ""


KINDS = {
    kind.mode: kind
    for kind in (
        EngineKind("systemd", "unit"),
        EngineKind("cgroup", "cgroup"),
        EngineKind(
            "fallback",
            "sessions",
            "fallback: once corral is gone, its run's processes are found by the mark in their "
            "environment; one that cleared it cannot be found",
        ),
        EngineKind(
            "pidns",
            "namespace",
            "pidns: the run's PID namespace ended with its corral (its init dies with corral, and the kernel "
            "kills every process in it): nothing of it can be left",
        ),
    )
}
#: Every engine's mode, as the record declares its ``mode`` field.
MODES = tuple(KINDS)


def kind_of(entry: dict) -> EngineKind | None:
    """A registry entry's kind; None for a mode no engine has (the entry is
    a file the run's uid can write: nothing is found through it)."""
    mode = entry.get("mode")
    return KINDS.get(mode) if isinstance(mode, str) else None


def leftovers_of(entry: dict) -> str | None:
    """A registry entry's ``EngineKind.leftovers`` (see ``kind_of``)."""
    kind = kind_of(entry)
    return kind.leftovers if kind is not None else None
