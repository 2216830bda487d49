"""Issue 13, item 9: the run record redacts what the registry redacts, and says so."""

import ast
import json
import os
from pathlib import Path

import corral_systemd as corral
from corral_systemd.common.redact import REDACTED, redact_argv

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "corral_systemd"
FB = ["--cgroup-mode", "fallback"]
SECRET = "hunter2-s3cr3t"
ARGV = [
    "sh",
    "-c",
    "exit 0",
    "sh",
    "--password",
    SECRET,
    f"API_TOKEN={SECRET}",
    f"Authorization: Bearer {SECRET}",
    f"https://u:{SECRET}@example.com/x",
    "plain",
]


def test_cli_record_redacts_like_the_registry(corral):
    from corral_systemd.state.registry import redact_argv as registry_redact

    run = corral(FB + ["--", *ARGV])
    assert run.returncode == 0, run.stderr
    record = run.record
    assert record["argv"] == registry_redact(ARGV) == redact_argv(ARGV)
    assert record["argv"][:5] == ARGV[:5] and record["argv"][-1] == "plain"
    assert record["argv"][5] == REDACTED
    assert record["argv_redacted"] is True
    assert SECRET not in json.dumps(record)


def test_cli_record_to_stdout_is_redacted_too(corral):
    run = corral(FB + ["--json", "-", "--", "true", f"--token={SECRET}"], record=False)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["argv"] == ["true", f"--token={REDACTED}"] and record["argv_redacted"] is True
    assert SECRET.encode() not in run.stdout


def test_nothing_to_redact_is_said_too(corral):
    run = corral(FB + ["--", "echo", "hello", "--verbose"])
    assert run.record["argv"] == ["echo", "hello", "--verbose"] and run.record["argv_redacted"] is False


def test_registry_entry_and_record_agree(corral):
    state = Path(os.environ["CORRAL_STATE_DIR"])
    run = corral(FB + ["--", *ARGV])
    entry = json.loads((state / f"{run.record['run_id']}.json").read_text())
    assert entry["command"] == run.record["argv"]


def test_library_result_is_redacted_and_keeps_the_exact_argv_out_of_dumps():
    result = corral.run(ARGV, mode="fallback")
    assert result.exit_code == 0
    assert result.argv == redact_argv(ARGV) and result.argv_redacted is True
    assert result.exact_argv == ARGV  # the caller's own argv, unredacted
    assert SECRET not in result.model_dump_json(exclude={"stdout", "stderr"})
    assert SECRET not in repr(result.model_dump())
    reread = type(result).model_validate_json(result.model_dump_json())
    assert reread.argv == result.argv and reread.exact_argv is None


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
            names.update("." * node.level + alias.name for alias in node.names if not node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_upward_import_of_the_registry():
    """The redaction lives in its own module: the record and the engines never import the registry."""
    assert _imports(PKG / "common" / "redact.py") == set()
    for path in [PKG / "core" / "record.py", *sorted((PKG / "engines").rglob("*.py"))]:
        assert not any(name.endswith("registry") for name in _imports(path)), path
