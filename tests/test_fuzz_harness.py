"""The fuzz harness (fuzz/fuzz_entry_points.py) runs clean over its seed corpus (no atheris)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fuzz_entry_points", FUZZ / "fuzz_entry_points.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


HARNESS = _harness()
SEEDS = sorted((FUZZ / "corpus").iterdir())


def test_every_target_has_seeds() -> None:
    seeded = {HARNESS.target_of(path.read_bytes())[0] for path in SEEDS}
    assert seeded == {name for name, _ in HARNESS.TARGETS}


@pytest.mark.parametrize("seed", SEEDS, ids=[path.name for path in SEEDS])
def test_one_input_over_the_seed_corpus(seed: Path) -> None:
    HARNESS.one_input(seed.read_bytes())


def test_a_finding_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness must not swallow what is not ours: a KeyError is a finding.
    def broken(_data: bytes) -> object:
        raise KeyError(_data)

    monkeypatch.setattr(HARNESS, "TARGETS", (("broken", broken),))
    with pytest.raises(KeyError):
        HARNESS.one_input(b"\x00{}")
