"""SessionPool: every exit path kills the session's process tree, proven in /proc."""

import asyncio
import os
import time

import pytest

from conftest import marker_env as _env
from corral_systemd.pool import PoolFull, SessionPool
from procscan import kill_marked, marked_pids, new_marker

# A session that answers one line per request and leaves a detached helper
# behind, like an agent CLI that spawns a daemon: killing only the main
# process would not be enough.
SERVER = ["sh", "-c", 'setsid sleep 3600 & while read line; do echo "got $line"; done']
MODES = ["fallback", pytest.param("enforced", marks=pytest.mark.systemd)]


async def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _request(s, text=b"ping"):
    await s.send(text + b"\n")
    return await s.stdout.readline()


@pytest.fixture(autouse=True)
def _manager(request):
    if "mode" in request.fixturenames and request.getfixturevalue("mode") == "enforced":
        from modes import mode_flags

        mode_flags("scope")  # skips (or fails under the harness) without a manager


@pytest.mark.parametrize("mode", MODES)
async def test_reuse_then_idle_ttl_kills_tree(mode, marker):
    async with SessionPool(max_sessions=2, idle_ttl=0.5, mode=mode, env=_env(marker)) as pool:
        async with pool.session("k", SERVER) as s1:
            assert await _request(s1) == b"got ping\n"
        async with pool.session("k", SERVER) as s2:
            assert s2 is s1  # reused, warm
        assert await _wait_for(lambda: len(marked_pids(marker)) == 2)  # shell + detached helper
        assert await _wait_for(lambda: marked_pids(marker) == [], 5), "idle TTL did not kill the tree"
        assert pool.stats()["count"] == 0


@pytest.mark.parametrize("mode", MODES)
async def test_idle_timer_does_not_run_during_a_long_request(mode, marker):
    async with SessionPool(max_sessions=1, idle_ttl=0.3, mode=mode, env=_env(marker)) as pool:
        async with pool.session("k", SERVER) as s:
            await _request(s)
            await asyncio.sleep(1.0)  # a request far longer than the TTL
            assert await _request(s, b"still") == b"got still\n"
            assert await _wait_for(lambda: len(marked_pids(marker)) == 2)
        assert await _wait_for(lambda: marked_pids(marker) == [], 5)


@pytest.mark.parametrize("mode", MODES)
async def test_failed_request_kills_live_child(mode, marker):
    async with SessionPool(max_sessions=1, idle_ttl=60, mode=mode, env=_env(marker)) as pool:
        with pytest.raises(ConnectionError):
            async with pool.session("k", SERVER) as s:
                await _request(s)
                assert await _wait_for(lambda: len(marked_pids(marker)) == 2)
                raise ConnectionError("the caller's API call failed")
        # Killed, not merely dropped from the pool: gone from /proc right now.
        assert marked_pids(marker) == []
        assert pool.stats()["count"] == 0


