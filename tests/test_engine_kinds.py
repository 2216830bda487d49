"""engines/kinds.py declares each engine's kind once; the engines and corralctl read it."""

import pytest

from corral_systemd.core.record import RunRecord
from corral_systemd.engines.cgroupv2 import CgroupEngine
from corral_systemd.engines.fallback import FallbackEngine
from corral_systemd.engines.kinds import (
    GUARANTEE_MEANINGS,
    GUARANTEE_PROOFS,
    GUARANTEES,
    KINDS,
    MODES,
    leftovers_of,
)
from corral_systemd.engines.pidns import PidnsEngine
from corral_systemd.engines.systemd import SystemdEngine

ENGINES = (SystemdEngine, CgroupEngine, PidnsEngine, FallbackEngine)


def test_every_engine_has_one_kind_and_every_kind_an_engine():
    assert sorted(e.mode for e in ENGINES) == sorted(KINDS)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.mode)
def test_every_engine_names_a_declared_guarantee(engine):
    assert engine.guarantee in GUARANTEES


def test_every_guarantee_is_an_engines_and_says_what_it_means():
    assert set(GUARANTEE_MEANINGS) == set(GUARANTEES)
    # ... and what its proof covers (the record's ``proof``): one sentence each, none shared.
    assert set(GUARANTEE_PROOFS) == set(GUARANTEES)
    assert all(GUARANTEE_PROOFS.values()) and len(set(GUARANTEE_PROOFS.values())) == len(GUARANTEES)
    assert {e.guarantee for e in ENGINES} == set(GUARANTEES)


def test_the_record_takes_exactly_the_declared_guarantees():
    assert RunRecord.model_fields["guarantee"].annotation.__args__ == GUARANTEES


def test_a_pidns_run_leaves_nothing_once_its_corral_is_gone():
    assert leftovers_of({"mode": "pidns"}) == "namespace"
    assert KINDS["pidns"].reclaim_note


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.mode)
def test_a_run_found_by_its_sessions_is_one_whose_processes_carry_its_mark(engine):
    # Without a cgroup, only the mark proves a process the run's once corral is gone.
    assert engine.marks_processes == (KINDS[engine.mode].leftovers == "sessions")


def test_an_entry_of_no_known_kind_leads_nowhere():
    assert leftovers_of({"mode": "systemd"}) == "unit"
    assert leftovers_of({"mode": "bogus"}) is None
    assert leftovers_of({"mode": ["fallback"]}) is None  # an entry is a file the run's uid can write
    assert leftovers_of({}) is None


def test_the_record_takes_exactly_the_declared_modes():
    field = RunRecord.model_fields["mode"].annotation
    assert field.__args__ == MODES
