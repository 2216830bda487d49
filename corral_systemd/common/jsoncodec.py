"""JSON through the interpreter's C codec, without importing ``json``: start-up is product speed.

``json``'s modules compile regular expressions when imported (so ``re`` and
``enum`` load with them): about 12 ms here, a fifth of an in-process run's
start. This module speaks through ``_json``, the C scanner and encoder that
``json`` itself uses, for what a run writes and reads on its way: the
registry's entries and event logs, the record, the sessions' files, the
Varlink wire. Faces that load heavier modules anyway (the MCP server, the
service's requests, corralctl's reports) may use ``json``.

Guarantees:

- ``dumps`` gives ``json.dumps``'s text for the same arguments, byte for
  byte (``indent`` included; tests/test_jsoncodec.py compares them), so a
  hash taken over it (the registry's event chain) is the same either way;
  a value JSON cannot hold is a ``TypeError``, NaN and infinities a
  ``ValueError`` with ``allow_nan=False``, a circular structure a
  ``ValueError``.
- ``loads`` reads what ``json.loads`` reads from text corral writes (UTF-8,
  no byte order mark); malformed text raises ``json.JSONDecodeError`` (a
  ``ValueError``), for which ``json`` is imported then; with
  ``allow_nan=False`` the literals ``NaN``, ``Infinity`` and ``-Infinity``
  are a ``ValueError`` too (a number too large for a float is infinite,
  as json reads it).
- Where there is no ``_json`` (not CPython) both are ``json``'s.
"""

try:
    import _json
except ImportError:  # pragma: no cover  (not CPython)
    _json = None  # type: ignore[assignment]

TYPE_CHECKING = False  # typing is not imported at run time: start-up is product speed
if TYPE_CHECKING:
    from typing import Any

_INFINITY = float("inf")
_CONSTANTS = {"NaN": float("nan"), "Infinity": _INFINITY, "-Infinity": -_INFINITY}
_WHITESPACE = " \t\n\r"


def dumps(
    obj: object,
    *,
    sort_keys: bool = False,
    separators: "tuple[str, str] | None" = None,
    indent: "int | None" = None,
    ensure_ascii: bool = True,
    allow_nan: bool = True,
) -> str:
    """``json.dumps(obj, ...)`` with these arguments (their defaults are json's)."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(
            obj,
            sort_keys=sort_keys,
            separators=separators,
            indent=indent,
            ensure_ascii=ensure_ascii,
            allow_nan=allow_nan,
        )
    encode_string = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    if indent is None:
        item, key = separators or (", ", ": ")
        if isinstance(obj, str):
            return encode_string(obj)
        # A new encoder each time: its markers (json's circular check) are left
        # behind by an encoding that raised.
        encoder = _json.make_encoder({}, _unserializable, encode_string, None, key, item, sort_keys, False, allow_nan)
        return "".join(encoder(obj, 0))
    item, key = separators or (",", ": ")
    out: list[str] = []
    _indented(obj, _Layout(encode_string, " " * indent, item, key, sort_keys, allow_nan), 0, out)
    return "".join(out)


class _Layout:
    """How ``_indented`` writes (json.encoder's ``_make_iterencode`` arguments)."""

    __slots__ = ("encode_string", "indent", "item", "key", "sort_keys", "allow_nan", "open")

    def __init__(self, encode_string, indent: str, item: str, key: str, sort_keys: bool, allow_nan: bool):
        self.encode_string, self.indent, self.item, self.key = encode_string, indent, item, key
        self.sort_keys, self.allow_nan = sort_keys, allow_nan
        self.open: set[int] = set()  # the containers being written (json's circular check)


def _indented(value: object, layout: _Layout, level: int, out: list[str]) -> None:
    """``value`` as json's pure-Python encoder writes it with an indent (the
    C encoder of Python 3.11 takes no indent)."""
    if isinstance(value, (list, tuple, dict)):
        if id(value) in layout.open:
            raise ValueError("Circular reference detected")
        layout.open.add(id(value))
        _container(value, layout, level, out)
        layout.open.discard(id(value))
    else:
        out.append(_scalar(value, layout))


def _container(value: "list | tuple | dict", layout: _Layout, level: int, out: list[str]) -> None:
    if isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = "\n" + layout.indent * (level + 1)
        out.append("[")
        for i, member in enumerate(value):
            out.append(layout.item + inner if i else inner)
            _indented(member, layout, level + 1, out)
        out.append("\n" + layout.indent * level + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = "\n" + layout.indent * (level + 1)
        out.append("{")
        items = sorted(value.items()) if layout.sort_keys else value.items()
        for i, (name, member) in enumerate(items):
            out.append(layout.item + inner if i else inner)
            out.append(_key(name, layout) + layout.key)
            _indented(member, layout, level + 1, out)
        out.append("\n" + layout.indent * level + "}")


def _scalar(value: object, layout: _Layout) -> str:
    if isinstance(value, str):
        return layout.encode_string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value, layout.allow_nan)
    _unserializable(value)
    raise AssertionError  # pragma: no cover  (_unserializable raises)


def _key(name: object, layout: _Layout) -> str:
    """A dict key as json writes it: a string, or a scalar spelled as one."""
    if isinstance(name, str):
        return layout.encode_string(name)
    if isinstance(name, (int, float)) or name is None:  # bool is an int
        return layout.encode_string(_scalar(name, layout))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(name).__name__}")


def _float(value: float, allow_nan: bool) -> str:
    if value != value:
        text = "NaN"
    elif value == _INFINITY:
        text = "Infinity"
    elif value == -_INFINITY:
        text = "-Infinity"
    else:
        return float.__repr__(value)
    if not allow_nan:
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    return text


def _unserializable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


class _Context:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder``."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    def __init__(self, parse_constant):
        self.parse_constant = parse_constant


# typeshed types the context as a scanner; the C code reads only these attributes.
_SCANNERS = (
    {
        True: _json.make_scanner(_Context(_CONSTANTS.__getitem__)),  # type: ignore[arg-type]
        False: _json.make_scanner(_Context(_refuse_constant)),  # type: ignore[arg-type]
    }
    if _json is not None
    else {}
)


def loads(text: "str | bytes", *, allow_nan: bool = True) -> "Any":
    """``json.loads(text)`` (the module's guarantees)."""
    if _json is None or _not_plain(text):  # json reads (or refuses) a byte order mark, UTF-16 and -32
        return _json_loads(text, allow_nan)
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8", "surrogatepass")  # as json decodes UTF-8
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _SCANNERS[allow_nan](text, start)
    except (StopIteration, SystemError):
        # Malformed. The C scanner raises json.JSONDecodeError, which it finds
        # only once json is imported (else SystemError): let json say what is wrong.
        return _json_loads(text, allow_nan)
    if text[end:].strip(_WHITESPACE):
        return _json_loads(text, allow_nan)  # extra data: json's error
    return value


def _json_loads(text: "str | bytes", allow_nan: bool) -> "Any":
    import json

    return json.loads(text, parse_constant=None if allow_nan else _refuse_constant)


def _not_plain(text: "str | bytes") -> bool:
    """``text`` starts with a byte order mark, or is bytes in UTF-16 or -32 (a NUL in its first four)."""
    if isinstance(text, str):
        return text.startswith("\ufeff")
    return text.startswith(b"\xef\xbb\xbf") or b"\x00" in text[:4]
