"""Properties of the exchange: any client body and any worker answers end in a reply or a
library error; streams do not depend on how their bytes were split; nothing generate-only
reaches a client of another route."""

from __future__ import annotations

import json
import re
from typing import Any

from exchange_driver import drive, fixture_bytes, scripted
from golden import load_fixture, load_stream
from hypothesis import given
from hypothesis import strategies as st
from strategies import client_route_bodies, hostile_json_bytes, hostile_sse_streams

from disagg_transforms import DisaggTransformError, Step, parse_pipeline_params
from disagg_transforms.exchange import ClientReply, ClientStream, Exchange, WorkerCall

CONFIGS = [
    parse_pipeline_params(
        {"prefill": {}, "decode": {"wrap_chat_completion": True}}, use_openai_format=False
    ),
    parse_pipeline_params({"decode": {}}, use_openai_format=False),
    parse_pipeline_params({"decode": {"output_mode": "derender"}}, use_openai_format=False),
    parse_pipeline_params({"encode": {}, "prefill": {}, "decode": {}}),
]
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
GENERATE_ONLY = {"kv_transfer_params", "ec_transfer_params", "token_ids", "request_id"}
TRANSFER = {"kv_transfer_params", "ec_transfer_params"}
STREAM = load_stream("generate-stream-usage.sse")

good_answers = st.sampled_from(
    [
        fixture_bytes(name)
        for name in (
            "render-chat-response.json",
            "generate-prefill-response.json",
            "generate-decode-response.json",
            "response-derender-text.json",
            "chat-completion-coupled.json",
        )
    ]
)
statuses = st.sampled_from([200, 200, 200, 200, 400, 404, 429, 500, 503, 302, 700])
bodies = good_answers | hostile_json_bytes() | hostile_sse_streams() | st.just(STREAM)

MESSAGES = [{"role": "user", "content": "Hi"}]


@st.composite
def split(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _top_keys(reply: bytes) -> list[set[str]]:
    """The top-level keys of a JSON reply, or of each JSON event of an SSE reply."""
    payloads = [reply]
    if not reply.lstrip().startswith(b"{"):
        payloads = [line[6:] for line in reply.split(b"\n") if line.startswith(b"data: ")]
    found = []
    for payload in payloads:
        try:
            value = json.loads(payload)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(set(value))
            choices = value.get("choices")
            if isinstance(choices, list):
                # vLLM's own chat writes token_ids null, and so does the wrap: no value.
                found.extend(
                    {"token_ids"} if isinstance(c, dict) and c.get("token_ids") else set()
                    for c in choices
                )
    return found


@given(
    config=st.sampled_from(CONFIGS),
    route_body=client_route_bodies,
    raw_client=st.none() | hostile_json_bytes(),
    answers=st.lists(st.tuples(statuses, bodies), min_size=4, max_size=4),
    fail_at=st.none() | st.integers(0, 3),
    data=st.data(),
)
def test_any_request_and_any_answers_end_in_a_reply_or_a_library_error(  # noqa: PLR0917
    config: Any,
    route_body: tuple[str, dict[str, Any]],
    raw_client: bytes | None,
    answers: list[tuple[int, bytes]],
    fail_at: int | None,
    data: st.DataObject,
) -> None:
    path, body = route_body
    client = raw_client if raw_client is not None else json.dumps(body).encode()
    try:
        ex = Exchange(config, path, {}, client)
        for position, (status, answer) in enumerate(answers):
            event = ex.next_event()
            if not isinstance(event, WorkerCall):
                break
            if fail_at == position:
                ex.worker_failed(event.step, "timeout")
                break
            if not event.stream:
                ex.receive(status, {}, answer)
                continue
            ex.receive_stream_head(status, {})
            for chunk in data.draw(split(answer)):
                over = ex.reply_over
                sent = ex.feed(chunk)
                assert not (over and sent), "bytes after the reply was over"
            ex.end_of_stream()
            break
        final = ex.next_event()
    except DisaggTransformError:
        return
    if isinstance(final, WorkerCall):
        return  # more calls than answers drawn
    assert isinstance(final, (ClientReply, ClientStream))
    assert ex.reply_over
    assert 200 <= final.status < 600
    # Every client here is on another route than generate: no transfer params ever, and
    # nothing generate-only when the decode leg spoke the generate route.
    over_generate = path != "/v1/completions" and not config[Step.DECODE].use_openai_format
    forbidden = GENERATE_ONLY if over_generate else TRANSFER
    reply = final.body if isinstance(final, ClientReply) else final.first
    for keys in _top_keys(reply):
        assert not keys & forbidden, keys


@given(
    data=st.data(), route=st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages"])
)
def test_a_streamed_reply_does_not_depend_on_where_the_worker_bytes_were_split(
    data: st.DataObject, route: str
) -> None:
    render = {
        "/v1/chat/completions": "render-chat-response.json",
        "/v1/responses": "render-responses-response.json",
        "/v1/messages": "render-messages-response.json",
    }[route]
    body = json.dumps(
        {"model": "m", "stream": True, "max_tokens": 64, "messages": MESSAGES, "input": "hi"}
    ).encode()
    chunks = data.draw(split(STREAM))
    config = CONFIGS[0]

    def run(stream: list[bytes]) -> bytes:
        worker = scripted(
            {
                "render": (200, {}, fixture_bytes(render)),
                "prefill": (200, {}, fixture_bytes("generate-prefill-response.json")),
                "decode": (200, {}, stream),
            }
        )
        out = drive(Exchange(config, route, {"x-request-id": "r1"}, body), worker)
        assert out.streamed
        return re.sub(rb'"(created|created_at)":\d+', b"", out.body)

    assert run(chunks) == run([STREAM])
    assert load_fixture("generate-decode-response.json")  # the fixtures load unchanged


def test_a_generate_clients_stream_cut_at_every_position_gives_the_same_reply() -> None:
    config = parse_pipeline_params({"decode": {}}, use_openai_format=False)
    body = json.dumps({"token_ids": [1, 2], "stream": True}).encode()

    def run(chunks: list[bytes]) -> bytes:
        worker = scripted({"decode": (200, {}, chunks)})
        out = drive(Exchange(config, "/inference/v1/generate", {}, body), worker)
        assert out.streamed
        return out.body

    whole = run([STREAM])
    assert whole == STREAM  # vLLM's framing: the generate envelope byte for byte
    for cut in range(len(STREAM) + 1):
        assert run([STREAM[:cut], STREAM[cut:]]) == whole, cut
