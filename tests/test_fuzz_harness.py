"""The fuzz harness (fuzz/fuzz_entry_points.py) runs clean over its seed corpus (no atheris)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from strategies import token_id_arrays

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


@given(array=token_id_arrays)
def test_token_ids_shape_is_judged_alike_on_both_paths(array: bytes) -> None:
    # The target raises AssertionError when the bytes and dict paths disagree.
    HARNESS.token_ids_shape(array)


@pytest.mark.parametrize(
    "array", [b"[1, 2]", b"[5.0, 1e19, 18446744073709551616]", b"[1, -2]", b"[1.5]", b"[]"]
)
def test_token_ids_shape_target_answers_both_paths_verdict(array: bytes) -> None:
    kind, _ = HARNESS.token_ids_shape(array)
    assert kind == ("RequestError" if array in {b"[1, -2]", b"[1.5]", b"[]"} else "ok")


def test_token_ids_shape_target_reports_a_disagreement(monkeypatch: pytest.MonkeyPatch) -> None:
    real = HARNESS.build_decode_request_bytes

    def rewrite(old: bytes, new: bytes) -> object:
        return lambda body, **kwargs: real(body.replace(old, new), **kwargs)

    monkeypatch.setattr(HARNESS, "build_decode_request_bytes", rewrite(b"2]", b"3]"))
    with pytest.raises(AssertionError, match="sent"):
        HARNESS.token_ids_shape(b"[1, 2]")
    monkeypatch.setattr(HARNESS, "build_decode_request_bytes", rewrite(b"2]", b"-2]"))
    with pytest.raises(AssertionError, match="dict path"):
        HARNESS.token_ids_shape(b"[1, 2]")  # refused on one path only
    monkeypatch.setattr(HARNESS, "build_decode_request_bytes", rewrite(b"[1, -2", b"[-1, 2"))
    with pytest.raises(AssertionError, match="dict path"):
        HARNESS.token_ids_shape(b"[1, -2]")  # refused on both, at different indexes


def test_token_ids_shape_target_skips_what_no_parser_reads() -> None:
    assert HARNESS.token_ids_shape(b"[1e400]") is None
