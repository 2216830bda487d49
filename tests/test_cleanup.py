"""common/cleanup.py's ExitStack against contextlib's, the one it replaces on a run's start."""

import contextlib

import pytest

from corral_systemd.common.cleanup import ExitStack

STACKS = [contextlib.ExitStack, ExitStack]


class Boom(Exception):
    pass


class Other(Exception):
    pass


def _unwind(stack_type, body_raises, callbacks):
    """Run callbacks (each: None or an exception to raise) under a stack; the calls made and what came out."""
    calls = []

    def make(i, exc):
        def cb():
            calls.append(i)
            if exc is not None:
                raise exc

        return cb

    try:
        with stack_type() as stack:
            for i, exc in enumerate(callbacks):
                stack.callback(make(i, exc))
            if body_raises is not None:
                raise body_raises
    except BaseException as exc:  # noqa: BLE001
        chain = []
        seen = exc
        while seen is not None and len(chain) < 10:
            chain.append(type(seen).__name__ + ":" + str(seen))
            seen = seen.__context__
        return calls, chain
    return calls, []


CASES = [
    (None, [None, None, None]),
    (Boom("body"), [None, None]),
    (None, [Other("first"), None, Boom("last")]),
    (Boom("body"), [Other("a"), Other("b")]),
    (KeyboardInterrupt("body"), [None, Boom("cb")]),
]


@pytest.mark.parametrize("body,callbacks", CASES)
def test_unwinds_every_callback_and_chains_what_they_raised(body, callbacks):
    calls, chain = _unwind(ExitStack, body, callbacks)
    assert calls == list(reversed(range(len(callbacks))))  # every callback ran, last pushed first
    raised = ([] if body is None else [body]) + [c for c in reversed(callbacks) if c is not None]
    # The last raised goes on; its context is the one raised before it, down to the block's own.
    assert chain == [type(e).__name__ + ":" + str(e) for e in reversed(raised)]
    if body is not None:  # where the block raised, contextlib chains alike
        theirs = _unwind(
            contextlib.ExitStack, type(body)(*body.args), [None if c is None else type(c)(*c.args) for c in callbacks]
        )
        assert (calls, chain) == theirs


@pytest.mark.parametrize("stack_type", STACKS)
def test_pop_all_keeps_what_a_failure_would_close(stack_type):
    closed = []
    with stack_type() as stack:
        stack.callback(closed.append, "on fail")
        kept = stack.pop_all()
    assert closed == []
    kept.close()
    assert closed == ["on fail"]


@pytest.mark.parametrize("stack_type", STACKS)
def test_enter_context_exits_on_leaving(stack_type, tmp_path):
    with stack_type() as stack:
        f = stack.enter_context(open(tmp_path / "x", "w"))
        assert not f.closed
    assert f.closed


def test_never_suppresses():
    class Swallow:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return True  # contextlib's stack would suppress; a start never enters such a context

    with pytest.raises(Boom):
        with ExitStack() as stack:
            stack.enter_context(Swallow())
            raise Boom()


@pytest.mark.parametrize("block_raises", [True, False], ids=["block-raised", "block-ok"])
def test_a_callbacks_own_chain_is_kept(block_raises):
    # A callback that raises while handling its own error (except OSError: raise
    # ValueError): the OSError stays in the chain, between it and what came before.
    def converts():
        try:
            raise OSError("underneath")
        except OSError:
            raise ValueError("converted")  # noqa: B904 - the implicit chain is what is tested

    def chain_of(stack_type):
        try:
            with stack_type() as stack:
                stack.callback(converts)
                if block_raises:
                    raise KeyError("block")
        except BaseException as exc:  # noqa: BLE001
            out, seen = [], exc
            while seen is not None and len(out) < 10:
                out.append(type(seen).__name__)
                seen = seen.__context__
            return out

    want = ["ValueError", "OSError"] + (["KeyError"] if block_raises else [])
    assert chain_of(ExitStack) == want
    assert chain_of(contextlib.ExitStack) == want
