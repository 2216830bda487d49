"""libc's functions Python does not expose, and the C types to call them with.

Built on ``_ctypes``, the core ``ctypes`` itself is made of, with ctypes'
own semantics (the names are ctypes', so a reader knows them): a function
of ``library()`` returns a C ``int`` unless its ``restype`` is set, converts
Python ints and bytes as ctypes does, and keeps ``errno`` for
``get_errno()`` (ctypes' ``use_errno=True``); ``pythonapi()``'s functions
run with the GIL held (ctypes' ``PyDLL``), for the few calls that must not
release it (a fork).

Why not ``import ctypes``: every run imports this, and ctypes' module costs
a run's start about 1 ms (it builds some forty classes, imports struct and
types, loads ``pythonapi``); corral needs a handful of calls.

Failure modes: ``AttributeError`` for a function libc does not have (as
ctypes); a call's errors are its return value and ``get_errno()``.
"""

import _ctypes
import os

_FLAGS = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
get_errno = _ctypes.get_errno
byref = _ctypes.byref
addressof = _ctypes.addressof
sizeof = _ctypes.sizeof
Structure = _ctypes.Structure


class c_int(_ctypes._SimpleCData):
    _type_ = "i"


class c_long(_ctypes._SimpleCData):
    _type_ = "l"


class c_ulong(_ctypes._SimpleCData):
    _type_ = "L"


c_size_t = c_ulong  # Linux's ABIs: size_t is as wide as an unsigned long


class c_uint32(_ctypes._SimpleCData):
    _type_ = "I"


class c_uint64(_ctypes._SimpleCData):
    _type_ = "Q"


class c_void_p(_ctypes._SimpleCData):
    _type_ = "P"


class c_char(_ctypes._SimpleCData):
    _type_ = "c"


def errno_error(what: str | None = None) -> OSError:
    """The last call's errno (``get_errno``) as an OSError, naming ``what`` if given."""
    err = get_errno()
    return OSError(err, os.strerror(err) if what is None else f"{what}: {os.strerror(err)}")


def string_buffer(size: int):
    """``size`` zeroed bytes to pass by address (ctypes' ``create_string_buffer``); ``.raw`` reads them."""
    return (c_char * size)()


class _Library:
    """This process's own symbols (``dlopen(NULL)``: libc and the interpreter's)."""

    def __init__(self, flags: int):
        self._handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]  # NULL: this process; RTLD_LOCAL as ctypes

        class Function(_ctypes.CFuncPtr):
            _flags_ = flags
            _restype_ = c_int

        self._function = Function

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        function = self._function((name, self))  # type: ignore[arg-type]  # any object with _handle
        function.__name__ = name  # type: ignore[attr-defined]  # as ctypes names them
        setattr(self, name, function)
        return function


def library() -> _Library:
    """libc's functions, ``errno`` kept, the GIL released during each call."""
    return _Library(_FLAGS)


def pythonapi() -> _Library:
    """The same symbols called with the GIL held (the interpreter's own
    functions, and a call that must not let another thread run meanwhile)."""
    return _Library(_FLAGS | _ctypes.FUNCFLAG_PYTHONAPI)
