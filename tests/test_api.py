"""The Python API: results, errors, streaming, cancellation, shared Runner.

Every test proves through /proc (the run's environment marker) that no
process of the run is left, not through the library's own bookkeeping.
"""

import asyncio
import os
import time

import pytest

import corral_systemd as corral
from conftest import marker_env as _env
from modes import _unavailable, systemctl, user_manager_reachable
from procscan import kill_marked, marked_pids, new_marker

DAEMON = ["sh", "-c", "setsid sleep 3600 & sleep 3600"]


def _mode_param(mode):
    return pytest.param(mode, marks=pytest.mark.systemd) if mode == "enforced" else mode


MODES = [_mode_param("fallback"), _mode_param("enforced")]


@pytest.fixture(autouse=True)
def _require_manager(request):
    if (
        "mode" in request.fixturenames
        and request.getfixturevalue("mode") == "enforced"
        and not user_manager_reachable()
    ):
        _unavailable("no user manager reachable")


@pytest.mark.parametrize("mode", MODES)
def test_run_captures_and_cleans_up(mode, marker):
    result = corral.run(
        ["sh", "-c", "printf out; printf err >&2; setsid sleep 3600 & exit 3"], mode=mode, env=_env(marker), wall=10
    )
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out", b"err")
    assert result.verified and result.outcome == "exited"
    assert result.mode == ("systemd" if mode == "enforced" else "fallback")
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_limits_are_results_not_exceptions(mode, marker):
    result = corral.run(DAEMON, mode=mode, env=_env(marker), wall=0.5)
    assert result.outcome == "timeout" and result.exit_code == 124
    assert marked_pids(marker) == []


def test_stdin_bytes(marker):
    assert corral.run(["cat"], stdin=b"\x00fed\xff", env=_env(marker)).stdout == b"\x00fed\xff"


def test_capture_false_passes_output_through(capfd, marker):
    result = corral.run(["sh", "-c", "echo visible"], capture=False, env=_env(marker))
    assert result.stdout == b"" and "visible" in capfd.readouterr().out


def test_typed_errors(tmp_path):
    with pytest.raises(corral.NotFound) as info:
        corral.run(["/nonexistent/binary"])
    assert info.value.result.exit_code == 127
    script = tmp_path / "noexec"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(corral.CannotExecute):
        corral.run([str(script)])
    with pytest.raises(corral.UsageError):
        corral.run(["true"], wall="2x")
    with pytest.raises(corral.UsageError):
        corral.run([])


@pytest.mark.parametrize("mode", MODES)
async def test_arun_and_streaming(mode, marker):
    result = await corral.arun(["sh", "-c", "echo a"], mode=mode, env=_env(marker))
    assert result.stdout == b"a\n"
    async with corral.start(
        ["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done; setsid sleep 3600 &"], mode=mode, env=_env(marker)
    ) as run:
        chunks = [chunk async for chunk in run.stdout]
        result = await run.wait()
    assert b"".join(chunks) == b"1\n2\n3\n" == result.stdout
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", MODES)
async def test_cancelled_task_stops_run_before_propagating(mode, marker):
    task = asyncio.create_task(corral.arun(DAEMON, mode=mode, env=_env(marker)))
    deadline = time.monotonic() + 10
    while len(marked_pids(marker)) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(marked_pids(marker)) >= 2, "run never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert marked_pids(marker) == []  # already gone when the cancellation arrives


@pytest.mark.parametrize("mode", MODES)
async def test_exception_in_with_block_stops_run(mode, marker):
    with pytest.raises(RuntimeError):
        async with corral.start(DAEMON, mode=mode, env=_env(marker)):
            deadline = time.monotonic() + 10
            while len(marked_pids(marker)) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            raise RuntimeError("caller failed")
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", MODES)
async def test_stop(mode, marker):
    async with corral.start(DAEMON, mode=mode, env=_env(marker)) as run:
        await asyncio.sleep(0.3)
        result = await run.stop()
    assert result.outcome == "interrupted" and result.verified
    assert marked_pids(marker) == []


@pytest.mark.parametrize("mode", MODES)
async def test_runner_shared_between_concurrent_tasks(mode):
    markers = [new_marker() for _ in range(8)]
    try:
        async with corral.Runner(mode=mode, wall=1) as runner:
            results = await asyncio.gather(*(runner.arun(DAEMON, env=_env(m)) for m in markers))
        assert [r.exit_code for r in results] == [124] * 8
        assert len({r.run_id for r in results}) == 8
        assert all(marked_pids(m) == [] for m in markers)
    finally:
        for m in markers:
            kill_marked(m)


