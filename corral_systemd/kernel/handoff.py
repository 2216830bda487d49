"""Hand-off channels: servers outside the run that would start work for its command.

A command can ask someone else to start work: a service manager
(``systemd-run``), a message bus (D-Bus activation), a socket that a
manager listens on for a service (``gpg-connect-agent``: socket
activation), atd (``at``), cron (``crontab``), a terminal multiplexer's
server that already runs (``tmux -L s new -d``, ``screen -dm``). That work
is outside the run's process tree and unit, so corral's proof does not
cover it. Each channel is declared here once (``CHANNELS``): what shows it
is open, from what the kernel shows (a listening socket in
``/proc/net/unix`` whose path the command can open; a spool directory
that exists), what hides it in a sealed run (``Mask``), and the
environment variables that name it.

``survey(env)`` is read in corral before the command starts: the record's
``handoff`` lists the channels it found open (``Survey.open``), and a
sealed run (``--network none``, ``--handoff deny``: ``kernel.seal``)
masks every path of every channel, open or not (``Survey.masks``), and
drops its variables (``Survey.command_env``). A bus address that no mount
can hide (an abstract socket, TCP) is ``Survey.unmaskable``: only a
network namespace of its own cuts it.

Read from corral's own view (its mount and network namespaces), which is
the command's until it is sealed. Never a guess from a process's name.
"""

import os
import stat

from ..common.plainclass import field, plainclass

#: /proc/net/unix's Flags bit for a listening socket (__SO_ACCEPTCON).
_ACCEPTING = 0x10000

#: How a path is hidden: "socket" (/dev/null bound over it), "spool" (an
#: empty read-only tmpfs on the directory), "private" (an empty tmpfs of the
#: command's own on the directory, mode 0700: a server the command starts
#: itself there works, inside the run).
HOW = ("socket", "spool", "private")

#: The record's ``handoff`` for a sealed run (else the list of channels found open).
DENIED = "denied"

#: Variables that name a channel: unset in a sealed run's environment.
VARIABLES = (
    "DBUS_SESSION_BUS_ADDRESS",
    "DBUS_SYSTEM_BUS_ADDRESS",
    "DBUS_STARTER_ADDRESS",
    "DBUS_STARTER_BUS_TYPE",
    "TMUX",
    "TMUX_PANE",
    "STY",
)


@plainclass(frozen=True)
class Mask:
    """A path a sealed run hides, and how (``HOW``)."""

    path: str
    how: str


@plainclass(frozen=True)
class Channel:
    """One kind of hand-off: its name in the record and what it says it is."""

    name: str
    what: str


#: Every channel, in the record's order.
CHANNELS = (
    Channel("user-manager", "the user's service manager ($XDG_RUNTIME_DIR/systemd/private)"),
    Channel("session-bus", "the session bus ($XDG_RUNTIME_DIR/bus, $DBUS_SESSION_BUS_ADDRESS)"),
    Channel("user-sockets", "other listening sockets in the user's runtime directory (socket activation, agents)"),
    Channel("corral-service", "a corral service ($XDG_RUNTIME_DIR/io.corral.Run, /run/io.corral.Run)"),
    Channel(
        "corral-session",
        "a corral session's holder (@corral-session/<uid>/<id>: it starts background runs)",
    ),
    Channel("system-manager", "the system manager (/run/systemd/private)"),
    Channel("system-bus", "the system bus (/run/dbus/system_bus_socket, $DBUS_SYSTEM_BUS_ADDRESS)"),
    Channel("atd", "atd's spool (/var/spool/cron/atjobs)"),
    Channel("cron", "cron's spool (/var/spool/cron/crontabs)"),
    Channel("tmux", "a tmux server's socket directory (/tmp/tmux-UID, $TMUX_TMPDIR, $TMUX)"),
    Channel("screen", "a screen server's socket directory (/run/screen/S-USER, $SCREENDIR)"),
)
NAMES = tuple(channel.name for channel in CHANNELS)

_ATD_SPOOLS = ("/var/spool/cron/atjobs", "/var/spool/cron/atspool", "/var/spool/at")
_CRON_SPOOLS = ("/var/spool/cron/crontabs",)
_SYSTEM_BUS = "/run/dbus/system_bus_socket"
_SYSTEM_MANAGER = "/run/systemd/private"


