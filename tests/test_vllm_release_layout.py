"""Envelopes written as the workers' vLLM release writes them (docs/envelopes.md, "vLLM releases").

vLLM 0.33 and 0.32 write a few things differently (docs/testing.md has the table, each row read
from the release or seen on the real engine): with ``EnvelopeOptions(vllm_version="0.32.0")``,
or an exchange whose ``ExchangeSettings.vllm_version`` names 0.32, a client gets 0.32's layout.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from simulated_router import SimulatedRouter

from disagg_transforms import (
    ConfigError,
    EnvelopeOptions,
    ExchangeSettings,
    OutputMode,
    parse_pipeline_params,
    single_frame_responses_events,
    wrap_chat_completion,
    wrap_responses_response,
)
from disagg_transforms.testing import SimulatedWorker, WorkerSettings

_CUT = {
    "request_id": "generate-tokens-r1",
    "output_mode": "text",
    "model": "m",
    "created": 1796000000,
    "choices": [{"index": 0, "text": "Hel", "finish_reason": "length", "stop_reason": None}],
    "usage": {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3},
}
_033_ONLY_ECHO = {
    "prompt_cache_options",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
}
_032 = EnvelopeOptions(vllm_version="0.32.0")


@pytest.mark.parametrize(("options", "item_status"), [(None, "incomplete"), (_032, "completed")])
def test_a_cut_responses_answer_in_each_releases_layout(
    options: EnvelopeOptions | None, item_status: str
) -> None:
    client = {"model": "m", "input": "Hi", "max_output_tokens": 3}
    answer = wrap_responses_response(
        _CUT, requested=OutputMode.TEXT, client_body=client, options=options
    )
    assert answer["status"] == "incomplete"  # both releases
    assert answer["output"][0]["status"] == item_status
    assert (answer.keys() >= _033_ONLY_ECHO) is (options is None)
    events = single_frame_responses_events(
        _CUT, requested=OutputMode.TEXT, client_body=client, options=options
    )
    terminal = "response.incomplete" if options is None else "response.completed"
    assert events[-1]["type"] == terminal


def test_a_chat_choice_in_each_releases_layout() -> None:
    client = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    newer = wrap_chat_completion(_CUT, requested=OutputMode.TEXT, client_body=client)
    older = wrap_chat_completion(_CUT, requested=OutputMode.TEXT, client_body=client, options=_032)
    assert "weight_versions" in newer["choices"][0]
    assert "weight_versions" not in older["choices"][0]
    assert {**older["choices"][0], "weight_versions": None} == newer["choices"][0]


def test_a_bad_release_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"EnvelopeOptions\.vllm_version"):
        EnvelopeOptions(vllm_version="latest")


def _responses_stream(version: str | None) -> list[Any]:
    config = parse_pipeline_params({"decode": {"use_openai_format": False, "output_mode": "text"}})
    worker = SimulatedWorker(WorkerSettings(created=1796000000), first_byte_delay=0.01)
    router = SimulatedRouter(config, worker, settings=ExchangeSettings(vllm_version=version))
    body = {"model": "m", "input": "Hi", "max_output_tokens": 2, "stream": True}
    status, _, reply = asyncio.run(router.serve("/v1/responses", [], json.dumps(body).encode()))
    assert status == 200
    return [
        json.loads(line[len(b"data: ") :])
        for line in reply.split(b"\n")
        if line.startswith(b"data: ")
    ]


@pytest.mark.parametrize(
    ("version", "terminal"),
    [
        (None, "response.incomplete"),
        ("0.33.0", "response.incomplete"),
        ("0.32.0", "response.completed"),
    ],
)
def test_the_exchange_writes_the_workers_release(version: str | None, terminal: str) -> None:
    events = _responses_stream(version)
    assert events[-1]["type"] == terminal
    assert events[-1]["response"]["status"] == "incomplete"
