"""``serve`` knows its workers' vLLM release before any leg (docs/proxy.md, "vLLM versions").

Every process is its own: ``simulate --vllm-version 0.32.0`` plays a vLLM 0.32 worker (no
``derender``), ``serve`` in front of it learns the release from its ``GET /version`` at startup
(or before its first request when the worker was not up yet), and a tool-using client is served
on the worker's own route. The last tests run the same against a real vLLM 0.32 when one is
given (``DISAGG_REAL_VLLM_URL``; marked ``real_vllm``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
import httpx
from proxy_helpers import Server, command, environment, refused, running, start, wait_ready

CHAT = "/v1/chat/completions"
GENERATE = "/inference/v1/generate"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
MESSAGES = [{"role": "user", "content": "Weather?"}]
_REAL = os.environ.get("DISAGG_REAL_VLLM_URL")
_REAL_PD = os.environ.get("DISAGG_REAL_VLLM_PD_URLS")  # "prefill,decode" over ExampleConnector


def _paths(worker: Server) -> list[str]:
    """The paths of the calls ``worker`` logged (``simulate --log-calls``)."""
    calls = []
    for line in worker.log().splitlines():
        _, marker, payload = line.partition(" disagg_transforms.testing: call ")
        if marker:
            calls.append(json.loads(payload))
    return [f"{call['method']} {call['path']}" for call in calls]


@pytest.fixture(scope="module")
def worker_032(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logs = tmp_path_factory.mktemp("versions")
    args = ["simulate", "--port", "0", "--log-calls", "--vllm-version", "0.32.0"]
    with running((args, logs / "worker.log")) as [worker]:
        yield worker


def _chat(url: str, **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 8, **extra}
    return httpx.post(url + CHAT, json=body, timeout=30)


def test_serve_asks_the_release_at_startup_and_serves_tools_on_the_clients_route(
    worker_032: Server, tmp_path: Path
) -> None:
    before = len(_paths(worker_032))
    args = ["serve", "--port", "0", "--prefill-url", worker_032.url, "--decode-url", worker_032.url]
    with running((args, tmp_path / "serve.log")) as [proxy]:
        startup = _paths(worker_032)[before:]
        tools = _chat(proxy.url, tools=TOOLS)
        after_tools = _paths(worker_032)[before:]
        plain = _chat(proxy.url)
        after_plain = _paths(worker_032)[before:]
    assert startup == ["GET /version"]
    assert tools.status_code == 200, tools.text
    # render and prefill on generate, then decode on the worker's own chat route.
    assert after_tools[1:] == [f"POST {CHAT}/render", f"POST {GENERATE}", f"POST {CHAT}"]
    assert tools.json()["object"] == "chat.completion"
    assert "kv_transfer_params" not in tools.json()
    assert plain.status_code == 200, plain.text
    assert after_plain[len(after_tools) :] == [
        f"POST {CHAT}/render",
        f"POST {GENERATE}",
        f"POST {GENERATE}",
    ]


def test_a_derender_step_against_032_stops_serve_at_startup(
    worker_032: Server, tmp_path: Path
) -> None:
    document = tmp_path / "derender.json"
    steps = {"decode": {"output_mode": "derender", "wrap_chat_completion": True}}
    document.write_text(json.dumps({"use_openai_format": False, "steps": steps}))
    line = refused("--config", str(document), "--decode-url", worker_032.url)
    assert line == (
        'disagg-transforms: error: decode.output_mode: "derender" needs vLLM >= 0.33.0, and the '
        "workers run vLLM 0.32.0; use output_mode: auto (a request with tools is then decoded "
        "on the client's own route)"
    )
    # Given, the release is not asked: the same line with no worker at all.
    given = refused(
        "--config", str(document), "--decode-url", "http://127.0.0.1:9", "--vllm-version", "0.32.0"
    )
    assert given == line
    versioned = {"vllm_version": "0.32.0", "use_openai_format": False, "steps": steps}
    document.write_text(json.dumps(versioned))
    # Named in the document, it is the document's error, as check-config names it.
    message = line.removeprefix("disagg-transforms: error: ")
    served = refused("--config", str(document), "--decode-url", "http://127.0.0.1:9")
    assert served == f"{document}: {message}"
    checked = subprocess.run(  # noqa: S603 - our own interpreter and command
        command("check-config", str(document)),
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
        check=False,
    )
    assert (checked.returncode, checked.stderr.strip()) == (2, served)


def test_a_bad_release_is_refused() -> None:
    assert "--vllm-version: expected a vLLM release such as 0.32.0, got latest" in refused(
        "--decode-url", "http://127.0.0.1:9", "--vllm-version", "latest"
    )


def test_a_worker_not_up_at_startup_is_asked_before_the_first_request(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, not listening: refused until the worker takes it
    port = holder.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with running((["serve", "--port", "0", "--decode-url", url], tmp_path / "serve.log")) as [
        proxy
    ]:
        assert "version call to" in proxy.wait_for_log("failed")
        holder.close()
        args = ["simulate", "--port", str(port), "--log-calls", "--vllm-version", "0.32.0"]
        worker = wait_ready(start(args, tmp_path / "worker.log"))
        try:
            tools = _chat(proxy.url, tools=TOOLS)
            again = _chat(proxy.url, tools=TOOLS)
        finally:
            worker.stop()
    assert (tools.status_code, again.status_code) == (200, 200), tools.text
    # Asked once, then the tools went to the worker's own route (no render, no derender).
    assert _paths(worker) == ["GET /version", f"POST {CHAT}", f"POST {CHAT}"]


def test_serve_simulate_plays_the_release_given(tmp_path: Path) -> None:
    args = ["serve", "--port", "0", "--simulate", "--vllm-version", "0.32.0"]
    with running((args, tmp_path / "serve.log")) as [proxy]:
        version = httpx.get(proxy.url + "/version", timeout=30).json()
        tools = _chat(proxy.url, tools=TOOLS)
    assert version == {"version": "0.32.0"}
    assert tools.status_code == 200, tools.text


@pytest.mark.real_vllm
@pytest.mark.skipif(
    _REAL is None, reason="no real vLLM: set DISAGG_REAL_VLLM_URL (docs/testing.md)"
)
def test_tools_through_serve_against_a_real_032_as_its_own_route(tmp_path: Path) -> None:
    assert _REAL is not None
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0,
        "tools": TOOLS,
    }
    own = httpx.post(_REAL + CHAT, json=body, timeout=60)
    with running((["serve", "--port", "0", "--decode-url", _REAL], tmp_path / "s.log")) as [proxy]:
        served = httpx.post(proxy.url + CHAT, json=body, timeout=60)
    assert (own.status_code, served.status_code) == (200, 200), served.text
    # Ids and stamps differ, the prefix cache warms between the two, and the proxy removes the
    # transfer params (they name internal hosts): the rest is the worker's own answer.
    ignored = {"id", "created", "kv_transfer_params", "ec_transfer_params"}
    mine, theirs = served.json(), own.json()
    for answer in (mine, theirs):
        del answer["usage"]["prompt_tokens_details"]
    assert {k: v for k, v in mine.items() if k not in ignored} == {
        k: v for k, v in theirs.items() if k not in ignored
    }


@pytest.mark.real_vllm
@pytest.mark.skipif(
    _REAL is None, reason="no real vLLM: set DISAGG_REAL_VLLM_URL (docs/testing.md)"
)
def test_a_derender_step_against_a_real_032_stops_serve(tmp_path: Path) -> None:
    assert _REAL is not None
    document = tmp_path / "derender.json"
    steps = {"decode": {"output_mode": "derender", "wrap_chat_completion": True}}
    document.write_text(json.dumps({"use_openai_format": False, "steps": steps}))
    line = refused("--config", str(document), "--decode-url", _REAL)
    assert 'decode.output_mode: "derender" needs vLLM >= 0.33.0' in line
    assert "vLLM 0.32.0" in line


def _external_hits(url: str) -> float:
    """The decode worker's count of prompt tokens whose KV it found in the connector's storage."""
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith("vllm:external_prefix_cache_hits_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


_REAL_TOOL_BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"messages": MESSAGES, "max_tokens": 8, "tools": TOOLS},
    "/v1/responses": {
        "input": "Weather?",
        "max_output_tokens": 8,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
    },
    "/v1/messages": {
        "messages": MESSAGES,
        "max_tokens": 8,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    },
}


@pytest.mark.real_vllm
@pytest.mark.skipif(
    _REAL_PD is None, reason="no real vLLM pair: set DISAGG_REAL_VLLM_PD_URLS (docs/testing.md)"
)
@pytest.mark.parametrize("path", sorted(_REAL_TOOL_BODIES))
def test_tools_after_a_real_prefill_decode_on_the_clients_route_and_find_the_kv(
    path: str, tmp_path: Path
) -> None:
    assert _REAL_PD is not None
    prefill, decode = _REAL_PD.split(",")
    # llm-d's coordinator document over ExampleConnector (kv-shared-storage), the default steps.
    steps = [
        {"type": "render", "params": {"address": decode}},
        {"type": "prefill"},
        {"type": "decode", "params": {"output_mode": "auto", "wrap_chat_completion": True}},
    ]
    pipeline = {"use_openai_format": False, "kv_connector": "kv-shared-storage", "steps": steps}
    document = tmp_path / "pd.json"
    document.write_text(json.dumps({"pipeline": pipeline}))
    args = ["serve", "--port", "0", "--config", str(document)]
    # A prompt no worker has seen: the decode's own prefix cache cannot hold it already.
    body = json.loads(json.dumps(_REAL_TOOL_BODIES[path]).replace("Weather?", uuid.uuid4().hex))
    body.update(model="tiny", temperature=0)
    before = _external_hits(decode)
    urls = ["--prefill-url", prefill, "--decode-url", decode]
    with running(([*args, *urls], tmp_path / "serve.log")) as [proxy]:
        served = httpx.post(proxy.url + path, json=body, timeout=120)
        log = proxy.log()
    assert served.status_code == 200, served.text
    assert "kv_transfer_params" not in served.json()
    # The decode leg went to the worker's own route, and found the KV the prefill stored.
    assert " render=200/" in log
    assert " prefill=200/" in log
    assert _external_hits(decode) > before
