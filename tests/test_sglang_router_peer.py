"""sglang-router 0.3.2 beside ``serve --engine sglang``, in front of the same simulated workers.

SGLang's own gateway (the registry's ``sglang-router``, installed into its own venv by
``benchmarks/sglang_gateway.py``) in P/D mode, and ``serve``, each get the same chat request in
front of one simulated SGLang prefill and decode (processes); the test asserts on what each did,
from the answers and from what the workers received (``GET /simulated/calls``). The behaviours
are those docs/sglang.md lists under "Side by side with sglang-router". Skipped with the reason
where sglang-router cannot be installed, except in CI (``CI=true``), where that fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from proxy_helpers import Server, running

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

import sglang_gateway

CHAT = "/v1/chat/completions"
TIMEOUT = 1.0
"""The simulated workers' transfer timeout (SGLang's 300 s, scaled down)."""
_SIMULATED_500 = "Internal server error (simulated)"


@pytest.fixture(scope="module")
def router_python() -> pathlib.Path:
    found = sglang_gateway.router_python()
    if isinstance(found, str):
        if os.environ.get("CI") == "true":
            pytest.fail(found)
        pytest.skip(found)
    return found


@dataclass
class Stack:
    prefill: Server
    decode: Server
    router: str
    ours: str

    def received(self, worker: Server) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{worker.url}/simulated/calls", timeout=10).json()
        answer["posted"] = [call for call in answer["calls"] if call["method"] == "POST"]
        return answer


@contextmanager
def stack(
    tmp_path: pathlib.Path,
    python: pathlib.Path,
    *,
    prefill_fault: str | None = None,
    decode_fault: str | None = None,
) -> Iterator[Stack]:
    """A simulated SGLang pair and a vLLM render worker; sglang-router and ``serve`` before them."""
    sglang = ["simulate", "--engine", "sglang", "--port", "0", "--transfer-timeout", str(TIMEOUT)]
    prefill = [*sglang, "--disaggregation-mode", "prefill", "--bootstrap-port", "0"]
    decode = [*sglang, "--disaggregation-mode", "decode"]
    prefill += ["--fault", prefill_fault] if prefill_fault else []
    decode += ["--fault", decode_fault] if decode_fault else []
    render = ["simulate", "--port", "0"]
    with running(
        (prefill, tmp_path / "prefill.log"),
        (decode, tmp_path / "decode.log"),
        (render, tmp_path / "render.log"),
    ) as (prefill_worker, decode_worker, render_worker):
        info = httpx.get(f"{prefill_worker.url}/server_info", timeout=10).json()
        bootstrap_port = info["disaggregation_bootstrap_port"]
        serve = [
            "serve", "--engine", "sglang", "--port", "0",
            "--render-url", render_worker.url,
            "--prefill-url", prefill_worker.url,
            "--decode-url", decode_worker.url,
            "--sglang-bootstrap-port", str(bootstrap_port),
        ]  # fmt: skip
        with (
            running((serve, tmp_path / "serve.log")) as (ours,),
            sglang_gateway.launched(
                python,
                prefill=prefill_worker.url,
                bootstrap_port=bootstrap_port,
                decode=decode_worker.url,
                log_path=tmp_path / "router.log",
            ) as (_, router),
        ):
            yield Stack(prefill_worker, decode_worker, router, ours.url)


def _chat(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        **fields,
    }


def _generate_rid(received: dict[str, Any]) -> str:
    """The rid of serve's one leg to a worker (sglang-router calls the OpenAI route)."""
    (leg,) = (call for call in received["posted"] if call["path"] == "/generate")
    rid: str = leg["body"]["rid"]
    return rid


