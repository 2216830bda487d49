"""Varlink (https://varlink.org), systemd's own IPC, as the corral service speaks it.

``wire.py`` is the protocol: NUL-terminated JSON messages over a unix
stream socket, with file descriptors passed alongside a message
(SCM_RIGHTS) and named in its parameters by their index. It imports only
what a process needs anyway (``os``, ``_socket``, ``json``), because the
CLI's client side runs on every ``corral`` start.

``io.corral.Run.varlink`` is the interface the service implements.
"""

#: Where the interface description lives, next to this file.
INTERFACE_FILE = "io.corral.Run.varlink"
INTERFACE = "io.corral.Run"
