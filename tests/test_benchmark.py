"""Smoke test of the benchmark: every runner agrees with the library; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pydantic")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import cases
import harness
import proxy
import run
import sglang_stream


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


def _row(case: str, lib: float, baselines: dict[str, float]) -> run.Row:
    seconds = {cases.LIBRARY: lib, **baselines}
    return run.Row(case=case, size=1000, seconds=seconds, rss={cases.LIBRARY: 1500})


def test_targets_table_marks_each_floor_met_or_missed() -> None:
    rt, scan, pydantic, stdlib, converter = (
        cases.ORJSON_ROUND_TRIP,
        cases.SYNTAX_SCAN,
        cases.PYDANTIC,
        cases.STDLIB,
        cases.ORJSON_CONVERTER,
    )
    rows = [
        # 32k: 0.1x the round trip (met), 4x faster than pydantic (missed)
        _row("decode leg, generate 32k tokens", 1.0, {rt: 10, scan: 1, pydantic: 4, stdlib: 40}),
        # 128k: 4x the syntax scan (missed), 10x faster than pydantic (met)
        _row("decode leg, generate 128k tokens", 4.0, {rt: 40, scan: 1, pydantic: 40, stdlib: 80}),
        # 1k: 2x the round trip (missed)
        _row("decode leg, generate 1k tokens", 2.0, {rt: 1, scan: 1, pydantic: 1, stdlib: 1}),
        _row("stream, chat converter, 512 tokens", 1.4, {converter: 1}),
        _row("stream, Anthropic converter, 512 tokens", 2.1, {converter: 1}),
    ]
    lines = run.targets(rows).splitlines()
    by_key = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in lines[2:]}
    assert by_key[("decode leg, generate 32k tokens", "pydantic/lib")].endswith("| **no** |")
    assert by_key[("decode leg, generate 128k tokens", "lib/scan")].endswith("| **no** |")
    assert by_key[("decode leg, generate 32k tokens", "lib/orjson rt")].endswith("| yes |")
    assert by_key[("decode leg, generate 1k tokens", "lib/orjson rt")].endswith("| **no** |")
    assert "| 1.50 | yes |" in by_key[("decode leg, generate 128k tokens", "peak RSS (x body)")]
    assert by_key[("library 128k / 32k", "time")].endswith("| 4.00 | yes |")
    chat = by_key[("stream, chat converter, 512 tokens", "lib/orjson converter")]
    assert chat.endswith("| <= 1.5 | 1.40 | yes |")
    anthropic = by_key[("stream, Anthropic converter, 512 tokens", "lib/orjson converter")]
    assert anthropic.endswith("| <= 2 | 2.10 | **no** |")
    assert not any("wrap" in line or "Responses" in line for line in lines)  # not in the run


def test_stream_table_reports_time_per_chunk() -> None:
    row = run.Row(
        case="stream, chat converter, 512 tokens",
        size=2048,
        seconds={cases.LIBRARY: 0.003, cases.ORJSON_CONVERTER: 0.002},
        rss={},
        items=1000,
    )
    assert run.stream_table([row]).splitlines()[2].endswith("| 2 KiB | 1000 | 3.00 | 2.00 | 1.50 |")
    assert "stream" not in run.table([row])  # the decode-leg and wrap table leaves it out


def test_a_case_timed_in_several_processes_reads_each_runner_s_median() -> None:
    def row(case: str, library: float, round_trip: float, rss: int) -> run.Row:
        seconds = {cases.LIBRARY: library, cases.ORJSON_ROUND_TRIP: round_trip}
        return run.Row(case=case, size=10, seconds=seconds, rss={cases.LIBRARY: rss})

    runs = [
        [row("a", 5.0, 1.0, 7), row("b", 2.0, 9.0, 8)],
        [row("a", 1.0, 3.0, 0), row("b", 4.0, 8.0, 0)],
        [row("a", 3.0, 2.0, 0), row("b", 3.0, 7.0, 0)],
    ]
    combined = run.combine(runs)
    assert [r.case for r in combined] == ["a", "b"]
    assert combined[0].seconds == {cases.LIBRARY: 3.0, cases.ORJSON_ROUND_TRIP: 2.0}
    assert combined[1].seconds == {cases.LIBRARY: 3.0, cases.ORJSON_ROUND_TRIP: 8.0}
    assert [r.rss for r in combined] == [{cases.LIBRARY: 7}, {cases.LIBRARY: 8}]  # the first's
    with pytest.raises(ValueError, match="zip"):
        run.combine([runs[0], runs[1][:1]])


def test_a_full_run_times_each_phase_in_three_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The children are stood in for (no timing): three a phase, RSS asked of the first only.
    calls: list[list[str]] = []

    def child(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        phase = args[args.index("--phase") + 1]
        row = run.Row(case=phase, size=1, seconds={cases.LIBRARY: float(len(calls))}, rss={})
        return subprocess.CompletedProcess(args, 0, stdout=json.dumps([asdict(row)]))

    monkeypatch.setattr(subprocess, "run", child)  # the module run.py calls it through
    rows = run.measure_apart(quick=False, memory=True)
    assert len(calls) == 3 * len(cases.PHASES)
    for index, args in enumerate(calls):
        assert ("--no-memory" in args) is (index % 3 != 0)
    # Each phase's row is the median of its three children (call numbers 3k+1..3k+3).
    assert [row.seconds[cases.LIBRARY] for row in rows] == [
        3.0 * phase + 2 for phase in range(len(cases.PHASES))
    ]


def test_each_phase_runs_in_its_own_child() -> None:
    rows = run.measure_apart(quick=True, memory=False)
    assert [row.case for row in rows] == [case.name for case in cases.all_cases(quick=True)]
    assert {case.phase for case in cases.all_cases()} == set(cases.PHASES)


def test_a_rerun_keeps_the_proxy_benchmark_s_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nthe tables of an older run\n", encoding="utf-8")
    monkeypatch.setattr(run, "_DOC", doc)
    monkeypatch.setattr(proxy, "_DOC", doc)
    proxy.write(
        [
            proxy.Result(target, mode, 100.0, 1.0, 2.0)
            for mode in ("whole", "stream")
            for target in ("worker", "pass-through", proxy.ONE_CALL, proxy.GENERATE)
        ]
    )
    section = doc.read_text(encoding="utf-8").partition(proxy.SECTION_START)[2]
    monkeypatch.setattr(run, "measure_apart", lambda **_: [])  # no timing: the page's text only
    assert run.main(["--quick"]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "an older run" not in text
    assert text.endswith(proxy.SECTION_START + section)
    assert text.count(proxy.SECTION_START) == 1


def test_a_rerun_keeps_the_notes_written_by_hand_after_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "performance.md"
    notes = f"{run.HAND_WRITTEN_START}\n## A note\n\nwritten by hand\n\n"
    proxy_section = f"{proxy.SECTION_START}\n## The proxy\n\nits tables\n"
    doc.write_text(f"# Performance\n\nthe tables of an older run\n\n{notes}{proxy_section}")
    monkeypatch.setattr(run, "_DOC", doc)
    monkeypatch.setattr(run, "measure_apart", lambda **_: [])  # no timing: the page's text only
    assert run.main(["--quick"]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "an older run" not in text
    assert text.endswith(notes + proxy_section)
    assert text.count(run.HAND_WRITTEN_START) == 1


def test_every_real_shape_case_has_its_floor() -> None:
    names = {case.name for case in cases.all_cases()}
    floors = {(target.case, target.ratio): target.bound for target in run.TARGETS}
    for size, bound in (("256", None), ("1k", 1.5), ("32k", 0.45), ("128k", 0.40)):
        for name in cases.real_shape_decode_cases(size):
            assert name in names
            assert floors.get((name, "lib/orjson rt")) == bound
    assert floors[("wrap, text 256 tokens, full client body", "lib/orjson rt")] == 0.8
    assert floors[("wrap, text 8k tokens + logprobs", "lib/msgspec")] == 1.15
    row = _row("wrap, text 8k tokens + logprobs", 1.1, {cases.SYNTAX_SCAN: 0.5, cases.MSGSPEC: 1})
    lines = run.targets([row]).splitlines()
    assert "| lib/msgspec | <= 1.15 | 1.10 | yes |" in next(x for x in lines if "msgspec" in x)


def test_the_sglang_stream_benchmark_turns_its_streams_into_the_chat_deltas() -> None:
    for logprobs in (False, True):
        out = sglang_stream._read_and_convert(sglang_stream.sglang_stream(64, logprobs=logprobs))
        chunks = [line[6:] for line in out.decode().split("\n\n") if line.startswith("data: {")]
        text = "".join(
            orjson.loads(c)["choices"][0]["delta"].get("content", "") for c in chunks[:-1]
        )
        assert text == "x" * 63
    assert "| case | events | us/event |" in sglang_stream.table([("case", 2, 1e-6)])


def test_the_sglang_stream_benchmark_relays_what_the_reader_then_converter_write() -> None:
    # "as the exchange relays it" (plain chunks written by the converter from their text, the
    # stream in reads that cut events anywhere): the chunks of reader then converter.
    def chunks(out: bytes) -> list[object]:
        events = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line[6:7] == b"{"]
        return [{**event, "created": 0} for event in events]

    stream = sglang_stream.sglang_stream(1024)
    relayed = sglang_stream._relayed(sglang_stream._reads(stream))
    assert chunks(relayed) == chunks(sglang_stream._read_and_convert(stream))
    assert relayed.endswith(b"data: [DONE]\n\n")


@given(st.lists(st.integers(0, 80), max_size=40))
def test_the_load_generator_counts_each_event_once_wherever_the_reads_cut(cuts: list[int]) -> None:
    events = (b"data: " + b"x" * size + b"\n\n" for size in (0, 3, 40))
    stream = b"".join(events) + b"data: [DONE]\n\n"
    points = sorted({min(cut, len(stream)) for cut in cuts})
    reads = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    counted = proxy.EventCount()
    for read in reads:
        counted.feed(read)
    assert counted.count == 4
