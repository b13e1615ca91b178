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

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

from disagg_transforms import ConfigError, Engine, SglangSettings  # noqa: E402
from disagg_transforms.integrations.litellm import VllmGenerateLLM  # noqa: E402
from disagg_transforms.testing import SimulatedSglangWorker, SimulatedWorker  # noqa: E402

pytestmark = LITELLM_WARNINGS

MESSAGES = [{"role": "user", "content": "Hi"}]


class _Fleet:
    def __init__(self, **prefill: Any) -> None:
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
            "prefill.test": self.prefill,
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


def test_sglang_needs_a_render_worker() -> None:
    with pytest.raises(ConfigError, match="render_api_base"):
        VllmGenerateLLM(engine=Engine.SGLANG)
