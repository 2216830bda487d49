"""-p/--property NAME=VALUE: passed to the unit, or refused with 125 and a reason."""

import shlex

import pytest

from corral_systemd.common.errors import UsageError
from corral_systemd.common.unitprops import parse_property
from corral_systemd.core.spec import RunSpec
from modes import mode_flags, scope_flag


@pytest.mark.parametrize(
    "text,unit_type,expected",
    [
        ("IOWeight=200", "scope", ("IOWeight", "t", 200)),
        ("CPUWeight=50", "service", ("CPUWeight", "t", 50)),
        ("MemoryHigh=64M", "scope", ("MemoryHigh", "t", 64 << 20)),
        ("MemoryHigh=infinity", "scope", ("MemoryHigh", "t", 2**64 - 1)),
        ("IOReadBandwidthMax=/dev/sda 10M", "scope", ("IOReadBandwidthMax", "a(st)", [("/dev/sda", 10 << 20)])),
        ("Nice=5", "service", ("Nice", "i", 5)),
        ("ProtectSystem=strict", "service", ("ProtectSystem", "s", "strict")),
        ("ReadOnlyPaths=/etc -/opt", "service", ("ReadOnlyPaths", "as", ["/etc", "-/opt"])),
    ],
)
def test_known_properties_parse_to_their_dbus_type(text, unit_type, expected):
    assert parse_property(text, unit_type) == expected


@pytest.mark.parametrize(
    "text,unit_type,says",
    [
        ("MemoryMax=1G", "scope", "--mem"),
        ("TasksMax=10", "service", "--pids"),
        ("RuntimeMaxSec=5", "scope", "--wall"),
        ("CPUQuota=50%", "scope", "--cpus"),
        ("KillMode=none", "scope", "stop"),
        ("Delegate=yes", "service", "stop"),
        ("BindsTo=foo.service", "scope", "tether"),
        ("Nice=5", "scope", "--unit-type service"),
        ("Frobnicate=1", "scope", "not one corral passes"),
        ("CPUWeight=0", "scope", "from 1 to 10000"),
        ("Nice=99", "service", "from -20 to 19"),
        ("IOWeight", "scope", "NAME=VALUE"),
    ],
)
def test_refused_properties_say_why(text, unit_type, says):
    with pytest.raises(UsageError, match=None) as info:
        parse_property(text, unit_type)
    assert says in str(info.value)


def test_properties_need_a_systemd_unit():
    with pytest.raises(UsageError, match="systemd unit"):
        RunSpec(argv=["true"], cgroup_mode="fallback", properties=["IOWeight=100"])
    with pytest.raises(UsageError, match="systemd unit"):
        RunSpec(argv=["true"], cgroup_parent="/sys/fs/cgroup/x", properties=["IOWeight=100"])


@pytest.mark.parametrize("args", [["-p", "MemoryMax=1G"], ["--property", "KillMode=none"], ["-p", "Nope=1"]])
def test_cli_refusal_is_125_one_line_nothing_runs(corral, args, tmp_path):
    flag = tmp_path / "ran"
    run = corral([*args, "--", "touch", str(flag)], record=False)
    assert run.returncode == 125
    assert len(run.stderr.decode().strip().splitlines()) == 1, run.stderr
    assert not flag.exists()


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_a_property_reaches_the_unit(corral, unit_type):
    """The command asks its own unit's manager for the property it was given."""
    ask = (
        'u=$(sed -n "s/^0::.*\\///p" /proc/self/cgroup); [ -n "$u" ] || '
        'u=$(sed -n "s/^[0-9]*:name=systemd:.*\\///p" /proc/self/cgroup); '
        f'systemctl {" ".join(scope_flag())} show -p CPUWeight --value "$u"'
    )
    run = corral(mode_flags(unit_type) + ["-p", "CPUWeight=77", "--", "sh", "-c", ask])
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().strip() == "77", (run.stdout, run.stderr)
    assert run.record["engine"]["properties"] == ["CPUWeight=77"]


@pytest.mark.systemd
def test_a_service_gets_its_process_settings(corral):
    run = corral(mode_flags("service") + ["-p", "Nice=7", "--", "sh", "-c", "cut -d' ' -f19 /proc/self/stat"])
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().strip() == "7", shlex.quote(run.stderr.decode())
