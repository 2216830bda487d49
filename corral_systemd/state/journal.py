"""A copy of every audit event in the journal, where journald runs.

The registry's event log is a file the run's own uid can rewrite, hash
chain and anchor included: the chain proves only that the file is
internally consistent, not who wrote it. journald is outside that uid's
reach: a message, once received, cannot be changed or removed by it, and
journald adds trusted fields (``_PID``, ``_UID``, ``_CMDLINE``...) that the
sender cannot forge. So each event line also goes to the journal, by the
native protocol: one datagram of ``KEY=value`` lines (a value holding a
newline is sent as ``KEY\\n``, its length as 64-bit little-endian, the
bytes, ``\\n``) to ``/run/systemd/journal/socket``; a datagram too large
for the socket goes as a sealed memfd (SCM_RIGHTS), as sd_journal_sendv()
does. Fields::

    MESSAGE=corral run <id>: <event>    PRIORITY=6    SYSLOG_IDENTIFIER=corral
    CORRAL_RUN_ID  CORRAL_EVENT  CORRAL_SEQ  CORRAL_HASH  CORRAL_LINE (the log line, byte for byte)

``corralctl audit verify`` reads them back (``journalctl -o json
CORRAL_RUN_ID=<id>``), keeps those sent by the run's owner (the ``_PID``
of the run's first event, ``registered``, sent before the command
started) or by corralctl (``reclaimed``), and names every difference with
the file. Sending is best effort and never fails a run; it costs one
``sendto()`` per event, and nothing when there is no journal socket.

Imports only os and json until a journal socket exists (corral's hot path).
"""

import os

from ..common import jsoncodec

#: journald's native socket; tests point this at a socket of their own.
SOCKET = "/run/systemd/journal/socket"

_senders: dict[str, "Sender | None"] = {}


def encode(fields) -> bytes:
    """The native protocol's datagram for ``fields`` (a dict or (key, value) pairs)."""
    out = bytearray()
    for key, value in fields.items() if isinstance(fields, dict) else fields:
        k = key.encode()
        v = value if isinstance(value, bytes) else str(value).encode()
        if b"\n" in v:
            out += k + b"\n" + len(v).to_bytes(8, "little") + v + b"\n"
        else:
            out += k + b"=" + v + b"\n"
    return bytes(out)


def decode(data: bytes) -> dict[str, bytes]:
    """The fields of one native-protocol datagram (for tests and fakes)."""
    fields = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = nl + 1
        else:
            key = line
            size = int.from_bytes(data[nl + 1 : nl + 9], "little")
            value = data[nl + 9 : nl + 9 + size]
            i = nl + 9 + size + 1
        fields[key.decode()] = value
    return fields


class Sender:
    def __init__(self, path: str):
        import _socket  # not socket (its enums): every run of a machine with journald sends

        self.path = path
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)

    def send(self, fields) -> bool:
        data = encode(fields)
        try:
            self.sock.sendto(data, self.path)
            return True
        except OSError as exc:
            if exc.errno not in (90, 105):  # EMSGSIZE, ENOBUFS: too large for a datagram
                return False
        return self._send_memfd(data)

    def _send_memfd(self, data: bytes) -> bool:
        import fcntl

        from ..kernel.fdpass import rights

        fd = os.memfd_create("corral-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            fcntl.fcntl(
                fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            )
            self.sock.sendmsg([], rights([fd]), 0, self.path)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def sender() -> "Sender | None":
    """This process's sender to the journal, or None where no journald listens."""
    path = SOCKET
    found = _senders.get(path)
    if found is None and path not in _senders:
        found = Sender(path) if os.path.exists(path) else None
        _senders[path] = found
    return found


