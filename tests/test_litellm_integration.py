"""The LiteLLM integration, run through the real ``litellm`` package against a fake worker."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import LITELLM_WARNINGS, TIMEOUT, WEATHER_TOOLS
from helpers import run_bounded as run

# LiteLLM fetches its model-cost map at import time unless told not to; there is no network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

from fake_worker import GENERATE_PATH, RENDER_PATH, FakeWorker  # noqa: E402 - after the env var
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402

from disagg_transforms import ConfigError, DecodeParams, RequestError, Route  # noqa: E402
from disagg_transforms.integrations import litellm as integration  # noqa: E402
from disagg_transforms.integrations.litellm import (  # noqa: E402
    SamplingCapsCallback,
    StripTransferParamsCallback,
    VllmGenerateLLM,
)

pytestmark = LITELLM_WARNINGS

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(autouse=True)
def providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        litellm,
        "custom_provider_map",
        [
            {"provider": "disagg-text", "custom_handler": integration.text_provider},
            {"provider": "disagg-derender", "custom_handler": integration.derender_provider},
            {"provider": "disagg-auto", "custom_handler": integration.auto_provider},
        ],
    )
    monkeypatch.setattr(litellm, "callbacks", [])


@pytest.fixture
def worker() -> Iterator[FakeWorker]:
    with FakeWorker(lifetime=TIMEOUT) as running:
        yield running


def complete(worker: FakeWorker, model: str, **kwargs: Any) -> Any:
    return run(
        litellm.acompletion(
            model=model, messages=MESSAGES, api_base=worker.url, timeout=TIMEOUT, **kwargs
        )
    )


async def _collect(stream: Any) -> list[Any]:
    return [chunk async for chunk in stream]


def stream_chunks(worker: FakeWorker, model: str, **kwargs: Any) -> list[Any]:
    async def go() -> list[Any]:
        stream = await litellm.acompletion(
            model=model,
            messages=MESSAGES,
            api_base=worker.url,
            timeout=TIMEOUT,
            stream=True,
            **kwargs,
        )
        return await _collect(stream)

    return run(go())


def test_derender_answers_with_tool_calls_and_reasoning(worker: FakeWorker) -> None:
    response = complete(worker, "disagg-derender/qwen", tools=WEATHER_TOOLS, max_tokens=33)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "get_weather"
    assert message.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert message.reasoning_content == "User wants weather."
    assert response.usage.completion_tokens == 3
    [rendered] = worker.bodies(RENDER_PATH)
    assert rendered["messages"] == MESSAGES
    assert rendered["max_tokens"] == 33
    [leg] = worker.bodies(GENERATE_PATH)
    assert leg["output_mode"] == "derender"
    assert leg["sampling_params"]["max_tokens"] == 33
    assert leg["stream"] is False
    assert leg["parse_context"]["tools"] == WEATHER_TOOLS


def test_text_answers_with_the_text(worker: FakeWorker) -> None:
    response = complete(worker, "disagg-text/qwen", max_completion_tokens=12, temperature=0.5)
    assert response.choices[0].message.content == "Hello!"
    assert response.choices[0].finish_reason == "stop"
    [leg] = worker.bodies(GENERATE_PATH)
    assert leg["output_mode"] == "text"
    assert leg["sampling_params"]["max_tokens"] == 12
    assert leg["sampling_params"]["temperature"] == 0.5


def test_text_streams_the_chunks(worker: FakeWorker) -> None:
    chunks = stream_chunks(worker, "disagg-text/qwen", stream_options={"include_usage": True})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Hello!"
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finishes[-1] == "stop"
    assert any(getattr(chunk, "usage", None) for chunk in chunks)
    [leg] = worker.bodies(GENERATE_PATH)
    assert leg["stream"] is True
    assert leg["output_mode"] == "text"
    assert leg["stream_options"] == {"include_usage": True}


def test_derender_streams_one_single_frame(worker: FakeWorker) -> None:
    chunks = stream_chunks(worker, "disagg-derender/qwen", tools=WEATHER_TOOLS)
    calls = [
        c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
    ]
    assert [call.function.name for call in calls] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    [leg] = worker.bodies(GENERATE_PATH)
    assert leg["stream"] is False  # vLLM 0.33 refuses derender + stream


def test_auto_streams_text_and_answers_tool_calls_over_sockets(worker: FakeWorker) -> None:
    chunks = stream_chunks(worker, "disagg-auto/qwen")
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Hello!"
    response = complete(worker, "disagg-auto/qwen", tools=WEATHER_TOOLS)
    assert response.choices[0].message.tool_calls[0].function.name == "get_weather"
    streamed, called = worker.bodies(GENERATE_PATH)
    assert (streamed["output_mode"], streamed["stream"]) == ("text", True)
    assert (called["output_mode"], called["stream"]) == ("derender", False)


def test_sync_completion_and_streaming(worker: FakeWorker) -> None:
    response = litellm.completion(
        model="disagg-text/qwen", messages=MESSAGES, api_base=worker.url, timeout=TIMEOUT
    )
    assert response.choices[0].message.content == "Hello!"
    stream = litellm.completion(
        model="disagg-text/qwen",
        messages=MESSAGES,
        api_base=worker.url,
        timeout=TIMEOUT,
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == "Hello!"


@pytest.mark.parametrize("stream", [False, True])
def test_an_old_worker_gives_a_clear_502(stream: bool) -> None:
    call = stream_chunks if stream else complete
    with (
        FakeWorker(old=True, lifetime=TIMEOUT) as old,
        pytest.raises(Exception) as caught,  # noqa: PT011 - LiteLLM picks the class
    ):
        call(old, "disagg-text/qwen")
    assert getattr(caught.value, "status_code", None) == 502
    message = str(caught.value)
    assert 'requested "text"' in message
    assert "no output_mode" in message
    assert "vLLM >= 0.32.0" in message


def test_a_worker_error_keeps_its_status_and_message(worker: FakeWorker) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        run(
            litellm.acompletion(
                model="disagg-text/qwen",
                messages=MESSAGES,
                api_base=worker.url + "/nowhere",
                timeout=TIMEOUT,
            )
        )
    assert getattr(caught.value, "status_code", None) == 404
    # The exchange names the step and quotes the worker (docs/exchange.md, "Errors").
    assert "render rejected the request: no route" in str(caught.value)


def test_a_bad_cap_is_a_400(worker: FakeWorker) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - LiteLLM picks the class
        complete(worker, "disagg-text/qwen", max_tokens=0)
    assert getattr(caught.value, "status_code", None) == 400
    assert "max_tokens" in str(caught.value)


def test_the_provider_refuses_openai_format_params() -> None:
    with pytest.raises(ConfigError, match="use_openai_format false"):
        VllmGenerateLLM(params=DecodeParams())
    assert integration.derender_provider.params.output_mode.value == "derender"


# --- callbacks -----------------------------------------------------------------------------------


def test_callbacks_define_their_hooks_on_their_own_class() -> None:
    for cls in (SamplingCapsCallback, StripTransferParamsCallback):
        assert issubclass(cls, CustomLogger)
        assert "async_pre_call_hook" in cls.__dict__
        assert "async_pre_call_deployment_hook" in cls.__dict__


def test_callbacks_refuse_subclasses() -> None:
    with pytest.raises(TypeError, match="Compose"):
        type("Mine", (SamplingCapsCallback,), {})
    with pytest.raises(TypeError, match="must not be subclassed"):
        type("Mine", (StripTransferParamsCallback,), {})


@pytest.mark.parametrize(
    ("call_type", "data", "expected"),
    [
        ("acompletion", {"max_tokens": 5, "max_completion_tokens": 9}, {"max_tokens": 9}),
        ("text_completion", {"max_tokens": 5, "min_tokens": 2}, {"max_tokens": 5, "min_tokens": 2}),
        ("aresponses", {"max_output_tokens": 4}, {"max_tokens": 4}),
        ("anthropic_messages", {"max_tokens": 3}, {"max_tokens": 3}),
    ],
)
def test_caps_callback_relocates_by_call_type(
    call_type: str, data: dict[str, Any], expected: dict[str, Any]
) -> None:
    callback = SamplingCapsCallback()
    body = {"model": "m", **data}
    before = copy.deepcopy(body)
    proxy = run(callback.async_pre_call_hook(None, None, body, call_type))
    sdk = run(
        callback.async_pre_call_deployment_hook(body, litellm.types.utils.CallTypes(call_type))
    )
    assert proxy == sdk == {"model": "m", "sampling_params": expected}
    assert body == before


def test_caps_callback_leaves_other_calls_and_honours_a_fixed_route() -> None:
    body = {"max_tokens": 5}
    assert run(SamplingCapsCallback().async_pre_call_hook(None, None, body, "embedding")) is None
    fixed = SamplingCapsCallback(Route.GENERATE)
    assert run(fixed.async_pre_call_deployment_hook(body, None)) == {
        "sampling_params": {"max_tokens": 5}
    }
    with pytest.raises(RequestError, match="max_tokens"):
        run(fixed.async_pre_call_deployment_hook({"max_tokens": -1}, None))
    with pytest.raises(ConfigError):
        SamplingCapsCallback("chat")  # type: ignore[arg-type]


def test_strip_callback_removes_client_transfer_params() -> None:
    body = {
        "model": "m",
        "kv_transfer_params": {"remote_host": "evil"},
        "extra_body": {"x": 1},
        "vllm_xargs": {"ec_transfer_params": {"remote_host": "evil"}},
    }
    before = copy.deepcopy(body)
    callback = StripTransferParamsCallback()
    # The vllm_xargs the stripping emptied goes too: nothing empty is left behind.
    expected = {"model": "m", "extra_body": {"x": 1}}
    assert run(callback.async_pre_call_hook(None, None, body, "acompletion")) == expected
    assert run(callback.async_pre_call_deployment_hook(body, None)) == expected
    assert body == before


def test_strip_callback_runs_inside_litellm(
    worker: FakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(litellm, "callbacks", [integration.strip_transfer_params_callback])
    complete(worker, "disagg-text/qwen", kv_transfer_params={"remote_host": "evil"})
    [rendered] = worker.bodies(RENDER_PATH)
    assert "kv_transfer_params" not in rendered


def test_the_core_never_imports_the_integration() -> None:
    code = (
        "import sys, disagg_transforms, disagg_transforms._cli.main\n"
        "assert 'disagg_transforms.integrations' not in sys.modules\n"
        "assert 'litellm' not in sys.modules\n"
    )
    done = subprocess.run(  # noqa: S603 - our own interpreter, fixed code
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
