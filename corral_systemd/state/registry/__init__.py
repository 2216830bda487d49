"""The run registry: every run written down before it starts, and an audit log.

Layout of the state directory (0700; every file 0600)::

    <dir>/<run id>.json    the run's entry, replaced atomically on each state change
    <dir>/<run id>.log     its events, JSON lines, append-only, hash-chained
    <dir>/credentials/     corral's private credential directories (only if <dir> is a tmpfs;
                           a systemd service's are the manager's, see credentials.py)
    <dir>/.pruned          its mtime: when registration last looked for stale entries

The directory is ``$CORRAL_STATE_DIR`` if set, else ``/run/corral`` for
root and ``$XDG_RUNTIME_DIR/corral`` for other users.

Entry states: ``active`` (registered, running), ``expired`` (its deadline
passed; written *before* the first signal is sent), ``finished`` (corral
has proven the run stopped, or could not and said so). A reader (``corralctl
status``) also treats an active entry whose deadline has passed, or whose
corral process is gone, as expired: a run is never more authorised than
its clock and its owner allow.

Every log line is ``{"seq", "event", "time", "monotonic", "run_id", "data",
"prev", "hash"}``: ``prev`` is the previous line's ``hash`` (64 zeros for
the first), ``hash`` the SHA-256 of the line's canonical JSON without
``hash``. The entry anchors the chain (``log.lines``, ``log.head``) each
time it is rewritten, so a truncated tail is caught too. Lines are written
with one ``write()`` each and fsynced before the call returns.

Retention: a finished entry and its log stay at least ``KEEP_FINISHED``
(24 h) after the run finished; then ``corralctl gc`` removes them
(``--keep-finished``), and so does registration of a new run, at most
``PRUNE_BATCH`` of them and only when ``.pruned`` is older than
``PRUNE_INTERVAL`` (``PRUNE_AGAIN`` while a backlog lasts; see ``maybe_prune``). Active and expired entries, and
entries whose owner still runs, are never removed.

The run's own uid can rewrite all of these files (see README "Security:
what corral trusts"), so a reader never acts on them alone: while the
owner lives, its token (``OwnerToken``, answered at an abstract address only it holds)
gives the run's state and deadline (``effective_state``, ``owner_verified``);
a fallback run's processes carry ``CORRAL_RUN_MARK`` (``carries_mark``);
each event line is also sent to the journal where journald runs
(``journal.py``).

Never recorded: environment values, credential contents. Arguments that
look like secrets (``Authorization:`` headers, ``--password=...``,
``TOKEN=...``, URL passwords) are redacted, best effort, in the command
line and in detached processes' argv.

The package, by concern: ``paths`` (where), ``identity`` (the owner and
the run's processes as the kernel shows them: start time, sealed token,
mark), ``files`` (entries and hash-chained logs), ``writer`` (a run's
registration and its events), ``retention``, ``audit`` (verifying a log),
``state`` (a run's state for an authorisation check). Everything but
``audit`` is re-exported here: ``registry.X`` is the interface; the
verifier is ``registry.audit.verify_log``, which no run loads.

On corral's hot path: it imports only os, json, time, a SHA-256
implementation and ``redact`` (the redaction the run record shares).
"""

# The package's interface: what the rest of corral and corralctl's callers use.
from ...common.redact import REDACTED, redact_argv  # noqa: F401  (shared with the run record)
from .files import (  # noqa: F401
    VERSION,
    ZERO_HASH,
    EventLog,
    _canonical,
    entry_path,
    list_entries,
    log_path,
    log_tail,
    output_path,
    read_entry,
    read_events,
    report_path,
)
from .identity import (  # noqa: F401
    MARK_ENV,
    TOKEN_PREFIX,
    OwnerToken,
    SealedToken,
    boot_id,
    carries_mark,
    looks_like_corral,
    mark_hash,
    new_mark,
    own_starttime,
    owner_alive,
    owner_token,
    owner_verified,
    proc_stat,
    process_mark,
    sealed_token,
    serving,
    token_holder,
)
from .paths import (  # noqa: F401
    STATE_FALLBACK,
    ensure_private_dir,
    ensure_state_dir,
    normalize_run_id,
    state_dir,
    unsafe_dir_reason,
    valid_run_id,
)
from .retention import (  # noqa: F401
    KEEP_FINISHED,
    PRUNE_AGAIN,
    PRUNE_BATCH,
    PRUNE_INTERVAL,
    PRUNE_STAMP,
    finished_time,
    maybe_prune,
    prunable,
    prune_finished,
    remove_run,
)
from .state import STATES, effective_state  # noqa: F401
from .writer import Registration, RegistryObserver, register  # noqa: F401
