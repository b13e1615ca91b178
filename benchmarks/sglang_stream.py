"""SGLang's cumulative stream read in process: CPU per event of the reader, beside vLLM's stream.

Usage: ``python benchmarks/sglang_stream.py [--quick]`` prints a table (``docs/performance.md``,
"SGLang: `serve --engine sglang` beside sglang-router"). An SGLang ``/generate`` stream of 1k and
8k tokens as the simulated SGLang worker writes it (a token a byte, every event repeating the text
and the token IDs so far, orjson's bytes), with and without logprobs, fed event by event to
``SglangStreamReader`` (and in 256 KB reads that cut events anywhere, as ``serve`` reads them),
then also through the chat stream converter, and as the exchange relays it (``EngineRelay``: the
reader's plain chunks written by the converter from their text; ``serve --engine sglang``'s
per-chunk work in the library); beside it vLLM's generate stream of as many tokens through the
chat stream converter (``serve``'s). Times are medians of CPU time (``harness.median_seconds``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial

import harness
import orjson
import payloads

from disagg_transforms import OutputMode
from disagg_transforms._exchange.reply import EngineRelay
from disagg_transforms._response.dispatch import stream_converter
from disagg_transforms._response.sglang import SglangStreamReader
from disagg_transforms._routes import Route

_MAX_EVENT = 1 << 26
_EOS = 151_645
_READ = 1 << 18
_CLIENT = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


def sglang_stream(n_tokens: int, *, logprobs: bool = False) -> list[bytes]:
    """The events (``data: ...\\n\\n`` each) of a cumulative SGLang stream of ``n_tokens``."""
    events = []
    for count in range(1, n_tokens + 1):
        ids = [ord("x")] * (count - 1) + [_EOS] if count == n_tokens else [ord("x")] * count
        meta: dict[str, object] = {
            "id": "0" * 32,
            "finish_reason": {"type": "stop", "matched": _EOS} if count == n_tokens else None,
            "prompt_tokens": 32,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if logprobs:
            meta["output_token_logprobs"] = [[-0.25, token, "x"] for token in ids]
        meta.update(reasoning_tokens=0, completion_tokens=count, cached_tokens=0)
        text = "x" * (n_tokens - 1 if count == n_tokens else count)
        event = {"text": text, "output_ids": ids, "meta_info": meta}
        events.append(b"data: " + orjson.dumps(event) + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


def _read(events: list[bytes]) -> bytes:
    reader = SglangStreamReader(max_event_bytes=_MAX_EVENT)
    return b"".join([*map(reader.feed, events), reader.close()])


def _reads(events: list[bytes]) -> list[bytes]:
    """The stream as ``serve`` reads it: in reads that cut events anywhere (256 KB here)."""
    data = b"".join(events)
    return [data[at : at + _READ] for at in range(0, len(data), _READ)]


def _read_and_convert(events: list[bytes]) -> bytes:
    reader = SglangStreamReader(max_event_bytes=_MAX_EVENT)
    converter = stream_converter(
        Route.CHAT_COMPLETIONS, requested=OutputMode.TEXT, client_body=_CLIENT
    )
    out = [converter.feed(reader.feed(event)) for event in events]
    return b"".join([*out, converter.feed(reader.close()), converter.close()])


def _relayed(reads: list[bytes]) -> bytes:
    """As the exchange relays it: ``EngineRelay.feed_each`` over each read, chat converter."""
    converter = stream_converter(
        Route.CHAT_COMPLETIONS, requested=OutputMode.TEXT, client_body=_CLIENT
    )
    relay = EngineRelay(SglangStreamReader(max_event_bytes=_MAX_EVENT), converter)
    out = [b"".join(relay.feed_each(read)) for read in reads]
    return b"".join([*out, relay.close()])


def _convert(events: list[bytes]) -> bytes:
    converter = stream_converter(
        Route.CHAT_COMPLETIONS, requested=OutputMode.TEXT, client_body=_CLIENT
    )
    return b"".join([*map(converter.feed, events), converter.close()])


def _vllm_events(n_tokens: int) -> list[bytes]:
    return [event + b"\n\n" for event in payloads.generate_stream(n_tokens).split(b"\n\n") if event]


def measure(*, quick: bool) -> list[tuple[str, int, float]]:
    """``(case, events, us per event)`` for each case and size."""
    rows = []
    for n_tokens in (1024, 8192):
        stream, vllm = sglang_stream(n_tokens), _vllm_events(n_tokens)
        cases: dict[str, tuple[Callable[[list[bytes]], bytes], list[bytes]]] = {
            "SGLang cumulative, reader": (_read, stream),
            "SGLang cumulative, reader, 256 KB reads": (_read, _reads(stream)),
            "SGLang cumulative, reader + chat converter": (_read_and_convert, stream),
            "SGLang cumulative, as the exchange relays it, 256 KB reads": (
                _relayed,
                _reads(stream),
            ),
            "vLLM generate, chat converter": (_convert, vllm),
        }
        if n_tokens == 1024:  # at 8k tokens a stream with logprobs holds about 600 MB
            logprobs = sglang_stream(n_tokens, logprobs=True)
            cases["SGLang cumulative with logprobs, reader"] = (_read, logprobs)
        funcs: dict[str, Callable[[], object]] = {
            name: partial(f, e) for name, (f, e) in cases.items()
        }
        times = harness.median_seconds(funcs, repeats=3 if quick or n_tokens > 1024 else 7)
        rows += [
            (
                f"{name}, {n_tokens // 1024}k tokens",
                len(vllm if cases[name][0] is _convert else stream),
                seconds,
            )
            for name, seconds in times.items()
        ]
    return rows


def table(rows: list[tuple[str, int, float]]) -> str:
    lines = ["| case | events | us/event |", "|---|---|---|"]
    lines += [
        f"| {name} | {events} | {seconds / events * 1e6:.1f} |" for name, events, seconds in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args(argv)
    print(table(measure(quick=args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
