"""The manager's newer APIs, used where it has them (issue 41).

corral asks the manager its ``Version`` once per connection
(``dbus.systemd1.ManagerAPIs``) and then takes, where the manager has them,
a scope made from the command's pidfd (``PIDFDs=``, 255+), the unit of an
escaped process asked by its pidfd (``GetUnitByPIDFD``, 253+) and the
unit's ``MemoryPeak`` (255+); systemd 252's paths (``PIDs=``,
``GetUnitByPID``, no manager peak) stay for older managers. The record's
``engine.manager_apis`` says which path a run took: the harness (systemd
252) must show the old ones, the Debian 13 guest of the VM lane (257) the
new ones. The version the tests expect is read from the manager by
``systemctl show -p Version``, not from corral.
"""

import os
import re
import shutil
import uuid

import pytest
from test_handoff import moved_out_script

from corral_systemd.dbus.connection import BusError
from corral_systemd.dbus.systemd1 import Manager, ManagerAPIs, parse_version
from corral_systemd.engines.systemd.properties import scope_properties
from modes import KERNEL_LIMITS, mode_flags, systemctl

MiB = 2**20


# -- the probe and the calls, against a recorded manager (no systemd needed) --


class _Reply:
    def __init__(self, *body):
        self.body = list(body)


class _Value:
    def __init__(self, value):
        self.value = value


class _Conn:
    """Answers like a manager of ``version`` and records every call."""

    unique_name = None

    def __init__(self, version, *, lacks=()):
        self.version, self.lacks, self.calls = version, set(lacks), []

    def call(self, destination, path, interface, member, signature="", body=(), *, fds=(), timeout=None):
        self.calls.append((member, list(body), list(fds)))
        if member in self.lacks:
            raise BusError(f"unknown method {member}", "org.freedesktop.DBus.Error.UnknownMethod")
        if member == "Get" and body[1] == "Version":
            if self.version is None:
                raise BusError("no reply", "org.freedesktop.DBus.Error.AccessDenied")
            return _Reply(_Value(self.version))
        if member == "Get" and body[1] == "Id":
            return _Reply(_Value("by-number.scope"))
        if member == "GetUnitByPID":
            return _Reply("/org/freedesktop/systemd1/unit/by_2dnumber_2escope")
        if member == "GetUnitByPIDFD":
            return _Reply("/org/freedesktop/systemd1/unit/by_2dpidfd_2escope", "by-pidfd.scope", b"")
        raise AssertionError(member)


@pytest.mark.parametrize(
    "text, major",
    [("252.39-1~deb12u1", 252), ("257.9-1~deb13u1", 257), ("v258-rc1", 258), ("255", 255), ("", None), ("x", None)],
)
def test_the_managers_version_is_its_major_number(text, major):
    assert parse_version(text) == major


@pytest.mark.parametrize(
    "version, scope, lookup, peak",
    [
        (None, False, False, False),
        (252, False, False, False),
        (253, False, True, False),
        (255, True, True, True),
        (257, True, True, True),
    ],
)
def test_each_newer_api_is_the_managers_from_its_version_on(version, scope, lookup, peak):
    apis = ManagerAPIs(version)
    assert (apis.scope_from_pidfds, apis.unit_by_pidfd, apis.memory_peak) == (scope, lookup, peak)


def test_the_version_is_asked_once_per_connection_and_unreadable_means_the_old_paths():
    conn = _Conn("257.9-1~deb13u1")
    manager = Manager(conn)
    assert manager.apis.version == 257 and manager.apis.version == 257
    assert [call[0] for call in conn.calls] == ["Get"]
    unreadable = Manager(_Conn(None))
    assert unreadable.apis == ManagerAPIs(None) and not unreadable.apis.scope_from_pidfds


def test_a_process_is_looked_up_by_its_pidfd_where_the_manager_has_it():
    conn = _Conn("257")
    assert Manager(conn).unit_of_process(4242, 7) == ("by-pidfd.scope", "pidfd")
    assert conn.calls[-1] == ("GetUnitByPIDFD", [0], [7])  # the descriptor travels, its index in the body


def test_by_number_on_252_without_a_pidfd_and_when_the_manager_lacks_the_method():
    old = _Conn("252.39-1~deb12u1")
    assert Manager(old).unit_of_process(4242, 7) == ("by-number.scope", "pid")
    assert "GetUnitByPIDFD" not in [call[0] for call in old.calls]
    assert Manager(_Conn("257")).unit_of_process(4242, None) == ("by-number.scope", "pid")
    # A manager whose version says it has the call, but answers that it does not: believed.
    lying = _Conn("257", lacks={"GetUnitByPIDFD"})
    manager = Manager(lying)
    assert manager.unit_of_process(4242, 7) == ("by-number.scope", "pid")
    assert manager.apis == ManagerAPIs(None)


