"""Which corral modes this machine can test, and the CLI flags for each."""

import os
import shutil

import pytest

#: Which manager the systemd tests run against: "user" (the session's, or the
#: harness's) or "system" (root on a machine booted with systemd: the VM lane).
#: corral's own choice is "auto" in both cases; the tests only need to know
#: which manager to ask about units.
MANAGER = os.environ.get("CORRAL_TEST_MANAGER", "user")
#: The cgroup layout the manager runs in: "hybrid" or "unified" (the harness's,
#: controllers on v1 or none at all) or "v2" (a booted machine: pure cgroup v2,
#: cpu/memory/pids delegated to the manager).
LAYOUT = os.environ.get("CORRAL_TEST_LAYOUT") or os.environ.get("CORRAL_HARNESS_LAYOUT")
#: Does the manager's cgroup tree have the memory and pids controllers?
KERNEL_LIMITS = LAYOUT in ("hybrid", "v2")


def scope_flag() -> list[str]:
    """``--user`` for the user manager, nothing for the system manager."""
    return ["--user"] if MANAGER == "user" else []


def manager_runtime_dir() -> str:
    """Where the manager keeps its runtime state (credentials/, systemd/transient/)."""
    return "/run" if MANAGER == "system" else os.environ["XDG_RUNTIME_DIR"]


def manager_reachable() -> bool:
    """Does the manager the tests target answer on its bus?"""
    if (
        MANAGER == "user"
        and not os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        and not os.path.exists(os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "bus"))
    ):
        return False
    busctl = shutil.which("busctl")
    if busctl is None:
        return False
    import subprocess

    probe = subprocess.run(
        [
            busctl,
            *scope_flag(),
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.DBus.Peer",
            "Ping",
        ],
        capture_output=True,
        timeout=10,
    )
    return probe.returncode == 0


#: The name the tests have always used; it means "the manager under test".
user_manager_reachable = manager_reachable