@pytest.mark.parametrize("mode", MODES)
async def test_cancelled_request_kills_child_before_propagating(mode, marker):
    pool = SessionPool(max_sessions=1, idle_ttl=60, mode=mode, env=_env(marker))

    async def request():
        async with pool.session("k", SERVER) as s:
            await _request(s)
            await asyncio.sleep(3600)

    task = asyncio.create_task(request())
    assert await _wait_for(lambda: len(marked_pids(marker)) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert marked_pids(marker) == []
    await pool.shutdown()


@pytest.mark.parametrize("mode", MODES)
async def test_reset_and_shutdown_kill_trees(mode):
    a, b = new_marker(), new_marker()
    try:
        pool = SessionPool(max_sessions=2, idle_ttl=60, mode=mode)
        async with pool.session("a", SERVER, env=_env(a)) as s:
            await _request(s)
        async with pool.session("b", SERVER, env=_env(b)) as s:
            await _request(s)
        assert await _wait_for(lambda: len(marked_pids(b)) == 2)
        await pool.reset("a")
        assert marked_pids(a) == [] and len(marked_pids(b)) == 2
        await pool.shutdown()
        assert marked_pids(b) == []
    finally:
        kill_marked(a)
        kill_marked(b)


async def test_child_that_dies_is_replaced(marker):
    async with SessionPool(max_sessions=1, idle_ttl=60, mode="fallback", env=_env(marker)) as pool:
        async with pool.session("k", ["sh", "-c", "read line; echo once"]) as s:
            assert await _request(s) == b"once\n"
        await asyncio.sleep(0.3)
        async with pool.session("k", ["sh", "-c", "read line; echo again"]) as s2:
            assert s2 is not s and await _request(s2) == b"again\n"


async def test_fifty_sessions_never_more_than_eight_alive(marker):
    import threading

    peak = 0
    stop = threading.Event()

    def sample():  # a thread: /proc scans must not starve the event loop
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(marked_pids(marker)) // 2)  # a session = shell + helper
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        async with SessionPool(
            max_sessions=8, idle_ttl=60, acquire_timeout=60, mode="fallback", env=_env(marker)
        ) as pool:

            async def one(i):
                async with pool.session(f"key-{i}", SERVER) as s:
                    await _request(s)
                    await asyncio.sleep(0.05)

            await asyncio.gather(*(one(i) for i in range(50)))
            assert pool.stats()["count"] <= 8
    finally:
        stop.set()
        sampler.join()
    assert 1 <= peak <= 8
    assert marked_pids(marker) == []


async def test_on_full_fail(marker):
    async with SessionPool(max_sessions=1, idle_ttl=60, on_full="fail", mode="fallback", env=_env(marker)) as pool:
        async with pool.session("a", SERVER) as s:
            await _request(s)
            with pytest.raises(PoolFull):
                async with pool.session("b", SERVER):
                    pass


async def test_acquire_timeout(marker):
    async with SessionPool(max_sessions=1, idle_ttl=60, acquire_timeout=0.3, mode="fallback", env=_env(marker)) as pool:
        async with pool.session("a", SERVER) as s:
            await _request(s)
            started = time.monotonic()
            with pytest.raises(PoolFull):
                async with pool.session("b", SERVER):
                    pass
            assert time.monotonic() - started >= 0.3


async def test_stats_report_memory_and_idle(marker):
    async with SessionPool(max_sessions=2, idle_ttl=60, mode="fallback", env=_env(marker)) as pool:
        async with pool.session(("agent", 7), SERVER) as s:
            await _request(s)
        await asyncio.sleep(0.1)
        (entry,) = pool.stats()["sessions"]
        assert entry["key"] == ("agent", 7) and entry["alive"]
        assert entry["idle"] >= 0.1 and entry["memory"] > 0


def test_supervising_process_death_kills_sessions(tmp_path):
    """The process holding the pool is SIGKILLed: its sessions die with it."""
    import signal
    import subprocess
    import sys

    marker = new_marker()
    # This server outlives its stdin closing, so only the pool's own
    # mechanism (the run's supervisor watching this process) can end it.
    server = ["sh", "-c", 'setsid sleep 3600 & while read line; do echo "got $line"; done; exec sleep 3600']
    script = tmp_path / "holder.py"
    script.write_text(f"""
import asyncio, os, sys
sys.path.insert(0, {str(os.path.dirname(__file__))!r})
from corral_systemd.pool import SessionPool
async def main():
    pool = SessionPool(max_sessions=2, idle_ttl=600, mode="fallback")
    async with pool.session("k", {server!r}) as s:
        await s.send(b"x\\n"); await s.stdout.readline()
    print("ready", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
""")
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(marker), stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        assert len(marked_pids(marker)) >= 3  # holder, shell, helper (and the run's supervisor)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 2.0 + 1.0 + 1.0  # grace + 1 s + slack
        while marked_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked_pids(marker) == []
    finally:
        proc.kill()
        kill_marked(marker)


async def test_sessions_appear_in_corralctl_ps(marker, tmp_path):
    import json
    import subprocess
    import sys

    async with SessionPool(max_sessions=2, idle_ttl=60, mode="fallback", env=_env(marker)) as pool:
        async with pool.session("k", SERVER) as s:
            await _request(s)
        run_id = pool.stats()["sessions"][0]["run_id"]
        out = subprocess.run(
            [sys.executable, "-m", "corral_systemd.ctl", "ps", "--json"], capture_output=True, text=True, check=True
        )
        (row,) = [r for r in json.loads(out.stdout) if r["run_id"] == run_id]
        assert row["state"] == "active" and row["processes"] >= 2


@pytest.mark.parametrize("mode", MODES)
async def test_send_accepts_str_utf8(mode, marker):
    """``send("text")`` is sent UTF-8 encoded; anything but bytes or str is a TypeError."""
    async with SessionPool(max_sessions=1, mode=mode, env=_env(marker)) as pool:
        async with pool.session("k", SERVER) as s:
            await s.send("héllo\n")
            assert await s.stdout.readline() == "got héllo\n".encode()
            await s.send(bytearray(b"raw\n"))
            assert await s.stdout.readline() == b"got raw\n"
            with pytest.raises(TypeError):
                await s.send(42)
    assert marked_pids(marker) == []
