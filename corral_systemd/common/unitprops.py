"""``-p/--property NAME=VALUE``: unit properties passed through, as ``systemd-run -p``.

Only properties corral knows how to send are taken, each with its D-Bus
type and a parser for its value; what a property would undo of corral's
guarantees is refused and names the option that does it; what the unit
type cannot take (a scope has no process of the manager's making, so only
resource control and kill settings apply) is refused too. Every refusal is
a UsageError (exit 125, one line) before anything starts.

Light: the CLI imports it only when ``-p`` is given; values become D-Bus
Variants in the systemd engine (``properties.user_properties``).
"""

import re

from .errors import UsageError

#: Properties corral sets itself, and what to use instead.
PROTECTED = {
    "MemoryMax": "--mem",
    "MemorySwapMax": "--mem",
    "TasksMax": "--pids",
    "CPUQuota": "--cpus",
    "CPUQuotaPerSecUSec": "--cpus",
    "RuntimeMaxSec": "--wall",
    "RuntimeMaxUSec": "--wall",
    "TimeoutStopSec": "--grace",
    "TimeoutStopUSec": "--grace",
    "Slice": "--slice",
    "Environment": "--env-* or the command's environment",
    "EnvironmentFile": "--env-* or the command's environment",
    "WorkingDirectory": "the working directory corral is started in",
    "LoadCredential": "--credential",
    "SetCredential": "--credential",
}
#: Properties that would break what corral guarantees (the stop, the proof, the tether).
BREAKS_GUARANTEES = {
    "KillMode",
    "KillSignal",
    "SendSIGKILL",
    "SendSIGHUP",
    "Delegate",
    "BindsTo",
    "After",
    "Before",
    "Requires",
    "Wants",
    "PartOf",
    "CollectMode",
    "AddRef",
    "PIDs",
    "Type",
    "ExecStart",
    "ExecStartEx",
    "ExecStartPre",
    "ExecStop",
    "ExecStopPost",
    "RemainAfterExit",
    "Restart",
    "RuntimeRandomizedExtraSec",
    "TimeoutStartSec",
    "User",
    "Group",
    "DynamicUser",
    "StandardInput",
    "StandardOutput",
    "StandardError",
}

_SIZE = re.compile(r"(\d+)([KMGT]?)")
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
UINT64_MAX = 2**64 - 1


def _uint(low: int, high: int):
    def parse(text: str):
        if not text.isdigit() or not low <= int(text) <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return int(text)

    return parse


def _int(low: int, high: int):
    def parse(text: str):
        if not re.fullmatch(r"-?\d+", text) or not low <= int(text) <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return int(text)

    return parse


def _bytes_or_infinity(text: str) -> int:
    if text == "infinity":
        return UINT64_MAX
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError("expected bytes (K, M, G, T: powers of 1024) or 'infinity'")
    value = int(m.group(1)) * _SCALE[m.group(2)]
    if value >= UINT64_MAX:
        raise ValueError("out of range")
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("1", "yes", "true", "on"):
        return True
    if text.lower() in ("0", "no", "false", "off"):
        return False
    raise ValueError("expected yes or no")


def _device_bandwidth(text: str) -> list:
    path, _, amount = text.partition(" ")
    if not path.startswith("/") or not amount:
        raise ValueError("expected 'PATH BYTES' (e.g. '/dev/sda 10M')")
    return [(path, _bytes_or_infinity(amount.strip()))]


def _device_iops(text: str) -> list:
    path, _, amount = text.partition(" ")
    if not path.startswith("/") or not amount.strip().isdigit():
        raise ValueError("expected 'PATH IOPS' (e.g. '/dev/sda 1000')")
    return [(path, int(amount))]


def _device_weight(text: str) -> list:
    path, _, weight = text.partition(" ")
    if not path.startswith("/"):
        raise ValueError("expected 'PATH WEIGHT' (e.g. '/dev/sda 200')")
    return [(path, _uint(1, 10000)(weight.strip()))]


def _paths(text: str) -> list:
    paths = text.split()
    if not paths or not all(p.lstrip("-+").startswith("/") for p in paths):
        raise ValueError("expected absolute paths, separated by spaces")
    return paths


def _choice(*choices: str):
    def parse(text: str):
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


#: name: (D-Bus signature, parser, "resource" (any unit) or "exec" (services only)).
SUPPORTED = {
    # resource control: scopes and services
    "CPUWeight": ("t", _uint(1, 10000), "resource"),
    "StartupCPUWeight": ("t", _uint(1, 10000), "resource"),
    "IOWeight": ("t", _uint(1, 10000), "resource"),
    "StartupIOWeight": ("t", _uint(1, 10000), "resource"),
    "IODeviceWeight": ("a(st)", _device_weight, "resource"),
    "IOReadBandwidthMax": ("a(st)", _device_bandwidth, "resource"),
    "IOWriteBandwidthMax": ("a(st)", _device_bandwidth, "resource"),
    "IOReadIOPSMax": ("a(st)", _device_iops, "resource"),
    "IOWriteIOPSMax": ("a(st)", _device_iops, "resource"),
    "MemoryMin": ("t", _bytes_or_infinity, "resource"),
    "MemoryLow": ("t", _bytes_or_infinity, "resource"),
    "MemoryHigh": ("t", _bytes_or_infinity, "resource"),
    "IOAccounting": ("b", _bool, "resource"),
    "CPUAccounting": ("b", _bool, "resource"),
    "DevicePolicy": ("s", _choice("auto", "closed", "strict"), "resource"),
    "ManagedOOMMemoryPressure": ("s", _choice("auto", "kill"), "resource"),
    # the execution context: services only
    "Nice": ("i", _int(-20, 19), "exec"),
    "OOMScoreAdjust": ("i", _int(-1000, 1000), "exec"),
    "LimitNOFILE": ("t", _uint(0, UINT64_MAX - 1), "exec"),
    "LimitCORE": ("t", _bytes_or_infinity, "exec"),
    "LimitSTACK": ("t", _bytes_or_infinity, "exec"),
    "NoNewPrivileges": ("b", _bool, "exec"),
    "PrivateTmp": ("b", _bool, "exec"),
    "PrivateDevices": ("b", _bool, "exec"),
    "ProtectSystem": ("s", _choice("no", "yes", "full", "strict"), "exec"),
    "ProtectHome": ("s", _choice("no", "yes", "read-only", "tmpfs"), "exec"),
    "ReadOnlyPaths": ("as", _paths, "exec"),
    "ReadWritePaths": ("as", _paths, "exec"),
    "InaccessiblePaths": ("as", _paths, "exec"),
}


def parse_property(text: str, unit_type: str) -> tuple[str, str, object]:
    """``NAME=VALUE`` as (name, D-Bus signature, value), or UsageError."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise UsageError(f"invalid --property {text!r}: expected NAME=VALUE")
    if name in PROTECTED:
        raise UsageError(f"--property {name}= is corral's own: use {PROTECTED[name]}")
    if name in BREAKS_GUARANTEES:
        raise UsageError(f"--property {name}= is refused: corral's stop, proof or tether depend on it")
    if name not in SUPPORTED:
        raise UsageError(f"--property {name}= is not one corral passes (it passes: {', '.join(sorted(SUPPORTED))})")
    signature, parse, scope_ok = SUPPORTED[name]
    if scope_ok == "exec" and unit_type != "service":
        raise UsageError(f"--property {name}= applies to a service's process only: use --unit-type service")
    try:
        return name, signature, parse(value)
    except ValueError as exc:
        raise UsageError(f"invalid --property {name}={value!r}: {exc}") from None