def _forget_in_child() -> None:
    """A forked child makes its own sender when it sends: its parent's socket is
    closed here, at once, before any descriptor number could be taken again."""
    for found in _senders.values():
        if found is not None:
            found.sock.close()
    _senders.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def send_event(line: dict, raw: bytes) -> bool:
    """Send one event line (``raw``: its bytes in the log, without the newline)."""
    out = sender()
    if out is None:
        return False
    return out.send(
        [
            ("MESSAGE", f"corral run {line['run_id']}: {line['event']}"),
            ("PRIORITY", "6"),
            ("SYSLOG_IDENTIFIER", "corral"),
            ("CORRAL_RUN_ID", line["run_id"]),
            ("CORRAL_EVENT", line["event"]),
            ("CORRAL_SEQ", str(line["seq"])),
            ("CORRAL_HASH", line["hash"]),
            ("CORRAL_LINE", raw),
        ]
    )


# -- reading back ------------------------------------------------------------------------
def available() -> bool:
    import shutil

    return os.path.exists(SOCKET) and shutil.which("journalctl") is not None


def read_records(run_id: str, timeout: float = 30.0) -> list[dict] | None:
    """The journal's records for ``run_id`` (journalctl -o json), or None if it cannot be read."""
    import subprocess

    try:
        proc = subprocess.run(
            ["journalctl", "--no-pager", "-q", "-o", "json", f"CORRAL_RUN_ID={run_id}"],
            capture_output=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    out = []
    for raw in proc.stdout.splitlines():
        try:
            out.append(jsoncodec.loads(raw))
        except ValueError:
            pass
    return out


def _text(value) -> str:
    """A journalctl -o json value: a string, or an array of bytes for binary data."""
    if isinstance(value, list):
        try:
            return bytes(value).decode(errors="replace")
        except (TypeError, ValueError):
            return ""
    return "" if value is None else str(value)


def trusted_lines(records: list[dict], run_id: str, uid: int) -> tuple[dict[int, str], str]:
    """{seq: line} from the records corral itself sent for ``run_id``, and who that was.

    journald's ``_PID``/``_UID``/``_CMDLINE`` are the sender's, as the kernel
    told journald: the run's owner is the sender of its first ``registered``
    event (sent before the command started); corralctl's ``reclaimed`` lines
    are taken from a process running corralctl. Anything else that names
    the run (the run's uid can send such datagrams too) is ignored.
    """
    mine = [r for r in records if _text(r.get("_UID")) == str(uid) and _text(r.get("CORRAL_RUN_ID")) == run_id]
    owner = next(
        (
            _text(r.get("_PID"))
            for r in mine
            if _text(r.get("CORRAL_EVENT")) == "registered" and _text(r.get("CORRAL_SEQ")) == "0"
        ),
        None,
    )
    lines: dict[int, str] = {}
    for r in mine:
        event, pid, cmd = _text(r.get("CORRAL_EVENT")), _text(r.get("_PID")), _text(r.get("_CMDLINE"))
        if pid == owner or (event == "reclaimed" and ("corral_systemd.ctl" in cmd or "corralctl" in cmd)):
            try:
                seq = int(_text(r.get("CORRAL_SEQ")))
            except ValueError:
                continue
            lines.setdefault(seq, _text(r.get("CORRAL_LINE")))
    return lines, (f"pid {owner}" if owner else "")


def compare(file_lines: list[bytes], journal_lines: dict[int, str]) -> list[tuple[int, str]]:
    """Every difference between the log file and the journal's copy: [(line number, what)]."""
    diffs = []
    for number, raw in enumerate(file_lines, 1):
        text = raw.decode(errors="replace")
        copy = journal_lines.get(number - 1)
        if copy is None:
            diffs.append((number, "not in the journal (written by someone else, or the journal dropped it)"))
        elif copy != text:
            diffs.append((number, f"differs from the journal, which has: {_summary(copy)}"))
    for seq in sorted(s for s in journal_lines if s >= len(file_lines)):
        diffs.append((seq + 1, f"missing from the file; the journal has: {_summary(journal_lines[seq])}"))
    return diffs


def _summary(line: str) -> str:
    try:
        obj = jsoncodec.loads(line)
        return f"{obj.get('event')} {jsoncodec.dumps(obj.get('data'), sort_keys=True)}"[:300]
    except (ValueError, AttributeError):
        return line[:300]
