"""Smoke test of the benchmark: every runner agrees with the library; no timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import cases
import harness
import run


@pytest.mark.parametrize("case", cases.all_cases(), ids=lambda case: case.name)
def test_every_baseline_gives_the_library_s_output(case: cases.Case) -> None:
    payload = case.build()
    run.check_outputs(case, payload)  # raises AssertionError naming the runner that disagrees
    assert cases.LIBRARY in case.runners


def test_quick_run_measures_every_case_without_writing() -> None:
    rows = run.measure(quick=True, memory=False)
    assert [row.case for row in rows] == [case.name for case in cases.all_cases(quick=True)]
    assert all(
        set(row.seconds) == set(case.runners)
        for row, case in zip(rows, cases.all_cases(quick=True), strict=True)
    )
    assert "| case |" in run.table(rows)


def test_memory_probe_reports_growth_in_a_child() -> None:
    case = cases.all_cases(quick=True)[2]
    growth = harness.peak_rss_growth(case.name, cases.LIBRARY, case.build())
    assert growth >= 0