@pytest.mark.systemd
async def test_corralctl_stop_of_library_run_stops_unit_not_application(marker):
    import subprocess
    import sys

    if not user_manager_reachable():
        _unavailable("no user manager reachable")
    async with corral.start(DAEMON, mode="enforced", env=_env(marker)) as run:
        deadline = time.monotonic() + 10
        while len(marked_pids(marker)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "corral_systemd.ctl",
            "stop",
            run._spec.run_id,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
        result = await run.wait()
    assert proc.returncode == 0, err
    assert result.verified and marked_pids(marker) == []
    # and this test process (the run's owner) was not signalled: we are here.


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
def test_runner_control_group_is_the_commands(unit_type, marker):
    """The Runner derives a service's cgroup and takes a scope's from the
    gated shell: both must be the cgroup the kernel puts the command in."""
    if not user_manager_reachable():
        _unavailable("no user manager reachable")
    with corral.Runner(mode="enforced", unit_type=unit_type) as runner:
        results = [runner.run(["cat", "/proc/self/cgroup"], env=_env(marker)) for _ in range(3)]
    for result in results:
        lines = [line.split(":", 2) for line in result.stdout.decode().splitlines()]
        own = {
            path
            for hierarchy, controllers, path in lines
            if hierarchy == "0" or "name=systemd" in controllers.split(",")
        }
        assert result.exit_code == 0 and result.engine.control_group in own, (own, result.engine)
        assert result.engine.unit.endswith(f".{unit_type}") and result.engine.invocation_id


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
async def test_runner_routes_each_runs_own_signals(unit_type):
    """32 concurrent runs over one shared manager connection: each gets its
    own exit status (routed by unit), none waits on another's signals.

    dash has no $RANDOM: every command exits at once, mostly non-zero, which
    makes systemd 252 fail most services' Type=exec start jobs after the
    command ran; those runs must still report their own status, not 125."""
    if not user_manager_reachable():
        _unavailable("no user manager reachable")
    markers = [new_marker() for _ in range(32)]
    try:
        async with corral.Runner(mode="enforced", unit_type=unit_type, wall=20) as runner:
            results = await asyncio.gather(
                *(
                    runner.arun(["sh", "-c", f"sleep 0.$((RANDOM % 3)); exit {i}"], env=_env(m))
                    for i, m in enumerate(markers)
                )
            )
        assert [r.exit_code for r in results] == list(range(32))
        assert all(r.verified and r.outcome == "exited" for r in results)
        assert len({r.engine.unit for r in results}) == 32
        assert all(marked_pids(m) == [] for m in markers)
    finally:
        for m in markers:
            kill_marked(m)


@pytest.mark.systemd
@pytest.mark.parametrize("unit_type", ["scope", "service"])
async def test_a_waiting_run_does_not_hold_up_the_others(unit_type, marker):
    """A Runner's runs take turns running Python (baton.py); one that is
    waiting for its command must let the others start, run and finish.
    If a wait kept the turn, the short runs could finish only after the
    long one ended (its wall), so it would be done by then."""
    if not user_manager_reachable():
        _unavailable("no user manager reachable")
    async with corral.Runner(mode="enforced", unit_type=unit_type) as runner:
        async with runner.start(["sh", "-c", "echo up; exec sleep 60"], env=_env(marker), wall=8) as long_run:
            assert await long_run.stdout.readline() == b"up\n"
            shorts = await asyncio.gather(*(runner.arun(["sh", "-c", f"exit {i}"]) for i in range(4)))
            assert [r.exit_code for r in shorts] == [0, 1, 2, 3]
            assert not long_run.done
            result = await long_run.stop()
    assert result.outcome == "interrupted" and result.verified
    assert marked_pids(marker) == []


@pytest.mark.manager_kill
def test_manager_killed_mid_library_run_is_reported_honestly(marker):
    """Kills the user manager under a Runner's shared connection (run alone).

    No wall: a service's end is known only through the manager, so the run
    must notice the loss and stop (and prove) it, not wait forever."""
    import signal
    import threading

    manager = int(os.environ["CORRAL_HARNESS_MANAGER_PID"])
    with corral.Runner(mode="enforced", grace=0.5) as runner:
        outcome = {}
        worker = threading.Thread(target=lambda: outcome.update(result=_run_or_error(runner, DAEMON, env=_env(marker))))
        worker.start()
        deadline = time.monotonic() + 10
        while len(marked_pids(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(marked_pids(marker)) >= 2, "run never started"
        os.kill(manager, signal.SIGKILL)
        worker.join(30)
        assert not worker.is_alive(), "the run hung after the manager died"
    left = marked_pids(marker)
    try:
        result = outcome["result"]
        if left:  # unprovable: it must say so
            assert isinstance(result, corral.Unverified), result
        else:
            assert isinstance(result, corral.Unverified) or result.exit_code in (124, 120), result
    finally:
        kill_marked(marker)


def _run_or_error(runner, argv, **kw):
    try:
        return runner.run(argv, **kw)
    except corral.CorralError as exc:
        return exc


CREDENTIAL_CASES = [
    pytest.param("fallback", "scope", "corral", id="fallback"),
    pytest.param("enforced", "scope", "corral", id="scope", marks=pytest.mark.systemd),
    pytest.param("enforced", "service", "systemd", id="service", marks=pytest.mark.systemd),
]


@pytest.mark.parametrize("mode,unit_type,delivery", CREDENTIAL_CASES)
def test_library_credentials_exist_only_while_the_run_does(mode, unit_type, delivery, tmp_path, marker):
    if mode == "enforced" and not user_manager_reachable():
        _unavailable("no user manager reachable")
    secret = tmp_path / "token"
    secret.write_text("s3cret-library")
    result = corral.run(
        ["sh", "-c", 'echo "$CREDENTIALS_DIRECTORY"; cat "$CREDENTIALS_DIRECTORY/api"'],
        mode=mode,
        unit_type=unit_type,
        credentials={"api": secret},
        env=_env(marker),
    )
    directory, content = result.stdout.decode().splitlines()
    assert content == "s3cret-library" and result.exit_code == 0
    assert not os.path.exists(directory), "the credential outlived the run"
    assert result.credentials_delivery == delivery
    assert "s3cret-library" not in result.model_dump_json(exclude={"stdout", "stderr"})
    from corral_systemd.state.registry import state_dir

    for path, data in _files_below(state_dir()):  # the registry entry and audit log
        assert b"s3cret-library" not in data, path
    assert marked_pids(marker) == []


def test_library_credentials_bad_name_is_a_usage_error(tmp_path):
    with pytest.raises(corral.UsageError):
        corral.run(["true"], credentials={"../x": tmp_path})


def _files_below(directory):
    """(path, contents) of each file below ``directory``. The state directory
    is shared by the suite's workers: a file another run replaces or prunes
    between the listing and the read (an entry's ``.tmp``) is passed over."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    yield path, f.read()
            except FileNotFoundError:
                continue


@pytest.mark.manager_kill  # disturbs every run on the manager: a harness of its own
def test_runner_survives_a_manager_reexec(marker):
    """daemon-reexec (package upgrades run it) closes every private
    connection: a Runner must reconnect for its next runs, not fail them."""
    import shutil

    if not user_manager_reachable() or shutil.which("systemctl") is None:
        _unavailable("no user manager reachable")
    if not (os.environ.get("CORRAL_HARNESS_MANAGER_PID") or os.environ.get("CORRAL_TEST_BOOTED") == "1"):
        pytest.skip("re-executes the manager: only inside tests/harness/with-user-manager or the VM lane")
    with corral.Runner(mode="enforced") as runner:
        assert runner.run(["true"], env=_env(marker)).exit_code == 0
        systemctl("daemon-reexec", check=True, timeout=120)
        results = [runner.run(["sh", "-c", "exit 7"], env=_env(marker)) for _ in range(2)]
    assert [(r.exit_code, r.verified) for r in results] == [(7, True), (7, True)]
    assert marked_pids(marker) == []


@pytest.mark.systemd
@pytest.mark.parametrize("underscore", [True, False], ids=["with _", "without _"])
def test_a_runner_scope_gets_the_environment_exactly(underscore, monkeypatch):
    """A library Runner's scope is held at a shell's gate (its host is
    multi-threaded: no fork). The shell reads the go into ``_``; the command
    gets the environment it was given back exactly, ``_`` included or
    absent, plus CORRAL_RUN_ID (before: ``_=go`` in every such command's
    environment)."""
    if underscore:
        monkeypatch.setenv("_", "/usr/bin/the-callers-underscore")
    else:
        monkeypatch.delenv("_", raising=False)
    with corral.Runner(mode="enforced") as runner:
        result = runner.run(["sh", "-c", "cat /proc/self/environ"], unit_type="scope")
    got = set(result.stdout.split(b"\0")) - {b""}
    want = {os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()}
    assert got - want == {b"CORRAL_RUN_ID=" + result.run_id.encode()} and want <= got
