"""common/jsoncodec.py against json: the same text out, the same values in.

The registry hashes its event lines over this text and corral's readers
take files the command can write, so "the same" is byte for byte and
malformed input must fail as json fails (a ValueError), never differently.
"""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral_systemd.common import jsoncodec

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # lone surrogates included: os.fsdecode makes them of undecodable bytes
)
keys = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=30,
)
ARGUMENTS = [
    {},
    {"sort_keys": True, "separators": (",", ":")},
    {"indent": 2, "ensure_ascii": False},
    {"indent": 4, "sort_keys": True},
    {"indent": 0},
    {"ensure_ascii": False, "separators": (",", ":")},
]


def same_outcome(call_a, call_b):
    """Both return the same, or both raise the same type."""
    outcomes = []
    for call in (call_a, call_b):
        try:
            outcomes.append(("value", call()))
        except (TypeError, ValueError) as exc:
            outcomes.append(("raised", type(exc).__name__))
    return outcomes


@pytest.mark.parametrize("arguments", ARGUMENTS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "defaults")
@settings(max_examples=150, deadline=None)
@given(value=values)
def test_dumps_writes_what_json_writes(arguments, value):
    # Mixed key types with sort_keys, unserializable keys: both raise, the same error.
    ours, theirs = same_outcome(lambda: jsoncodec.dumps(value, **arguments), lambda: json.dumps(value, **arguments))
    assert ours == theirs


@settings(max_examples=200, deadline=None)
@given(value=values)
def test_loads_reads_what_json_reads(value):
    text = json.dumps(value)
    ours, theirs = jsoncodec.loads(text), json.loads(text)
    # NaN is not equal to itself: compare the text of what was read
    assert json.dumps(ours) == json.dumps(theirs)
    assert json.dumps(jsoncodec.loads(text.encode())) == json.dumps(theirs)


@pytest.mark.parametrize(
    "text",
    ["", " ", "{", '{"a": 1', '{"a": 1}}', "[1,]", "nul", '"\x01"', '{"a" 1}', "01", "1 2", "\ufeff{}", "[1] x"],
)
def test_malformed_text_fails_as_json_fails(text):
    with pytest.raises(ValueError) as ours:
        jsoncodec.loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert type(ours.value) is type(theirs.value)


@pytest.mark.parametrize("data", ['{"a": [1, "x"]}'.encode("utf-16"), '\ufeff{"a": 2}'.encode(), b' {"a": 3}\n'])
def test_bytes_are_read_as_json_reads_them(data):
    assert jsoncodec.loads(data) == json.loads(data)


def test_nan_and_infinities_are_refused_where_asked():
    with pytest.raises(ValueError):
        jsoncodec.loads('{"a": NaN}', allow_nan=False)
    with pytest.raises(ValueError):
        jsoncodec.dumps({"a": math.inf}, allow_nan=False)
    with pytest.raises(ValueError):
        jsoncodec.dumps([math.nan], indent=2, allow_nan=False)
    assert math.isinf(jsoncodec.loads("[Infinity]")[0])


def test_what_json_cannot_hold_is_a_type_error():
    for arguments in ({}, {"indent": 2}):
        with pytest.raises(TypeError):
            jsoncodec.dumps({"a": object()}, **arguments)
        with pytest.raises(TypeError):
            jsoncodec.dumps({(1, 2): 3}, **arguments)


def test_a_circular_structure_is_json_s_value_error():
    loop: list = []
    loop.append(loop)
    for arguments in ({}, {"indent": 2}):
        with pytest.raises(ValueError):
            json.dumps(loop, **arguments)
        with pytest.raises(ValueError):
            jsoncodec.dumps(loop, **arguments)


def test_nan_is_refused_on_every_way_in():
    # bytes with a byte order mark go through json itself: refused there too
    for data in ("[NaN]", b"[NaN]", "\ufeff[NaN]".encode(), "[NaN]".encode("utf-16")):
        with pytest.raises(ValueError):
            jsoncodec.loads(data, allow_nan=False)
