"""The --json record corral writes without pydantic is the schema's record.

``record_json`` builds the document from a run's outcome; ``record`` declares
it (pydantic). These hold the two together: the same field lists in the same
order, and for varied outcomes the very same JSON data (the library's
``from_result`` validates ``record_data`` itself, so what differs here is
what the model would coerce or fill in). Every record the rest of the suite
reads is validated against ``RunRecord`` too (conftest's ``corral`` fixture).
"""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral_systemd.core import record_json
from corral_systemd.core.record import EngineInfo, EnvironmentNames, Limits, RunRecord, Steps, from_result
from corral_systemd.core.result import RunOutcome
from corral_systemd.engines.kinds import GUARANTEE_PROOFS, GUARANTEES


def test_field_lists_are_the_models():
    assert record_json.LIMIT_FIELDS == tuple(Limits.model_fields)
    assert record_json.STEP_FIELDS == tuple(Steps.model_fields)
    assert record_json.ENGINE_FIELDS == tuple(EngineInfo.model_fields)
    assert record_json.ENVIRONMENT_FIELDS == tuple(EnvironmentNames.model_fields)
    outcome = RunOutcome(
        run_id="0" * 12,
        mode="fallback",
        guarantee="subreaper",
        argv=["true"],
        cwd="/",
        limits={"grace": 2, "verify_timeout": 2},
    )
    assert tuple(record_json.record_data(outcome)) == tuple(RunRecord.model_fields)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_time = st.floats(min_value=0, max_value=2e9, allow_nan=False)
_seconds = st.one_of(st.none(), st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False))


@st.composite
def outcomes(draw):
    start = draw(_time)
    steps = {}
    t = 0.0
    for name in ("spawned", "deadline", "term_sent", "kill_sent", "verified"):  # in the validator's order
        if draw(st.booleans()):
            t += draw(st.floats(0, 100, allow_nan=False))
            steps[name] = t
    engine = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "manager": st.sampled_from(["user", "system"]),
                "unit": _text,
                "unit_type": st.sampled_from(["scope", "service"]),
                "memory_peak": st.integers(0, 2**62),
                "cpu_usage_nsec": st.integers(0, 2**62),
                "pids_limit_hits": st.integers(0, 2**31),
                "memory_events": st.dictionaries(st.sampled_from(["max", "oom", "oom_kill"]), st.integers(0, 99)),
                "accounting_source": st.sampled_from(["cgroup", "manager", "cgroup+manager", "procfs"]),
                "an_engine_extra": st.one_of(_text, st.integers(), st.lists(st.integers(), max_size=3)),
            },
        )
    )
    outcome = RunOutcome(
        run_id=draw(st.text("0123456789abcdef", min_size=12, max_size=12)),
        mode=draw(st.sampled_from(["fallback", "systemd", "cgroup"])),
        guarantee=draw(st.sampled_from(GUARANTEES)),
        argv=draw(
            st.lists(
                st.one_of(_text, st.sampled_from(["--password=hunter2", "Authorization: Bearer x"])),
                min_size=1,
                max_size=5,
            )
        ),
        cwd=draw(_text),
        limits={
            "wall": draw(_seconds),
            "grace": draw(st.integers(0, 60)),
            "verify_timeout": draw(st.floats(0, 60)),
            "mem": draw(st.one_of(st.none(), st.integers(1, 2**40))),
            "pids": None,
            "max_output": None,
            "cpu_time": draw(st.one_of(st.none(), st.integers(1, 60), st.floats(0.1, 60))),
            "cpus": draw(st.one_of(st.none(), st.floats(0.01, 8))),
        },
        limits_enforced=draw(
            st.dictionaries(
                st.sampled_from(["mem", "pids", "cpu_time", "cpus"]), st.sampled_from(["kernel", "watch", "none"])
            )
        ),
        started_at=start,
        started_monotonic=draw(_time),
        ended_at=start + 1,
        ended_monotonic=draw(_time),
        reason=draw(
            st.sampled_from(["exited", "timeout", "memory", "output", "cpu_time", "interrupted", "internal_error"])
        ),
        detail=draw(_text),
        exit_code=draw(st.integers(0, 255)),
        command_exit_status=draw(st.one_of(st.none(), st.integers(0, 255))),
        steps=steps,
        processes_seen=draw(st.integers(0, 999)),
        processes_stopped=draw(st.integers(0, 999)),
        remaining_pids=draw(st.lists(st.integers(1, 2**22), max_size=3)),
        verified=draw(st.booleans()),
        engine=engine,
        warnings=draw(st.lists(_text, max_size=2)),
        environment=draw(
            st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {
                        "cleared": st.booleans(),
                        "keep": st.lists(_text, max_size=2),
                        "drop": st.lists(_text, max_size=2),
                        "kept": st.lists(_text, max_size=2),
                        "dropped": st.lists(_text, max_size=2),
                    }
                ),
            )
        ),
        credentials=draw(st.lists(_text, max_size=2)),
        credentials_delivery=draw(st.sampled_from([None, "systemd", "corral"])),
    )
    return outcome


