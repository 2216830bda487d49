"""A run's transient-unit properties, as pure functions of what it asks for.

systemd-run builds its StartTransientUnit call the same way, one builder
per concern (``transient_unit_set_properties``, ``transient_kill_set_properties``,
``transient_scope_set_properties`` in run.c). Nothing here talks to a
manager or touches the machine: given the same inputs, the same list of
``(name, Variant)`` pairs, so every property can be tested without systemd.
"""

import os

from ...common.redact import redact_argv
from ...dbus.systemd1 import prop
from ..cgroup_limits import asked

_USEC = 1_000_000
#: The longest Description corral writes (the argv, redacted, is cut there).
DESCRIPTION_MAX = 200


def unit_properties(spec, argv, *, tether_unit: str, add_ref: bool, keep_failed: bool) -> list:
    """What every run unit has: description, slice, the stop sequence, the
    binding to corral's tether, accounting and the limits.

    ``add_ref``: keep the unit until UnrefUnit (only on a bus connection).
    ``keep_failed``: CollectMode=inactive, so a failed unit stays loaded to
    be asked why (a service whose credentials may not arrive).
    """
    props = [
        # Redacted as the registry and the record redact it: the unit's
        # properties are visible to everyone who may ask its manager.
        prop("Description", "s", description(argv)),
        prop("Slice", "s", spec.slice),
        prop("CollectMode", "s", "inactive" if keep_failed else "inactive-or-failed"),
        prop("SendSIGKILL", "b", True),
        # 0 would mean "no timeout" to the manager: the least it takes is 1 µs.
        prop("TimeoutStopUSec", "t", max(1, int(spec.grace * _USEC))),
        # --grace 0: the manager's own stop (corral gone: the tether) kills at once too.
        *([prop("KillSignal", "i", 9)] if spec.grace == 0 else []),
        prop("BindsTo", "as", [tether_unit]),
        prop("After", "as", [tether_unit]),
        prop("TasksAccounting", "b", True),
        prop("MemoryAccounting", "b", True),
        # The manager caches a unit's last CPU figure before it removes the
        # group (252: unit_prune_cgroup), but only with CPUAccounting: a
        # service that ends between two of corral's samples keeps its total.
        # Cheap on cgroup v2 (cpu.stat needs no controller).
        prop("CPUAccounting", "b", True),
    ]
    if add_ref:
        props.append(prop("AddRef", "b", True))
    return props + limit_properties(spec) + user_properties(spec)


def description(argv) -> str:
    """The unit's Description=: the argv, redacted, cut at DESCRIPTION_MAX.
    D-Bus strings are UTF-8: bytes that are not (os.fsdecode's lone
    surrogates) are written as ``\\xNN``."""
    text = "corral: " + " ".join(redact_argv(argv))[:DESCRIPTION_MAX]
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def user_properties(spec) -> list:
    """-p/--property NAME=VALUE, as validated by ``unitprops.parse_property``
    (only properties corral knows, none of its own, none the unit type refuses)."""
    if not spec.properties:
        return []
    from ...common.unitprops import parse_property

    return [prop(*parse_property(text, spec.unit_type)) for text in spec.properties]


def limit_properties(spec) -> list:
    """The kernel-enforced limits (memory, tasks, CPU quota), and
    RuntimeMaxSec as a backstop past the wall, the grace period and
    verification (corral stops the run first). ``--cpu-time`` is corral's to
    watch: no property expresses "CPU time of the whole unit"."""
    props = []
    if spec.wall is not None:
        backstop = spec.wall + spec.grace + spec.verify_timeout
        props.append(prop("RuntimeMaxUSec", "t", int(backstop * _USEC)))
    for limit, value in asked(spec):
        props += [prop(*p) for p in limit.unit_properties(value)]
    return props


def slice_limit_properties(limits: dict) -> list:
    """A session's slice: its aggregate limits, as a run's would be."""
    from ..cgroup_limits import CGROUP_LIMITS

    asked = [limit for limit in CGROUP_LIMITS if limit.field in limits]
    return [prop(*p) for limit in asked for p in limit.unit_properties(limits[limit.field])]


def scope_properties(main_pid: int, *, by_pidfd: bool = False) -> list:
    """A scope is made of processes that exist: the command, held at its gate.
    ``by_pidfd``: named by the pidfd that is the call's first descriptor
    (``PIDFDs=``, systemd 255+: no process number the manager could take for
    another's), else by its number (``PIDs=``, every systemd)."""
    if by_pidfd:
        return [prop("PIDFDs", "ah", [0])]
    return [prop("PIDs", "au", [main_pid])]


