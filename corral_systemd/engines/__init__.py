"""Engines: how a run's processes are contained, signalled and proven gone.

The supervisor drives every engine through the interface documented in
``base.Engine``; engine modules are imported only when chosen, so the
fallback path never loads dbus-fast.
"""

import os

from ..common.errors import SetupError, UsageError
from ..common.nesting import outer_run
from ..dbus.discovery import session_bus_candidates


def open_engine(spec, session=None, held=None, *, skip_manager: bool = False):
    """The engine for this run, per --guarantee, --cgroup-mode and --cgroup-parent.

    The ladder (``_ladder``, strongest first): a systemd manager's unit → a
    child group of the delegated cgroup v2 subtree corral runs in → a PID
    namespace of its own → the subreaper. auto takes the first rung that can
    be had (why each stronger one could not is kept in the record); a tier
    asked for (``spec.tiers()``: --guarantee X, --cgroup-mode enforced or
    fallback) is that rung or SetupError naming what is missing (125).
    --cgroup-parent: the cgroup engine in the directory named. ``held``: the command's process,
    forked by the caller (``kernel.held.HeldProcess``); only the systemd
    engine takes one (the corral service runs nothing else), the engine owns it.
    """
    from ..kernel.procfs import proc_is_ours

    if not proc_is_ours():
        if held is not None:
            held.abandon()
        raise SetupError(
            "this process's /proc shows another pid namespace than its own (a pid namespace without a /proc of "
            "its own, as after `unshare -fp`): the process numbers corral reads there would be other processes'; "
            "mount one (unshare -fp --mount-proc), or run through the corral service"
        )
    if held is not None:
        if spec.cgroup_parent is not None or spec.cgroup_mode != "enforced":
            held.abandon()
            raise SetupError("a caller's held process is for an enforced systemd run only")
        from .systemd import SystemdEngine

        try:
            return SystemdEngine(spec, session, held=held)
        except BaseException:
            held.abandon()
            raise
    if spec.cgroup_parent is not None:
        if spec.cgroup_mode == "fallback":
            raise UsageError("--cgroup-parent cannot be combined with --cgroup-mode fallback")
        from .cgroupv2 import CgroupEngine

        return CgroupEngine(spec)
    return climb(spec, _ladder(spec, session), skip_manager=skip_manager)


def _ladder(spec, session) -> tuple:
    """The rungs, strongest first: (guarantee, opener). An opener returns the
    engine, or raises SetupError saying in a few words why its tier cannot be
    had here (that becomes the record's ``engine.auto_fallback_reason``, or
    the one line of a forced tier's 125)."""
    return (
        ("unit", lambda: _unit(spec, session)),
        ("cgroup", lambda: _delegated_cgroup(spec)),
        ("pidns", lambda: _pidns(spec)),
        ("subreaper", lambda: _subreaper(spec)),
    )


def climb(spec, rungs, *, skip_manager: bool = False):
    """The first rung of ``rungs`` among ``spec.tiers()`` whose engine opens.

    One tier asked (--guarantee X, --cgroup-mode enforced or fallback): its
    SetupError is the run's (125). Several (auto): each failing rung's reason
    is kept, and the engine opened below them carries them all
    (``auto_fallback_reason``, joined by " | "). ``skip_manager``: the caller
    already knows no manager answers (the library's fallback child)."""
    tiers = spec.tiers()
    reasons: list[str] = []
    for guarantee, opener in rungs:
        if guarantee not in tiers or (skip_manager and guarantee == "unit" and len(tiers) > 1):
            continue
        try:
            engine = opener()
        except SetupError as exc:
            if len(tiers) == 1:
                if spec.guarantee == "auto":
                    raise  # --cgroup-mode enforced: the manager's own words, as ever
                raise SetupError(f"--guarantee {guarantee}: {exc}") from None
            if guarantee == "unit" and spec.properties:
                # Fail closed: what was asked of the unit cannot be had without one.
                raise SetupError(f"--property needs a systemd unit, and auto mode found no manager: {exc}") from None
            reasons.append(str(exc) if guarantee == "unit" else f"{guarantee}: {exc}")
            continue
        if reasons:
            engine.auto_fallback_reason = " | ".join(reasons)
        return engine
    if not reasons:
        raise SetupError(f"--guarantee {spec.guarantee}: not built into this corral")
    raise SetupError(f"no guarantee tier could be had: {' | '.join(reasons)}")


def _unit(spec, session):
    """A systemd manager's transient unit (SystemdEngine)."""
    ladder = len(spec.tiers()) > 1
    if (outer := outer_run()) is not None:
        if not ladder:
            raise SetupError(
                f"inside corral run {outer}: a unit of this run's own would leave that run's cgroup and "
                "its limits; use --cgroup-mode auto or fallback (they stay inside), or --cgroup-parent"
            )
        raise SetupError(f"nested in corral run {outer}: its processes stay in that run's cgroup, under its limits")
    if ladder and spec.manager != "system" and session_bus_candidates() is None and not _system_manager_possible(spec):
        raise SetupError("no user bus (DBUS_SESSION_BUS_ADDRESS unset, no $XDG_RUNTIME_DIR/bus)")
    from .systemd import SystemdEngine

    return SystemdEngine(spec, session)


def _delegated_cgroup(spec):
    """A child group of the delegated cgroup v2 subtree corral runs in (``delegated.py``)."""
    if (outer := outer_run()) is not None:
        raise SetupError(f"nested in corral run {outer}: it stays in that run's group")
    from . import delegated
    from .cgroup_limits import asked
    from .cgroupv2 import CgroupEngine

    subtree = delegated.find_subtree()
    delegated.prepare(subtree, {limit.controller for limit, _ in asked(spec)})
    return CgroupEngine(spec, delegated=subtree)


def _pidns(spec):
    """A PID namespace whose init is corral's child (PidnsEngine); SetupError
    where none can be had (user namespaces forbidden, no /proc of its own).
    A session's run too: its command sees neither its corral nor the session's
    holder, so it can stop neither (a corral nested in it joins through the
    holder's check that it is inside this run, ``state.sessions.join``)."""
    from .pidns import PidnsEngine

    return PidnsEngine(spec)


def _subreaper(spec):
    """No cgroup: corral as child subreaper (FallbackEngine); always to be had."""
    from .fallback import FallbackEngine

    return FallbackEngine(spec)


def _system_manager_possible(spec) -> bool:
    return (
        spec.manager != "user"
        and os.geteuid() == 0
        and os.path.isdir("/run/systemd/system")
        and os.path.exists("/run/dbus/system_bus_socket")
    )
