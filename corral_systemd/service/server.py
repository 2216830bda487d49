"""The corral service's socket, its connections and its lifetime.

    python -m corral_systemd.service [--socket PATH] [--manager user|system]
                                     [--idle-exit SECONDS] [--max-runs N]

It listens on the socket systemd passes (socket activation: ``LISTEN_FDS``),
or binds ``--socket PATH`` itself (tests, a manual run).

Guarantees and failure modes:

- **Who**: a connection's peer (SO_PEERCRED, recorded by the kernel at
  connect time) must be this process's uid, else ``PermissionDenied`` and
  the connection is closed. The system instance runs as root: it serves
  root only.
- **Bounds a peer meets**: a message is at most ``wire.MAX_MESSAGE`` bytes
  with at most ``wire.MAX_FDS`` descriptors; a connection that sends nothing
  for ``CONNECTION_IDLE`` seconds between calls is closed; at most
  ``max_connections`` connections (past that: ``Busy``, closed) and
  ``max_runs`` runs in flight (``Busy``: the client runs it itself).
  Anything malformed gets a Varlink error and ends that connection only;
  an unexpected exception in one connection is logged (stderr: the journal)
  and ends that connection only.
- **Idle exit**: with no connection for ``idle_exit`` seconds it stops
  accepting and exits; a client that connects meanwhile waits in the
  listening socket's backlog, which systemd owns and answers by starting
  the service again.
- **Stopped** (SIGTERM, SIGINT, SIGHUP: ``systemctl stop``): every run in
  flight is stopped as corral stops a run for that signal, verified, and
  replied to; then the Runner closes (its tether ends, so the manager stops
  any unit still bound to it) and the process exits.
- **Killed**: the Runner's tether dies with it, the manager stops every
  run's unit; each client's connection closes and the client reports 120.
"""

import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from .. import varlink
from ..common.version import __version__
from ..varlink import INTERFACES
from ..varlink.wire import Channel, ProtocolError, VarlinkError, close_fds, peer_credentials

CONNECTION_IDLE = 30.0
INVALID = "org.varlink.service.InvalidParameter"