def service_properties(argv, executable: str, cwd: str | None, unset: list[str]) -> list:
    """The command as the manager starts it: ExecStartEx with no-env-expand
    (the ":" prefix), so the arguments reach the command as given (plain
    ExecStart would expand "$VAR", "${VAR}" and "$$"); Type=exec, so the
    start job ends once the command was executed.

    ExitType=cgroup: the unit stays active while any process of it lives, so
    what the main process left behind is stopped by corral's own stop
    sequence (and counted), as in a scope, not by the manager before corral
    has seen it. IgnoreSIGPIPE=no: SIGPIPE at its default action, as a
    scope's command, a shell's child and ``timeout``'s have it (systemd
    ignores it in services by default: ``yes | head -1`` would report EPIPE).
    RemainAfterExit=no: the unit goes once empty. (Kept loaded, corral could
    read the manager's final CPU figure on a private connection too, which
    cannot AddRef it; the stop job that then takes costs ~15 % of the
    service's throughput with 8 runs in flight, measured: not paid.)"""
    return [
        prop("Type", "s", "exec"),
        prop("ExitType", "s", "cgroup"),
        prop("IgnoreSIGPIPE", "b", False),
        prop("ExecStartEx", "a(sasas)", [(executable, list(argv), ["no-env-expand"])]),
        *([prop("UnsetEnvironment", "as", unset)] if unset else []),
        prop("WorkingDirectory", "s", os.path.abspath(cwd or os.getcwd())),
        prop("RemainAfterExit", "b", False),
    ]


def stdio_properties() -> list:
    """The service's stdin, stdout and stderr: the three descriptors passed with the call."""
    return [
        prop("StandardInputFileDescriptor", "h", 0),
        prop("StandardOutputFileDescriptor", "h", 1),
        prop("StandardErrorFileDescriptor", "h", 2),
    ]


def tty_properties(terminal_fd: int | None) -> list:
    """--pty: the terminal passed as the service's stdio is also its
    TTYPath=, as systemd-run --pty sets it (the manager makes a terminal on
    stdin the controlling terminal of the service's session)."""
    if terminal_fd is None:
        return []
    return [prop("TTYPath", "s", os.ttyname(terminal_fd))]


def credential_properties(pairs, check_script: str) -> list:
    """LoadCredential= for each (NAME, PATH) (the manager reads the file:
    only the path goes over the bus) and an ExecStartPre= that checks,
    inside the unit and before the command, that each one arrived."""
    if not pairs:
        return []
    names = [name for name, _ in pairs]
    return [
        prop("LoadCredential", "a(ss)", [(name, path) for name, path in pairs]),
        prop(
            "ExecStartPre",
            "a(sasb)",
            [("/bin/sh", ["/bin/sh", "-c", check_script, "corral-credentials", *names], False)],
        ),
    ]


def isolation_properties(manager_kind: str) -> list:
    """A system manager's service gets a mount namespace of its own
    (PrivateMounts=): systemd 252 then mounts an empty read-only tmpfs on
    /run/credentials with only this unit's own directory bound in
    (namespace.c), so the command cannot read another run's credentials.
    A user manager would need PrivateUsers= for it, and keeps credentials
    under $XDG_RUNTIME_DIR, which the namespace does not hide: nothing to gain."""
    return [prop("PrivateMounts", "b", True)] if manager_kind == "system" else []


def seal_properties(masks, network: bool, host_net: str, host_user: str, check_script: str) -> list:
    """A sealed run for a system manager's service (``--handoff deny``,
    ``--network none``), as ``kernel.seal`` makes it for a forked child:
    PrivateUsers= (its own uid and gid mapped, set up after the mount and
    network namespaces, which it then cannot change or leave), each socket
    of ``masks`` covered by /dev/null (BindReadOnlyPaths=), each directory by
    an empty tmpfs (TemporaryFileSystem=: read-only for a spool, the
    command's own for a multiplexer's socket directory), PrivateNetwork= for
    --network none; and an ExecStartPre= that checks, inside the unit and
    before the command, that it is so (``seal.CHECK_SCRIPT``: not
    ``host_user``'s user namespace, nothing of ``masks`` visible, PID 1's
    network namespace out of reach, and for ``host_net`` only lo)."""
    sockets = [("/dev/null", m.path, True, 0) for m in masks if m.how == "socket"]
    directories = [(m.path, "ro,mode=0555" if m.how == "spool" else "mode=0700") for m in masks if m.how != "socket"]
    return [
        prop("PrivateUsers", "b", True),
        *([prop("PrivateNetwork", "b", True)] if network else []),
        *([prop("BindReadOnlyPaths", "a(ssbt)", sockets)] if sockets else []),
        *([prop("TemporaryFileSystem", "a(ss)", directories)] if directories else []),
        prop(
            "ExecStartPre",
            "a(sasb)",
            [
                (
                    "/bin/sh",
                    [
                        "/bin/sh",
                        "-c",
                        check_script,
                        SEAL_CHECK,
                        host_net if network else "",
                        host_user,
                        *(f"{m.how}:{m.path}" for m in masks),
                    ],
                    False,
                )
            ],
        ),
    ]


#: The seal check's $0, by which its ExecStartPre= entry is found again.
SEAL_CHECK = "corral-seal"


def environment_properties(environment: dict, env_file: str | None) -> list:
    """The service's environment: the path of a private file holding it
    (EnvironmentFiles=), or, only when no such file could be made, the
    values themselves (Environment=, visible in the unit)."""
    if not environment:
        return []
    if env_file is not None:
        return [prop("EnvironmentFiles", "a(sb)", [(env_file, False)])]
    return [prop("Environment", "as", [f"{key}={value}" for key, value in environment.items()])]


def tether_properties(pid: int, slice_: str, for_what: str) -> list:
    """The tether's scope: corral's small child, whose end stops every unit bound to it."""
    return [
        prop("Description", "s", f"corral tether for {for_what}"),
        prop("PIDs", "au", [pid]),
        prop("Slice", "s", slice_),
        prop("CollectMode", "s", "inactive-or-failed"),
    ]
