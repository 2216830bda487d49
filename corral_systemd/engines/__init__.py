"""Engines: how a run's processes are contained, signalled and proven gone.

The supervisor drives every engine through the interface documented in
``base.Engine``; engine modules are imported only when chosen, so the
fallback path never loads dbus-fast.
"""

import os

from ..common.errors import SetupError, UsageError
from ..common.nesting import outer_run
from ..dbus.discovery import session_bus_candidates


def open_engine(spec, session=None, held=None):
    """The engine for this run, per --cgroup-mode / --cgroup-parent.

    auto: systemd when a manager answers, else the fallback engine (the
    reason is kept in the record). enforced: systemd or --cgroup-parent, or
    SetupError naming what is missing. ``held``: the command's process,
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
    if spec.cgroup_mode == "fallback":
        from .fallback import FallbackEngine

        return FallbackEngine(spec)
    outer = outer_run()
    if spec.cgroup_mode == "enforced":
        if outer is not None:
            raise SetupError(
                f"inside corral run {outer}: a unit of this run's own would leave that run's cgroup and "
                "its limits; use --cgroup-mode auto or fallback (they stay inside), or --cgroup-parent"
            )
        from .systemd import SystemdEngine

        return SystemdEngine(spec, session)
    # auto
    if outer is not None:
        reason = f"nested in corral run {outer}: its processes stay in that run's cgroup, under its limits"
    elif spec.manager != "system" and session_bus_candidates() is None and not _system_manager_possible(spec):
        reason = "no user bus (DBUS_SESSION_BUS_ADDRESS unset, no $XDG_RUNTIME_DIR/bus)"
    else:
        from .systemd import SystemdEngine

        try:
            return SystemdEngine(spec, session)
        except SetupError as exc:
            reason = str(exc)
    if spec.properties:
        # Fail closed: what was asked of the unit cannot be had without one.
        raise SetupError(f"--property needs a systemd unit, and auto mode found no manager: {reason}")
    from .fallback import FallbackEngine

    engine = FallbackEngine(spec)
    engine.auto_fallback_reason = reason
    return engine


def _system_manager_possible(spec) -> bool:
    return (
        spec.manager != "user"
        and os.geteuid() == 0
        and os.path.isdir("/run/systemd/system")
        and os.path.exists("/run/dbus/system_bus_socket")
    )
