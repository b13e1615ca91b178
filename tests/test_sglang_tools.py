"""Tools on an SGLang pipeline: the client's own route on SGLang's OpenAI server, or a 400.

In process, driven as test_sglang_exchange drives the exchange: simulated SGLang prefill and
decode workers serving SGLang's OpenAI routes, met by room (docs/sglang.md, "Tools"); and
through ``serve`` with the SDK, the workers as processes.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import httpx
import openai
import pytest
from helpers import WEATHER_TOOLS
from proxy_helpers import running
from test_sglang_exchange import _exchange, _Router, _settings, _workers

from disagg_transforms import parse_pipeline_params
from disagg_transforms.exchange import ClientReply, Exchange, Phase

_OWN_ROUTE = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=True)
_TOOLS_CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": WEATHER_TOOLS,
    "max_tokens": 64,
    "temperature": 0.7,
}


def _own_route(body: dict[str, Any]) -> Exchange:
    return Exchange(
        _OWN_ROUTE,
        "/v1/chat/completions",
        {},
        json.dumps(body).encode(),
        settings=_settings(),
        bootstrap_host="prefill",
    )


def test_a_tool_call_is_served_on_the_clients_route_by_sglangs_openai_server() -> None:
    prefill, decode, workers = _workers()
    outcome = asyncio.run(_Router(workers).run(_own_route(_TOOLS_CHAT)))
    assert outcome.status == 200, outcome.body
    # No render: both workers get the client's body on its route, with our rid and room.
    assert [call.step for call in outcome.calls] == [Phase.DECODE, Phase.PREFILL]
    decode_call, prefill_call = outcome.calls
    assert decode_call.path == prefill_call.path == "/v1/chat/completions"
    assert decode_call.body == prefill_call.body
    leg = json.loads(decode_call.body)
    assert {k: leg[k] for k in _TOOLS_CHAT} == _TOOLS_CHAT
    assert leg["bootstrap_host"] == "prefill"
    assert 1 <= leg["bootstrap_room"] <= 2**63 - 1
    assert decode_call.abort is not None
    assert json.loads(decode_call.abort.body) == {"rid": leg["rid"]}
    answer = outcome.json()
    openai.types.chat.ChatCompletion.model_validate(answer)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert len(prefill.calls_to("/v1/chat/completions")) == 1
    assert len(decode.calls_to("/v1/chat/completions")) == 1


def test_a_streamed_tool_call_is_relayed_as_sglang_wrote_it() -> None:
    _, _, workers = _workers()
    outcome = asyncio.run(_Router(workers).run(_own_route({**_TOOLS_CHAT, "stream": True})))
    assert outcome.status == 200, outcome.body
    events = [
        json.loads(line[6:])
        for line in outcome.body.decode().split("\n\n")
        if line.startswith("data: {")
    ]
    calls = [e["choices"][0]["delta"].get("tool_calls") for e in events if e["choices"]]
    named = next(call for call in calls if call)
    assert named[0]["function"]["name"] == "get_weather"
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert outcome.body.endswith(b"data: [DONE]\n\n")


def test_a_prefill_that_fails_on_the_clients_route_ends_the_request_at_once() -> None:
    _, decode, workers = _workers(fault="http-500")
    outcome = asyncio.run(_Router(workers).run(_own_route(_TOOLS_CHAT)))
    assert outcome.status == 502
    assert "Internal server error (simulated)" in outcome.json()["error"]["message"]
    assert decode.aborted == [json.loads(outcome.calls[0].body)["rid"]]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_tools_on_the_token_route_are_refused_naming_the_setting(path: str) -> None:
    tool = (
        {"name": "f", "input_schema": {"type": "object"}}
        if path == "/v1/messages"
        else {"type": "function", "name": "f", "parameters": {"type": "object"}}
        if path == "/v1/responses"
        else WEATHER_TOOLS[0]
    )
    conversation = "input" if path == "/v1/responses" else "messages"
    body = {
        "model": "m",
        conversation: [{"role": "user", "content": "Hi"}],
        "tools": [tool],
        "max_tokens": 16,
    }
    reply = _exchange(path, body).next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 400
    error = json.loads(reply.body)
    text = json.dumps(error)
    assert "use_openai_format: true" in text
    assert "tools" in text


def test_an_old_vllm_render_worker_does_not_change_the_refusal() -> None:
    settings = _settings()
    settings = type(settings)(engine=settings.engine, sglang=settings.sglang, vllm_version="0.32.0")
    body = {**_TOOLS_CHAT}
    reply = _exchange("/v1/chat/completions", body, settings).next_event()
    assert isinstance(reply, ClientReply)
    assert reply.status == 400
    assert "use_openai_format: true" in json.loads(reply.body)["error"]["message"]


def test_serve_with_the_setting_answers_the_sdks_tool_calls(tmp_path: pathlib.Path) -> None:
    sglang = ["simulate", "--engine", "sglang", "--port", "0", "--transfer-timeout", "5"]
    with running(
        ([*sglang, "--disaggregation-mode", "prefill", "--bootstrap-port", "0"], tmp_path / "p"),
        ([*sglang, "--disaggregation-mode", "decode"], tmp_path / "d"),
    ) as (prefill, decode):
        port = httpx.get(f"{prefill.url}/server_info").json()["disaggregation_bootstrap_port"]
        document = tmp_path / "pipeline.json"
        document.write_text(
            json.dumps(
                {
                    "engine": "sglang",
                    "sglang": {"bootstrap_port": port},
                    "steps": {"prefill": {}, "decode": {"use_openai_format": True}},
                }
            )
        )
        serve = ["serve", "--config", str(document), "--port", "0"]
        serve += ["--prefill-url", prefill.url, "--decode-url", decode.url]  # no render
        with running((serve, tmp_path / "serve")) as (ours,):
            client = openai.OpenAI(base_url=f"{ours.url}/v1", api_key="-", max_retries=0)
            messages: Any = _TOOLS_CHAT["messages"]
            tools: Any = WEATHER_TOOLS
            whole = client.chat.completions.create(model="m", messages=messages, tools=tools)
            with client.chat.completions.stream(
                model="m", messages=messages, tools=tools
            ) as stream:
                for _ in stream:
                    pass
                streamed = stream.get_final_completion()
            completion = client.completions.create(model="m", prompt="hi", max_tokens=4)
            client.close()
    for answer in (whole, streamed):
        assert answer.choices[0].finish_reason == "tool_calls"
        (call,) = answer.choices[0].message.tool_calls or []
        assert call.type == "function"
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert (completion.choices[0].text, completion.choices[0].finish_reason) == ("Hell", "length")
