"""The LiteLLM provider in front of SGLang P/D workers: prefill and decode sent together.

In process: a simulated vLLM render worker and simulated SGLang prefill and decode workers,
picked by the request's host, through ``litellm.acompletion``.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from helpers import LITELLM_WARNINGS, TIMEOUT
from helpers import run_bounded as run
from proxy_helpers import by_host, held_back, served

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

from disagg_transforms import ConfigError, Engine, SglangSettings  # noqa: E402
from disagg_transforms.integrations.litellm import VllmGenerateLLM  # noqa: E402
from disagg_transforms.testing import SimulatedSglangWorker, SimulatedWorker  # noqa: E402

pytestmark = LITELLM_WARNINGS

MESSAGES = [{"role": "user", "content": "Hi"}]


class _Fleet:
    def __init__(self, late: float = 0.0, **prefill: Any) -> None:
        self.prefill = SimulatedSglangWorker(
            disaggregation_mode="prefill", transfer_timeout=5, **prefill
        )
        self.decode = SimulatedSglangWorker(
            disaggregation_mode="decode",
            transfer_timeout=5,
            prefills={("prefill.test", 8998): self.prefill},
        )
        apps: dict[str, Any] = {
            "render.test": SimulatedWorker(),
            "prefill.test": held_back(self.prefill, late) if late else self.prefill,
            "decode.test": self.decode,
        }
        transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

        class ByHost(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                return await transports[request.url.host].handle_async_request(request)

        self.provider = VllmGenerateLLM(
            async_http_client=httpx.AsyncClient(transport=ByHost()),
            engine=Engine.SGLANG,
            sglang=SglangSettings(bootstrap_port=8998),
            prefill_api_base="http://prefill.test",
            render_api_base="http://render.test",
        )


@pytest.fixture
def register(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(fleet: _Fleet) -> None:
        entry = {"provider": "sglang-pd", "custom_handler": fleet.provider}
        monkeypatch.setattr(litellm, "custom_provider_map", [entry])
        monkeypatch.setattr(litellm, "callbacks", [])

    return use


def _complete(**kwargs: Any) -> Any:
    call = litellm.acompletion(
        model="sglang-pd/m",
        messages=MESSAGES,
        api_base="http://decode.test",
        timeout=TIMEOUT,
        max_tokens=32,
        **kwargs,
    )
    return run(call)


def test_a_chat_completion_from_sglang_workers(register: Any) -> None:
    fleet = _Fleet()
    register(fleet)
    response = _complete()
    assert response.choices[0].message.content == "Hello!"
    [prefill] = fleet.prefill.calls_to("/generate")
    [decode] = fleet.decode.calls_to("/generate")
    assert prefill.body == decode.body
    assert decode.body["bootstrap_host"] == "prefill.test"


def test_a_streamed_chat_completion_from_sglang_workers(register: Any) -> None:
    fleet = _Fleet()
    register(fleet)

    async def go() -> str:
        chunks = await litellm.acompletion(
            model="sglang-pd/m",
            messages=MESSAGES,
            api_base="http://decode.test",
            timeout=TIMEOUT,
            max_tokens=32,
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks])

    assert run(go()) == "Hello!"


def test_a_failed_prefill_is_a_502_and_aborts_the_decode(register: Any) -> None:
    fleet = _Fleet(fault="http-500")
    register(fleet)
    with pytest.raises(litellm.exceptions.BadGatewayError) as failed:
        _complete()
    assert "prefill failed with HTTP 500" in str(failed.value)
    assert len(fleet.decode.aborted) == 1


def test_prompt_logprobs_wait_for_the_prefills_answer(register: Any) -> None:
    fleet = _Fleet(late=0.3)  # the prefill answers after the decode
    register(fleet)
    response = _complete(extra_body={"prompt_logprobs": 2})
    assert response.choices[0].message.content == "Hello!"
    prompt = response.model_extra["prompt_logprobs"]
    assert prompt[0] is None
    assert prompt[1] is not None
    [prefill] = fleet.prefill.calls_to("/generate")
    assert prefill.body["logprob_start_len"] == 0


def test_prompt_logprobs_through_a_synchronous_call(register: Any) -> None:
    # litellm.completion: the prefill sent in a thread, its answer fed before the reply.
    prefill = SimulatedSglangWorker(disaggregation_mode="prefill", transfer_timeout=5)
    decode = SimulatedSglangWorker(
        disaggregation_mode="decode", transfer_timeout=5, prefills={("127.0.0.1", 8998): prefill}
    )
    workers = by_host({"127.0.0.1": held_back(prefill, 0.3), "localhost": decode})

    with served(SimulatedWorker()) as render, served(workers) as url, httpx.Client() as http:
        provider = VllmGenerateLLM(
            http_client=http,
            engine=Engine.SGLANG,
            sglang=SglangSettings(bootstrap_port=8998),
            prefill_api_base=url,
            render_api_base=render,
        )
        fleet = _Fleet()
        fleet.provider = provider
        register(fleet)
        response = litellm.completion(
            model="sglang-pd/m",
            messages=MESSAGES,
            api_base=url.replace("127.0.0.1", "localhost"),
            timeout=TIMEOUT,
            max_tokens=32,
            extra_body={"prompt_logprobs": 1},
        )
    assert response.choices[0].message.content == "Hello!"
    assert response.model_extra["prompt_logprobs"][1] is not None
    assert len(decode.calls_to("/generate")) == 1


def test_sglang_needs_a_render_worker() -> None:
    with pytest.raises(ConfigError, match="render_api_base"):
        VllmGenerateLLM(engine=Engine.SGLANG)
