"""Smoke test of the proxy benchmark's ratio and table logic; nothing is timed."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from disagg_transforms.testing import SimulatedWorker

_BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
_PATH = _BENCHMARKS / "proxy.py"
sys.path.insert(0, str(_BENCHMARKS))  # proxy.py imports fast_worker.py beside it
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
    assert "| whole | 16 | proxy | 300 | 3.00 | 7.00 | 2.00 | 5.00 | - | - | - |" in table
    assert "| stream | 16 | 0.60 | >= 0.8 | **no** |" in table


def _figures(router: bool) -> list[object]:
    """Whole answers at c1, c16 and c64 and streams of 256 chunks at c1 and c16."""
    cpu = {"worker": 0.5, "pass-through": 2.0, "proxy": 1.5, "proxy (generate)": 4.0}
    cpu["proxy (generate, gateway)"] = 5.0
    if router:
        cpu["vllm-router"] = 0.5
    ttft = {"worker": 1.0, "pass-through": 2.0, "proxy": 2.0, "proxy (generate)": 5.5}
    ttft["proxy (generate, gateway)"] = 5.5
    ttft["vllm-router"] = 1.5
    results = []
    for target, ms in cpu.items():
        for concurrency in (1, 16, 64):
            scale = 2.0 if (target, concurrency) == ("proxy (generate)", 64) else 1.0
            results.append(bench.Result(target, "whole", 100.0, 1.0, 2.0, ms * scale, concurrency))
        results.extend(
            bench.Result(target, "stream", 10.0, 9.0, 9.0, 2 * ms, concurrency, ttft[target], 256)
            for concurrency in (1, 16)
        )
    return results


def test_the_floors_of_the_issue_are_the_ratios_of_the_right_rows() -> None:
    floors = bench.floors(_figures(router=True))
    assert "| `serve` default (3 calls) / pass-through (1 call), CPU per request, c16 | 2.00 |" in (
        floors
    )
    assert (
        "| `serve` decode only / pass-through, CPU per request, c16 | 0.75 | <= 0.8x | yes |"
        in (floors)
    )
    assert "| `serve` default / vllm-router P/D, CPU per request, c16 | 8.00 | <= 12x | yes |" in (
        floors
    )
    # 3 ms over 256 chunks against 1 ms over 256 chunks
    assert "decode only / vllm-router, c16 | 3.00 | <= 4x | yes |" in floors
    assert "| CPU per request c64 / c1, `serve` default | 2.00 | <= 1.5 | **no** |" in floors
    assert "over the worker, c1, p50 (ms) | 4.50 | <= 3 ms | **no** |" in floors
    # 5.0 ms against 4.0 ms a request: a cost the spread of the fixed target cannot hide
    assert (
        "| gateway mode / fixed URLs, `serve` default, CPU per request, c16 | 1.25 | <= 1.20x"
        " | **no** |" in floors
    )


def test_the_first_chunk_note_quotes_each_hop_of_this_run() -> None:
    note = " ".join(bench.first_chunk_note(_figures(router=True)).split())  # as wrapped
    # the worker's first chunk at 1 ms; the pass-through's and decode only's at 2, default's at 5.5
    assert "the pass-through, which only relays, adds 1.0 ms" in note
    assert "`serve` decode only 1.0 ms; `serve` default adds 4.5 ms" in note
    assert "its whole answers at c1 add 0.0 ms p50" in note
    # a run without a stream row says so instead of failing
    assert "adds - ms" in bench.first_chunk_note(_figures(router=True)[:3])


def test_without_vllm_router_its_floors_are_not_judged() -> None:
    floors = bench.floors(_figures(router=False))
    assert "| `serve` default / vllm-router P/D, CPU per request, c16 | - | <= 12x | - |" in floors
    assert bench.Result("x", "stream", 1.0, 1.0, 1.0, 2.56, 16, 1.0, 256).cpu_us_per_chunk == 10.0


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


def test_a_rerun_keeps_the_stacks_section_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "performance.md"
    stacks = f"{bench.STACKS_SECTION_START}\n## Choosing the proxy's HTTP stack\n\nthe table\n"
    old = f"# Performance\n\n{bench.SECTION_START}\nan older run\n\n{stacks}"
    doc.write_text(old, encoding="utf-8")
    monkeypatch.setattr(bench, "_DOC", doc)
    targets = ("worker", "pass-through", "proxy")
    bench.write(
        [bench.Result(t, m, 1.0, 1.0, 1.0) for m in ("whole", "stream") for t in targets], "cmd"
    )
    text = doc.read_text(encoding="utf-8")
    assert "an older run" not in text
    assert "`cmd`" in text
    assert text.endswith("\n\n" + stacks)


def test_a_rerun_of_the_stacks_benchmark_keeps_the_soak_section_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "proxy", bench)  # what stacks.py imports as ``proxy``
    spec = importlib.util.spec_from_file_location("stacks_benchmark", _PATH.with_stem("stacks"))
    assert spec is not None
    assert spec.loader is not None
    stacks = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, stacks)
    spec.loader.exec_module(stacks)
    doc = tmp_path / "performance.md"
    soak = f"{bench.SOAK_SECTION_START}\n## Memory over a long run\n\nthe figures\n"
    old = f"# Performance\n\n{bench.STACKS_SECTION_START}\nan older run\n\n{soak}"
    doc.write_text(old, encoding="utf-8")
    monkeypatch.setattr(stacks, "DOC", doc)
    monkeypatch.setattr(stacks, "section", lambda *_: f"{bench.STACKS_SECTION_START}\nnew\n")
    stacks.write({}, "cmd", 1)
    text = doc.read_text(encoding="utf-8")
    assert "an older run" not in text
    assert text == f"# Performance\n\n{bench.STACKS_SECTION_START}\nnew\n\n{soak}"


def test_each_target_answers_a_256_token_stream_and_its_cpu_is_read(tmp_path: Path) -> None:
    payload = bench.body(stream=True)
    with bench.servers(tmp_path, None) as targets:
        assert set(targets) == {
            "worker",
            "pass-through",
            "proxy",
            "proxy (generate)",
            "proxy (generate, gateway)",
        }
        for url, pid in targets.values():
            run = asyncio.run(bench.load(url + bench.PATH, payload, 2, 2))
            assert len(run.latencies) == 2
            # a role chunk, 256 token chunks (or 255 and a finish chunk), the usage/finish, [DONE]
            assert run.events >= bench.MAX_TOKENS
            assert bench.cpu_seconds(pid) > 0


def test_the_fast_worker_replays_the_simulated_workers_answer_for_any_request_id() -> None:
    import fast_worker  # noqa: PLC0415 - beside proxy.py, on the path set above

    replayer = fast_worker.Replayer(fast_worker.simulated_worker())

    async def ask() -> list[httpx.Response]:
        server = await asyncio.get_running_loop().create_server(replayer.connection, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                # the third of each kind as gateway mode sends it, with its pool's header
                return [
                    await client.post(
                        bench.PATH,
                        json={**orjson.loads(bench.body(stream=stream)), "request_id": f"r{n}"},
                        headers={"EPP-Profile": "decode"} if n == 3 else {},
                    )
                    for stream in (True, False)
                    for n in (1, 2, 3)
                ]
        finally:
            server.close()

    answers = asyncio.run(ask())
    assert [a.status_code for a in answers] == [200] * 6
    # one recording per kind, neither a request id nor a header being one: the rest are replayed
    assert len(replayer.replies) == 2
    assert answers[0].content == answers[1].content == answers[2].content
    assert answers[3].content == answers[4].content == answers[5].content
    assert answers[0].headers["content-type"].startswith("text/event-stream")
    assert answers[0].content.count(b"data:") >= bench.MAX_TOKENS
    assert answers[0].content.endswith(b"data: [DONE]\n\n")
    whole = answers[3].json()
    assert whole["object"] == "chat.completion"
    assert whole["usage"]["completion_tokens"] == bench.MAX_TOKENS


def test_the_sglang_floors_compare_with_the_vllm_pipeline_and_sglang_router() -> None:
    def row(target: str, mode: str, concurrency: int, cpu: float, chunks: int = 0) -> Any:
        return bench.Result(target, mode, 100.0, 1.0, 2.0, cpu, concurrency, None, chunks)

    vllm = [row(bench.GENERATE, "whole", 16, 1.0), row(bench.ROUTER, "whole", 16, 0.1)]
    sglang = [
        row(bench.SG_OURS, "whole", 1, 1.0),
        row(bench.SG_OURS, "whole", 16, 1.1),
        row(bench.SG_OURS, "whole", 64, 1.6),
        row(bench.SG_ROUTER, "whole", 16, 0.11),
        row(bench.SG_OURS, "stream 1k", 1, 2.0, 1000),
        row(bench.SG_ROUTER_GENERATE, "stream 1k", 1, 1.0, 1000),
    ]
    floors = bench.sglang_floors(sglang, vllm).splitlines()
    assert "| 1.10 | <= 1.2x | yes |" in floors[2]  # the vLLM pipeline, the same run
    assert "| 10.00 | reported | - |" in floors[3]  # sglang-router
    assert "| 10.00 | reported | - |" in floors[4]  # vllm-router beside it
    assert "| 1.60 | <= 1.5 | **no** |" in floors[5]  # c64 / c1
    assert "| 2.00 | <= 1.5x | **no** |" in floors[6]  # per chunk, 1k
    assert "| - | <= 1.5x | - |" in floors[7]  # 8k not measured


def test_the_fast_sglang_pair_meets_by_room_and_replays_for_any_rid_and_room() -> None:
    import fast_worker  # noqa: PLC0415 - beside proxy.py, on the path set above

    replayer = fast_worker.Replayer(fast_worker.sglang_worker("decode"))
    _, generate = bench.sglang_bodies(8, stream=False)

    async def ask() -> list[httpx.Response]:
        server = await asyncio.get_running_loop().create_server(replayer.connection, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                return [
                    await client.post(
                        "/generate",
                        json={**orjson.loads(generate), "rid": f"{n:032x}", "bootstrap_room": n},
                    )
                    for n in (1, 2)
                ]
        finally:
            server.close()

    first, second = asyncio.run(ask())
    assert first.status_code == 200, first.text
    assert len(replayer.replies) == 1
    assert first.content == second.content
    assert first.json()["meta_info"]["completion_tokens"] == 8