class Service:
    def __init__(
        self,
        listener: socket.socket,
        *,
        manager_kind: str,
        idle_exit: float,
        max_runs: int = 64,
        max_connections: int = 256,
    ):
        from ..core.manager_session import SharedSession
        from .watch import Watcher

        self.listener = listener
        self.manager_kind = manager_kind
        self.idle_exit = idle_exit
        self.max_runs = max_runs
        self.max_connections = max_connections
        #: The manager session every run of the service shares (one tether).
        self.sessions = SharedSession()
        self.watcher = Watcher(on_failure=self._part_failed)
        #: Why a part of the service died (its watcher thread): it stops taking
        #: runs and stops those in flight rather than go on without it.
        self.failed: str | None = None
        self.started = time.monotonic()
        self.runs_served = 0
        self._lock = threading.Lock()
        #: Each connection's thread -> its socket, and whether a call is in progress on it.
        self._connections: dict[threading.Thread, list] = {}
        self._stopping = False
        self._wake_w = -1
        self._runs_in_flight = 0
        self._last_activity = time.monotonic()

    # -- lifetime --------------------------------------------------------
    def serve(self) -> int:
        """Accept until idle or stopped; returns the exit status."""
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        old = {sig: signal.signal(sig, lambda *_: None) for sig in stop_signals}
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        stopped_by = None
        self._wake_w = wake_w
        try:
            while stopped_by is None and self.failed is None:
                with self._lock:
                    idle_for = None if self._connections else time.monotonic() - self._last_activity
                if idle_for is not None and idle_for >= self.idle_exit:
                    break
                # No timer while connections are open: the last one to end wakes this loop (``_wake``).
                timeout = None if idle_for is None else (self.idle_exit - idle_for) * 1000
                for fd, _ in poller.poll(timeout):
                    if fd == wake_r:
                        signums = os.read(wake_r, 64)
                        stopped_by = next((s for s in signums if s in stop_signals), None)
                    else:
                        self._accept()
            if self.failed is not None:
                print(
                    f"corral service: stopping, a part of it failed (its runs are stopped):\n{self.failed}",
                    file=sys.stderr,
                    flush=True,
                )
                stopped_by = signal.SIGTERM
            self._close_connections(stopped_by)
        finally:
            self.sessions.close()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self._wake_w = -1
            os.close(wake_r)
            os.close(wake_w)
        return 0 if self.failed is None else 1

    def _part_failed(self, why: str) -> None:
        """A thread the service cannot do without died: stop (from the main loop)."""
        with self._lock:
            self.failed = why
            self._stopping = True  # no new run from here
        self._wake()

    def _wake(self) -> None:
        """Wake the main loop (a byte that is no stop signal): it looks at the service's state again."""
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def _close_connections(self, stopped_by: int | None) -> None:
        """Stopping: runs in flight are stopped as corral stops for the
        signal, and answered; connections between calls are closed."""
        with self._lock:
            self._stopping = True
        if stopped_by is not None:
            self.watcher.cancel_all(stopped_by)
        while True:
            with self._lock:
                left = list(self._connections.items())
            if not left:
                return
            for thread, (sock, busy) in left:
                if not busy:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)  # its receive() returns: the thread ends
                    except OSError:
                        pass
                thread.join(0.05)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        with self._lock:
            self._last_activity = time.monotonic()
            if len(self._connections) >= self.max_connections:
                busy = True
            else:
                busy = False
                thread = threading.Thread(target=self._serve_connection, args=(sock,), daemon=True)
                self._connections[thread] = [sock, False]
        if busy:
            _send_and_close(sock, {"error": "io.corral.Run.Busy", "parameters": {"limit": self.max_connections}})
            return
        thread.start()

    # -- one connection --------------------------------------------------
    def _serve_connection(self, sock: socket.socket) -> None:
        pidfd = -1
        try:
            pid, uid, _ = peer_credentials(sock)
            if uid != os.getuid():
                _send_and_close(sock, {"error": "io.corral.Run.PermissionDenied", "parameters": {"uid": uid}})
                return
            pidfd = os.pidfd_open(pid)  # the client's death stops its run (watch.py)
            sock.settimeout(CONNECTION_IDLE)
            channel = Channel(sock)
            while True:
                try:
                    got = channel.receive()
                except ProtocolError as exc:
                    channel.send({"error": INVALID, "parameters": {"parameter": f"message: {exc}"}})
                    return
                if got is None:
                    return
                message, fds = got
                state = self._connections[threading.current_thread()]
                with self._lock:
                    if self._stopping:
                        close_fds(fds)
                        return
                    state[1] = True
                try:
                    self._call(channel, message, fds, pid, pidfd)
                finally:
                    close_fds(fds)
                    with self._lock:
                        state[1] = False
                if message.get("method") == "io.corral.Run.Run":
                    # One run per connection: whatever else reaches this socket
                    # (a call written by the command onto a descriptor it got
                    # hold of, say) is never read, let alone run.
                    return
        except OSError:
            pass  # the peer went away, or its socket timed out: nothing to answer
        except Exception:
            print(f"corral service: a connection failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            try:
                # The end, whatever else still refers to this socket: the peer
                # reads end of file now (one run per connection).
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            with self._lock:
                self._connections.pop(threading.current_thread(), None)
                self._last_activity = time.monotonic()
                last = not self._connections
            if last:
                self._wake()  # the idle exit counts from now

    def _call(self, channel: Channel, message: dict, fds: list[int], pid: int, pidfd: int) -> None:
        method = message.get("method")
        oneway = message.get("oneway") is True
        try:
            if not isinstance(method, str):
                raise VarlinkError(INVALID, {"parameter": "method"})
            if method == "io.corral.Run.Run":
                if oneway:
                    raise VarlinkError(INVALID, {"parameter": "oneway"})
                reply = self._run(channel, message, fds, pid, pidfd)
            elif method == "io.corral.Run.Status":
                reply = self.status()
            elif method == "io.corral.Session.Ctl":
                if oneway:
                    raise VarlinkError(INVALID, {"parameter": "oneway"})
                reply = self._ctl(channel, message)
            elif method == "org.varlink.service.GetInfo":
                reply = {
                    "vendor": "corral-systemd",
                    "product": "corral",
                    "version": __version__,
                    "url": "https://github.com/corral-systemd/corral-systemd",
                    "interfaces": ["org.varlink.service", *INTERFACES],
                }
            elif method == "org.varlink.service.GetInterfaceDescription":
                parameters = message.get("parameters")
                interface = parameters.get("interface") if isinstance(parameters, dict) else None
                if not isinstance(interface, str):
                    raise VarlinkError(INVALID, {"parameter": "interface"})
                reply = {"description": _description(interface)}
            else:
                raise VarlinkError("org.varlink.service.MethodNotFound", {"method": method})
        except VarlinkError as exc:
            if not oneway:
                channel.send({"error": exc.name, "parameters": exc.parameters})
            return
        except Exception as exc:  # a bug here: said to the client and logged; the service goes on
            print(f"corral service: {method} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            if not oneway:
                channel.send({"error": "io.corral.Run.InternalError", "parameters": {"message": repr(exc)}})
            return
        if not oneway:
            channel.send({"parameters": reply})

    def _run(self, channel: Channel, message: dict, fds: list[int], pid: int, pidfd: int) -> dict:
        from .requests import check_parameters, execute, execute_background, held_process, parse

        checked = check_parameters(message.get("parameters"), fds)
        request = parse(checked, self.manager_kind, pid)
        held = held_process(checked, pid) if request.spec.unit_type == "scope" and request.background is None else None
        with self._lock:
            busy = self._runs_in_flight >= self.max_runs
            if not busy:
                self._runs_in_flight += 1
        if busy:
            if held is not None:
                held.close()
            raise VarlinkError("io.corral.Run.Busy", {"limit": self.max_runs})
        try:

            def accepted():
                if message.get("more") is True:
                    channel.send({"parameters": {"accepted": True}, "continues": True})

            if request.background is not None:
                reply = execute_background(request, checked, channel.sock.fileno(), accepted)
            else:
                reply = execute(self, request, checked, held, pidfd, channel.sock.fileno(), accepted)
            with self._lock:
                self.runs_served += 1
            return reply
        finally:
            with self._lock:
                self._runs_in_flight -= 1

    def _ctl(self, channel: Channel, message: dict) -> dict:
        from . import ctl_calls

        argv, env, cwd = ctl_calls.check(message.get("parameters"))

        def send_more(parameters: dict) -> None:
            channel.send({"parameters": parameters, "continues": True})

        channel.sock.settimeout(None)  # `logs -f`, `wait`: as long as the command takes
        try:
            return ctl_calls.run(argv, env, cwd, channel.sock.fileno(), send_more if message.get("more") else None)
        finally:
            channel.sock.settimeout(CONNECTION_IDLE)

    def status(self) -> dict:
        with self._lock:
            return {
                "pid": os.getpid(),
                "manager": self.manager_kind,
                "runs_in_flight": self._runs_in_flight,
                "runs_served": self.runs_served,
                "uptime_seconds": round(time.monotonic() - self.started, 3),
                "idle_exit_seconds": self.idle_exit,
            }


def _description(interface) -> str:
    if interface in INTERFACES:
        with open(os.path.join(os.path.dirname(varlink.__file__), INTERFACES[interface])) as f:
            return f.read()
    if interface == "org.varlink.service":
        return _VARLINK_SERVICE
    raise VarlinkError("org.varlink.service.InterfaceNotFound", {"interface": interface})


def _send_and_close(sock: socket.socket, message: dict) -> None:
    """One message, best effort (never blocks on a peer that does not read), then close."""
    try:
        sock.setblocking(False)
        Channel(sock).send(message)
    except OSError:
        pass
    finally:
        sock.close()


_VARLINK_SERVICE = """\
interface org.varlink.service
method GetInfo() -> (vendor: string, product: string, version: string, url: string, interfaces: []string)
method GetInterfaceDescription(interface: string) -> (description: string)
error InterfaceNotFound (interface: string)
error MethodNotFound (method: string)
error MethodNotImplemented (method: string)
error InvalidParameter (parameter: string)
"""


def listener_from_environment() -> socket.socket | None:
    """The socket systemd passed (socket activation), or None."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or int(os.environ.get("LISTEN_FDS", "0")) < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for the runs' commands
    sock = socket.socket(fileno=3)
    os.set_inheritable(3, False)
    return sock


def bind(path: str) -> socket.socket:
    """Listen on ``path`` ourselves (mode 0600), replacing a stale socket there."""
    import stat

    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .. import dbus

    dbus.light_import = True  # this process is corral's own: see dbus/_dbus_fast.py
    from ..kernel.prctl import set_dumpable

    set_dumpable(False)  # its runs' commands are of its uid: none may ptrace it or open its descriptors
    parser = argparse.ArgumentParser(prog="corral-service", description="The corral service (io.corral.Run).")
    parser.add_argument("--socket", help="bind this path instead of using the socket systemd passes")
    parser.add_argument("--manager", choices=("user", "system"), default="system" if os.geteuid() == 0 else "user")
    parser.add_argument("--idle-exit", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--max-runs", type=int, default=64)
    args = parser.parse_args(argv)
    listener = listener_from_environment()
    if listener is None:
        if not args.socket:
            print("corral-service: no socket passed by systemd (LISTEN_FDS) and no --socket", file=sys.stderr)
            return 125
        listener = bind(args.socket)
    listener.setblocking(False)
    service = Service(listener, manager_kind=args.manager, idle_exit=args.idle_exit, max_runs=args.max_runs)
    print(
        f"corral service {__version__}: pid {os.getpid()}, uid {os.getuid()}, {args.manager} manager, "
        f"idle exit after {args.idle_exit:g} s",
        file=sys.stderr,
        flush=True,
    )
    try:
        return service.serve()
    finally:
        listener.close()
        if args.socket:
            try:
                os.unlink(args.socket)
            except FileNotFoundError:
                pass
