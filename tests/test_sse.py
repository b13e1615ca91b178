from __future__ import annotations

import pytest
from golden import load_stream
from hypothesis import given
from hypothesis import strategies as st
from strategies import sse_streams

from disagg_transforms import UpstreamContractError
from disagg_transforms._wire.sse import SseParser, format_sse_event


def _feed_all(parser: SseParser, pieces: list[bytes]) -> list[bytes]:
    return [payload for piece in pieces for payload in parser.feed(piece)]


def test_golden_stream_payloads() -> None:
    payloads = SseParser().feed(load_stream("stream-text.sse"))
    assert len(payloads) == 5
    assert payloads[-1] == b"[DONE]"
    assert payloads[0].startswith(b'{"request_id":"generate-tokens-r1"')


@pytest.mark.parametrize("name", ["stream-text.sse", "stream-text-error.sse"])
def test_every_byte_boundary_gives_the_same_payloads(name: str) -> None:
    stream = load_stream(name)
    whole = SseParser().feed(stream)
    for cut in range(len(stream) + 1):
        parser = SseParser()
        assert _feed_all(parser, [stream[:cut], stream[cut:]]) == whole
        assert parser.close() == []
    one_by_one = SseParser()
    assert _feed_all(one_by_one, [bytes([b]) for b in stream]) == whole


def test_line_endings_comments_fields_and_multiline_data() -> None:
    stream = b": hi\r\nevent: x\r\ndata: a\r\ndata:b\r\n\r\nid: 1\n\ndata\rdata: c\r\r"
    parser = SseParser()
    # The last "\r" could be half of a "\r\n" until the stream ends.
    assert parser.feed(stream) == [b"a\nb"]
    assert parser.close() == [b"\nc"]
    one_by_one = SseParser()
    pieces = [stream[i : i + 1] for i in range(len(stream))]
    assert [*_feed_all(one_by_one, pieces), *one_by_one.close()] == [b"a\nb", b"\nc"]


def test_crlf_split_between_feeds_is_one_line_end() -> None:
    parser = SseParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r") == []
    assert parser.feed(b"\n") == [b"x"]


def test_multibyte_character_split_anywhere() -> None:
    stream = 'data: {"t":"é😀"}\n\n'.encode()
    for cut in range(len(stream) + 1):
        assert _feed_all(SseParser(), [stream[:cut], stream[cut:]]) == ['{"t":"é😀"}'.encode()]


def test_event_size_is_bounded() -> None:
    parser = SseParser(max_event_bytes=16)
    parser.feed(b"data: 0123456789\n")
    with pytest.raises(UpstreamContractError) as caught:
        parser.feed(b"data: 0123456789\n")
    assert caught.value.status_hint == 502
    with pytest.raises(UpstreamContractError):
        SseParser(max_event_bytes=16).feed(b"data: " + b"x" * 32)


@pytest.mark.parametrize("tail", [b"data: {", b"data: {}\n", b"data: {}\r"])
def test_close_refuses_a_stream_cut_mid_event(tail: bytes) -> None:
    parser = SseParser()
    parser.feed(tail)
    with pytest.raises(UpstreamContractError):
        parser.close()


def test_format_is_compact_json() -> None:
    assert (
        format_sse_event({"a": [1, "é"], "b": None}) == 'data: {"a":[1,"é"],"b":null}\n\n'.encode()
    )


def test_format_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(UpstreamContractError):
        format_sse_event({"a": object()})


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_random_splits_match_whole_feed(stream: bytes, cuts: list[int]) -> None:
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert _feed_all(SseParser(), pieces) == SseParser().feed(stream)


def _fed(pieces: list[bytes]) -> tuple[list[bytes], list[bytes] | str]:
    # The payloads, then what close() gives or the error it raises.
    parser = SseParser()
    payloads = _feed_all(parser, pieces)
    try:
        return payloads, parser.close()
    except UpstreamContractError as error:
        return payloads, str(error)


