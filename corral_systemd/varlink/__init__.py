"""Varlink (https://varlink.org), systemd's own IPC, as the corral service speaks it.

``wire.py`` is the protocol: NUL-terminated JSON messages over a unix
stream socket, with file descriptors passed alongside a message
(SCM_RIGHTS) and named in its parameters by their index. It imports only
what a process needs anyway (``os``, ``_socket``, ``json``), because the
CLI's client side runs on every ``corral`` start.

``io.corral.Run.varlink`` and ``io.corral.Session.varlink`` are the
interfaces the service implements.
"""

#: Each interface the service implements, and its description's file (next to this one).
INTERFACES = {"io.corral.Run": "io.corral.Run.varlink", "io.corral.Session": "io.corral.Session.varlink"}
