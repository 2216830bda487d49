"""tests/vm/red-without-fixes takes fixes out of corral's source by text; a
pattern that no longer matches (code moved or reworded) would make it fail
only when someone runs it. Checked here, on every run, without the lane."""

import importlib.machinery
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _red_without_fixes():
    path = ROOT / "tests" / "vm" / "red-without-fixes"
    loader = importlib.machinery.SourceFileLoader("red_without_fixes", str(path))
    spec = importlib.util.spec_from_loader("red_without_fixes", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_mutant_pattern_is_in_the_source_once():
    mutants = _red_without_fixes().MUTANTS
    assert mutants
    for name, (path, edits, tests) in mutants.items():
        text = (ROOT / path).read_text()
        for pattern, _ in edits:
            assert text.count(pattern) == 1, f"mutant {name}: {pattern!r} is not in {path} exactly once"
        assert tests, name
