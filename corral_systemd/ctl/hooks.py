"""``corralctl hook claude-code | codex``: an agent's shell calls run through corral, in a
session owned by the agent (see docs/hooks.md).

Each call is one hook: the agent writes the hook's JSON on stdin, this answers
on stdout with the JSON the agent's documented hook schema takes, and exits 0.

- **SessionStart**: a corral session (``ctl/sessions.start``) whose ``--owner``
  is the agent's process, so the agent's exit or SIGKILL ends it (the holder
  watches the owner's pidfd). Its id is recorded under the agent's
  ``session_id`` in ``<state dir>/hooks/`` (one 0600 file per agent session).
- **PreToolUse** (Bash): the call's command becomes ``corral --session ID
  [limits] -- bash -c '<command>'`` (``--background`` for a Claude Code
  ``run_in_background`` call), answered as ``hookSpecificOutput.updatedInput``.
  With no open session recorded (Codex's SessionStart may not have run, an idle
  timeout ended it), one is started first.
- **SessionEnd** (Claude Code; Codex has none: its owner's exit ends the
  session): ``corralctl session end``, then the record is removed.

Which process is the agent: the hook's nearest ancestor that is not a shell.
The agent starts each hook through a shell (``sh -c`` on Linux, for Claude
Code's and Codex's shell-form commands), which may or may not exec this
process; the shell lives only for this hook, the agent for the whole session.
``CORRAL_HOOK_AGENT_PID`` names it instead (an agent that is itself a shell, or
behind a wrapper that stays).

Failure mode, by design: anything unexpected (malformed JSON, another event
or tool, no agent process found, a session that cannot start) passes the call
through unchanged — exit 0, nothing on stdout — with one ``corralctl hook:``
line on stderr. A hook never blocks the agent. What is not covered: a command
the agent runs without the hook (another tool, a hook that timed out), and
what a command hands off outside the session (a systemd unit, a container
daemon's container).

Start-up: this module imports json and os; the session machinery, the
config's TOML reader and the limit table are imported only on the paths that
use them.
"""

import json
import os
import sys

AGENTS = ("claude-code", "codex")
#: Programs an agent starts a hook through: the hook's ancestors skipped to find the agent.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish"})
#: Names the agent's pid instead of the parent chain.
AGENT_PID_ENV = "CORRAL_HOOK_AGENT_PID"
#: The corral command line the rewritten command runs (default: the corral installed beside this one).
CORRAL_ENV = "CORRAL_HOOK_CORRAL"
#: The config file (default ``$XDG_CONFIG_HOME/corral/hooks.toml``).
CONFIG_ENV = "CORRAL_HOOK_CONFIG"
#: A hook session's idle timeout unless the config says: its owner's exit is what ends it.
IDLE_TIMEOUT = 24 * 3600.0
#: Keys of the config's top level other than run limits.
_TOP_KEYS = ("grace", "decision", "session")
#: Keys of its ``[session]`` table.
_SESSION_KEYS = ("idle_timeout", "max_runs", "mem", "pids", "cpus")


class PassThrough(Exception):
    """Why this call is passed through unchanged (its message is the warning line)."""


def main(argv: list[str]) -> int:
    """``corralctl hook AGENT [--print-settings]``: 0 always once the agent is known."""
    if not argv or argv[0] not in AGENTS or any(a not in ("--print-settings",) for a in argv[1:]):
        print(f"corralctl: hook: expected one of {', '.join(AGENTS)} [--print-settings]", file=sys.stderr)
        return 125
    agent = argv[0]
    if "--print-settings" in argv or sys.stdin is None or sys.stdin.isatty():
        print(settings_snippet(agent))
        return 0
    text = sys.stdin.read()
    if not text.strip():
        print(settings_snippet(agent))
        return 0
    try:
        answer = handle(agent, text)
    except PassThrough as why:
        print(f"corralctl hook: {why}; the call goes on unchanged", file=sys.stderr)
        return 0
    except Exception as exc:  # never block the agent, whatever went wrong
        print(f"corralctl hook: {type(exc).__name__}: {exc}; the call goes on unchanged", file=sys.stderr)
        return 0
    if answer is not None:
        sys.stdout.write(json.dumps(answer) + "\n")
    return 0


