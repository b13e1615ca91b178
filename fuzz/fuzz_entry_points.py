"""Coverage-guided fuzz target over the library's byte-taking entry points (atheris).

One input is one call: its first byte picks the target in :data:`TARGETS` (modulo their
number), the rest is the target's bytes. A target either parses the bytes itself (the stream
converters, the SSE parser) or decodes them as JSON the way a router would and hands the
value to a dict entry point. Our own errors (:class:`RequestError`,
:class:`UpstreamContractError`) are expected answers to bad input; anything else escaping is
a finding. Run it through ``fuzz/run.py``; ``tests/test_fuzz_harness.py`` runs
:func:`one_input` over the seed corpus so the harness cannot rot.

To fuzz a new bytes entry point, append one line to :data:`TARGETS` (append only: the corpus
files name their target by index).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import msgspec

from disagg_transforms import (
    AnthropicStreamConverter,
    ChatStreamConverter,
    DecodeParams,
    EnvelopeOptions,
    LegInputs,
    OutputMode,
    RequestError,
    ResponsesStreamConverter,
    Route,
    UpstreamContractError,
    apply_sampling_caps,
    build_decode_request,
    build_decode_request_bytes,
    wrap_anthropic_message,
    wrap_chat_completion,
    wrap_chat_completion_bytes,
    wrap_responses_response,
)
from disagg_transforms._wire.sse import SseParser

EXPECTED = (RequestError, UpstreamContractError)
"""What hostile input may raise; ConfigError cannot come from these fixed configurations."""

_DECODE = DecodeParams(use_openai_format=False)
_FIXED_CLOCK = 1_700_000_000.0


def _fixed_clock() -> float:
    return _FIXED_CLOCK


def _split(data: bytes) -> tuple[bytes, bytes]:
    # The first byte is where the stream is cut in two reads (converters must not care).
    if not data:
        return b"", b""
    cut = data[0] % (len(data))
    rest = data[1:]
    return rest[:cut], rest[cut:]


def _stream(make: Callable[[], Any]) -> Callable[[bytes], object]:
    def run(data: bytes) -> object:
        converter = make()
        head, tail = _split(data)
        return converter.feed(head) + converter.feed(tail) + converter.close()

    return run


def _sse(data: bytes) -> object:
    parser = SseParser(max_event_bytes=1 << 16)
    head, tail = _split(data)
    return [*parser.feed(head), *parser.feed(tail), *parser.close()]


def _json(call: Callable[[Any], object]) -> Callable[[bytes], object]:
    def run(data: bytes) -> object:
        try:
            value = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            return None  # the router's parser refuses it before the library sees it
        return call(value)

    return run


_CHAT_CLIENT = {"top_logprobs": 1, "stream_options": {"include_usage": True}}
_STREAM_OPTIONS = EnvelopeOptions(model="m", max_event_bytes=1 << 16)
_GENERATE = "/inference/v1/generate"
_INT64_MAX = 2**63 - 1


def _verdict(call: Callable[[], bytes | dict[str, Any]]) -> tuple[str, object]:
    try:
        return "ok", call()
    except EXPECTED as error:
        return type(error).__name__, error.param


def _in_int64(item: object) -> object:
    # What only the dict path's range bound refuses, as an ID inside it.
    whole = type(item) is int or (type(item) is float and item.is_integer())
    return 0 if whole and item > _INT64_MAX else item  # type: ignore[operator]


def token_ids_shape(data: bytes) -> object:
    """Differential: ``data`` as a generate body's ``token_ids``, on the bytes and dict paths.

    The bytes path proves the array's shape and leaves the range to the worker; the dict path
    also refuses IDs at or above 2**63. Apart from that bound, both must accept or refuse alike
    (refusals naming the same param) and accept the same IDs.

    Raises:
        AssertionError: the paths disagree (a finding).
    """
    body = b'{"token_ids": ' + data + b"}"
    try:
        value = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None  # not JSON (or numbers past what a parser reads): refused before either path
    ids = value.get("token_ids")
    if isinstance(ids, list):
        value["token_ids"] = [_in_int64(item) for item in ids]
    by_bytes = _verdict(
        lambda: build_decode_request_bytes(body, client_path=_GENERATE, params=_DECODE).body
    )
    by_dict = _verdict(
        lambda: build_decode_request(value, client_path=_GENERATE, params=_DECODE).body
    )
    if by_bytes[0] != by_dict[0] or (by_bytes[0] != "ok" and by_bytes != by_dict):
        msg = f"token_ids {data!r}: bytes path {by_bytes}, dict path {by_dict}"
        raise AssertionError(msg)
    if by_bytes[0] == "ok":
        sent = msgspec.json.decode(by_bytes[1])["token_ids"]  # type: ignore[arg-type]
        if sent != [int(item) for item in ids]:
            msg = f"token_ids {data!r}: the bytes path sent {sent!r}"
            raise AssertionError(msg)
    return by_bytes


TARGETS: tuple[tuple[str, Callable[[bytes], object]], ...] = (
    (
        "ChatStreamConverter",
        _stream(
            lambda: ChatStreamConverter(
                requested=OutputMode.TEXT,
                client_body=_CHAT_CLIENT,
                options=_STREAM_OPTIONS,
                created=1,
            )
        ),
    ),
    (
        "ResponsesStreamConverter",
        _stream(
            lambda: ResponsesStreamConverter(
                requested=OutputMode.TEXT, options=_STREAM_OPTIONS, created=1
            )
        ),
    ),
    (
        "AnthropicStreamConverter",
        _stream(
            lambda: AnthropicStreamConverter(
                requested=OutputMode.TEXT,
                client_body={"stop_sequences": ["x"]},
                options=_STREAM_OPTIONS,
            )
        ),
    ),
    ("SseParser", _sse),
    (
        "build_decode_request",
        _json(
            lambda v: build_decode_request(
                v, client_path="/v1/chat/completions", params=_DECODE, token_ids=[1, 2, 3]
            )
        ),
    ),
    (
        "wrap_chat_completion",
        _json(
            lambda v: wrap_chat_completion(
                v,
                requested=OutputMode.TEXT,
                client_body=_CHAT_CLIENT,
                options=EnvelopeOptions(clock=_fixed_clock),
            )
        ),
    ),
    (
        "wrap_responses_response",
        _json(
            lambda v: wrap_responses_response(
                v, requested=OutputMode.DERENDER, options=EnvelopeOptions(clock=_fixed_clock)
            )
        ),
    ),
    (
        "wrap_anthropic_message",
        _json(lambda v: wrap_anthropic_message(v, requested=OutputMode.DERENDER)),
    ),
    ("apply_sampling_caps", _json(lambda v: apply_sampling_caps(v, Route.CHAT_COMPLETIONS))),
    (
        "build_decode_request (generate client)",
        _json(
            lambda v: build_decode_request(v, client_path="/inference/v1/generate", params=_DECODE)
        ),
    ),
    # The bytes paths take the raw bytes themselves: no router-side parse in front of them.
    (
        "build_decode_request_bytes (generate client)",
        lambda data: build_decode_request_bytes(
            data, client_path="/inference/v1/generate", params=_DECODE
        ),
    ),
    (
        "build_decode_request_bytes (chat client)",
        lambda data: build_decode_request_bytes(
            data,
            client_path="/v1/chat/completions",
            params=_DECODE,
            inputs=LegInputs(token_ids=[1, 2, 3]),
        ),
    ),
    (
        "wrap_chat_completion_bytes",
        lambda data: wrap_chat_completion_bytes(
            data,
            requested=OutputMode.TEXT,
            client_body=_CHAT_CLIENT,
            options=EnvelopeOptions(clock=_fixed_clock),
        ),
    ),
    ("token_ids shape (bytes path against dict path)", token_ids_shape),
)


def target_of(data: bytes) -> tuple[str, Callable[[bytes], object]]:
    """The target an input names (its first byte), and the target's bytes."""
    return TARGETS[data[0] % len(TARGETS)] if data else TARGETS[0]


def one_input(data: bytes) -> None:
    """Run one fuzz input; anything but our expected errors propagates (a finding)."""
    _, call = target_of(data)
    try:
        call(data[1:])
    except EXPECTED:
        return


def main(argv: list[str]) -> None:
    """Run under atheris / libFuzzer with ``argv`` (``fuzz/run.py`` builds it)."""
    import atheris  # noqa: PLC0415 - only the fuzz run needs it, not the smoke test

    atheris.instrument_all()  # coverage of every loaded Python function, the library's included
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
