"""The command's parent for a caller that passes no process of its own.

A caller that cannot pass descriptors (many languages' socket APIs: the
README's Node example) cannot fork the command's process either. The
service then starts a holder for the run: a small process of its own
(``python -I -m corral_systemd.service.holder``) that does what a client
does (``kernel.gate``): it forks the command's process held at a gate,
hands the service its pidfd, the gate and an exit pipe, waits for it and
reports its wait status, and reaps it once the service is done (end of file
on their socket). So no command has the service as its parent: ``$PPID`` is
the run's own holder, and what a command does to it (``kill -STOP $PPID``,
``prlimit --pid $PPID``) reaches no other run. The command's context
(rlimits, namespaces) is then the service's: such a caller has none to pass.

Failure modes: the holder cannot be started, or says nothing within
``START_TIMEOUT``: ``NotServed`` (nothing ran). The holder dies mid-run:
its exit pipe ends unreported, and the run is stopped and said unproven
(the engine's ``lost_track``).
"""

import os
import sys

#: How long the service waits for a new holder's descriptors.
START_TIMEOUT = 30.0


class Holder:
    """A running holder (the service's child) and the held process it hands over."""

    def __init__(self):
        import select
        import socket

        from ..kernel.fdpass import received
        from ..kernel.held import HeldProcess
        from ..kernel.signals import CHILD_DEFAULTS

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock = ours
        try:
            devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                self.pid = os.posix_spawn(
                    sys.executable,
                    [sys.executable, "-I", "-m", "corral_systemd.service.holder"],
                    {"PATH": os.environ.get("PATH", os.defpath)},
                    file_actions=[
                        (os.POSIX_SPAWN_DUP2, devnull, 0),
                        (os.POSIX_SPAWN_DUP2, devnull, 1),
                        (os.POSIX_SPAWN_DUP2, devnull, 2),
                        (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
                    ],
                    setsigdef=CHILD_DEFAULTS,
                    setsigmask=(),
                )
            finally:
                os.close(devnull)
                theirs.close()
            self.pidfd = os.pidfd_open(self.pid)
            poller = select.poll()
            poller.register(ours.fileno(), select.POLLIN)
            if not poller.poll(START_TIMEOUT * 1000):
                raise OSError("the holder did not start in time")
            data, ancillary, _, _ = ours.recvmsg(64, socket.CMSG_SPACE(3 * 4), socket.MSG_CMSG_CLOEXEC)
            fds = received(ancillary)
            if data != b"held\n" or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                raise OSError(f"the holder said {data!r}")
            self.held = HeldProcess(*fds, parent=self.pid)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """The run is over: the holder reaps its child and exits; reap it."""
        self._sock.close()
        pid = getattr(self, "pid", None)
        if pid is not None:
            os.waitpid(pid, 0)
            os.close(self.pidfd)
            self.pid = None


def main() -> int:  # pragma: no cover  (runs as the holder; tested through the service's runs)
    import select
    import socket

    from ..kernel.fdpass import rights
    from ..kernel.gate import fork_held

    service = socket.socket(fileno=3)
    exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
    child = fork_held(close_in_child=(3, exit_r, exit_w))
    service.sendmsg([b"held\n"], rights((child.pidfd, child.gate, exit_r)))
    os.close(exit_r)
    os.close(child.gate)
    child.gate = -1
    poller = select.poll()
    poller.register(service.fileno(), select.POLLIN)
    poller.register(child.pidfd, select.POLLIN)
    while True:
        ready = [fd for fd, _ in poller.poll()]
        if child.pidfd in ready and child.exited() is not None:
            poller.unregister(child.pidfd)
            os.write(exit_w, child.report())
        if service.fileno() in ready:
            break  # the service is done with the run (or gone)
    child.discard()
    return 0


if __name__ == "__main__":
    sys.exit(main())
