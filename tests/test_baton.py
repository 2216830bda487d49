"""The Runner's baton (corral_systemd/common/baton.py): turns are fair and bounded.

What a run sees is tested in test_api.py (a waiting run lets the others
through); here, the two properties a systemd run cannot show reliably: a
thread whose events are always ready still hands over, and hand-over is in
the order the waiters came.
"""

import os
import select
import threading
import time

from corral_systemd.common import baton


def _always_ready():
    r, w = os.pipe()
    os.write(w, b"x")  # never read: POLLIN for ever
    poller = select.poll()
    poller.register(r, select.POLLIN)
    return poller, (r, w)


def test_a_thread_always_ready_still_hands_over():
    """Without the bounded turn, the busy thread would keep the baton until
    it stops (5 s), and the other would get it only after."""
    shared = baton.Baton()
    poller, fds = _always_ready()
    busy_started, busy_done, other_got_it = threading.Event(), threading.Event(), threading.Event()
    got_while_busy = []

    def busy():
        with shared.held():
            busy_started.set()
            end = time.monotonic() + 5
            while time.monotonic() < end and not other_got_it.is_set():
                assert baton.poll(poller, 1000)  # always ready: returns at once
            busy_done.set()  # inside: set before an ordinary hand-over at the end

    def other():
        busy_started.wait()
        with shared.held():
            got_while_busy.append(not busy_done.is_set())
            other_got_it.set()

    threads = [threading.Thread(target=busy), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for fd in fds:
        os.close(fd)
    assert got_while_busy == [True]


def test_hand_over_is_in_arrival_order():
    shared = baton.Baton()
    order = []
    holder_ready, release = threading.Event(), threading.Event()

    def holder():
        with shared.held():
            holder_ready.set()
            release.wait(5)

    def waiter(i):
        with shared.held():
            order.append(i)

    first = threading.Thread(target=holder)
    first.start()
    holder_ready.wait(5)
    waiters = []
    for i in range(5):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        waiters.append(t)
        deadline = time.monotonic() + 5
        while len(shared._waiters) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.001)  # queued before the next one starts
    release.set()
    for t in [first, *waiters]:
        t.join(5)
    assert order == [0, 1, 2, 3, 4]


def test_without_a_baton_poll_just_polls():
    poller, fds = _always_ready()
    try:
        assert baton.poll(poller, 1000)
    finally:
        for fd in fds:
            os.close(fd)


def test_nested_release_does_not_hand_out_the_baton_twice():
    shared = baton.Baton()
    inside = []
    with shared.held():
        with baton.released():
            with baton.released():  # nothing to give: not ours in here
                pass
            with shared.held():  # a fresh take, not a re-entry
                inside.append(len(shared._waiters))
    assert inside == [0] and not shared._held and not shared._waiters
