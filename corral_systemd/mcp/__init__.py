"""``corralctl mcp``: an MCP server over stdio whose whole life is one corral session.

    runs.py    the session's runs: exec (corral --yield's run) and start (corral --background)
    front.py   an exec's front in this process: corral's parser and background.launch, no corral start
    output.py  a run's output: its log read with cursors, cut to head and tail
    tools.py   the tools: schemas, argument checks, what each does (no SDK import)
    tasks.py   MCP tasks: start and a long exec as tasks of their runs, where the client asks
    server.py  the SDK's low-level Server over stdio

The session is opened before the first message is read, owned by this
process (``corralctl session start --owner <this pid>``): its holder watches
this process through a pidfd, and so does each run's corral. So whatever
ends the server -- the client closing stdin (then the server ends the
session itself and waits for the proof), a signal, SIGKILL -- ends every run
of the session, each with its stop sequence and its proof.

Failure modes: without the SDK (the ``mcp`` extra), one line naming the
extra and exit 125; a session that cannot be started: one line, 125; the
session's end not proven: one line, 120.
"""

import sys


def main(idle_timeout: float) -> int:
    """Serve MCP on stdin/stdout until the client goes; the exit code of the session's end."""
    try:
        import mcp.server.lowlevel  # noqa: F401  (the SDK: an optional extra)
    except ImportError:
        print("corralctl mcp: the MCP SDK is not installed: pip install 'corral-systemd[mcp]'", file=sys.stderr)
        return 125
    import logging

    import anyio

    from ..common.errors import SetupError, Unverified, UsageError
    from ..session import Session
    from .server import serve
    from .tools import Tools

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="corralctl mcp: %(message)s")
    _find_runtime_dir()
    session = Session(idle_timeout=idle_timeout)  # owner: this process
    try:
        session.open()
    except (UsageError, SetupError) as exc:
        print(f"corralctl mcp: the session could not start: {' '.join(str(exc).split())}", file=sys.stderr)
        return 125
    tools = Tools(session)
    try:
        anyio.run(serve, tools)
    except KeyboardInterrupt:
        pass
    try:
        session.end()  # every run of it stopped and proven gone (its exec runs' corrals write their records)
    except Unverified as exc:
        print(f"corralctl mcp: session {session.id}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 120
    except SetupError as exc:
        print(f"corralctl mcp: session {session.id}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 125
    finally:
        tools.close()
    return 0


def _find_runtime_dir() -> None:
    """``XDG_RUNTIME_DIR`` as the user's session has it, where the MCP client left it
    out: the SDKs start a server with HOME, PATH, USER, SHELL, TERM and LOGNAME only,
    and without it corral finds no user manager (its runs would take a weaker tier).
    ``/run/user/<uid>``, as systemd's tools look for it, if it is this user's own
    private directory (as the registry's ``state_dir`` judges it); the server's runs
    inherit it, as they would from a login shell."""
    import os

    from ..state.registry.paths import _private_dir_of

    path = f"/run/user/{os.getuid()}"
    if not os.environ.get("XDG_RUNTIME_DIR") and _private_dir_of(path, os.getuid()):
        os.environ["XDG_RUNTIME_DIR"] = path
