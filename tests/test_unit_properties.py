"""The transient unit's properties, built without a manager (properties.py).

Every valid RunSpec gives a StartTransientUnit call that D-Bus can marshal
(each value fits its signature: a 100-year wall in microseconds, an 8 EiB
memory limit), and the properties say what corral promises: the backstop
past the wall, no swap beside a memory limit, the tether binding, no secret
in the description or the environment.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral_systemd.common.limits import MAX_DURATION, MAX_PIDS, MAX_SIZE
from corral_systemd.core.spec import RunSpec
from corral_systemd.dbus._dbus_fast import Message
from corral_systemd.engines.systemd import properties as P

TETHER = "corral-0123456789ab-tether.scope"


def _marshal(props, aux=()):
    """StartTransientUnit's body as it goes on the wire (raises if a value does not fit)."""
    msg = Message(
        destination="org.freedesktop.systemd1",
        path="/org/freedesktop/systemd1",
        interface="org.freedesktop.systemd1.Manager",
        member="StartTransientUnit",
        signature="ssa(sv)a(sa(sv))",
        body=["corral-0123456789ab.scope", "fail", props, list(aux)],
    )
    return bytes(msg._marshall(False))


def _as_dict(props):
    return {name: variant.value for name, variant in props}


durations = st.floats(min_value=0, max_value=MAX_DURATION, allow_nan=False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wall=st.none() | durations,
    grace=durations,
    verify=durations,
    mem=st.none() | st.integers(1, MAX_SIZE),
    pids=st.none() | st.integers(1, MAX_PIDS),
    add_ref=st.booleans(),
    keep_failed=st.booleans(),
)
def test_every_valid_spec_marshals(wall, grace, verify, mem, pids, add_ref, keep_failed):
    spec = RunSpec(argv=["true"], wall=wall, grace=grace, verify_timeout=verify, mem=mem, pids=pids)
    props = P.unit_properties(spec, spec.argv, tether_unit=TETHER, add_ref=add_ref, keep_failed=keep_failed)
    aux = [(TETHER, P.tether_properties(1234, spec.slice, "corral-0123456789ab.scope"))]
    assert _marshal(props + P.scope_properties(4321), aux)
    values = _as_dict(props)
    if wall is None:
        assert "RuntimeMaxUSec" not in values
    else:
        assert values["RuntimeMaxUSec"] == int((wall + grace + verify) * 1_000_000)
    # 0 µs means "no timeout" to the manager: the least corral asks for is 1 µs.
    assert values["TimeoutStopUSec"] == max(1, int(grace * 1_000_000))
    assert values.get("KillSignal") == (9 if grace == 0 else None)  # --grace 0: the manager kills at once too
    assert values.get("MemoryMax") == mem and values.get("MemorySwapMax") == (0 if mem else None)
    assert values.get("TasksMax") == pids
    assert ("AddRef" in values) == add_ref
    assert values["CollectMode"] == ("inactive" if keep_failed else "inactive-or-failed")
    assert values["BindsTo"] == values["After"] == [TETHER]


def test_description_is_redacted_and_bounded():
    argv = ["curl", "-H", "Authorization: Bearer s3cr3t-token", "--password=hunter2", "x" * 500]
    spec = RunSpec(argv=argv)
    description = _as_dict(P.unit_properties(spec, argv, tether_unit=TETHER, add_ref=False, keep_failed=False))[
        "Description"
    ]
    assert "s3cr3t-token" not in description and "hunter2" not in description
    assert len(description) <= len("corral: ") + P.DESCRIPTION_MAX


def test_service_environment_is_a_file_path_not_values():
    environment = {"API_KEY": "v3ry-s3cret", "PATH": "/usr/bin"}
    props = P.environment_properties(environment, "/run/user/1000/corral-env/x.env")
    assert _as_dict(props) == {"EnvironmentFiles": [("/run/user/1000/corral-env/x.env", False)]}
    assert b"v3ry-s3cret" not in _marshal(props)
    # Only when no private file could be made do the values go in (the engine warns).
    assert "API_KEY=v3ry-s3cret" in _as_dict(P.environment_properties(environment, None))["Environment"]


def test_service_command_and_credentials_marshal():
    props = [
        *P.service_properties(["printf", "%s", "$HOME"], "/usr/bin/printf", "/tmp", ["HOME", "LOGNAME"]),
        *P.stdio_properties(),
        *P.credential_properties([("token", "/etc/hostname")], "exit 0"),
    ]
    values = _as_dict(props)
    assert values["ExecStartEx"] == [("/usr/bin/printf", ["printf", "%s", "$HOME"], ["no-env-expand"])]
    assert values["UnsetEnvironment"] == ["HOME", "LOGNAME"]
    assert values["LoadCredential"] == [("token", "/etc/hostname")]
    assert values["ExecStartPre"][0][1][-1] == "token"
    assert P.credential_properties([], "exit 0") == []
    with pytest.raises(ValueError):
        _marshal([*props, P.prop("TasksMax", "t", -1)])  # a value that does not fit is refused here, not by systemd


def test_a_system_managers_service_gets_a_mount_namespace_of_its_own():
    """Issue 14: PrivateMounts= is what makes systemd hide other units'
    /run/credentials from the command (the VM lane's system step shows it)."""
    props = P.isolation_properties("system")
    assert [(name, value.value) for name, value in props] == [("PrivateMounts", True)]
    _marshal(props)
    assert P.isolation_properties("user") == []
