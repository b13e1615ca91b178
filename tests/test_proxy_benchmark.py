"""Smoke test of the proxy benchmark's ratio and table logic; nothing is timed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import orjson

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "proxy.py"
_SPEC = importlib.util.spec_from_file_location("proxy_benchmark", _PATH)
assert _SPEC is not None
assert _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # dataclasses look their module up there
_SPEC.loader.exec_module(bench)


def test_the_floor_is_eight_tenths_of_the_pass_through() -> None:
    assert bench.verdict(80.0, 100.0) == (0.8, True)
    assert bench.verdict(79.0, 100.0) == (0.79, False)
    assert bench.verdict(150.0, 100.0) == (1.5, True)
    assert bench.verdict(10.0, 0.0) == (0.0, False)


def test_the_table_adds_latency_over_the_worker_and_judges_each_mode() -> None:
    results = [
        bench.Result(target, mode, rps, p50, p99)
        for mode in ("whole", "stream")
        for target, rps, p50, p99 in (
            ("worker", 1000.0, 1.0, 2.0),
            ("pass-through", 500.0, 2.0, 4.0),
            ("proxy", 300.0, 3.0, 7.0),
        )
    ]
    table = bench.table(results)
    assert "| whole | proxy | 300 | 3.00 | 7.00 | 2.00 | 5.00 |" in table
    assert "| stream | 0.60 | >= 0.8 | **no** |" in table


def test_the_request_has_a_1k_token_prompt() -> None:
    assert len(orjson.loads(bench.body(stream=True))["token_ids"]) == 1024