@given(sse_streams, st.lists(st.integers(0, 200), max_size=6))
def test_fast_path_and_general_reader_agree_for_any_split(stream: bytes, cuts: list[int]) -> None:
    # Fed one byte at a time, no feed holds a whole event: only the general reader runs. Fed in
    # pieces, the regular events are cut out by the fast path: the same payloads must come out.
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    one_by_one = _fed([stream[i : i + 1] for i in range(len(stream))])
    assert _fed(pieces) == one_by_one
    assert _fed([stream]) == one_by_one


def test_an_event_cut_by_a_read_is_ended_by_the_next_one() -> None:
    # A cumulative SGLang event is tens of KB: the reads cut most of them. The next read ends
    # the held line, then its own whole events are cut out as usual.
    parser = SseParser()
    assert parser.feed(b'data: {"text":"ab') == []
    assert parser.feed(b'c"}\n\ndata: {"b":2}\n\ndata: [DO') == [b'{"text":"abc"}', b'{"b":2}']
    assert parser.feed(b"NE]\n") == []  # one line end: the event may still go on
    assert parser.feed(b"\n") == [b"[DONE]"]
    assert parser.close() == []
    # A held line that is not one data line is the line reader's, as before.
    parser = SseParser()
    assert parser.feed(b"data: 1\ndata: ") == []
    assert parser.feed(b"2\n\n") == [b"1\n2"]
    parser = SseParser()
    assert parser.feed(b": a comment, then data: x") == []
    assert parser.feed(b"\n\ndata: y\n\n") == [b"y"]


def _fed_held_first(pieces: list[bytes]) -> tuple[list[bytes], list[bytes] | str]:
    # Each read: the held event ended by feed_held, the rest fed; else all of it fed.
    parser, payloads = SseParser(), list[bytes]()
    for piece in pieces:
        at = parser.feed_held(piece, payloads)
        parser.feed_into(piece[at:] if at > 0 else piece, payloads)
    try:
        return payloads, parser.close()
    except UpstreamContractError as error:
        return payloads, str(error)


@given(sse_streams, st.lists(st.integers(0, 200), max_size=6))
def test_an_event_ended_by_feed_held_then_the_rest_fed_gives_the_same_payloads(
    stream: bytes, cuts: list[int]
) -> None:
    # A reader that cuts a read's events itself (SGLang's) starts where feed_held says.
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert _fed_held_first(pieces) == _fed(pieces)


def test_feed_held_says_where_a_reads_whole_events_start() -> None:
    parser, payloads = SseParser(), list[bytes]()
    assert parser.feed_held(b"data: 1\n\n", payloads) == 0  # nothing held
    parser.feed_into(b"data: 1\n\ndata: 2", payloads)
    assert parser.feed_held(b"3\n\ndata: 4\n\n", payloads) == 3
    assert payloads == [b"1", b"23"]
    parser.feed_into(b"data: 5", payloads)
    assert parser.feed_held(b"6\r\n\r\n", payloads) == -1  # another framing: feed_into's
    assert parser.feed_held(b"6\n", payloads) == -1  # the event does not end in it
    assert payloads == [b"1", b"23"]


def test_feed_into_keeps_the_events_before_one_past_the_bound() -> None:
    parser = SseParser(max_event_bytes=64)
    payloads: list[bytes] = []
    with pytest.raises(UpstreamContractError, match="grew past 64 bytes"):
        parser.feed_into(b"data: 1\n\ndata: 2\n\ndata: " + b"x" * 80, payloads)
    assert payloads == [b"1", b"2"]


def test_bytes_like_feeds_give_bytes_payloads() -> None:
    # A router may hand on its HTTP client's buffers as they are.
    stream = b'data: {"a":1}\n\ndata: [DONE]\n\n'
    for piece in (bytearray(stream), memoryview(stream)):
        payloads = SseParser().feed(piece)
        assert payloads == [b'{"a":1}', b"[DONE]"]
        assert all(type(payload) is bytes for payload in payloads)