def test_a_scope_names_its_process_by_pidfd_or_by_number():
    ((name, value),) = scope_properties(4242, by_pidfd=True)
    assert (name, value.signature, value.value) == ("PIDFDs", "ah", [0])
    ((name, value),) = scope_properties(4242)
    assert (name, value.signature, value.value) == ("PIDs", "au", [4242])


# -- a real manager: the harness's 252, the VM lane's 252 and 257 --------------


def _manager_version() -> int:
    version = parse_version(systemctl("show", "-p", "Version", "--value").stdout)
    assert version is not None, "the manager under test did not say its version"
    return version


def _expected(since: int) -> str:
    return "pidfd" if _manager_version() >= since else "pid"


@pytest.mark.systemd
def test_a_scope_is_made_from_the_commands_pidfd_where_the_manager_takes_one(corral):
    """The record says how the scope was made, and the kernel shows the
    command in the scope (the manager found the process either way)."""
    run = corral(mode_flags("scope") + ["--", "cat", "/proc/self/cgroup"])
    assert run.returncode == 0, run.stderr
    engine = run.record["engine"]
    apis = engine["manager_apis"]
    assert apis["version"] == _manager_version(), apis
    assert apis["scope_from"] == _expected(255), apis
    unified = [line for line in run.stdout.decode().splitlines() if line.startswith("0::")]
    assert unified and unified[0].rstrip().endswith("/" + engine["unit"]), (run.stdout, engine["unit"])
    assert run.survivors == []


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_the_managers_memory_peak_is_read_where_it_has_one(corral, unit_type):
    """Stopped at its wall while the unit lives, the run's unit is read in
    full: a manager with MemoryPeak (255+) gives its reading (at least what
    the command touched), 252's none."""
    if not KERNEL_LIMITS:
        pytest.skip("the manager's cgroups have no memory controller here (unified layout)")
    flags = mode_flags(unit_type)
    touch = "b = bytearray(48 << 20); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True); time.sleep(300)"
    python = shutil.which("python3") or "python3"
    run = corral(flags + ["--mem", "512M", "--wall", "4s", "--", python, "-c", f"import time; {touch}"])
    assert run.returncode == 124, run.stderr
    assert b"held" in run.stdout, run.stdout
    apis = run.record["engine"].get("manager_apis", {})
    if _expected(255) == "pidfd":
        assert apis.get("memory_peak", 0) >= 48 * MiB, run.record["engine"]
        assert run.record["engine"]["memory_peak"] >= apis["memory_peak"]
    else:
        assert "memory_peak" not in apis, apis
    assert run.survivors == []


@pytest.mark.systemd
def test_a_process_the_manager_moved_out_is_looked_up_by_its_pidfd_where_it_can_be(corral):
    """`systemd-run --scope` inside the run moves itself out: corral asks the
    manager which unit holds it, by its pidfd on 253+, by its number before."""
    flags = mode_flags("scope")
    if shutil.which("systemd-run") is None:
        pytest.skip("systemd-run")
    unit = f"apis-test-{uuid.uuid4().hex[:8]}"
    try:
        run = corral(flags + ["--", "sh", "-c", moved_out_script(unit, "1009")])
    finally:
        systemctl("stop", f"{unit}.scope")
    assert run.returncode == 120, run.stderr
    assert run.record["handed_off"] == [f"{unit}.scope"], run.record
    assert run.record["engine"]["manager_apis"]["unit_lookup"] == _expected(253), run.record["engine"]
    assert run.survivors == []


def test_this_file_is_named_where_the_lanes_run_it():
    """The VM lane's guests and tests/run's harness run this file (a rename would drop it silently)."""
    here = os.path.dirname(os.path.abspath(__file__))
    lane = open(os.path.join(here, "vm", "guest-lane")).read()
    assert re.search(r"tests/test_manager_apis\.py", lane)


@pytest.mark.systemd
@pytest.mark.parametrize("transport", ["private", "bus"])
def test_a_caller_in_another_user_namespace_authenticates(transport):
    """EXTERNAL with no identity: the manager (or the bus) takes the caller's
    uid from the socket. Named by the caller, a uid of its own user namespace
    (this one mapped to another inside) was refused: a Runner, or corral
    enforced, in a user namespace had no manager (Debian 13's user lane)."""
    import subprocess
    import sys

    from corral_systemd.dbus import discovery

    address = (
        f"unix:path={discovery.private_socket('user')}"
        if transport == "private"
        else discovery.session_bus_candidates()
    )
    if address is None or address == "unix:path=None":
        pytest.skip(f"no {transport} address to the user manager here")
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    inside = [f"--map-user={os.geteuid() + 1000}", f"--map-group={os.getegid() + 1000}"]
    probe = (
        "import sys; from corral_systemd.dbus.connection import Connection; "
        f"Connection({address!r}, bus={transport == 'bus'}); print('authenticated')"
    )
    proc = subprocess.run(
        ["unshare", "--user", *inside, sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0 and proc.stderr.startswith("unshare:"):
        pytest.skip(f"no user namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0 and proc.stdout.strip() == "authenticated", proc.stderr
