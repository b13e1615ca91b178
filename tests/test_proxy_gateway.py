"""``serve --gateway-url``: llm-d's coordinator seat, against a simulated gateway (docs/llm-d.md).

The gateway runs in this process (its call log is an in-process list); the proxy and the render
worker are separate processes, driven with the official SDKs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
import anthropic
import openai
from proxy_helpers import Server, refused, running, served

from disagg_transforms import parse_pipeline_params
from disagg_transforms.integrations.proxy import url_errors
from disagg_transforms.testing import SimulatedGateway

MESSAGES: list[Any] = [{"role": "user", "content": "Hi"}]
CLIENT_PROFILE = {"EPP-Profile": "encode"}  # a client's own: never reaches a worker


@pytest.fixture
def gateway() -> Iterator[tuple[SimulatedGateway, str]]:
    simulated = SimulatedGateway()
    with served(simulated) as url:
        yield simulated, url


@contextmanager
def _serve(tmp_path: Path, gateway_url: str, *extra: str) -> Iterator[Server]:
    """The proxy in gateway mode, render sent to a simulated worker of its own."""
    render = (["simulate", "--port", "0"], tmp_path / "render.log")
    with running(render) as (renderer,):
        args = ["serve", "--port", "0", "--gateway-url", gateway_url]
        with running(([*args, "--render-url", renderer.url, *extra], tmp_path / "serve.log")) as (
            proxy,
        ):
            yield proxy


def _legs(gateway: SimulatedGateway) -> list[tuple[str, str, str | None, str | None]]:
    """Each call the gateway got: its path, the EPP-Profile and Prefer it carried."""
    return [
        (call.path, call.profile, call.headers.get("epp-profile"), call.headers.get("prefer"))
        for call in gateway.calls
    ]


def test_every_leg_reaches_the_gateway_with_its_profile(
    tmp_path: Path, gateway: tuple[SimulatedGateway, str]
) -> None:
    simulated, gateway_url = gateway
    with _serve(tmp_path, gateway_url) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        with client:
            reply = client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=8, extra_headers=CLIENT_PROFILE
            )
            chunks = list(
                client.chat.completions.create(
                    model="m", messages=MESSAGES, max_tokens=8, stream=True
                )
            )
        messages = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
        with messages:
            message = messages.messages.create(
                model="m", messages=MESSAGES, max_tokens=8, extra_headers=CLIENT_PROFILE
            )
    assert reply.choices[0].message.content == "Hello!"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello!"
    assert message.content[0].type == "text"
    generate = "/inference/v1/generate"
    # Render went to the render worker: the gateway got the prefill and decode legs only.
    assert (
        _legs(simulated)
        == [
            (generate, "prefill", "prefill", None),
            (generate, "decode", "decode", None),
        ]
        * 3
    )
    for worker in (*simulated.pools["prefill"], *simulated.pools["decode"]):
        for call in worker.calls:
            assert call.headers["epp-profile"] in {"prefill", "decode"}


def test_a_conditional_decode_answers_a_warm_prompt_alone(
    tmp_path: Path, gateway: tuple[SimulatedGateway, str]
) -> None:
    simulated, gateway_url = gateway
    config = tmp_path / "pipeline.json"
    steps = {"conditional-decode": {}, "prefill": {}, "decode": {"wrap_chat_completion": True}}
    config.write_text(json.dumps({"use_openai_format": False, "steps": steps}))
    with _serve(tmp_path, gateway_url, "--config", str(config)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        with client:
            cold = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8)
            cold_legs = _legs(simulated)
            simulated.calls.clear()
            warm = client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=8, extra_headers=CLIENT_PROFILE
            )
            warm_legs = _legs(simulated)
            simulated.calls.clear()
            other: list[Any] = [{"role": "user", "content": "Another prompt"}]
            chunks = list(
                client.chat.completions.create(model="m", messages=other, max_tokens=8, stream=True)
            )
    chat, generate = "/v1/chat/completions", "/inference/v1/generate"
    assert cold_legs == [
        (chat, "decode", "decode", "if-available"),
        (generate, "prefill", "prefill", None),
        (generate, "decode", "decode", None),
    ]
    assert warm_legs == [(chat, "decode", "decode", "if-available")]
    assert cold.choices[0].message.content == warm.choices[0].message.content == "Hello!"
    # A streamed request: the 412 is read whole, then the legs run and decode streams.
    assert _legs(simulated) == cold_legs
    assert [call.status for call in simulated.calls] == [412, 200, 200]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello!"


def test_gateway_url_with_a_worker_url_is_one_line() -> None:
    urls = ("--gateway-url", "http://g:80", "--render-url", "http://r:80")
    line = refused(*urls, "--decode-url", "http://d:80")
    assert "--gateway-url: give no --decode-url with it" in line


def test_gateway_mode_needs_a_render_url_for_a_generate_leg() -> None:
    generate = parse_pipeline_params({"prefill": {}, "decode": {}}, use_openai_format=False)
    [error] = url_errors(generate, gateway_url="http://g")
    assert error.message.startswith("--render-url: a leg speaks the generate route")
    assert url_errors(generate, gateway_url="http://g", render_url="http://r") == []
    openai_format = parse_pipeline_params({"prefill": {}, "decode": {}})
    assert url_errors(openai_format, gateway_url="http://g") == []
    both = url_errors(openai_format, gateway_url="http://g", prefill_url="http://p")
    assert [error.param for error in both] == ["gateway"]


# ---- serve --config with llm-d's coordinator document ------------------------------------

LLM_D = Path(__file__).parent / "fixtures" / "llm-d"


def test_a_coordinator_document_from_llm_d_starts_it(tmp_path: Path) -> None:
    args = ["serve", "--config", str(LLM_D / "pd-only.yaml"), "--host", "127.0.0.1", "--port", "0"]
    with running((args, tmp_path / "serve.log")) as (proxy,):
        log = proxy.log()
    warnings = [line for line in log.splitlines() if ": warning: " in line]
    ignored = "warning: log_level: ignored, the proxy logs at INFO, one access line per request"
    assert any(line.endswith(f"pd-only.yaml: {ignored}") for line in warnings)
    assert len(warnings) == 5  # log_level, two server timeouts, two gateway pool keys


def test_a_coordinator_document_runs_the_coordinators_seat(
    tmp_path: Path, gateway: tuple[SimulatedGateway, str]
) -> None:
    simulated, gateway_url = gateway
    document = tmp_path / "coordinator.yaml"
    document.write_text(
        f"""
