"""Parsing of the CLI's DURATION and SIZE values.

Both parsers raise ``ValueError`` with a message fit for a one-line error;
they never accept a value that would be silently misread (negative, NaN,
infinite, empty, or with an unknown suffix).
"""

# Read by hand, not with ``re``: most runs parse a duration, and ``re``
# costs every run's start more than the parse. The grammar: a DURATION is
# DIGITS[.DIGITS] or .DIGITS, then a unit; a SIZE is DIGITS, then an
# optional suffix (DIGITS: ASCII digits).
_DURATION_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_SCALE = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def finite(value: float) -> bool:
    """Neither infinite nor NaN (``math.isfinite``, whose module is a shared
    object to load at every run's start): only then is ``value - value`` zero."""
    return value - value == 0


def parse_duration(text: str, *, what: str = "duration") -> float:
    """``"1.5s"`` -> 1.5. A unit (ms, s, m, h) is required, but for zero (``"0"``)."""
    if text.strip() == "0":
        return 0.0
    number, unit = _split(text.strip(), ("ms", "s", "m", "h"))
    whole, dot, fraction = number.partition(".")
    well_formed = unit and (_digits(whole) or not whole and dot) and (not dot or _digits(fraction))
    if not well_formed:
        raise ValueError(f"invalid {what} {text!r}: expected a number with ms, s, m or h (e.g. 500ms, 2s)")
    value = float(number) * _DURATION_SCALE[unit]
    if not finite(value):
        raise ValueError(f"invalid {what} {text!r}: out of range")
    return value


def parse_size(text: str, *, what: str = "size") -> int:
    """``"64M"`` -> 67108864. Powers of 1024; a bare number is bytes."""
    number, suffix = _split(text.strip(), ("K", "M", "G"))
    if not _digits(number):
        raise ValueError(f"invalid {what} {text!r}: expected bytes with an optional K, M or G suffix (e.g. 64M)")
    value = int(number) * _SIZE_SCALE[suffix]
    if value <= 0:
        raise ValueError(f"invalid {what} {text!r}: must be greater than zero")
    return value


def _split(text: str, suffixes: tuple[str, ...]) -> tuple[str, str]:
    """``text`` as (what comes before the first of ``suffixes`` it ends with, that suffix), else (text, "")."""
    for suffix in suffixes:
        if text.endswith(suffix):
            return text[: -len(suffix)], suffix
    return text, ""


def _digits(text: str) -> bool:
    """One or more ASCII digits and nothing else."""
    return text.isascii() and text.isdigit()


def parse_count(text: str, *, what: str = "count") -> int:
    """A positive whole number."""
    if not text.strip().isdigit() or int(text) <= 0:
        raise ValueError(f"invalid {what} {text!r}: expected a whole number greater than zero")
    return int(text)


def parse_cpus(text: str, *, what: str = "cpus") -> float:
    """A positive number of CPUs, fractional ("0.5", "2"); a trailing "%" is
    hundredths of one CPU, as systemd's CPUQuota= takes it ("50%" is 0.5)."""
    body = text.strip()
    scale = 100.0 if body.endswith("%") else 1.0
    try:
        value = float(body[:-1] if scale != 1.0 else body) / scale
    except ValueError:
        value = float("nan")
    if not finite(value) or value <= 0:
        raise ValueError(f"invalid {what} {text!r}: expected a number of CPUs greater than zero (e.g. 0.5 or 50%)")
    return value


def format_duration(seconds: float) -> str:
    """Human form for the summary line: ``0.012s`` or ``1m03s``."""
    if seconds < 60:
        return f"{seconds:.3f}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:04.1f}s"
