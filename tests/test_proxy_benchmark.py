"""Smoke test of the proxy benchmark's ratio and table logic; nothing is timed."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import httpx
import orjson

from disagg_transforms.testing import SimulatedWorker

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
            ("proxy (generate)", 200.0, 4.0, 9.0),
        )
    ]
    table = bench.table(results)
    assert "| whole | proxy | 300 | 3.00 | 7.00 | 2.00 | 5.00 | - |" in table
    assert "| stream | 0.60 | >= 0.8 | **no** |" in table
    # The two-call pipeline is reported, never judged.
    assert "| stream, generate pipeline (two calls) | 0.40 | - | - |" in table


def test_the_request_is_a_chat_request_rendering_to_1k_tokens() -> None:
    chat = orjson.loads(bench.body(stream=True))
    assert chat["stream"] is True
    assert bench.PATH == "/v1/chat/completions"

    async def render() -> list[int]:
        worker = SimulatedWorker()
        transport = httpx.ASGITransport(app=worker)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            answer = await client.post("/v1/chat/completions/render", json=chat)
        token_ids: list[int] = answer.json()["token_ids"]
        return token_ids

    assert len(asyncio.run(render())) == 1024