def _timed(url: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = httpx.post(f"{url}{CHAT}", json=body, timeout=120)
    return answer, time.monotonic() - started


def test_unknown_fields_and_floats(tmp_path: pathlib.Path, router_python: pathlib.Path) -> None:
    with stack(tmp_path, router_python) as workers:
        # A field SGLang has no place for: sglang-router drops it silently and answers 200; the
        # workers never see it. serve refuses it with a 400 naming it, before any worker call.
        body = _chat(allowed_token_ids=[1001])
        theirs, _ = _timed(workers.router, body)
        assert theirs.status_code == 200
        assert theirs.json()["choices"][0]["message"]["content"] == "Hello!"
        (sent,) = workers.received(workers.decode)["posted"]
        assert "allowed_token_ids" not in sent["body"]
        ours, _ = _timed(workers.ours, body)
        assert ours.status_code == 400
        assert ours.json()["error"]["param"] == "$.allowed_token_ids"
        assert len(workers.received(workers.decode)["posted"]) == 1  # no worker call

        # Floats: sglang-router re-encodes them through 32 bits; serve keeps the client's.
        body = _chat(temperature=0.7, top_p=0.9)
        assert _timed(workers.router, body)[0].status_code == 200
        assert _timed(workers.ours, body)[0].status_code == 200
        _, theirs_sent, ours_sent = workers.received(workers.decode)["posted"]
        assert theirs_sent["path"] == CHAT
        assert theirs_sent["body"]["temperature"] == 0.699999988079071
        assert theirs_sent["body"]["top_p"] == 0.8999999761581421
        assert ours_sent["path"] == "/generate"
        assert ours_sent["body"]["sampling_params"]["temperature"] == 0.7
        assert ours_sent["body"]["sampling_params"]["top_p"] == 0.9

        # SGLang's own /generate client with vLLM's cap name: sglang-router drops the unknown
        # sampling key, so SGLang's default cap of 128 tokens applies, with a 200; serve
        # refuses it naming it.
        generate = {
            "input_ids": [1001, 1002, 1003],
            "sampling_params": {"max_tokens": 8, "ignore_eos": True},
        }
        theirs = httpx.post(f"{workers.router}/generate", json=generate, timeout=60)
        assert theirs.status_code == 200
        assert theirs.json()["meta_info"]["completion_tokens"] == 128
        assert workers.received(workers.decode)["posted"][-1]["body"]["sampling_params"] == {
            "ignore_eos": True
        }
        ours = httpx.post(f"{workers.ours}/generate", json=generate, timeout=60)
        assert ours.status_code == 400
        assert "$.sampling_params.max_tokens" in ours.text
        assert len(workers.received(workers.decode)["posted"]) == 4  # no worker call


def test_a_prefill_that_failed(tmp_path: pathlib.Path, router_python: pathlib.Path) -> None:
    with stack(tmp_path, router_python, prefill_fault="http-500") as workers:
        # sglang-router looks at the prefill only after the decode answered: it waits for the
        # decode's transfer timeout, on each of its 5 attempts, and shows the decode's error.
        theirs, waited = _timed(workers.router, _chat())
        assert theirs.status_code == 500
        assert waited >= 5 * TIMEOUT
        assert theirs.json()["error"]["message"].startswith("Decode transfer failed")
        assert workers.received(workers.decode)["aborted"] == []
        # serve answers at once with the prefill's error and aborts the decode by its rid.
        ours, answered = _timed(workers.ours, _chat())
        assert ours.status_code == 502
        assert answered < TIMEOUT
        assert _SIMULATED_500 in ours.json()["error"]["message"]
        decode = workers.received(workers.decode)
        assert decode["aborted"] == [_generate_rid(decode)]


def test_a_decode_that_failed(tmp_path: pathlib.Path, router_python: pathlib.Path) -> None:
    with stack(tmp_path, router_python, decode_fault="http-500") as workers:
        # sglang-router's streamed error: Python's repr inside, and cut at the decode's own
        # Content-Length; the prefill is never aborted (it waits out its own timeout).
        theirs, _ = _timed(workers.router, _chat(stream=True))
        assert theirs.status_code == 500
        payload = theirs.text.removeprefix("data: ")
        with pytest.raises(json.JSONDecodeError):
            json.loads(payload)
        assert _SIMULATED_500 in payload
        assert not payload.rstrip().endswith("}")
        assert workers.received(workers.prefill)["aborted"] == []
        # serve: SGLang's whole error text in the API's shape, and the prefill aborted.
        ours, answered = _timed(workers.ours, _chat(stream=True))
        assert ours.status_code == 502
        assert answered < TIMEOUT
        assert _SIMULATED_500 in ours.json()["error"]["message"]
        prefill = workers.received(workers.prefill)
        assert prefill["aborted"] == [_generate_rid(prefill)]
