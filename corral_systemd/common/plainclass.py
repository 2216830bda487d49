"""Classes of declared fields, without ``dataclasses``: start-up is product speed.

``dataclasses`` imports ``inspect`` (and with it ``ast``, ``dis`` and
``tokenize``) and compiles three methods per class with ``exec`` when a
module defines one: together more than the interpreter's own start, on
every corral run. The package uses a small part of it, which this gives at
the cost of a closure per class:

- ``@plainclass`` or ``@plainclass(frozen=True)``: the fields are the names
  annotated in the class body, in order, after those of its plainclass
  bases. A field's default is the class attribute of its name, or
  ``field(default_factory=f)`` for a new value per object. ``__init__``
  takes the fields by position or by name (TypeError for a missing, unknown
  or repeated one) and then calls ``__post_init__`` if the class has one.
  ``__eq__`` compares the fields of objects of the same class; ``__repr__``
  shows them. A plain class is unhashable; a frozen one hashes its fields,
  and setting or deleting an attribute raises ``FrozenInstanceError``.
- ``replace(obj, **changes)``: a new object of those fields, made through
  ``__init__`` (so ``__post_init__`` checks it again).
- ``asdict(obj)``: the fields as a new dict, recursively through plain
  classes, lists, tuples and dicts.

As with ``dataclasses``, mypy reads the classes' ``__init__`` from the
fields (``typing.dataclass_transform``, seen only by the type checker).
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform, overload

    _T = TypeVar("_T")
    _C = TypeVar("_C", bound=type)

__all__ = ["FrozenInstanceError", "asdict", "field", "plainclass", "replace"]

#: The fields of a plain class, in ``__init__``'s order, and their defaults (class attributes).
_FIELDS = "__plainclass_fields__"
_DEFAULTS = "__plainclass_defaults__"
_FACTORIES = "__plainclass_factories__"
_MISSING = object()


class FrozenInstanceError(AttributeError):
    """An attribute of a frozen plain class's object was set or deleted."""


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def field(*, default_factory: "Callable[[], _T]") -> "_T":
    """A field whose default is ``default_factory()``, called for each new object."""
    return _Factory(default_factory)  # type: ignore[return-value]


if TYPE_CHECKING:

    @overload
    def plainclass(cls: "_C", /) -> "_C": ...

    @overload
    def plainclass(*, frozen: bool = False) -> "Callable[[_C], _C]": ...

    @dataclass_transform(field_specifiers=(field,))
    def plainclass(cls: "Any" = None, /, *, frozen: bool = False) -> "Any": ...

else:

    def plainclass(cls=None, /, *, frozen=False):
        """Make ``cls`` a plain class (the module's docstring)."""
        if cls is None:
            return lambda cls: _make(cls, frozen)
        return _make(cls, frozen)


def _make(cls, frozen: bool):
    names: list[str] = []
    defaults: dict[str, object] = {}
    factories: dict[str, Callable[[], object]] = {}
    for base in reversed(cls.__mro__[1:]):  # the plainclass bases' fields first, with their defaults
        for name in base.__dict__.get(_FIELDS, ()):
            if name not in names:
                names.append(name)
        defaults.update(base.__dict__.get(_DEFAULTS, {}))
        factories.update(base.__dict__.get(_FACTORIES, {}))
    for name in _own_annotations(cls):
        if name not in names:
            names.append(name)
        defaults.pop(name, None)  # this class's declaration of a field is the one that counts
        factories.pop(name, None)
        value = cls.__dict__.get(name, _MISSING)
        if isinstance(value, _Factory):
            factories[name] = value.make
            delattr(cls, name)  # as dataclasses: no shared default left on the class
        elif value is not _MISSING:
            defaults[name] = value
    setattr(cls, _DEFAULTS, defaults)
    setattr(cls, _FACTORIES, factories)
    fields = tuple(names)
    known = frozenset(fields)
    qualname = cls.__qualname__

    def __init__(self, *args, **kwargs):
        if len(args) > len(fields):
            raise TypeError(f"{qualname}() takes {len(fields)} arguments, {len(args)} given")
        values = dict(zip(fields[: len(args)], args, strict=True))
        for name, value in kwargs.items():
            if name not in known:
                raise TypeError(f"{qualname}() got an unexpected argument {name!r}")
            if name in values:
                raise TypeError(f"{qualname}() got {name!r} twice")
            values[name] = value
        for name in fields:
            if name in values:
                value = values[name]
            elif name in defaults:
                value = defaults[name]
            elif name in factories:
                value = factories[name]()
            else:
                raise TypeError(f"{qualname}() is missing {name!r}")
            object.__setattr__(self, name, value)
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __repr__(self):
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in fields)
        return f"{qualname}({shown})"

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, name) for name in fields) == tuple(getattr(other, name) for name in fields)

    cls.__init__ = __init__
    cls.__repr__ = __repr__
    cls.__eq__ = __eq__
    setattr(cls, _FIELDS, fields)
    if frozen:

        def __setattr__(self, name, value):
            raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen {qualname}")

        def __delattr__(self, name):
            raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen {qualname}")

        def __hash__(self):
            return hash(tuple(getattr(self, name) for name in fields))

        cls.__setattr__ = __setattr__
        cls.__delattr__ = __delattr__
        cls.__hash__ = __hash__
    else:
        cls.__hash__ = None  # mutable and compared by value: unhashable, as a dataclass
    return cls


def _own_annotations(cls) -> "dict[str, object]":
    """The names annotated in ``cls``'s own body, in order. From Python 3.14
    annotations are evaluated when first asked for and kept out of the
    class's ``__dict__`` (PEP 649): there ``annotationlib`` gives them, as
    forward references where a name is the type checker's only."""
    if sys.version_info < (3, 14):  # asked of the version: a failed import is a path search per class
        return cls.__dict__.get("__annotations__", {})
    import annotationlib

    return annotationlib.get_annotations(cls, format=annotationlib.Format.FORWARDREF)


def replace(obj: "_T", /, **changes: object) -> "_T":
    """A new object of ``obj``'s class: its fields, with ``changes``."""
    values = {name: getattr(obj, name) for name in getattr(obj, _FIELDS)}
    values.update(changes)
    return obj.__class__(**values)


def asdict(obj: object) -> "dict[str, Any]":
    """``obj``'s fields as a new dict, copied through plain classes, lists, tuples and dicts."""
    return {name: _copied(getattr(obj, name)) for name in getattr(obj, _FIELDS)}


def _copied(value):
    if hasattr(type(value), _FIELDS):
        return asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple: by position
        return type(value)(*[_copied(item) for item in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item) for item in value)
    if isinstance(value, dict):
        return {_copied(key): _copied(item) for key, item in value.items()}
    return value
