"""Which corral modes this machine can test, and the CLI flags for each."""

import os
import shutil

import pytest


def user_manager_reachable() -> bool:
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS") and not os.path.exists(
        os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "bus")
    ):
        return False
    busctl = shutil.which("busctl")
    if busctl is None:
        return False
    import subprocess

    probe = subprocess.run(
        [busctl, "--user", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
         "org.freedesktop.DBus.Peer", "Ping"],
        capture_output=True, timeout=10,
    )
    return probe.returncode == 0


def unit_property(unit: str, name: str) -> str:
    """``systemctl --user show -p NAME --value UNIT`` ("" when the manager has no such unit)."""
    import subprocess

    return subprocess.run(["systemctl", "--user", "show", "-p", name, "--value", unit],
                          capture_output=True, text=True).stdout.strip()


def delegated_cgroup_parent() -> str | None:
    """A writable cgroup v2 directory for --cgroup-parent tests (harness-provided)."""
    path = os.environ.get("CORRAL_TEST_CGROUP_PARENT")
    return path if path and os.path.isdir(path) else None


MODE_FLAGS = {
    "fallback": ["--cgroup-mode", "fallback"],
    "scope": ["--cgroup-mode", "enforced", "--unit-type", "scope"],
    "service": ["--cgroup-mode", "enforced", "--unit-type", "service"],
}


def mode_flags(mode: str) -> list[str]:
    if mode == "cgroup-parent":
        parent = delegated_cgroup_parent()
        if parent is None:
            _unavailable("no delegated cgroup v2 directory (CORRAL_TEST_CGROUP_PARENT)")
        return ["--cgroup-parent", parent]
    if mode in ("scope", "service") and not user_manager_reachable():
        _unavailable("no systemd user manager reachable")
    return MODE_FLAGS[mode]


def _unavailable(why: str):
    # Inside the harness the systemd tests must run: a skip there would hide
    # a broken setup, so it fails instead.
    if os.environ.get("CORRAL_REQUIRE_SYSTEMD") == "1":
        pytest.fail(f"required test environment missing: {why}")
    pytest.skip(why)


def all_modes() -> list:
    """Modes as pytest params, marked so a run can select them (-m)."""
    return [
        "fallback",
        pytest.param("scope", marks=pytest.mark.systemd),
        pytest.param("service", marks=pytest.mark.systemd),
        pytest.param("cgroup-parent", marks=pytest.mark.cgroupv2),
    ]
