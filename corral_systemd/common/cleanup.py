"""``ExitStack``: the cleanup stack of a run's start, without contextlib.

contextlib loads functools and collections (about 1 ms of every corral start,
issue 38); a run's start needs only this part of it: ``callback``,
``enter_context``, ``pop_all``, and the stack unwound on exit.

Guarantees, as contextlib's: on exit every callback runs, last pushed first,
even when an earlier one raised; the exception the block ends with is the
last one raised, its ``__context__`` the one before it (the block's own,
first). Unlike contextlib's, nothing is ever suppressed (what a context's
``__exit__`` returns is not read: the files a start enters never suppress),
so a type checker knows the block's assignments happened. ``pop_all`` moves
the callbacks to a new stack, so leaving this one runs none of them (a start
that succeeded keeps what its failure would have closed).
"""

import sys


class ExitStack:
    def __init__(self):
        self._exits: list = []  # each called as __exit__ is: (type, value, traceback)

    def callback(self, function, /, *args, **kwargs):
        """Call ``function(*args, **kwargs)`` on exit; returns ``function``."""

        def call(kind, value, traceback) -> None:
            function(*args, **kwargs)

        self._exits.append(call)
        return function

    def enter_context(self, context):
        """Enter ``context`` now, exit it on exit; returns what its ``__enter__`` did."""
        kind = type(context)
        result = kind.__enter__(context)
        self._exits.append(lambda *exc_info: kind.__exit__(context, *exc_info))
        return result

    def pop_all(self) -> "ExitStack":
        """A new stack with this one's callbacks; this one is left empty."""
        moved = ExitStack()
        moved._exits, self._exits = self._exits, []
        return moved

    def close(self) -> None:
        self.__exit__(None, None, None)

    def __enter__(self) -> "ExitStack":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        handled = sys.exc_info()[1]  # what a callback's raise is chained to by Python itself
        current = value  # the exception the block ends with so far
        raised = False
        while self._exits:
            exit_ = self._exits.pop()
            try:
                exit_(type(current) if current is not None else None, current, _traceback(current))
            except BaseException as exc:  # noqa: B036 - every callback runs; the last raised goes on
                if current is not None:
                    _chain(exc, current, handled)
                current, raised = exc, True
        if raised and current is not None:
            context = current.__context__
            try:
                raise current
            except BaseException:
                current.__context__ = context  # as chained above, not the block's (raise re-chains)
                raise


def _traceback(exc: BaseException | None):
    return exc.__traceback__ if exc is not None else None


def _chain(exc: BaseException, earlier: BaseException, handled: BaseException | None) -> None:
    """Make ``earlier`` the end of ``exc``'s context chain, as contextlib does:
    what ``exc`` was raised during (a callback's own ``except ... raise``) is
    kept, down to ``handled`` (the block's exception, which Python chained
    to itself) or the chain's end, and ``earlier`` follows; unlike
    contextlib, also where no exception was being handled."""
    seen = exc
    while True:
        context = seen.__context__
        if context is earlier:
            return  # already chained
        if context is None or context is handled:
            break
        seen = context
    seen.__context__ = earlier