def handle(agent: str, text: str) -> dict | None:
    """The hook's answer (None: nothing to print) for the payload ``text``; PassThrough if unexpected."""
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise PassThrough(f"hook input is not JSON ({exc})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("session_id"), str) or not payload["session_id"]:
        raise PassThrough("hook input has no session_id")
    event = payload.get("hook_event_name")
    if event == "SessionStart":
        return session_start(agent, payload)
    if event == "PreToolUse":
        return pre_tool_use(agent, payload)
    if event == "SessionEnd":
        session_end(agent, payload)
        return None
    raise PassThrough(f"hook event {event!r} is not one corral handles (SessionStart, PreToolUse, SessionEnd)")


# -- the events ------------------------------------------------------------------------------------
def session_start(agent: str, payload: dict) -> dict:
    """Start (or keep: a resumed or compacted agent session whose corral session is open) the session."""
    session_id = ensure_session(agent, payload["session_id"], load_config())
    said = (
        f"Shell commands in this session run through corral (session {session_id}): when a command returns, "
        "every process it started is stopped, proven gone. A background command becomes a corral background run "
        f"that lives until the session ends: `corralctl ps --session {session_id}`, `corralctl logs RUN`, "
        "`corralctl stop RUN`."
    )
    return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": said}}


def pre_tool_use(agent: str, payload: dict) -> dict:
    """The Bash call rewritten to run through corral in the agent's session."""
    tool_input = payload.get("tool_input")
    if payload.get("tool_name") != "Bash":
        raise PassThrough(f'tool {payload.get("tool_name")!r} is not Bash (set the hook\'s matcher to "Bash")')
    if not isinstance(tool_input, dict) or not isinstance(tool_input.get("command"), str):
        raise PassThrough("tool_input.command is not a string")
    if not tool_input["command"].strip():
        raise PassThrough("tool_input.command is empty")
    config = load_config()
    session_id = ensure_session(agent, payload["session_id"], config)
    background = agent == "claude-code" and tool_input.get("run_in_background") is True
    timeout_ms = tool_input.get("timeout")
    wall_ms = timeout_ms if not background and _positive_number(timeout_ms) else None
    command = corral_command(session_id, tool_input["command"], config, background=background, wall_ms=wall_ms)
    updated = {**tool_input, "command": command}
    out: dict = {"hookEventName": "PreToolUse", "updatedInput": updated}
    if agent == "codex":
        out["permissionDecision"] = "allow"  # Codex applies updatedInput only with "allow"
        return {"hookSpecificOutput": out}
    # Claude Code: "allow" would skip the permission prompt the call would have had; the
    # rewritten call is shown for approval unless the agent skips prompts anyway, or the
    # config says to allow.
    decision = config.get("decision") or ("allow" if payload.get("permission_mode") == "bypassPermissions" else "ask")
    out["permissionDecision"] = decision
    out["permissionDecisionReason"] = f"runs through corral in session {session_id}"
    if background:
        # corral --background returns once the run has started, printing its id: the call
        # itself is then a short foreground one, and the run lives on in the session.
        updated["run_in_background"] = False
        out["additionalContext"] = (
            f"This command was started as a corral background run in session {session_id}; the call prints its "
            "run id. Read its output with `corralctl logs RUN`, wait for it with `corralctl wait RUN`, stop it "
            "with `corralctl stop RUN`; it ends with the session."
        )
    return {"hookSpecificOutput": out}


def session_end(agent: str, payload: dict) -> None:
    """End the agent session's corral session (every run of it, proven gone), then forget it."""
    from contextlib import redirect_stdout

    from .sessions import end
    from .status import CtlError

    record = read_record(agent, payload["session_id"])
    if record is None:
        raise PassThrough("no corral session is recorded for this agent session")
    try:
        with redirect_stdout(sys.stderr):  # its report is for the log: the agent discards SessionEnd's stdout
            code = end(record["corral_session"])
    except CtlError as exc:  # already gone (ended by its owner or by gc): nothing left to end
        print(f"corralctl hook: session {record['corral_session']}: {exc}", file=sys.stderr)
        code = 0
    remove_record(agent, payload["session_id"])
    if code != 0:
        print(f"corralctl hook: session {record['corral_session']} not proven ended (exit {code})", file=sys.stderr)


# -- the session and its record ---------------------------------------------------------------------
def ensure_session(agent: str, agent_session: str, config: dict) -> str:
    """The corral session of ``agent_session``: the recorded one while its holder says it is
    open, else a new one owned by the agent's process (recorded)."""
    from ..state import registry as REG
    from ..state import sessions as S

    record = read_record(agent, agent_session)
    if record is not None:
        try:
            return S.joinable(record["corral_session"], REG.state_dir())
        except S.NotJoinable:
            pass  # ended (idle timeout, its owner gone, session end): a new one below
    owner = agent_pid()
    session_id = start_session(owner, config.get("session") or {})
    write_record(agent, agent_session, {"corral_session": session_id, "owner": owner, "agent": agent})
    return session_id


def start_session(owner: int, options: dict) -> str:
    """A new session owned by ``owner`` (``corralctl session start``'s, in this process); its id."""
    from .sessions import start_session as start
    from .status import CtlError

    idle = options.get("idle_timeout", IDLE_TIMEOUT)
    limits = {k: options[k] for k in ("mem", "pids", "cpus") if k in options}
    try:
        return start(None, owner, idle, options.get("max_runs"), limits=limits)
    except CtlError as exc:
        raise PassThrough(f"no corral session could start: {exc}") from None


def agent_pid() -> int:
    """The agent's process: ``$CORRAL_HOOK_AGENT_PID``, else the nearest ancestor that is not a shell."""
    from ..kernel import procfs

    named = os.environ.get(AGENT_PID_ENV)
    if named:
        if not named.isdigit() or int(named) <= 1:
            raise PassThrough(f"{AGENT_PID_ENV}={named!r} is not a process id")
        return int(named)
    pid = os.getppid()
    for _ in range(16):
        argv = procfs.cmdline(pid)
        info = procfs.read_stat(pid)
        if pid <= 1 or info is None or not argv:
            break
        if os.path.basename(argv[0]).lstrip("-") not in SHELLS:
            return pid
        pid = info.ppid
    raise PassThrough(f"no agent process above this hook (only shells up to pid {pid}); set {AGENT_PID_ENV}")


def _record_path(agent: str, agent_session: str, make: bool = False) -> str:
    """``<state dir>/hooks/<agent>-<sha256 of the agent's session id>.json`` (its id is the agent's text)."""
    import hashlib

    from ..state import registry as REG

    directory = os.path.join(REG.ensure_state_dir() if make else REG.state_dir(), "hooks")
    if make:
        REG.ensure_private_dir(directory)
    digest = hashlib.sha256(agent_session.encode(errors="surrogatepass")).hexdigest()[:32]
    return os.path.join(directory, f"{agent}-{digest}.json")


def read_record(agent: str, agent_session: str) -> dict | None:
    try:
        with open(_record_path(agent, agent_session), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("corral_session"), str)
    return record if ok and record.get("agent_session") == agent_session else None


def write_record(agent: str, agent_session: str, record: dict) -> None:
    from ..state.registry.files import _canonical, _write_atomic

    _write_atomic(_record_path(agent, agent_session, make=True), _canonical({**record, "agent_session": agent_session}))


def remove_record(agent: str, agent_session: str) -> None:
    try:
        os.unlink(_record_path(agent, agent_session))
    except OSError:
        pass


# -- the command line -------------------------------------------------------------------------------
def corral_command(session_id: str, command: str, config: dict, *, background: bool, wall_ms=None) -> str:
    """``corral --session ID [--background] [limits] -- bash -c COMMAND`` as one shell-quoted line."""
    import shlex

    argv = [*corral_program(), "--session", session_id]
    if background:
        argv.append("--background")
    argv += limit_options(config, wall_ms)
    argv += ["--", "bash", "-c", command]
    return " ".join(shlex.quote(a) for a in argv)


def corral_program() -> list[str]:
    """``$CORRAL_HOOK_CORRAL`` (a command line), else the corral beside this corralctl or this
    Python, else ``corral`` on the agent's PATH."""
    named = os.environ.get(CORRAL_ENV)
    if named:
        import shlex

        return shlex.split(named)
    for directory in (os.path.dirname(os.path.abspath(sys.argv[0])), os.path.dirname(sys.executable)):
        path = os.path.join(directory, "corral")
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return [path]
    return ["corral"]


def limit_options(config: dict, wall_ms=None) -> list[str]:
    """The run's limits as corral options: the config's, and the call's own timeout as ``--wall``
    (the shorter of the two), so a command past its timeout is stopped, not left running."""
    options = []
    wall = config.get("wall")
    if wall_ms is not None and (wall is None or wall_ms / 1000 < wall):
        wall = wall_ms / 1000
    if wall is not None:
        options += ["--wall", f"{wall:g}s"]
    for field, value in config.get("limits", {}).items():
        options += [f"--{field.replace('_', '-')}", value]
    if "grace" in config:
        options += ["--grace", f"{config['grace']:g}s"]
    return options


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# -- the config ------------------------------------------------------------------------------------
def config_path() -> str:
    named = os.environ.get(CONFIG_ENV)
    if named:
        return named
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "corral", "hooks.toml")


