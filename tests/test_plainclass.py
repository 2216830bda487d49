"""common/plainclass.py against dataclasses, the behaviour it stands in for.

Each case builds the same classes with ``dataclasses.dataclass`` and with
``plainclass`` and checks that they behave alike where the package relies on
it: fields and their order, defaults and factories (inherited too), frozen,
equality, hashing, ``replace`` (``__post_init__`` again) and ``asdict``.
"""

import dataclasses
import math
from collections import namedtuple

import pytest

from corral_systemd.common import plainclass as P

Point = namedtuple("Point", "x y")


def both(build):
    """``build(decorator, field)`` made once with dataclasses and once with plainclass."""
    return (
        build(dataclasses.dataclass, dataclasses.field, dataclasses.asdict, dataclasses.replace),
        build(P.plainclass, P.field, P.asdict, P.replace),
    )


def _classes(decorate, field, asdict, replace):
    @decorate
    class Base:
        name: str
        items: list = field(default_factory=list)
        size: int = 3

    @decorate
    class Sub(Base):
        extra: float = 0.5
        size = 99  # not annotated: no new default for the field (a plain class attribute)

    @decorate(frozen=True)
    class Frozen:
        a: int
        b: tuple = ()

    class Checked:
        checks = 0

    @decorate
    class Validated(Checked):
        value: int = 0

        def __post_init__(self):
            type(self).checks += 1
            if self.value < 0:
                raise ValueError("negative")

    return Base, Sub, Frozen, Validated, asdict, replace


@pytest.mark.parametrize("make", ["dataclasses", "plainclass"])
def test_fields_defaults_and_factories(make):
    Base, Sub, _, _, asdict, _ = both(_classes)[make == "plainclass"]
    one, two = Base("a"), Base("b", [1])
    assert (one.name, one.items, one.size) == ("a", [], 3)
    one.items.append(1)
    assert Base("c").items == []  # a new list each time
    assert two.items == [1]
    sub = Sub("s")
    assert (sub.items, sub.size, sub.extra) == ([], 3, 0.5)  # the inherited factory and default
    assert Sub("s", [2], 4, 1.5) == Sub(name="s", items=[2], size=4, extra=1.5)
    assert asdict(Sub("s", [Point(1, [2])])) == {"name": "s", "items": [Point(1, [2])], "size": 3, "extra": 0.5}


@pytest.mark.parametrize("make", ["dataclasses", "plainclass"])
def test_bad_arguments_are_type_errors(make):
    Base = both(_classes)[make == "plainclass"][0]
    for args, kwargs in (((), {}), (("a",), {"name": "b"}), (("a",), {"nope": 1}), (("a", [], 1, 2), {})):
        with pytest.raises(TypeError):
            Base(*args, **kwargs)


@pytest.mark.parametrize("make", ["dataclasses", "plainclass"])
def test_frozen_equality_and_hashing(make):
    Base, _, Frozen, _, _, replace = both(_classes)[make == "plainclass"]
    frozen = Frozen(1, (2,))
    with pytest.raises(AttributeError):
        frozen.a = 2
    with pytest.raises(AttributeError):
        del frozen.a
    assert hash(frozen) == hash(Frozen(1, (2,))) and frozen == Frozen(1, (2,)) and frozen != Frozen(2)
    assert replace(frozen, a=5) == Frozen(5, (2,))
    with pytest.raises(TypeError):
        hash(Base("a"))  # compared by value and mutable: unhashable
    nan = Base("n", [], math.nan)
    assert nan == nan  # the same object: equal, as tuples compare
    assert Base("a") != "a"


@pytest.mark.parametrize("make", ["dataclasses", "plainclass"])
def test_replace_checks_again(make):
    _, _, _, Validated, _, replace = both(_classes)[make == "plainclass"]
    made = Validated(1)
    assert replace(made, value=2).value == 2
    with pytest.raises(ValueError):
        replace(made, value=-1)
    assert Validated.checks == 3
