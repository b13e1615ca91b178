"""The chat stream converter against a real vLLM's own chat stream (captured from vLLM 0.32).

Each fixture in ``tests/fixtures/vllm-0.32-real/chat-stream-*.json`` holds one client request
sent twice to the same real worker: to its coupled ``/v1/chat/completions`` and, rendered, to
``/inference/v1/generate`` in text mode. The converter fed the generate stream must give the
coupled chat stream event for event, after the normalisation rules of docs/testing.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk

from disagg_transforms import ChatStreamConverter, EnvelopeOptions, OutputMode

_CAPTURES = sorted((Path(__file__).parent / "fixtures" / "vllm-0.32-real").glob("chat-stream-*"))
# The captures' release: the converter writes its layout (docs/envelopes.md, "Envelope options").
_VLLM_032 = EnvelopeOptions(vllm_version="0.32.0")


def _normalised(event: str) -> Any:
    """An event with what a router cannot reproduce left out (docs/testing.md, the rules)."""
    if event == "[DONE]":
        return event
    chunk = json.loads(event)
    for key in ("id", "created", "system_fingerprint"):  # the worker's own id, clock and config
        chunk.pop(key, None)
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    details.pop("created_cache_tokens", None)  # not reported by the generate route
    return chunk


def _per_choice(events: list[Any]) -> list[Any]:
    # With n > 1 the engine's interleaving of the choices is its own: compare each choice's
    # events in order (a stable sort keeps the order within a choice).
    def choice_of(event: Any) -> int:
        if isinstance(event, dict) and event["choices"]:
            return int(event["choices"][0]["index"])
        return 1 << 30  # usage and [DONE] stay last

    return sorted(events, key=choice_of)


def test_the_captures_are_there() -> None:
    assert len(_CAPTURES) >= 5


def _converted(capture: dict[str, Any], options: EnvelopeOptions) -> list[str]:
    """The converter's events (``data:`` payloads) for a capture's generate stream."""
    converter = ChatStreamConverter(
        requested=OutputMode.TEXT, client_body=capture["request"], options=options
    )
    sse = b"".join(f"data: {event}\n\n".encode() for event in capture["generate_events"])
    out = (converter.feed(sse) + converter.close()).decode()
    return [line[6:] for line in out.split("\n") if line.startswith("data: ")]


@pytest.mark.parametrize("path", _CAPTURES, ids=[path.stem for path in _CAPTURES])
def test_converted_generate_stream_is_vllms_chat_stream(path: Path) -> None:
    capture = json.loads(path.read_text(encoding="utf-8"))
    events = _converted(capture, _VLLM_032)
    theirs = [_normalised(event) for event in capture["chat_events"]]
    assert _per_choice([_normalised(event) for event in events]) == _per_choice(theirs)
    for event in events[:-1]:
        ChatCompletionChunk.model_validate_json(event)


def test_the_opening_chunk_carries_the_prompt_token_ids_when_asked() -> None:
    [path] = [path for path in _CAPTURES if path.stem.endswith("return-token-ids")]
    capture = json.loads(path.read_text(encoding="utf-8"))
    converter = ChatStreamConverter(requested=OutputMode.TEXT, client_body=capture["request"])
    sse = b"".join(f"data: {event}\n\n".encode() for event in capture["generate_events"])
    first = json.loads((converter.feed(sse)).split(b"\n\n")[0][6:])
    assert first["prompt_token_ids"] == capture["generate_request"]["token_ids"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("path", _CAPTURES, ids=[path.stem for path in _CAPTURES])
def test_on_033_each_finishing_chunk_writes_weight_versions_null(path: Path) -> None:
    # vLLM 0.33's chat route sets weight_versions on the finishing chunk's choice (null unless
    # the request asks return_weight_versions), and dumps chunks with exclude_unset: the key is
    # written there, after token_ids; 0.32 has no such field (the captures).
    capture = json.loads(path.read_text(encoding="utf-8"))
    on_032 = [_normalised(event) for event in _converted(capture, _VLLM_032)]
    on_033 = [_normalised(event) for event in _converted(capture, EnvelopeOptions())]
    finishing = 0
    for old, new in zip(on_032, on_033, strict=True):
        old_choices = old["choices"] if isinstance(old, dict) else []
        if old_choices and old_choices[0]["finish_reason"] is not None:
            finishing += 1
            assert list(new["choices"][0])[-2:] == ["token_ids", "weight_versions"]
            old_choices[0]["weight_versions"] = None
        assert new == old
    assert finishing == int(capture["request"].get("n", 1))