def load_config() -> dict:
    """The config, checked: ``{wall, limits: {field: text}, grace, decision, session: {...}}``.
    No file: {}. A file that does not parse or check: PassThrough (the call is not rewritten
    with limits nobody asked for, nor without the ones asked for)."""
    path = config_path()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise PassThrough(f"config {path}: {exc.strerror}") from None
    import tomllib

    try:
        raw = tomllib.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise PassThrough(f"config {path}: {exc}") from None
    try:
        return check_config(raw)
    except ValueError as exc:
        raise PassThrough(f"config {path}: {exc}") from None


def check_config(raw: dict) -> dict:
    """The config's values, each checked as corral checks its option (ValueError, one line)."""
    from ..common.limits import BY_FIELD
    from ..common.units import parse_duration

    config: dict = {"limits": {}}
    for key, value in raw.items():
        if key in BY_FIELD:
            limit = BY_FIELD[key]
            parsed = _bounded(limit, value)
            if key == "wall":
                config["wall"] = parsed
            else:
                config["limits"][key] = limit.show(parsed)
        elif key == "grace":
            config["grace"] = parse_duration(value, what="grace") if isinstance(value, str) else _fail(key, value)
        elif key == "decision":
            config["decision"] = value if value in ("allow", "ask") else _fail(key, value, '"allow" or "ask"')
        elif key == "session" and isinstance(value, dict):
            config["session"] = _session_config(value)
        else:
            known = ", ".join([*BY_FIELD, *_TOP_KEYS])
            raise ValueError(f"unknown key {key!r} (known: {known})")
    return config