@plainclass
class Survey:
    """What the command could reach, found before it starts."""

    #: Names of the channels found open (``NAMES``' order).
    open: list[str] = field(default_factory=list)
    #: What a sealed run hides: every channel's paths that exist.
    masks: list[Mask] = field(default_factory=list)
    #: Bus addresses no mount can hide (abstract sockets, TCP): why a seal
    #: without a network namespace of its own cannot be had.
    unmaskable: list[str] = field(default_factory=list)

    def command_env(self, env: dict) -> dict:
        """``env`` without the variables that name a channel."""
        return {k: v for k, v in env.items() if k not in VARIABLES}


def listening_sockets(text: str | None = None) -> set[str]:
    """The paths of the listening unix sockets in this network namespace
    (``/proc/net/unix``; abstract ones start with "@")."""
    if text is None:
        try:
            with open("/proc/net/unix") as f:
                text = f.read()
        except OSError:
            return set()
    found = set()
    for line in text.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) == 8 and int(parts[3], 16) & _ACCEPTING:
            found.add(parts[7])
    return found


def bus_paths(address: str) -> tuple[list[str], list[str]]:
    """A D-Bus address's socket paths, and the parts no mount can hide
    (``unix:abstract=``, ``tcp:``, ``nonce-tcp:``)."""
    paths, unmaskable = [], []
    for part in address.split(";"):
        kind, _, params = part.partition(":")
        fields = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
        if kind == "unix" and "path" in fields:
            paths.append(_unescape(fields["path"]))
        elif kind == "unix" and "abstract" in fields:
            unmaskable.append(part)
        elif kind in ("tcp", "nonce-tcp"):
            unmaskable.append(part)
    return paths, unmaskable


def _unescape(value: str) -> str:
    out, i = bytearray(), 0
    while i < len(value):
        if value[i] == "%" and i + 3 <= len(value):
            out.append(int(value[i + 1 : i + 3], 16))
            i += 3
        else:
            out += value[i].encode()
            i += 1
    return out.decode(errors="surrogateescape")


def runtime_dirs(env: dict, uid: int) -> list[str]:
    """The user's runtime directories: ``$XDG_RUNTIME_DIR`` and the one its
    manager uses (``/run/user/UID``), where they exist."""
    out = []
    for path in (env.get("XDG_RUNTIME_DIR") or "", f"/run/user/{uid}"):
        if path and os.path.isabs(path) and os.path.isdir(path):
            real = os.path.realpath(path)
            if real not in out:
                out.append(real)
    return out


def survey(env: dict, uid: int | None = None, listening: set[str] | None = None) -> Survey:
    """The channels the command (uid ``uid``, environment ``env``) could reach
    and what hides them; see the module's docstring."""
    uid = os.geteuid() if uid is None else uid
    listening = listening_sockets() if listening is None else listening
    found = Survey()
    masked: set[str] = set()

    def add(name: str, path: str, how: str, opened: bool) -> None:
        real = os.path.realpath(path)
        if real not in masked and os.path.lexists(real):
            masked.add(real)
            found.masks.append(Mask(real, how))
        if opened and name not in found.open:
            found.open.append(name)

    def listens(path: str) -> bool:
        return (path in listening or os.path.realpath(path) in listening) and _socket_we_may_use(path)

    runtimes = runtime_dirs(env, uid)
    session_paths, unmaskable = bus_paths(env.get("DBUS_SESSION_BUS_ADDRESS", ""))
    system_paths, more = bus_paths(env.get("DBUS_SYSTEM_BUS_ADDRESS", ""))
    found.unmaskable = unmaskable + more
    for runtime in runtimes:
        private = os.path.join(runtime, "systemd", "private")
        add("user-manager", os.path.join(runtime, "systemd"), "spool", listens(private))
    for path in [os.path.join(runtime, "bus") for runtime in runtimes] + session_paths:
        add("session-bus", path, "socket", listens(path))
    for path in _corral_services(env, runtimes):
        add("corral-service", path, "socket", listens(path))
    # A session's holder listens on an abstract address: no path to hide. It
    # refuses every caller in another user namespace than its own, which a
    # sealed run's command always is (``ctl/session_holder.py``).
    from ..common.programs import SESSION_ADDRESS_PREFIX

    if any(p.startswith(f"@{SESSION_ADDRESS_PREFIX}{uid}/") for p in listening):
        found.open.append("corral-session")
    prefixes = tuple(runtime + "/" for runtime in runtimes)
    for path in sorted(p for p in listening if p.startswith(prefixes)):
        real = os.path.realpath(path)
        if real not in masked and not any(real.startswith(m.path + "/") for m in found.masks if m.how != "socket"):
            add("user-sockets", path, "socket", listens(path))
    add("system-manager", _SYSTEM_MANAGER, "socket", listens(_SYSTEM_MANAGER))
    for path in [_SYSTEM_BUS, *system_paths]:
        add("system-bus", path, "socket", listens(path))
    for name, spools in (("atd", _ATD_SPOOLS), ("cron", _CRON_SPOOLS)):
        for path in spools:
            add(name, path, "spool", os.path.isdir(path))
    for path in _tmux_dirs(env, uid):
        add("tmux", path, "private", _holds_listening(path, listening))
    for path in _screen_dirs(env, uid):
        add("screen", path, "private", _holds_listening(path, listening) or _holds_fifo(path))
    found.open.sort(key=NAMES.index)
    return found


