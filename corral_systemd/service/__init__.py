"""The corral service: runs handed over by ``corral`` clients, over Varlink.

One long-lived process per manager (socket-activated: ``corral.socket`` +
``corral.service``, user or system) keeps what every corral start would
otherwise pay for: the interpreter with typer, dbus-fast and pydantic
loaded, one manager connection and one tether (a library ``Runner``).

- ``server.py``: the socket, who may connect (this uid only), the accept
  loop, per-connection threads, idle exit, the bounds a hostile peer meets;
- ``requests.py``: one ``io.corral.Run.Run`` call: validate, parse the
  command line with the CLI's own parser, decide whether it is served here,
  run it, and build the reply;
- ``watch.py``: the clients' control pipes and pidfds, watched by one thread;
- ``units.py``: the unit files, for ``corralctl service install|status|uninstall``.

The client side is ``corral_systemd.client`` (imports nothing heavy).
"""