def _session_config(raw: dict) -> dict:
    from ..common.limits import BY_FIELD
    from ..common.units import parse_duration

    session: dict = {}
    for key, value in raw.items():
        if key == "idle_timeout":
            ok = isinstance(value, str)
            session[key] = parse_duration(value, what="session.idle_timeout") if ok else _fail(key, value)
        elif key == "max_runs":
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            session[key] = value if ok else _fail("session.max_runs", value)
        elif key in ("mem", "pids", "cpus"):
            session[key] = _bounded(BY_FIELD[key], value)
        else:
            raise ValueError(f"unknown key session.{key!r} (known: {', '.join(_SESSION_KEYS)})")
    return session


def _bounded(limit, value):
    parsed = limit.coerce(value, limit.field)
    if isinstance(parsed, bool) or not isinstance(parsed, (int, float)) or not 0 < parsed <= limit.maximum:
        raise ValueError(f"{limit.field} = {value!r}: out of range")
    return parsed


def _fail(key: str, value, expected: str = 'a duration such as "2s"'):
    raise ValueError(f"{key} = {value!r}: expected {expected}")


# -- the settings snippet ---------------------------------------------------------------------------
def settings_snippet(agent: str) -> str:
    """What the user pastes: Claude Code's ``.claude/settings.json`` ``hooks``, or Codex's
    ``.codex/hooks.json`` (the same shape; Codex has no SessionEnd event)."""
    import shlex

    program = os.path.abspath(sys.argv[0]) if os.path.basename(sys.argv[0]) == "corralctl" else "corralctl"
    command = f"{shlex.quote(program)} hook {agent}"

    def handler(timeout: int) -> list[dict]:
        return [{"type": "command", "command": command, "timeout": timeout}]

    hooks: dict = {
        "SessionStart": [{"hooks": handler(30)}],
        "PreToolUse": [{"matcher": "Bash", "hooks": handler(30)}],
    }
    if agent == "claude-code":
        # SessionEnd's budget is 1.5 s unless a hook's timeout raises it (to at most 60 s):
        # ending a session stops its background runs, each with its grace.
        hooks["SessionEnd"] = [{"hooks": handler(60)}]
    return json.dumps({"hooks": hooks}, indent=2)