def _socket_we_may_use(path: str) -> bool:
    """A socket the command could connect to: it is one, and writable to it
    (root: always; the kernel asks for write permission on the inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and os.access(path, os.W_OK)


def _corral_services(env: dict, runtimes: list[str]) -> list[str]:
    """Where a corral service of this user (or root's) may listen: it would
    run a command outside this run. (``CORRAL_SERVICE=0`` only tells a client
    not to ask it: the socket is there all the same.)"""
    from ..common.programs import SOCKET_NAME, SYSTEM_SOCKET

    named = [env["CORRAL_SERVICE_SOCKET"]] if env.get("CORRAL_SERVICE_SOCKET") else []
    return [*named, *(os.path.join(runtime, SOCKET_NAME) for runtime in runtimes), SYSTEM_SOCKET]


def _tmux_dirs(env: dict, uid: int) -> list[str]:
    """tmux's socket directories: ``$TMUX_TMPDIR/tmux-UID``, ``/tmp/tmux-UID``,
    and that of the server ``$TMUX`` names (its socket path, then ",pid,session")."""
    dirs = [os.path.join(base, f"tmux-{uid}") for base in (env.get("TMUX_TMPDIR") or "", "/tmp") if base]
    if env.get("TMUX"):
        dirs.append(os.path.dirname(env["TMUX"].split(",", 1)[0]))
    return [d for d in dirs if os.path.isabs(d) and os.path.isdir(d) and d not in ("/", "/tmp")]


def _screen_dirs(env: dict, uid: int) -> list[str]:
    """screen's socket directories: ``$SCREENDIR``, ``/run/screen/S-USER``."""
    dirs = [env["SCREENDIR"]] if env.get("SCREENDIR") else []
    # The user's name only where screen made its directory: a lookup costs
    # every run NSS's files (nsswitch.conf, passwd), or a directory server.
    if os.path.isdir("/run/screen"):
        try:
            import pwd

            dirs.append(f"/run/screen/S-{pwd.getpwuid(uid).pw_name}")
        except (KeyError, ImportError):
            pass
    return [d for d in dirs if os.path.isabs(d) and os.path.isdir(d) and d not in ("/", "/tmp")]


def _holds_listening(directory: str, listening: set[str]) -> bool:
    """A listening socket the command may use in ``directory`` (as bound, or
    through the directory's real path: sockets are bound where their server
    looked, which is the path it was given)."""
    prefixes = (directory.rstrip("/") + "/", os.path.realpath(directory) + "/")
    return any(path.startswith(prefixes) and _socket_we_may_use(path) for path in listening)


def _holds_fifo(directory: str) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(stat.S_ISFIFO(e.stat(follow_symlinks=False).st_mode) for e in entries)
    except OSError:
        return False