def systemctl(*args: str, check: bool = False, timeout: float = 60):
    """``systemctl [--user] ARGS`` against the manager under test."""
    import subprocess

    return subprocess.run(
        ["systemctl", *scope_flag(), *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def unit_property(unit: str, name: str) -> str:
    """``systemctl [--user] show -p NAME --value UNIT`` ("" when the manager has no such unit)."""
    return systemctl("show", "-p", name, "--value", unit).stdout.strip()


def needs_user_manager(why: str) -> None:
    """Skip a test that is about the user manager's bus when the system manager is under test."""
    if MANAGER != "user":
        pytest.skip(f"user manager only: {why}")


def delegated_cgroup_parent() -> str | None:
    """A writable cgroup v2 directory for --cgroup-parent tests (harness-provided)."""
    path = os.environ.get("CORRAL_TEST_CGROUP_PARENT")
    return path if path and os.path.isdir(path) else None


#: A user namespace of its own (root mapped to root, so the cgroup files stay its own)
#: whose ``user.max_pid_namespaces`` is 0: no pid namespace below it (ENOSPC, as where
#: user namespaces are forbidden). Then the command, and its argv.
NO_PID_NAMESPACES = ["unshare", "--user", "--map-root-user", "sh", "-c"]
NO_PID_NAMESPACES_SETUP = "echo 0 >/proc/sys/user/max_pid_namespaces"


def pid_namespaces_to_refuse() -> bool:
    """Must a test refuse corral its pid namespaces (``NO_PID_NAMESPACES``) to see a
    cgroup tier run without one? False where none can be had anyway
    (``pidns_unavailable``: a container's); the test is skipped where the limit
    cannot be set (a read-only /proc/sys). Asked once."""
    if pidns_unavailable() is not None:
        return False
    if not _REFUSAL_PROBE:
        import subprocess

        probe = subprocess.run(
            [*NO_PID_NAMESPACES, f"{NO_PID_NAMESPACES_SETUP} && exec true"], capture_output=True, text=True, timeout=30
        )
        _REFUSAL_PROBE.append(None if probe.returncode == 0 else probe.stderr.strip() or f"exit {probe.returncode}")
    if _REFUSAL_PROBE[0] is not None:
        pytest.skip(f"no pid namespace can be refused to corral here: {_REFUSAL_PROBE[0]}")
    return True


_REFUSAL_PROBE: list[str | None] = []


def without_pid_namespaces(corral: list[str]) -> list[str]:
    """``corral``'s argv run where no pid namespace can be had (``pid_namespaces_to_refuse``):
    the cgroup tier then runs the command in corral's pid namespace."""
    if not pid_namespaces_to_refuse():
        return list(corral)
    return [*NO_PID_NAMESPACES, f'{NO_PID_NAMESPACES_SETUP} && exec "$@"', "sh", *corral]


#: The pid namespace tier, forced.
PIDNS_FLAGS = ["--guarantee", "pidns"]

MODE_FLAGS = {
    "auto": ["--cgroup-mode", "auto"],
    "fallback": ["--cgroup-mode", "fallback"],
    "pidns": PIDNS_FLAGS,
    "scope": ["--cgroup-mode", "enforced", "--unit-type", "scope"],
    "service": ["--cgroup-mode", "enforced", "--unit-type", "service"],
}


def mode_flags(mode: str) -> list[str]:
    if mode == "cgroup-tier":
        import delegated

        if (why := delegated.unavailable()) is not None:
            pytest.skip(f"the cgroup tier's test subtree: {why}")
        return ["--guarantee", "cgroup"]  # forced: not found is 125, never a weaker tier
    if mode == "cgroup-parent":
        parent = delegated_cgroup_parent()
        if parent is None:
            _unavailable("no delegated cgroup v2 directory (CORRAL_TEST_CGROUP_PARENT)")
        return ["--cgroup-parent", parent]
    if mode == "pidns" and (why := pidns_unavailable()) is not None:
        pytest.skip(f"no pid namespace here: {why}")
    if mode in ("scope", "service") and not manager_reachable():
        _unavailable(f"no systemd {MANAGER} manager reachable")
    return MODE_FLAGS[mode]


def mode_program(mode: str, corral: list[str]) -> list[str] | None:
    """The argv that is corral for ``mode`` (None: ``corral`` itself): the
    cgroup tier's runs start inside a delegated subtree of their own
    (``tests/delegated.py``: what a container with a writable cgroup gives)."""
    if mode != "cgroup-tier":
        return None
    import delegated

    return delegated.program(corral)


def _unavailable(why: str):
    # Inside the harness the systemd tests must run: a skip there would hide
    # a broken setup, so it fails instead.
    if os.environ.get("CORRAL_REQUIRE_SYSTEMD") == "1":
        pytest.fail(f"required test environment missing: {why}")
    pytest.skip(why)


#: A container lane cell (tests/containers/run-lane) names the modes its fault
#: matrix runs in: "auto" (whatever tier the container gives), "fallback",
#: "cgroup-parent". Unset: every mode but "auto".
CONTAINER_MODES = os.environ.get("CORRAL_TEST_CONTAINER_MODES")


def all_modes() -> list:
    """Modes as pytest params, marked so a run can select them (-m)."""
    modes = [
        "fallback",
        pytest.param("pidns", marks=pytest.mark.pidns),
        pytest.param("scope", marks=pytest.mark.systemd),
        pytest.param("service", marks=pytest.mark.systemd),
        pytest.param("cgroup-parent", marks=pytest.mark.cgroupv2),
    ]
    if CONTAINER_MODES is None:
        return modes
    wanted = CONTAINER_MODES.split()
    return [m for m in ["auto", *modes] if (m if isinstance(m, str) else m.values[0]) in wanted]


#: Modes whose runs need their own argv for corral (``mode_program``): the
#: cgroup tier's, in a subtree of their own. Not in ``all_modes``: a test
#: parametrized with them passes ``program=mode_program(mode, CORRAL)``.
PROGRAM_MODES = [m for m in ["cgroup-tier"] if CONTAINER_MODES is None or m in CONTAINER_MODES.split()]


_PIDNS_PROBE: list = []


def pidns_unavailable() -> str | None:
    """Why this user can have no pid namespace with a /proc of its own here
    (None: it can), as ``unshare`` finds it; asked once."""
    if not _PIDNS_PROBE:
        import subprocess

        user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
        try:
            probe = subprocess.run(
                ["unshare", *user, "--pid", "--fork", "--mount-proc", "true"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            _PIDNS_PROBE.append(None if probe.returncode == 0 else probe.stderr.strip() or f"exit {probe.returncode}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            _PIDNS_PROBE.append(str(exc))
    return _PIDNS_PROBE[0]
