"""Smoke test of benchmarks/exchange.py: the replayed exchange is the live one; no timing."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import exchange
import fast_worker


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_replay_makes_the_three_calls_and_a_good_reply(stream: bool) -> None:
    body, answers = exchange.record(stream=stream)
    assert [answer.status for answer in answers] == [200, 200, 200]  # render, prefill, decode
    assert exchange.run_exchange(body, answers) > 0
    if stream:  # one chunk per event, each a `data:` line
        decode = answers[-1]
        assert len(decode.chunks) > fast_worker.MAX_TOKENS
        assert all(chunk.startswith(b"data: ") for chunk in decode.chunks)
    else:
        assert orjson.loads(answers[-1].chunks[0])["choices"]


def test_a_refused_replay_is_an_error_not_a_figure() -> None:
    body, answers = exchange.record(stream=False)
    broken = [*answers[:-1], exchange.Answer(200, (), (b'{"not": "a generate answer"}',))]
    with pytest.raises(AssertionError, match="refused"):
        exchange.run_exchange(body, broken)


def test_the_table_has_a_row_per_case() -> None:
    rows = [exchange.Row("whole", 3, 0, 2e-4, 3e-5), exchange.Row("streamed", 3, 257, 2e-3, 2e-4)]
    text = exchange.table(rows)
    assert text.count("\n") == 3
    assert "| streamed | 3 | 257 |" in text