@settings(max_examples=200, deadline=None)
@given(outcomes())
def test_written_record_is_the_models_record(outcome):
    written = record_json.record_bytes(outcome)
    assert written.endswith(b"}\n")
    model = from_result(outcome)
    plain = json.loads(written)
    dumped = json.loads(model.model_dump_json())
    # Same values, types (5 is not 5.0 in JSON) and order, at every level:
    # compared as JSON text, re-serialised the same way.
    assert json.dumps(plain) == json.dumps(dumped)
    assert list(plain) == list(dumped)
    for key in ("limits", "steps", "engine"):
        assert list(plain[key]) == list(dumped[key]), key
    assert model.exact_argv == [str(a) for a in outcome.argv]


@pytest.mark.parametrize("guarantee", GUARANTEES)
@pytest.mark.parametrize("reason,verified", [("exited", True), ("internal_error", False), ("spawn_failed", True)])
def test_every_record_says_what_its_proof_covers(guarantee, reason, verified):
    """In every tier, verified or not (``verified`` says whether the proof held):
    the tier's sentence, from the run's guarantee (never its mode)."""
    outcome = RunOutcome(
        run_id="0" * 12,
        mode="fallback",
        guarantee=guarantee,
        argv=["true"],
        cwd="/",
        limits={"grace": 2, "verify_timeout": 2},
        reason=reason,
        verified=verified,
    )
    data = record_json.record_data(outcome)
    assert data["proof"] == GUARANTEE_PROOFS[guarantee] and data["verified"] is verified
    assert from_result(outcome).proof == GUARANTEE_PROOFS[guarantee]


@pytest.mark.parametrize(
    "flags,guarantee", [(["--cgroup-mode", "fallback"], "subreaper"), (["--guarantee", "pidns"], "pidns")]
)
def test_a_cli_records_proof_is_its_tiers(tmp_path, flags, guarantee):
    from modes import pidns_unavailable

    if guarantee == "pidns" and (why := pidns_unavailable()) is not None:
        pytest.skip(f"no pid namespace here: {why}")
    env = {**os.environ, "CORRAL_SERVICE": "0"}
    for argv, code in ((["true"], 0), (["/nonexistent/command"], 127)):
        out = subprocess.run(
            [sys.executable, "-m", "corral_systemd", *flags, "--no-registry", "--json", "-", "--", *argv],
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert out.returncode == code, out.stderr
        record = RunRecord.model_validate_json(out.stdout)
        assert record.guarantee == guarantee and record.proof == GUARANTEE_PROOFS[guarantee]


def test_cli_record_path_imports_no_pydantic(tmp_path):
    """What the pydantic-free writer is for: a CLI run with --json never loads it."""
    # client.main, not the entry point: that one leaves with os._exit (no teardown), before a print after it.
    script = (
        "import sys; from corral_systemd.client import main\n"
        "code = main(['--cgroup-mode', 'fallback', '--quiet', '--json', "
        f"{str(tmp_path / 'r.json')!r}, '--', 'true'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'), code)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[] 0", out
    RunRecord.model_validate_json((tmp_path / "r.json").read_text())