server:
  listen_addr: "127.0.0.1:0"
  max_request_body_size: 1
  shutdown_timeout: 5s
gateway:
  address: "{gateway_url}"
  timeout: 30s
pipeline:
  kv_connector: kv-shared-storage
  steps:
    - type: conditional-decode
    - type: prefill
    - type: decode
"""
    )
    with running((["serve", "--config", str(document)], tmp_path / "serve.log")) as (proxy,):
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        with client:
            reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8)
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "x" * (1024 * 1024)}],
                    max_tokens=8,
                )
    assert proxy.url.startswith("http://127.0.0.1:")  # the document's listen address
    assert reply.choices[0].message.content == "Hello!"
    assert caught.value.status_code == 413  # over the document's 1 MiB
    chat = "/v1/chat/completions"
    assert _legs(simulated) == [
        (chat, "decode", "decode", "if-available"),
        (chat, "prefill", "prefill", None),
        (chat, "decode", "decode", None),
    ]
    [decode] = [c for c in simulated.pools["decode"][0].calls if "prefer" not in c.headers]
    shared = {"do_remote_decode": False, "do_remote_prefill": True}
    assert decode.body["kv_transfer_params"] == shared


def test_a_coordinator_step_not_carried_out_stops_it(tmp_path: Path) -> None:
    document = tmp_path / "coordinator.yaml"
    document.write_text(
        """
gateway:
  address: "http://gateway:80"
pipeline:
  steps:
    - type: replace-media-urls
    - type: decode
"""
    )
    line = refused("--config", str(document))
    assert line.startswith(f"{document}: pipeline.steps[0].type: replace-media-urls")


def test_outside_gateway_mode_a_conditional_decode_goes_to_the_decode_url(tmp_path: Path) -> None:
    # The simulated worker does not know Prefer: it simply answers, and that is the reply.
    config = tmp_path / "pipeline.json"
    steps: dict[str, Any] = {"conditional-decode": {}, "decode": {}}
    config.write_text(json.dumps({"steps": steps}))
    args = ["serve", "--simulate", "--config", str(config), "--port", "0"]
    with running((args, tmp_path / "serve.log")) as (proxy,):
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        with client:
            reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8)
        log = proxy.wait_for_log("conditional-decode=200")
    assert reply.choices[0].message.content == "Hello!"
    assert " decode=" not in log  # answered by the conditional decode alone
